// Output metadata of host-kernel-path ops, remembered per argument geometry.
//
// Many ATen ops reach the host-kernel path with a meta kernel written in
// Python (the reference implementations behind addmm, native_layer_norm, the
// convolution and batch-norm families): running it costs tens to hundreds of
// microseconds on the issuing thread, every call, while a training step
// repeats the same shapes over and over. A meta kernel's result depends only
// on the arguments' metadata (dtype, sizes, strides, offset, device, conj/neg
// bits, which arguments share a storage) and non-tensor values, so its
// returned meta tensors are remembered under that key and reused. The
// host-kernel path reads only their metadata: sizes and strides of fresh
// outputs, the new geometry of out= and in-place arguments (a resized out=
// tensor), the sizes, strides and offset of views.
// Only successful meta calls are remembered: an argument error still raises
// from the meta kernel the first time and every time after. Calls with an
// integer or bool CPU tensor argument (an index mask, repeats) are not: the
// meta kernel reads its values, which may decide the output's shape.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace vtpu::bridge {

// The cache key of a call of `op` with the arguments at stack[first...], or
// nothing when an argument is of a kind the key does not describe (symbolic
// sizes, Scalars, generators, objects, integer or bool CPU tensors).
std::optional<std::string> meta_cache_key(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                                          std::size_t first);

// The meta kernel's returns for `key`, if remembered.
std::optional<std::vector<c10::IValue>> meta_cache_find(const std::string& key);
void meta_cache_insert(std::string key, std::vector<c10::IValue> returns);

}  // namespace vtpu::bridge
