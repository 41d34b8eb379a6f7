// The strides ATen's TensorIterator gives a fresh elementwise result, for
// kernels that allocate their own output (generated lowerings of where,
// relu, ...). Views and in-place ops compiled graphs apply to such a result
// (AOTAutograd replays them with as_strided) assume the CPU's layout.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace vtpu::bridge {

// `operands`: the op's inputs in TensorIterator's order (0-dim wrapped
// numbers included); `sizes`: the broadcast result shape.
std::vector<std::int64_t> iterator_output_strides(const std::vector<at::Tensor>& operands, c10::IntArrayRef sizes);

}  // namespace vtpu::bridge
