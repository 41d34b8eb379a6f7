// Type inference of 2-d max pooling, its indices and its backward. The
// checks are ATen's (max_pool2d_with_indices's shape checks), so that a graph
// the IR accepts is one ATen's CPU kernel accepts.
#include "infer.h"
#include "pooling.h"

namespace vtpu::ir::detail {
namespace {

std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  const std::int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

// The pooled sizes of x: x's leading dims, then the output height and width.
std::vector<std::int64_t> pooled_sizes(OpKind op, const TensorType& x, const Pool2d& p) {
  if (!is_floating(x.dtype)) fail(op, "expected a floating point input, got " + std::string(name(x.dtype)));
  if (x.rank() != 3 && x.rank() != 4)
    fail(op, "expected a 3-dim (C, H, W) or 4-dim (N, C, H, W) input, got shape " + shape_string(x.sizes));
  const std::size_t r = x.rank();
  if (x.sizes[r - 3] == 0 || x.sizes[r - 2] == 0 || x.sizes[r - 1] == 0)
    fail(op, "expected non-empty channel and spatial dims, got shape " + shape_string(x.sizes));
  const std::int64_t oh = pool_output_size(x.sizes[r - 2], p.kh, p.sh, p.ph, p.dh, p.ceil_mode);
  const std::int64_t ow = pool_output_size(x.sizes[r - 1], p.kw, p.sw, p.pw, p.dw, p.ceil_mode);
  if (oh < 1 || ow < 1)
    fail(op, "input shape " + shape_string(x.sizes) + " gives the output size " + std::to_string(oh) + "x" +
                 std::to_string(ow) + ", which is too small");
  std::vector<std::int64_t> sizes(x.sizes.begin(), x.sizes.end() - 2);
  sizes.push_back(oh);
  sizes.push_back(ow);
  return sizes;
}

}  // namespace

Pool2d pool2d_attributes(OpKind op, const Attributes& attrs) {
  auto pair = [&](const char* key) {
    const std::vector<std::int64_t> v = attrs.get_ints(key);
    if (v.size() != 2) fail(op, std::string(key) + " must have 2 entries, got " + std::to_string(v.size()));
    return v;
  };
  const auto k = pair("kernel_size"), s = pair("stride"), p = pair("padding"), d = pair("dilation");
  const Pool2d g{k[0], k[1], s[0], s[1], p[0], p[1], d[0], d[1], attrs.get_bool("ceil_mode", false)};
  if (g.kh <= 0 || g.kw <= 0) fail(op, "kernel size should be greater than zero");
  if (g.sh <= 0 || g.sw <= 0) fail(op, "stride should be greater than zero");
  if (g.dh <= 0 || g.dw <= 0) fail(op, "dilation should be greater than zero");
  if (g.ph < 0 || g.pw < 0) fail(op, "padding should be non-negative");
  if (g.ph > g.kh / 2 || g.pw > g.kw / 2) fail(op, "pad should be smaller than or equal to half of kernel size");
  return g;
}

std::int64_t pool_output_size(std::int64_t input, std::int64_t kernel, std::int64_t stride, std::int64_t pad,
                              std::int64_t dilation, bool ceil_mode) {
  std::int64_t out =
      floor_div(input + 2 * pad - dilation * (kernel - 1) - 1 + (ceil_mode ? stride - 1 : 0), stride) + 1;
  if (ceil_mode && (out - 1) * stride >= input + pad) --out;
  return out;
}

Inferred infer_pooling(const Graph& g, OpKind op, const std::vector<ValueId>& in, const Attributes& attrs) {
  const Pool2d p = pool2d_attributes(op, attrs);
  switch (op) {
    case OpKind::MaxPool2d:
    case OpKind::MaxPool2dIndices: {
      const TensorType& x = g.type(in[0]);
      auto sizes = pooled_sizes(op, x, p);
      const DType dt = op == OpKind::MaxPool2d ? x.dtype : DType::kInt64;
      return {TensorType::contiguous(dt, std::move(sizes)), x.dtype};
    }
    case OpKind::MaxPool2dBackward: {
      const TensorType& grad = g.type(in[0]);
      const TensorType& x = g.type(in[1]);
      const TensorType& indices = g.type(in[2]);
      const auto sizes = pooled_sizes(op, x, p);
      if (grad.dtype != x.dtype)
        fail(op, "grad dtype " + std::string(name(grad.dtype)) + " differs from the input's " +
                     std::string(name(x.dtype)));
      if (grad.sizes != sizes)
        fail(op, "grad shape " + shape_string(grad.sizes) + " must be the pooled shape " + shape_string(sizes));
      if (indices.dtype != DType::kInt64 || indices.sizes != sizes)
        fail(op, "indices must be int64 of the pooled shape " + shape_string(sizes) + ", got " +
                     std::string(name(indices.dtype)) + " " + shape_string(indices.sizes));
      return {TensorType::contiguous(x.dtype, x.sizes), x.dtype};
    }
    default:
      fail(op, "not a pooling op");
  }
}

}  // namespace vtpu::ir::detail
