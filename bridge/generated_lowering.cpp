#include "generated_lowering.h"
#include "iterator_layout.h"

#include <ATen/ATen.h>
#include <ATen/ops/_embedding_bag_backward_native.h>
#include <ATen/Dispatch.h>
#include <ATen/native/TypeProperties.h>

#include <functional>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "aten_bridge.h"
#include "batch_norm_lowering.h"
#include "generated_kernels.h"
#include "memory_overlap.h"

namespace vtpu::bridge {
namespace {

using ir::OpKind;
using Args = c10::ArrayRef<c10::IValue>;

struct Lowering {
  OpKind op;
  std::vector<int> operands;  // argument positions of the operands (Tensor or Scalar)
  std::function<ir::Attributes(Args)> attributes;
  bool reduction = false;  // operands = {self}; dims at 1, keepdim at 2
  // Functional (no out argument): the result is allocated here with the
  // first operand's shape and dtype (kFresh) or with the broadcast shape and
  // the promoted dtype of the operands from `promote_from` on
  // (kFreshBroadcast); in place: the first operand is the result.
  enum class Result { kOutArgument, kFresh, kFreshBroadcast, kInPlace } result = Result::kOutArgument;
  int promote_from = 0;
  // Extra operand conditions (dtype restrictions); empty accepts all.
  std::function<bool(const std::vector<at::Tensor>&)> accepts;
};

ir::Attributes none(Args) { return {}; }
ir::Attributes alpha_at_2(Args a) { return {{"alpha", a[2].toScalar().toDouble()}}; }
ir::Attributes threshold_at_2(Args a) { return {{"threshold", a[2].toScalar().toDouble()}}; }
ir::Attributes gelu_approximate(Args a) { return {{"approximate", a[1].toStringRef()}}; }
ir::Attributes value_at_3(Args a) { return {{"value", a[3].toScalar().toDouble()}}; }

// pow(x, e) of a floating x by a number e that ATen's kernel special-cases
// (PowKernel: x for 1, x * x for 2, sqrt for 0.5, 1 / sqrt for -0.5, 1 / x
// for -1) as that op, whose generated code is the same expression, so the
// bits do not change. The generic pow branches on its exponent per element,
// which left loops scalar: RMSNorm's x.pow(2).mean(-1) fused ran ~8x slower
// than x * x, and its backward's x.pow(1).
std::optional<OpKind> pow_as_simpler_op(const std::vector<at::Tensor>& operands) {
  if (operands.size() != 2 || !at::isFloatingType(operands[0].scalar_type())) return std::nullopt;
  const at::Tensor& exponent = operands[1];
  if (!exponent.unsafeGetTensorImpl()->is_wrapped_number() || exponent.is_complex()) return std::nullopt;
  const double e = exponent.item<double>();
  if (e == 1.0) return OpKind::Cast;
  if (e == 2.0) return OpKind::Mul;
  // float16's pow by +-0.5 is pow itself in ATen (pow(-inf, 0.5) is inf).
  const bool half = operands[0].scalar_type() == at::kHalf;
  if (e == 0.5 && !half) return OpKind::Sqrt;
  if (e == -0.5 && !half) return OpKind::Rsqrt;
  if (e == -1.0) return OpKind::Reciprocal;
  return std::nullopt;
}

const std::unordered_map<std::string, Lowering>& table() {
  static const auto* lowerings = [] {
    auto* t = new std::unordered_map<std::string, Lowering>();
    const std::pair<const char*, OpKind> unary[] = {
        {"exp", OpKind::Exp},         {"log", OpKind::Log},       {"neg", OpKind::Neg},
        {"abs", OpKind::Abs},         {"sqrt", OpKind::Sqrt},     {"rsqrt", OpKind::Rsqrt},
        {"reciprocal", OpKind::Reciprocal}, {"sin", OpKind::Sin}, {"cos", OpKind::Cos},
        {"tanh", OpKind::Tanh},       {"sigmoid", OpKind::Sigmoid}, {"silu", OpKind::Silu},
        {"erf", OpKind::Erf},         {"floor", OpKind::Floor},   {"ceil", OpKind::Ceil},
        {"trunc", OpKind::Trunc},     {"exp2", OpKind::Exp2},     {"log2", OpKind::Log2},
        {"log1p", OpKind::Log1p},     {"expm1", OpKind::Expm1},   {"sign", OpKind::Sign},
        {"bitwise_not", OpKind::BitwiseNot}, {"logical_not", OpKind::LogicalNot}};
    // ATen has no bool kernel for these (the CPU raises); left to it.
    const auto not_bool = [](const std::vector<at::Tensor>& operands) {
      for (const at::Tensor& t : operands)
        if (t.scalar_type() == at::kBool) return false;
      return true;
    };
    for (const auto& [name, kind] : unary) {
      const bool rejects_bool = kind == OpKind::Floor || kind == OpKind::Ceil || kind == OpKind::Trunc;
      t->emplace(std::string("aten::") + name + ".out",
                 Lowering{kind, {0}, none, false, Lowering::Result::kOutArgument, 0,
                          rejects_bool ? std::function<bool(const std::vector<at::Tensor>&)>(not_bool) : nullptr});
    }
    const std::pair<const char*, OpKind> binary[] = {
        {"mul.out", OpKind::Mul},          {"div.out", OpKind::Div},
        {"maximum.out", OpKind::Maximum},  {"minimum.out", OpKind::Minimum},
        {"pow.Tensor_Tensor_out", OpKind::Pow}, {"atan2.out", OpKind::Atan2},
        {"eq.Tensor_out", OpKind::Eq},     {"ne.Tensor_out", OpKind::Ne},
        {"lt.Tensor_out", OpKind::Lt},     {"le.Tensor_out", OpKind::Le},
        {"gt.Tensor_out", OpKind::Gt},     {"ge.Tensor_out", OpKind::Ge},
        // `x > 0`: the Scalar overloads, the scalar as a wrapped number (the
        // promotion ATen's Scalar overloads give it).
        {"eq.Scalar_out", OpKind::Eq},     {"ne.Scalar_out", OpKind::Ne},
        {"lt.Scalar_out", OpKind::Lt},     {"le.Scalar_out", OpKind::Le},
        {"gt.Scalar_out", OpKind::Gt},     {"ge.Scalar_out", OpKind::Ge},
        {"logical_and.out", OpKind::LogicalAnd}, {"logical_or.out", OpKind::LogicalOr},
        {"sigmoid_backward.grad_input", OpKind::SigmoidBackward},
        {"tanh_backward.grad_input", OpKind::TanhBackward},
        {"silu_backward.grad_input", OpKind::SiluBackward}};
    // silu_backward's CPU kernel promotes mixed dtypes itself and has no integer kernel:
    // only one floating dtype is generated (a float16 grad with an int32 input came back
    // float32, integers computed where the CPU raises).
    const auto one_floating_dtype = [](const std::vector<at::Tensor>& operands) {
      for (const at::Tensor& t : operands)
        if (!at::isFloatingType(t.scalar_type()) || t.scalar_type() != operands[0].scalar_type()) return false;
      return true;
    };
    for (const auto& [name, kind] : binary)
      t->emplace(std::string("aten::") + name,
                 Lowering{kind, {0, 1}, none, false, Lowering::Result::kOutArgument, 0,
                          kind == OpKind::SiluBackward
                              ? std::function<bool(const std::vector<at::Tensor>&)>(one_floating_dtype)
                              : nullptr});
    // The functional form too (vtpu registers it: ATen's composite computed odd dtypes
    // its own way); other dtypes go to ATen's kernel on the host-kernel path.
    t->emplace("aten::silu_backward", Lowering{OpKind::SiluBackward, {0, 1}, none, false,
                                                Lowering::Result::kFreshBroadcast, 0, one_floating_dtype});
    t->emplace("aten::add.out", Lowering{OpKind::Add, {0, 1}, alpha_at_2});
    t->emplace("aten::sub.out", Lowering{OpKind::Sub, {0, 1}, alpha_at_2});
    t->emplace("aten::threshold_backward.grad_input", Lowering{OpKind::ThresholdBackward, {0, 1}, threshold_at_2});
    t->emplace("aten::gelu.out", Lowering{OpKind::Gelu, {0}, gelu_approximate});
    t->emplace("aten::gelu_backward.grad_input",
               Lowering{OpKind::GeluBackward, {0, 1}, [](Args a) { return ir::Attributes{{"approximate", a[2].toStringRef()}}; }});
    t->emplace("aten::where.self_out", Lowering{OpKind::Where, {0, 1, 2}, none});
    t->emplace("aten::where.self",
               Lowering{OpKind::Where, {0, 1, 2}, none, false, Lowering::Result::kFreshBroadcast, 1});
    // isneginf(x) = (x == -inf), false for integers by promotion.
    t->emplace("aten::isneginf.out", Lowering{OpKind::Eq, {0, -1}, none});
    t->emplace("aten::relu", Lowering{OpKind::Relu, {0}, none, false, Lowering::Result::kFresh, 0, not_bool});
    t->emplace("aten::relu_", Lowering{OpKind::Relu, {0}, none, false, Lowering::Result::kInPlace, 0, not_bool});
    // The optimizers' arithmetic (foreach AdamW/SGD decompose into these).
    t->emplace("aten::addcmul.out",
               Lowering{OpKind::Addcmul, {0, 1, 2}, value_at_3, false, Lowering::Result::kOutArgument, 0, not_bool});
    t->emplace("aten::addcdiv.out", Lowering{OpKind::Addcdiv, {0, 1, 2}, value_at_3});
    t->emplace("aten::lerp.Scalar_out", Lowering{OpKind::Lerp, {0, 1, 2}, none});
    t->emplace("aten::lerp.Tensor_out", Lowering{OpKind::Lerp, {0, 1, 2}, none});
    t->emplace("aten::pow.Tensor_Scalar_out", Lowering{OpKind::Pow, {0, 1}, none});
    // Row operations. ATen's half_to_float and input_dtype variants convert
    // dtypes on the way; only the plain case is lowered (checked below).
    const auto dim_at_2 = [](Args a) { return ir::Attributes{{"dim", a[2].toInt()}}; };
    const auto dim_at_1 = [](Args a) { return ir::Attributes{{"dim", a[1].toInt()}}; };
    t->emplace("aten::_softmax.out", Lowering{OpKind::Softmax, {0}, dim_at_1});
    t->emplace("aten::_log_softmax.out", Lowering{OpKind::LogSoftmax, {0}, dim_at_1});
    t->emplace("aten::_softmax_backward_data.out", Lowering{OpKind::SoftmaxBackward, {0, 1}, dim_at_2});
    t->emplace("aten::_log_softmax_backward_data.out", Lowering{OpKind::LogSoftmaxBackward, {0, 1}, dim_at_2});
    const std::pair<const char*, OpKind> reductions[] = {{"aten::sum.IntList_out", OpKind::Sum},
                                                         {"aten::mean.out", OpKind::Mean},
                                                         {"aten::amax.out", OpKind::Amax},
                                                         {"aten::amin.out", OpKind::Amin},
                                                         {"aten::prod.int_out", OpKind::Prod}};
    for (const auto& [name, kind] : reductions) t->emplace(name, Lowering{kind, {0}, none, true});
    // all(dim) of a bool tensor is its minimum (other dtypes differ on NaN).
    const auto bool_operand = [](const std::vector<at::Tensor>& operands) {
      return operands[0].scalar_type() == at::kBool;
    };
    t->emplace("aten::all.out",
               Lowering{OpKind::Amin, {0}, none, true, Lowering::Result::kOutArgument, 0, bool_operand});
    t->emplace("aten::all.dims_out",
               Lowering{OpKind::Amin, {0}, none, true, Lowering::Result::kOutArgument, 0, bool_operand});
    return t;
  }();
  return *lowerings;
}

// Ops whose arguments need more than the table's shape: each returns the
// results it queued (the op's returns, in order), or an empty list to leave
// the op to ATen. Single-result lowerings are written as functions returning
// that result or an undefined tensor (see `single`).
using CustomLowering = std::function<std::vector<at::Tensor>(Args)>;

CustomLowering single(std::function<at::Tensor(Args)> lowering) {
  return [lowering = std::move(lowering)](Args a) -> std::vector<at::Tensor> {
    at::Tensor result = lowering(a);
    if (!result.defined()) return {};
    return {std::move(result)};
  };
}

// ATen's Reduction enum (0 none, 1 mean, 2 sum) as the IR's attribute.
std::optional<std::string> reduction_name(std::int64_t reduction) {
  switch (reduction) {
    case 0: return "none";
    case 1: return "mean";
    case 2: return "sum";
    default: return std::nullopt;
  }
}

// nll_loss's operands and attributes: (x, target, weight?) from the
// arguments at `x`, `x + 1`, `x + 2`; reduction and ignore_index after them.
// nullopt leaves the op to ATen: an undefined reduction code, or an input of
// another rank than 1 or 2 (nll_loss2d's shapes), which the IR does not take.
struct NllArguments {
  std::vector<at::Tensor> operands;
  ir::Attributes attrs;
};
std::optional<NllArguments> nll_arguments(Args a, std::size_t x, std::size_t reduction_at) {
  const at::Tensor& input = a[x].toTensor();
  const auto reduction = reduction_name(a[reduction_at].toInt());
  if (!reduction || (input.dim() != 1 && input.dim() != 2)) return std::nullopt;
  NllArguments n;
  n.operands = {input, a[x + 1].toTensor()};
  const bool has_weight = a[x + 2].isTensor() && a[x + 2].toTensor().defined();
  n.attrs = {{"reduction", *reduction}, {"ignore_index", a[reduction_at + 1].toInt()}, {"has_weight", has_weight}};
  if (has_weight) n.operands.push_back(a[x + 2].toTensor());
  return n;
}

// max_pool2d's geometry from the arguments kernel_size, stride, padding,
// dilation, ceil_mode starting at `first`, in the IR's two-entry form (ATen
// takes one entry for both dims, and an empty stride for the kernel size).
// nullopt for list lengths ATen rejects (it then raises its own error).
std::optional<ir::Attributes> pool2d_attributes(Args a, std::size_t first) {
  auto pair = [](std::vector<std::int64_t> v, const std::vector<std::int64_t>& when_empty) {
    if (v.empty()) v = when_empty;
    if (v.size() == 1) v.push_back(v[0]);
    return v;
  };
  const auto kernel = pair(a[first].toIntVector(), {});
  const auto stride = pair(a[first + 1].toIntVector(), kernel);
  const auto padding = pair(a[first + 2].toIntVector(), {});
  const auto dilation = pair(a[first + 3].toIntVector(), {});
  for (const auto* v : {&kernel, &stride, &padding, &dilation})
    if (v->size() != 2) return std::nullopt;
  return ir::Attributes{{"kernel_size", kernel}, {"stride", stride}, {"padding", padding},
                        {"dilation", dilation}, {"ceil_mode", a[first + 4].toBool()}};
}

std::vector<std::int64_t> optional_dims(const c10::IValue& v) {
  if (v.isNone()) return {};
  if (v.isInt()) return {v.toInt()};
  return v.toIntVector();
}

// arange's length as ATen computes it; nullopt for the arguments ATen rejects
// (then ATen raises its own error).
std::optional<std::int64_t> arange_length(const c10::Scalar& start, const c10::Scalar& end, const c10::Scalar& step,
                                          c10::ScalarType dtype) {
  const double s = start.toDouble(), e = end.toDouble(), d = step.toDouble();
  if (d == 0 || !std::isfinite(s) || !std::isfinite(e) || (d > 0 && e < s) || (d < 0 && e > s)) return std::nullopt;
  double length = 0;
  if (dtype == at::kLong) {
    const std::int64_t xs = start.toLong(), xe = end.toLong(), xd = step.toLong();
    if (xd == 0) return std::nullopt;
    const std::int64_t sign = (xd > 0) - (xd < 0);
    length = static_cast<double>((xe - xs + xd - sign) / xd);  // integer division, as ATen
  } else {
    length = std::ceil((e - s) / d);
  }
  if (!(length >= 0) || length > 1e15) return std::nullopt;
  return static_cast<std::int64_t>(length);
}

const std::unordered_map<std::string, CustomLowering>& custom_lowerings() {
  static const auto* lowerings = [] {
    auto* t = new std::unordered_map<std::string, CustomLowering>();
    auto index_select = [](Args a, at::Tensor out) {
      return launch_generated_indexed(OpKind::IndexSelect, std::move(out), {a[0].toTensor(), a[2].toTensor()},
                                      {{"dim", a[1].toInt()}});
    };
    t->emplace("aten::index_select", single([=](Args a) { return index_select(a, {}); }));
    t->emplace("aten::index_select.out", single([=](Args a) { return index_select(a, a[3].toTensor()); }));
    auto gather = [](Args a, at::Tensor out) {
      return launch_generated_indexed(OpKind::Gather, std::move(out), {a[0].toTensor(), a[2].toTensor()},
                                      {{"dim", a[1].toInt()}});
    };
    t->emplace("aten::gather", single([=](Args a) { return gather(a, {}); }));
    t->emplace("aten::gather.out", single([=](Args a) { return gather(a, a[4].toTensor()); }));
    t->emplace("aten::embedding_dense_backward", single([](Args a) {
      return launch_generated_indexed(
          OpKind::EmbeddingBackward, {}, {a[0].toTensor(), a[1].toTensor()},
          {{"num_weights", a[2].toInt()}, {"padding_idx", a[3].toInt()}, {"scale_grad_by_freq", a[4].toBool()}});
    }));
    // _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices,
    // num_weights, scale_grad_by_freq, mode, sparse, per_sample_weights?, padding_idx): the dense
    // backward of mode "sum" is embedding_dense_backward of each index's bag row of grad, so two
    // generated kernels (index_select by offset2bag, then the sorted accumulation) instead of
    // ATen's CPU kernel. The forward leaves offset2bag empty on its fast path; then it is ATen's
    // make_offset2bag, the bag of index k: (offsets <= k) - 1, from offsets on the device.
    // Mean/max modes, per-sample weights, sparse gradients, scale_grad_by_freq (ATen's bag
    // variant scales differently from embedding's) and offsets with one entry more than there are
    // bags (include_last_offset, whose trailing indices the offsets alone do not place) stay on ATen.
    t->emplace("aten::native_batch_norm", lower_native_batch_norm);
    t->emplace("aten::_native_batch_norm_legit", [](Args a) { return lower_native_batch_norm_legit(a, true); });
    t->emplace("aten::_native_batch_norm_legit.no_stats",
               [](Args a) { return lower_native_batch_norm_legit(a, false); });
    t->emplace("aten::native_batch_norm_backward", lower_native_batch_norm_backward);
    t->emplace("aten::_embedding_bag_backward", single([](Args a) -> at::Tensor {
      const at::Tensor& grad = a[0].toTensor();
      const at::Tensor& indices = a[1].toTensor();
      const at::Tensor& offsets = a[2].toTensor();
      const bool weighted = a[10].isTensor() && a[10].toTensor().defined();
      // A sparse gradient (EmbeddingBag(sparse=True)): ATen's backward is
      // device-generic code (offset2bag, index_select of the bags' rows,
      // the mean's scaling, per-sample weights, then the sparse tensor over
      // the indices), so it runs here on device ops, queued like the rest of
      // the step; only a padding index (a boolean mask) synchronises. On the
      // host-kernel path it would synchronise every table's backward.
      if (a[9].toBool() && grad.device().type() == kVtpu) {
        const std::optional<at::Tensor> weights = weighted ? std::optional(a[10].toTensor()) : std::nullopt;
        return at::native::_embedding_bag_backward_symint(grad, indices, offsets, a[3].toTensor(), a[4].toTensor(),
                                                          a[5].toTensor(), a[6].toSymInt(), a[7].toBool(),
                                                          a[8].toInt(), true, weights, a[11].toInt());
      }
      if (a[9].toBool() || a[8].toInt() != 0 || weighted || a[7].toBool() || grad.dim() != 2 || indices.dim() != 1 ||
          offsets.dim() != 1 || offsets.numel() != grad.size(0) || indices.numel() == 0 ||
          offsets.scalar_type() != indices.scalar_type())
        return {};
      at::Tensor bags = a[3].toTensor();
      if (bags.numel() != indices.numel()) {
        const at::Tensor positions = at::arange(indices.numel(), offsets.options());
        bags = at::searchsorted(offsets, positions, offsets.scalar_type() == at::kInt, /*right=*/true).sub_(1);
      }
      const at::Tensor rows = launch_generated_indexed(OpKind::IndexSelect, {}, {grad, bags}, {{"dim", std::int64_t{0}}});
      if (!rows.defined()) return {};
      return launch_generated_indexed(
          OpKind::EmbeddingBackward, {}, {rows, indices},
          {{"num_weights", a[6].toInt()}, {"padding_idx", a[11].toInt()}, {"scale_grad_by_freq", false}});
    }));
    t->emplace("aten::arange.start_out", single([](Args a) -> at::Tensor {
      at::Tensor out = a[3].toTensor();
      const auto dtype = out.scalar_type();
      // The signed integer types and uint8 as int64: start and step truncated
      // to integers, the length from the unrounded values (ATen's CPU rule:
      // arange(0, 1, 0.1, dtype=int32) is ten zeros). On the host-kernel path
      // their meta kernel refused the call and the CPU kernel could not resize
      // the queued output (found by review).
      const bool integral = dtype == at::kLong || dtype == at::kInt || dtype == at::kShort || dtype == at::kChar ||
                            dtype == at::kByte;
      if (!integral && dtype != at::kFloat && dtype != at::kDouble) return {};
      const auto length = arange_length(a[0].toScalar(), a[1].toScalar(), a[2].toScalar(), dtype);
      if (!length) return {};
      if (out.numel() != *length) {
        if (out.numel() > 0)  // ATen's CPU kernel's warning, word for word
          TORCH_WARN("The number of elements in the out tensor of shape ", out.sizes(), " is ", out.numel(),
                     " which does not match the computed number of elements ", *length,
                     ". Note that this may occur as a result of rounding error. The out tensor will be resized to a "
                     "tensor of shape (",
                     *length, ",).");
        out.resize_({*length});
      }
      if (!out.is_contiguous()) return {};
      return launch_generated_indexed(OpKind::Arange, out, {wrapped_number(a[0].toScalar()), wrapped_number(a[2].toScalar())},
                                      {{"size", *length}, {"dtype", *to_ir_dtype(dtype)}});
    }));
    // Reductions with a statistic: the stats kernels' launch scalars.
    auto arg_extremum = [](OpKind kind) {
      return [kind](Args a) -> at::Tensor {
        at::Tensor out = a[3].toTensor();
        return launch_generated_reduction(kind, out, a[0].toTensor(), optional_dims(a[1]), a[2].toBool()) ? out
                                                                                                           : at::Tensor();
      };
    };
    t->emplace("aten::argmax.out", single(arg_extremum(OpKind::Argmax)));
    // prod over all elements: (self, *, dtype?, out); the conversion case stays on ATen.
    t->emplace("aten::prod.out", single([](Args a) -> at::Tensor {
      if (!a[1].isNone()) return {};
      at::Tensor out = a[2].toTensor();
      return launch_generated_reduction(OpKind::Prod, out, a[0].toTensor(), {}, false) ? out : at::Tensor();
    }));
    // Its functional form (self, *, dtype?) has no composite that reaches the
    // out= variant; integral and bool inputs give int64, as in ATen.
    t->emplace("aten::prod", single([](Args a) -> at::Tensor {
      const at::Tensor self = a[0].toTensor();
      if (!a[1].isNone() || self.device().type() != kVtpu) return {};
      const bool integral = at::isIntegralType(self.scalar_type(), /*includeBool=*/true);
      at::Tensor out = empty_device({}, integral ? at::kLong : self.scalar_type());
      return launch_generated_reduction(OpKind::Prod, out, self, {}, false) ? out : at::Tensor();
    }));
    t->emplace("aten::argmin.out", single(arg_extremum(OpKind::Argmin)));
    auto variance = [](OpKind kind) {
      return [kind](Args a) -> at::Tensor {
        // (self, dim?, *, correction?, keepdim, out)
        const double correction = a[2].isNone() ? 1.0 : a[2].toScalar().toDouble();
        at::Tensor out = a[4].toTensor();
        return launch_generated_reduction(kind, out, a[0].toTensor(), optional_dims(a[1]), a[3].toBool(),
                                          {{"correction", correction}}, {correction})
                   ? out
                   : at::Tensor();
      };
    };
    t->emplace("aten::var.correction_out", single(variance(OpKind::Var)));
    t->emplace("aten::std.correction_out", single(variance(OpKind::Std)));
    t->emplace("aten::logsumexp.out", single([](Args a) -> at::Tensor {
      at::Tensor out = a[3].toTensor();
      return launch_generated_reduction(OpKind::LogSumExp, out, a[0].toTensor(), optional_dims(a[1]), a[2].toBool())
                 ? out
                 : at::Tensor();
    }));
    t->emplace("aten::linalg_vector_norm.out", single([](Args a) -> at::Tensor {
      // (self, ord, dim?, keepdim, *, dtype?, out)
      if (!a[4].isNone()) return {};
      const double p = a[1].toScalar().toDouble();
      at::Tensor out = a[5].toTensor();
      return launch_generated_reduction(OpKind::Norm, out, a[0].toTensor(), optional_dims(a[2]), a[3].toBool(),
                                        {{"p", p}}, {p})
                 ? out
                 : at::Tensor();
    }));
    // nll_loss_forward.output(self, target, weight?, reduction, ignore_index, *, output, total_weight)
    // returns (output, total_weight): both are written by one kernel.
    t->emplace("aten::nll_loss_forward.output", [](Args a) -> std::vector<at::Tensor> {
      const auto n = nll_arguments(a, 0, 3);
      if (!n) return {};
      std::vector<at::Tensor> outs{a[5].toTensor(), a[6].toTensor()};
      if (!launch_generated_node(OpKind::NllLoss, outs, n->operands, n->attrs)) return {};
      return outs;
    });
    // nll_loss_backward.grad_input(grad_output, self, target, weight?, reduction, ignore_index,
    // total_weight, *, grad_input): IR operands (grad, x, target, total_weight, weight?).
    t->emplace("aten::nll_loss_backward.grad_input", [](Args a) -> std::vector<at::Tensor> {
      const auto n = nll_arguments(a, 1, 4);
      if (!n) return {};
      std::vector<at::Tensor> operands{a[0].toTensor(), n->operands[0], n->operands[1], a[6].toTensor()};
      if (n->operands.size() > 2) operands.push_back(n->operands[2]);
      std::vector<at::Tensor> outs{a[7].toTensor()};
      if (!launch_generated_node(OpKind::NllLossBackward, outs, operands, n->attrs)) return {};
      return outs;
    });
    // max_pool2d_with_indices.out(self, kernel_size, stride, padding, dilation, ceil_mode, *, out, indices)
    // Channels-last inputs stay on ATen's kernel: it vectorises across the
    // channels, innermost there, while the generated kernel vectorises along W,
    // at stride C in that layout (32x64x32x32 2x2: 2.6 ms forward and 3.2
    // backward against ATen's 0.47 and 0.66). Both give the CPU's bits.
    const auto channels_last = [](const at::Tensor& t) {
      return t.dim() == 4 && !t.is_contiguous() && t.is_contiguous(at::MemoryFormat::ChannelsLast);
    };
    t->emplace("aten::max_pool2d_with_indices.out", [=](Args a) -> std::vector<at::Tensor> {
      const auto attrs = pool2d_attributes(a, 1);
      if (!attrs || channels_last(a[0].toTensor())) return {};
      std::vector<at::Tensor> outs{a[6].toTensor(), a[7].toTensor()};
      if (!launch_generated_node(OpKind::MaxPool2d, outs, {a[0].toTensor()}, *attrs)) return {};
      return outs;
    });
    // max_pool2d_with_indices_backward.grad_input(grad_output, self, kernel_size, stride, padding,
    // dilation, ceil_mode, indices, *, grad_input): IR operands (grad, x, indices).
    t->emplace("aten::max_pool2d_with_indices_backward.grad_input", [=](Args a) -> std::vector<at::Tensor> {
      const auto attrs = pool2d_attributes(a, 2);
      if (!attrs || channels_last(a[1].toTensor())) return {};
      std::vector<at::Tensor> outs{a[8].toTensor()};
      if (!launch_generated_node(OpKind::MaxPool2dBackward, outs, {a[0].toTensor(), a[1].toTensor(), a[7].toTensor()},
                                 *attrs))
        return {};
      return outs;
    });
    return t;
  }();
  return *lowerings;
}

}  // namespace

// The lowering of an operator, found by name once and then by the schema's
// address (stable for the process): building the name per call was a
// measurable share of a small op's dispatch.
struct FoundLowering {
  const CustomLowering* custom = nullptr;
  const Lowering* table = nullptr;
};

FoundLowering find_lowering(const c10::OperatorHandle& op) {
  static std::mutex mutex;
  static std::unordered_map<const c10::FunctionSchema*, FoundLowering> found;
  const c10::FunctionSchema* schema = &op.schema();
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = found.find(schema); it != found.end()) return it->second;
  const auto& name = op.operator_name();
  const std::string key = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
  FoundLowering f;
  if (auto custom = custom_lowerings().find(key); custom != custom_lowerings().end()) f.custom = &custom->second;
  else if (auto entry = table().find(key); entry != table().end()) f.table = &entry->second;
  found.emplace(schema, f);
  return f;
}

at::Tensor wrapped_number(const c10::Scalar& value) {
  at::Tensor t = at::scalar_to_tensor(value);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

namespace {

// Puts an empty out= tensor this lowering sized back as it was when the op
// then stays on ATen's kernel: ATen checks the result dtype before it sizes
// its out, so a call that raises (`maximum(bool, float64 0-dim, out=bool)`)
// leaves the out untouched on the CPU, and did not on vtpu.
struct RestoreSizedOut {
  at::Tensor out;
  std::vector<std::int64_t> sizes;
  std::vector<std::int64_t> strides;
  bool armed = false;

  void remember(const at::Tensor& t) {
    out = t;
    sizes = t.sizes().vec();
    strides = t.strides().vec();
    armed = true;
  }
  ~RestoreSizedOut() {
    if (!armed) return;
    try {
      out.resize_(sizes);
      out.as_strided_(sizes, strides);
    } catch (...) {  // an empty tensor's geometry: nothing left to restore
    }
  }
};

}  // namespace

bool try_generated_lowering(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const std::size_t num_args = schema.arguments().size();
  // Scalar arguments reach the kernel as doubles: an integer beyond 2^53, or a
  // complex one (`addcmul(c, c, c, value=0.3+0.7j)` raised "cannot be converted
  // to type double" where ATen computes it), stays with ATen's kernel.
  for (std::size_t i = stack->size() - num_args; i < stack->size(); ++i)
    if ((*stack)[i].isScalar() &&
        ((*stack)[i].toScalar().isComplex() || !exact_in_double((*stack)[i].toScalar())))
      return false;
  const FoundLowering lowering_of_op = find_lowering(op);
  if (lowering_of_op.custom != nullptr) {
    const auto* custom = lowering_of_op.custom;
    const Args args(stack->data() + (stack->size() - num_args), num_args);
    std::vector<at::Tensor> results = (*custom)(args);
    if (results.empty()) return false;
    stack->erase(stack->end() - static_cast<std::ptrdiff_t>(num_args), stack->end());
    for (at::Tensor& result : results) stack->emplace_back(std::move(result));
    return true;
  }
  if (lowering_of_op.table == nullptr) return false;
  const Lowering& lowering = *lowering_of_op.table;
  const Args args(stack->data() + (stack->size() - num_args), num_args);
  // A bool alpha of add/sub is ATen's error unless the result is bool
  // ("Boolean alpha only supported for Boolean results"); the kernel would
  // take it as 1 (found by review).
  if ((lowering.op == OpKind::Add || lowering.op == OpKind::Sub) && num_args > 2 && args[2].isScalar() &&
      args[2].toScalar().isBoolean() &&
      !(args[num_args - 1].isTensor() && args[num_args - 1].toTensor().scalar_type() == at::kBool))
    return false;
  std::vector<at::Tensor> operands;
  for (int position : lowering.operands) {
    if (position == -1) {  // the constant -inf (isneginf)
      operands.push_back(wrapped_number(c10::Scalar(-std::numeric_limits<double>::infinity())));
      continue;
    }
    const c10::IValue& arg = args[static_cast<std::size_t>(position)];
    if (arg.isTensor()) operands.push_back(arg.toTensor());
    else if (arg.isScalar()) operands.push_back(wrapped_number(arg.toScalar()));
    else return false;
  }
  // lerp of 16-bit tensors with a 0-dim CPU tensor weight: ATen's kernel
  // reads the weight as a tensor operand, converted to the 16-bit type first
  // (a Python number weight stays unrounded). The kernel reads a host
  // scalar as a Python number, so it gets the rounded value as one.
  if (lowering.op == OpKind::Lerp && operands.size() == 3 && operands[2].device().is_cpu() &&
      operands[2].dim() == 0 && !operands[2].unsafeGetTensorImpl()->is_wrapped_number() &&
      operands[2].is_floating_point() &&
      (operands[0].scalar_type() == at::kBFloat16 || operands[0].scalar_type() == at::kHalf))
    operands[2] = wrapped_number(c10::Scalar(operands[2].to(operands[0].scalar_type()).item().toDouble()));
  if (lowering.accepts && !lowering.accepts(operands)) return false;
  // TensorIterator's layout for a fresh result of `sizes` (iterator_layout.h).
  auto fresh_strides = [&](c10::IntArrayRef sizes) { return iterator_output_strides(operands, sizes); };
  at::Tensor out;
  RestoreSizedOut restore_out;
  switch (lowering.result) {
    case Lowering::Result::kOutArgument:  // the last argument for every such op in the table
      if (!args.back().isTensor()) return false;
      out = args.back().toTensor();
      // Composites such as abs pass an empty out tensor for the kernel to
      // size, as ATen's resize_output does (only an empty one: resizing a
      // non-empty out of another shape warns in ATen, left to ATen).
      if (!lowering.reduction && out.numel() == 0 && out.device().type() == kVtpu) {
        std::vector<std::int64_t> sizes;
        for (const at::Tensor& t : operands) sizes = at::infer_size(sizes, t.sizes());
        if (c10::multiply_integers(sizes) != 0) {
          restore_out.remember(out);
          out.resize_(sizes);
          out.as_strided_(sizes, fresh_strides(sizes));
        }
      }
      break;
    case Lowering::Result::kFresh: {
      if (operands[0].device().type() != kVtpu) return false;
      out = empty_device_strided(operands[0].sizes(), fresh_strides(operands[0].sizes()), operands[0].scalar_type());
      break;
    }
    case Lowering::Result::kFreshBroadcast: {
      if (operands[0].device().type() != kVtpu) return false;
      std::vector<std::int64_t> sizes = operands[0].sizes().vec();
      for (const at::Tensor& t : operands) sizes = at::infer_size(sizes, t.sizes());
      at::native::ResultTypeState state{};
      for (std::size_t i = static_cast<std::size_t>(lowering.promote_from); i < operands.size(); ++i)
        state = at::native::update_result_type_state(operands[i], state);
      out = empty_device_strided(sizes, fresh_strides(sizes), at::native::result_type(state));
      break;
    }
    case Lowering::Result::kInPlace:
      out = operands[0];
      break;
  }
  // An output sharing memory with an input it is not (x[1:].add_(x[:-1]),
  // an out= over a shifted view): ATen's kernel, which raises the CPU's
  // error for dense tensors and otherwise computes in the CPU's order.
  // The same for an output that is one location in several places (an
  // expanded out=).
  if (out.defined() && out.device().type() == kVtpu) {
    if (may_overlap_itself(out)) return false;
    for (const at::Tensor& t : operands)
      if (t.device().type() == kVtpu && partly_overlaps(out, t)) return false;
  }
  // _softmax(self, dim, half_to_float) and the backward's input_dtype.
  if ((lowering.op == OpKind::Softmax || lowering.op == OpKind::LogSoftmax) && args[2].toBool()) return false;
  if ((lowering.op == OpKind::SoftmaxBackward || lowering.op == OpKind::LogSoftmaxBackward) &&
      args[3].toScalarType() != operands[0].scalar_type())
    return false;
  // The row kernels walk the softmax dim element by element: over a dim whose
  // elements are not adjacent (dim 0 of a matrix, a transposed view) ATen's
  // kernel, which runs along the contiguous dim, was 2-11x faster (found by a
  // performance review: dim 0 of 4096x1024, 73 against 7 ms).
  if (lowering.op == OpKind::Softmax || lowering.op == OpKind::LogSoftmax ||
      lowering.op == OpKind::SoftmaxBackward || lowering.op == OpKind::LogSoftmaxBackward) {
    const bool backward = lowering.op == OpKind::SoftmaxBackward || lowering.op == OpKind::LogSoftmaxBackward;
    const std::int64_t rank = operands[0].dim();
    if (rank > 0) {
      const std::int64_t dim = c10::maybe_wrap_dim(args[backward ? 2 : 1].toInt(), rank);
      for (const at::Tensor& t : operands)
        if (t.dim() == rank && t.size(dim) > 1 && t.stride(dim) != 1) return false;
    }
  }
  // add/sub's alpha, addcmul/addcdiv's value and pow's scalar exponent,
  // converted by ATen with an overflow check (its error, or its computation
  // in a wider type, is ATen's to give).
  const int converted_scalar = (lowering.op == OpKind::Add || lowering.op == OpKind::Sub)           ? 2
                               : (lowering.op == OpKind::Addcmul || lowering.op == OpKind::Addcdiv) ? 3
                               : lowering.op == OpKind::Pow                                         ? 1
                                                                                                    : -1;
  if (converted_scalar >= 0 && static_cast<std::size_t>(converted_scalar) < num_args &&
      args[static_cast<std::size_t>(converted_scalar)].isScalar() &&
      !converts_without_overflow(args[static_cast<std::size_t>(converted_scalar)].toScalar(), out.scalar_type()))
    return false;
  bool launched = false;
  if (lowering.reduction) {
    std::vector<std::int64_t> dims;
    if (args[1].isIntList()) dims = args[1].toIntVector();
    else if (args[1].isInt()) dims = {args[1].toInt()};
    else if (!args[1].isNone()) return false;
    if (!args[2].isBool()) return false;
    // sum/mean take an optional dtype, which ATen gives `out` (structured
    // kernels): launch_generated_reduction decides which conversions it lowers.
    if (num_args > 4 && !args[3].isNone() && args[3].toScalarType() != out.scalar_type()) return false;
    launched = launch_generated_reduction(lowering.op, out, operands[0], dims, args[2].toBool());
  } else if (const auto simpler = lowering.op == OpKind::Pow ? pow_as_simpler_op(operands) : std::nullopt) {
    const auto dtype = to_ir_dtype(out.scalar_type());
    if (*simpler == OpKind::Mul) launched = launch_generated(OpKind::Mul, out, {operands[0], operands[0]}, {});
    else if (*simpler == OpKind::Cast) launched = dtype && launch_generated(OpKind::Cast, out, {operands[0]}, {{"dtype", *dtype}});
    else launched = launch_generated(*simpler, out, {operands[0]}, {});
  } else {
    launched = launch_generated(lowering.op, out, operands, lowering.attributes(args));
  }
  if (!launched) return false;
  restore_out.armed = false;
  stack->erase(stack->end() - static_cast<std::ptrdiff_t>(num_args), stack->end());
  stack->emplace_back(out);
  return true;
}

// fill_/zero_ on a generated Fill kernel. ATen converts the value with an
// overflow check (300 into int8 raises): a value that fails it, or an integer
// beyond 2^53 (launch scalars are doubles), stays on ATen's kernel.
bool launch_generated_fill(const at::Tensor& self, const c10::Scalar& value) {
  const auto dtype = to_ir_dtype(self.scalar_type());
  if (!generated_kernels_enabled() || !dtype || value.isComplex() || self.is_conj() || self.is_neg()) return false;
  double converted = 0;
  try {
    AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, self.scalar_type(), "vtpu_fill",
                               [&] { converted = static_cast<double>(value.to<scalar_t>()); });
  } catch (const c10::Error&) {
    return false;
  }
  const bool floating = at::isFloatingType(self.scalar_type());
  if (!floating && !exact_in_double(value)) return false;
  const c10::Scalar exact = floating ? c10::Scalar(converted) : c10::Scalar(static_cast<std::int64_t>(converted));
  return launch_generated_indexed(OpKind::Fill, self, {wrapped_number(exact)},
                                  {{"sizes", self.sizes().vec()}, {"dtype", *dtype}})
      .defined();
}

// A device-to-device copy_ of equal shapes on a generated Cast kernel. ATen
// refuses a destination that overlaps itself or its source; those (and
// broadcasting copies) stay on ATen's kernel, which raises or handles them.
bool launch_generated_copy(const at::Tensor& dst, const at::Tensor& src) {
  const auto dtype = to_ir_dtype(dst.scalar_type());
  if (!generated_kernels_enabled() || !dtype || src.sizes() != dst.sizes() || src.is_conj() || src.is_neg() ||
      dst.is_conj() || dst.is_neg() || !dst.is_non_overlapping_and_dense() || src.storage().is_alias_of(dst.storage()))
    return false;
  return launch_generated(OpKind::Cast, dst, {src}, {{"dtype", *dtype}});
}

}  // namespace vtpu::bridge
