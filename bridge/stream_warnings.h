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

// Runs `kernel` with the c10 warnings it raises on this thread kept.
void run_keeping_warnings(const std::function<void()>& kernel);

// Issues the kept warnings on the calling thread, oldest first, unchanged
// (message, category, source location): inside a Python call torch's
// handler makes them Python warnings.
void issue_kept_warnings();

}  // namespace vtpu::bridge
