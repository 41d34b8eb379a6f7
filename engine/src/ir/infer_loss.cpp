// Type inference of the negative log-likelihood loss and its backward. The
// checks are ATen's (LossNLL.cpp's meta functions) so that a graph the IR
// accepts is one ATen's CPU kernel accepts: target values are only known at
// run time, their range is checked by the interpreter and the kernels.
#include "infer.h"

namespace vtpu::ir::detail {
namespace {

std::string dname(DType t) { return std::string(name(t)); }

// The validated common part of nll_loss's operands: x, target and weight.
struct NllOperands {
  const TensorType* x;
  bool none_2d;  // reduction "none" of a 2-dim x: one loss per row
};

NllOperands check_nll_operands(const Graph& g, OpKind op, const TensorType& x, const TensorType& target,
                               const TensorType* weight, const Attributes& attrs) {
  const std::string reduction = attrs.get_string("reduction", "mean");
  if (reduction != "none" && reduction != "mean" && reduction != "sum")
    fail(op, "reduction must be \"none\", \"mean\" or \"sum\", got \"" + reduction + "\"");
  if (!is_floating(x.dtype)) fail(op, "expected a floating point input, got " + dname(x.dtype));
  if (x.rank() != 1 && x.rank() != 2)
    fail(op, "input tensor should be 1D or 2D, got shape " + shape_string(x.sizes));
  if (target.dtype != DType::kInt64 && target.dtype != DType::kUInt8)
    fail(op, "expected target dtype to be int64 or uint8, got " + dname(target.dtype));
  // 1-dim x (one sample of C classes): a 0-dim target; 2-dim x: one per row.
  const bool ok = x.rank() == 1 ? target.rank() == 0 : target.rank() == 1 && target.sizes[0] == x.sizes[0];
  if (!ok) {
    fail(op, "target shape " + shape_string(target.sizes) + " does not fit input shape " + shape_string(x.sizes) +
                 " (expected [] for a 1-dim input, [N] for [N, C])");
  }
  if (weight != nullptr) {
    if (weight->rank() != 1 || weight->sizes[0] != x.sizes.back())
      fail(op, "weight shape " + shape_string(weight->sizes) + " must be [C] for input shape " +
                   shape_string(x.sizes));
    if (weight->dtype != x.dtype)
      fail(op, "weight dtype " + dname(weight->dtype) + " differs from the input's " + dname(x.dtype));
  }
  (void)g;
  return {&x, reduction == "none" && x.rank() == 2};
}

}  // namespace

Inferred infer_loss(const Graph& g, OpKind op, const std::vector<ValueId>& in, const Attributes& attrs) {
  switch (op) {
    case OpKind::NllLoss:
    case OpKind::NllLossTotalWeight: {
      check_optional_count(op, in, 2, attrs, {"has_weight"});
      const TensorType& x = g.type(in[0]);
      const NllOperands n =
          check_nll_operands(g, op, x, g.type(in[1]), in.size() > 2 ? &g.type(in[2]) : nullptr, attrs);
      std::vector<std::int64_t> sizes;
      if (op == OpKind::NllLoss && n.none_2d) sizes = {x.sizes[0]};
      return {TensorType::contiguous(x.dtype, std::move(sizes)), x.dtype};
    }
    case OpKind::NllLossBackward: {
      check_optional_count(op, in, 4, attrs, {"has_weight"});
      const TensorType& grad = g.type(in[0]);
      const TensorType& x = g.type(in[1]);
      const TensorType& total = g.type(in[3]);
      const NllOperands n =
          check_nll_operands(g, op, x, g.type(in[2]), in.size() > 4 ? &g.type(in[4]) : nullptr, attrs);
      const std::vector<std::int64_t> grad_sizes =
          n.none_2d ? std::vector<std::int64_t>{x.sizes[0]} : std::vector<std::int64_t>{};
      if (grad.sizes != grad_sizes)
        fail(op, "grad shape " + shape_string(grad.sizes) + " must be " + shape_string(grad_sizes) +
                     " (the loss's shape)");
      if (grad.dtype != x.dtype || total.dtype != x.dtype)
        fail(op, "grad and total_weight must have the input's dtype " + dname(x.dtype) + ", got " +
                     dname(grad.dtype) + " and " + dname(total.dtype));
      if (total.rank() != 0) fail(op, "total_weight must be 0-dim, got shape " + shape_string(total.sizes));
      return {TensorType::contiguous(x.dtype, x.sizes), x.dtype};
    }
    default:
      fail(op, "not a loss op");
  }
}

}  // namespace vtpu::ir::detail
