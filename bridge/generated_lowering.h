// Lowers ATen ops that reach the host-kernel path (mostly the out= forms that
// ATen's structured composites call) to generated kernels, when
// VTPU_GENERATED_KERNELS=1. The table below names each op's IR kind, which
// arguments are its tensor operands and which become attributes.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace vtpu::bridge {

// True when the op ran (was queued) on a generated kernel; the stack then
// holds its results. False leaves the stack untouched.
bool try_generated_lowering(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// A Scalar argument as the wrapped-number tensor ATen makes of it (0-dim, on
// the CPU): the form in which generated launches take Python numbers.
at::Tensor wrapped_number(const c10::Scalar& value);

// The bridge's native fill_/zero_ and device-to-device copy_ on generated
// kernels. False, having queued nothing, when the case stays on ATen's kernel.
bool launch_generated_fill(const at::Tensor& self, const c10::Scalar& value);
bool launch_generated_copy(const at::Tensor& dst, const at::Tensor& src);

}  // namespace vtpu::bridge
