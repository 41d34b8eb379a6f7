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

}  // namespace vtpu::bridge
