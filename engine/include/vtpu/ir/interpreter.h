// A slow, obviously-correct reference interpreter: the oracle the engine's
// tests compare generated kernels against. Every node's result is rounded to
// its dtype (so bf16 chains round like the device does); elementwise math runs
// in double and is rounded to compute_type(common_dtype) (float32 for the
// 16-bit floats); reductions and normalizations accumulate in double.
#pragma once

#include <cstdint>
#include <vector>

#include "vtpu/ir/graph.h"

namespace vtpu::ir {

// Host storage of one tensor. Element (i0, i1, ...) lives at element offset
// sum(ik * strides[k]) from bytes.data(); bytes covers the storage extent.
struct Buffer {
  TensorType type;
  std::vector<std::uint8_t> bytes;

  // Zero-filled storage for `type` (strided types get their full extent).
  static Buffer zeros(TensorType type);
};

// Contiguous buffers from values in row-major order, converted to dtype with
// the engine's rounding (round-to-nearest-even for 16-bit floats).
Buffer make_buffer(DType dtype, std::vector<std::int64_t> sizes,
                   const std::vector<double>& values);
Buffer make_int_buffer(DType dtype, std::vector<std::int64_t> sizes,
                       const std::vector<std::int64_t>& values);

// Elements in row-major logical order, read through the strides.
std::vector<double> to_doubles(const Buffer& buffer);
std::vector<std::int64_t> to_int64s(const Buffer& buffer);

// Evaluates the graph; returns one contiguous buffer per output. Inputs pair
// with graph.inputs() and must match their types exactly. Throws
// Error(kInvalidArgument) naming the op for a kind it does not implement, an
// out-of-range index, or integer division by zero.
std::vector<Buffer> interpret(const Graph& graph, const std::vector<Buffer>& inputs);

}  // namespace vtpu::ir
