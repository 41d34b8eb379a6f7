// Internals of the reference interpreter: element access through strides and
// dtype conversions, shared by the per-family evaluators. Internal.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vtpu/ir/interpreter.h"

namespace vtpu::ir::detail {

[[noreturn]] void interp_fail(OpKind op, const std::string& message);

// Reads: floats exactly, integers as int64, bool as 0/1.
double load_double(const Buffer& b, std::int64_t offset);
std::int64_t load_int(const Buffer& b, std::int64_t offset);
bool load_bool(const Buffer& b, std::int64_t offset);
// Writes with the engine's conversions: doubles round to the dtype (through
// float32 for the 16-bit floats), to integers truncate toward zero (NaN and
// out of range as x86 gives them: see x86_float_to_int); ints wrap to width.
void store_double(Buffer& b, std::int64_t offset, double v);
void store_int(Buffer& b, std::int64_t offset, std::int64_t v);

// A value converted to dtype `t`'s compute precision (float32 for the 16-bit
// floats and float32): how an operand enters an op with common dtype t.
double round_to_compute(DType t, double v);
// `v` rounded to float16/bfloat16 when `t` is one (ATen's operand conversion).
double round_to_16_bits(DType t, double v);

std::vector<std::int64_t> unravel(std::int64_t linear, const std::vector<std::int64_t>& sizes);
// Offset of an element of `t` given an index into a (possibly larger) shape
// that `t` broadcasts to, right-aligned: size-1 dims read index 0.
std::int64_t broadcast_offset(const TensorType& t, const std::vector<std::int64_t>& index);

// For each combination of the dims not in `grouped` (row-major), the offsets
// of the elements over the grouped dims (row-major): the lanes of a reduction
// or a softmax.
std::vector<std::vector<std::int64_t>> lanes(const TensorType& t, const std::vector<bool>& grouped);

// Per-family evaluators: inputs are the buffers of node.inputs.
Buffer eval_source(const Node& node, const std::vector<const Buffer*>& in);
// to_16_bits[k]: operand k goes through the 16-bit common dtype first
// (ir::rounds_operand_to_16_bits).
Buffer eval_elementwise(const Node& node, const std::vector<const Buffer*>& in, const std::vector<bool>& to_16_bits);
Buffer eval_reduction(const Node& node, const std::vector<const Buffer*>& in);
Buffer eval_normalization(const Node& node, const std::vector<const Buffer*>& in);
Buffer eval_indexing(const Node& node, const std::vector<const Buffer*>& in);
// nll_loss, its total weight and its backward (interp_loss.cpp).
Buffer eval_loss(const Node& node, const std::vector<const Buffer*>& in);
// max_pool2d, its indices and its backward (interp_pooling.cpp).
Buffer eval_pooling(const Node& node, const std::vector<const Buffer*>& in);
Buffer eval_extern(const Node& node, const std::vector<const Buffer*>& in);
Buffer eval_conv(const Node& node, const std::vector<const Buffer*>& in);

}  // namespace vtpu::ir::detail
