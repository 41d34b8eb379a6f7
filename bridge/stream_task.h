// How a kernel runs on the device stream's worker thread, which has none of
// the issuing thread's thread-local state.
//
// Below autograd: a kernel implements an op autograd already saw on the
// issuing thread; the CPU tensors it calls ATen on (aliases of device
// memory) made inside torch.inference_mode() are inference tensors, and an
// in-place copy_ on one outside InferenceMode raised "Inplace update to
// inference tensor outside InferenceMode" (`.to("vtpu")` inside
// inference_mode, strict and fused mode).
//
// Warnings of kernels that ran on the device stream. ATen's CPU kernels on
// the host-kernel path warn through c10 (var with too few degrees of
// freedom, deprecations); on the stream's worker thread c10's default
// handler printed them to stderr as C++ warnings, out of reach of Python's
// `warnings` filters. They are kept instead and issued again on the thread
// that synchronises next (strict and fused mode; debug runs kernels on the
// calling thread, where torch turns them into Python warnings at once), as
// the asynchronous errors are.
#pragma once

#include <functional>

namespace vtpu::bridge {

// Runs `kernel` below autograd, with the c10 warnings it raises on this
// thread kept.
void run_stream_task(const std::function<void()>& kernel);

// Issues the kept warnings on the calling thread, oldest first, unchanged
// (message, category, source location): inside a Python call torch's
// handler makes them Python warnings.
void issue_kept_warnings();

}  // namespace vtpu::bridge
