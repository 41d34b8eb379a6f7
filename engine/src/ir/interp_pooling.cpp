// Reference semantics of 2-d max pooling and its backward: ATen's CPU kernels
// (MaxPoolKernel.cpp's cpu_max_pool and cpu_max_pool_backward) exactly.
//
// Forward, per plane (n, c) and output (oh, ow): the window starts at
// (oh * sH - pH, ow * sW - pW), steps by the dilation and is clipped to the
// input (a start in the padding moves forward by whole dilation steps). The
// maximum starts at -inf with the index of the window's first element, and an
// element replaces it when it is greater or NaN (so the last NaN wins). The
// value is stored in the dtype (it is one of the inputs), the index as
// h * W + w within the plane.
//
// Backward: dx starts at zero; per plane, in output order, dx[index] +=
// grad, each addition rounded to the dtype (ATen's scalar_t arithmetic). An
// index of -1 is skipped; any other index outside the plane is an error.
#include <limits>
#include <string>

#include "interp.h"
#include "pooling.h"

namespace vtpu::ir::detail {
namespace {

// A tensor of rank 3 or 4 addressed as (plane, h, w); a 3-dim one has one
// plane per channel.
struct Planes {
  const TensorType& t;
  std::int64_t channels, height, width;
  explicit Planes(const TensorType& type)
      : t(type), channels(type.sizes[type.rank() - 3]), height(type.sizes[type.rank() - 2]),
        width(type.sizes[type.rank() - 1]) {}
  std::int64_t count() const { return t.rank() == 4 ? t.sizes[0] * channels : channels; }
  std::int64_t offset(std::int64_t plane, std::int64_t h, std::int64_t w) const {
    const std::size_t r = t.rank();
    std::int64_t off = (plane % channels) * t.strides[r - 3] + h * t.strides[r - 2] + w * t.strides[r - 1];
    if (r == 4) off += (plane / channels) * t.strides[0];
    return off;
  }
};

// The first element of a window along one dim, and its end (exclusive).
void window(std::int64_t o, std::int64_t stride, std::int64_t pad, std::int64_t kernel, std::int64_t dilation,
            std::int64_t size, std::int64_t* begin, std::int64_t* end) {
  std::int64_t b = o * stride - pad;
  *end = std::min(b + (kernel - 1) * dilation + 1, size);
  while (b < 0) b += dilation;
  *begin = b;
}

Buffer forward(const Node& node, const Buffer& x) {
  const Pool2d p = pool2d_attributes(node.op, node.attrs);
  Buffer out = Buffer::zeros(node.type);
  const Planes in(x.type), o(node.type);
  const bool want_index = node.op == OpKind::MaxPool2dIndices;
  for (std::int64_t plane = 0; plane < in.count(); ++plane) {
    for (std::int64_t oh = 0; oh < o.height; ++oh) {
      std::int64_t h0, h1;
      window(oh, p.sh, p.ph, p.kh, p.dh, in.height, &h0, &h1);
      for (std::int64_t ow = 0; ow < o.width; ++ow) {
        std::int64_t w0, w1;
        window(ow, p.sw, p.pw, p.kw, p.dw, in.width, &w0, &w1);
        double best = -std::numeric_limits<double>::infinity();
        std::int64_t best_index = h0 * in.width + w0;
        for (std::int64_t h = h0; h < h1; h += p.dh)
          for (std::int64_t w = w0; w < w1; w += p.dw) {
            const double v = load_double(x, in.offset(plane, h, w));
            if (v > best || v != v) {
              best = v;
              best_index = h * in.width + w;
            }
          }
        const std::int64_t at = o.offset(plane, oh, ow);
        if (want_index) store_int(out, at, best_index);
        else store_double(out, at, best);
      }
    }
  }
  return out;
}

Buffer backward(const Node& node, const Buffer& grad, const Buffer& indices) {
  Buffer dx = Buffer::zeros(node.type);
  const Planes d(node.type), g(grad.type);
  const std::int64_t plane_size = d.height * d.width;
  for (std::int64_t plane = 0; plane < d.count(); ++plane)
    for (std::int64_t oh = 0; oh < g.height; ++oh)
      for (std::int64_t ow = 0; ow < g.width; ++ow) {
        const std::int64_t index = load_int(indices, Planes(indices.type).offset(plane, oh, ow));
        if (index == -1) continue;
        if (index < 0 || index >= plane_size)
          interp_fail(node.op, "index " + std::to_string(index) + " is out of range for a plane of " +
                                   std::to_string(plane_size) + " elements");
        const std::int64_t at = d.offset(plane, index / d.width, index % d.width);
        store_double(dx, at, load_double(dx, at) + load_double(grad, g.offset(plane, oh, ow)));
      }
  return dx;
}

}  // namespace

Buffer eval_pooling(const Node& node, const std::vector<const Buffer*>& in) {
  switch (node.op) {
    case OpKind::MaxPool2d:
    case OpKind::MaxPool2dIndices:
      return forward(node, *in[0]);
    case OpKind::MaxPool2dBackward:
      return backward(node, *in[0], *in[2]);
    default:
      interp_fail(node.op, "not a pooling op");
  }
}

}  // namespace vtpu::ir::detail
