// Batch norm's training forward and backward on vTPU ops (see the .cpp for
// why and when). Each takes the op's boxed arguments and returns its results
// (queued), or nothing to leave the op to ATen's CPU kernel.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <vector>

namespace vtpu::bridge {

std::vector<at::Tensor> lower_native_batch_norm(c10::ArrayRef<c10::IValue> args);
// _native_batch_norm_legit with running statistics, or its no_stats overload.
std::vector<at::Tensor> lower_native_batch_norm_legit(c10::ArrayRef<c10::IValue> args, bool with_stats);
std::vector<at::Tensor> lower_native_batch_norm_backward(c10::ArrayRef<c10::IValue> args);

}  // namespace vtpu::bridge
