// Reference semantics of nll_loss, its total weight and its backward: ATen's
// CPU kernel (LossNLL.cpp) with one deliberate difference, the summation.
//
// Per counted row b (target t != ignore_index, 0 <= t < C), the term is
// x[b, t] * weight[t] in the dtype's compute precision (x[b, t] without a
// weight). "none" of a 2-dim x stores -term per row (0 for ignored rows).
// Otherwise the terms and the weights (1 without a weight) are summed in
// double in row order and rounded once: loss = -sum ("sum", or "none" of a
// 1-dim x) or (-sum) / total ("mean": NaN when every target is ignored, as
// ATen's 0/0), total_weight = total (0 for "none" of a 2-dim x). ATen sums in
// the dtype with a cascade; a double sum in a fixed order is as accurate and
// deterministic, and kernels reproduce it bit for bit.
//
// The backward writes zeros except dx[b, t] of counted rows:
//   "none" of a 2-dim x: -(weight[t] * grad[b])
//   otherwise: g = -(grad / total_weight) ("mean") or -grad, each operation
//   rounded to the dtype as ATen's scalar arithmetic does; dx = weight[t] * g
//   (rounded), or g without a weight.
// A target outside [0, C) that is not ignore_index is an error in both.
#include <string>

#include "interp.h"

namespace vtpu::ir::detail {
namespace {

// `v` rounded to dtype `t` (through float for the 16-bit floats).
double round_to(DType t, double v) {
  Buffer b = Buffer::zeros(TensorType::contiguous(t, {}));
  store_double(b, 0, v);
  return load_double(b, 0);
}

struct NllView {
  const Buffer& x;
  const Buffer& target;
  const Buffer* weight;
  std::int64_t rows, classes, ignore_index;
  bool two_dim;

  NllView(const Node& node, const Buffer& x_, const Buffer& target_, const Buffer* weight_)
      : x(x_), target(target_), weight(weight_),
        rows(x_.type.rank() == 2 ? x_.type.sizes[0] : 1), classes(x_.type.sizes.back()),
        ignore_index(node.attrs.get_int("ignore_index", -100)), two_dim(x_.type.rank() == 2) {}

  // The target of row b; nullopt-like -1 flag through `counted`.
  std::int64_t target_of(std::int64_t b) const {
    return load_int(target, two_dim ? b * target.type.strides[0] : 0);
  }
  bool counted(OpKind op, std::int64_t t) const {
    if (t == ignore_index) return false;
    if (t < 0 || t >= classes) {
      interp_fail(op, "target " + std::to_string(t) + " is out of bounds for " + std::to_string(classes) +
                          " classes");
    }
    return true;
  }
  double x_at(std::int64_t b, std::int64_t t) const {
    const std::int64_t off = two_dim ? b * x.type.strides[0] + t * x.type.strides[1] : t * x.type.strides[0];
    return load_double(x, off);
  }
  double weight_at(std::int64_t t) const { return weight ? load_double(*weight, t * weight->type.strides[0]) : 1.0; }
};

Buffer forward(const Node& node, const std::vector<const Buffer*>& in) {
  Buffer out = Buffer::zeros(node.type);
  const NllView v(node, *in[0], *in[1], in.size() > 2 ? in[2] : nullptr);
  const DType dt = v.x.type.dtype;
  const std::string reduction = node.attrs.get_string("reduction", "mean");
  const bool none_2d = reduction == "none" && v.two_dim;
  double sum = 0, total = 0;
  for (std::int64_t b = 0; b < v.rows; ++b) {
    const std::int64_t t = v.target_of(b);
    if (!v.counted(node.op, t)) continue;  // ignored rows of "none" stay 0
    const double term = v.weight ? round_to_compute(dt, v.x_at(b, t) * v.weight_at(t)) : v.x_at(b, t);
    if (none_2d && node.op == OpKind::NllLoss) store_double(out, b * out.type.strides[0], -term);
    sum += term;
    total += v.weight_at(t);
  }
  if (node.op == OpKind::NllLossTotalWeight) {
    store_double(out, 0, none_2d ? 0.0 : total);
  } else if (!none_2d) {
    // Negated, then divided, as ATen: all-ignored "mean" is 0/0, the hardware's NaN.
    store_double(out, 0, reduction == "mean" ? (-sum) / total : -sum);
  }
  return out;
}

Buffer backward(const Node& node, const std::vector<const Buffer*>& in) {
  Buffer out = Buffer::zeros(node.type);
  const Buffer& grad = *in[0];
  const NllView v(node, *in[1], *in[2], in.size() > 4 ? in[4] : nullptr);
  const DType dt = v.x.type.dtype;
  const std::string reduction = node.attrs.get_string("reduction", "mean");
  const bool none_2d = reduction == "none" && v.two_dim;
  double g = 0;
  if (!none_2d) {
    g = load_double(grad, 0);
    if (reduction == "mean") g = round_to(dt, g / load_double(*in[3], 0));
    g = -g;
  }
  for (std::int64_t b = 0; b < v.rows; ++b) {
    const std::int64_t t = v.target_of(b);
    if (!v.counted(node.op, t)) continue;
    double value = 0;
    if (none_2d) value = -(v.weight_at(t) * load_double(grad, b * grad.type.strides[0]));
    else value = v.weight ? v.weight_at(t) * g : g;
    // out is contiguous in x's shape.
    store_double(out, v.two_dim ? b * v.classes + t : t, value);
  }
  return out;
}

}  // namespace

Buffer eval_loss(const Node& node, const std::vector<const Buffer*>& in) {
  switch (node.op) {
    case OpKind::NllLoss:
    case OpKind::NllLossTotalWeight:
      return forward(node, in);
    case OpKind::NllLossBackward:
      return backward(node, in);
    default:
      interp_fail(node.op, "not a loss op");
  }
}

}  // namespace vtpu::ir::detail
