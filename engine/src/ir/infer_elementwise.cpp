// Type inference of sources and elementwise ops: broadcasting and
// torch.result_type, plus the per-op dtype rules (int -> float for
// transcendental ops and true division, bool for predicates).
#include <algorithm>

#include "infer.h"

namespace vtpu::ir::detail {
namespace {

std::string dname(DType t) { return std::string(name(t)); }

// Ops that compute in floating point: integer and bool inputs become the
// default float, like torch's "int_to_float" unary ufuncs.
bool int_to_float(OpKind op) {
  switch (op) {
    case OpKind::Exp: case OpKind::Exp2: case OpKind::Log: case OpKind::Log2:
    case OpKind::Log10: case OpKind::Log1p: case OpKind::Expm1: case OpKind::Sqrt:
    case OpKind::Rsqrt: case OpKind::Reciprocal: case OpKind::Sin: case OpKind::Cos:
    case OpKind::Tan: case OpKind::Asin: case OpKind::Acos: case OpKind::Atan:
    case OpKind::Sinh: case OpKind::Cosh: case OpKind::Tanh: case OpKind::Sigmoid:
    case OpKind::Erf: case OpKind::Atan2:
      return true;
    default:
      return false;
  }
}

// Ops ATen implements for floating types only (no int->float promotion).
bool floating_only(OpKind op) {
  switch (op) {
    case OpKind::Gelu: case OpKind::Silu: case OpKind::GeluBackward:
    case OpKind::SiluBackward: case OpKind::SigmoidBackward: case OpKind::TanhBackward:
    case OpKind::Lerp:
      return true;
    default:
      return false;
  }
}

bool bool_result(OpKind op) {
  switch (op) {
    case OpKind::LogicalNot: case OpKind::IsNan: case OpKind::IsInf: case OpKind::IsFinite:
    case OpKind::Eq: case OpKind::Ne: case OpKind::Lt: case OpKind::Le: case OpKind::Gt:
    case OpKind::Ge: case OpKind::LogicalAnd: case OpKind::LogicalOr: case OpKind::LogicalXor:
      return true;
    default:
      return false;
  }
}

bool bitwise(OpKind op) {
  return op == OpKind::BitwiseNot || op == OpKind::BitwiseAnd || op == OpKind::BitwiseOr ||
         op == OpKind::BitwiseXor;
}

void require_rank0(OpKind op, const Graph& g, ValueId id, const char* what) {
  if (g.type(id).rank() != 0) {
    fail(op, std::string(what) + " must be a 0-dim tensor, got shape " +
                 shape_string(g.type(id).sizes));
  }
}

void require_bool(OpKind op, const Graph& g, ValueId id, const char* what) {
  if (g.type(id).dtype != DType::kBool) {
    fail(op, std::string(what) + " must be bool, got " + dname(g.type(id).dtype));
  }
}

}  // namespace

Inferred infer_source(const Graph& g, OpKind op, const std::vector<ValueId>& in,
                      const Attributes& attrs) {
  switch (op) {
    case OpKind::Constant: {
      const AttrValue* v = attrs.find("value");
      DType t;
      if (!v) fail(op, "attribute 'value' is required");
      if (std::holds_alternative<bool>(*v)) t = DType::kBool;
      else if (std::holds_alternative<std::int64_t>(*v)) t = DType::kInt64;
      else if (std::holds_alternative<double>(*v)) t = DType::kFloat64;
      else fail(op, "'value' must be a bool, int or double, got " + to_string(*v));
      t = attrs.get_dtype("dtype").value_or(t);
      return {TensorType::contiguous(t, {}), t};
    }
    case OpKind::Fill: {
      require_rank0(op, g, in[0], "value");
      const auto dtype = attrs.get_dtype("dtype");
      if (!dtype) fail(op, "attribute 'dtype' is required");
      std::vector<std::int64_t> sizes = attrs.get_ints("sizes");
      if (std::any_of(sizes.begin(), sizes.end(), [](std::int64_t s) { return s < 0; })) {
        fail(op, "negative size in " + shape_string(sizes));
      }
      return {TensorType::contiguous(*dtype, std::move(sizes)), *dtype};
    }
    case OpKind::Arange: {
      require_rank0(op, g, in[0], "start");
      require_rank0(op, g, in[1], "step");
      const auto dtype = attrs.get_dtype("dtype");
      if (!dtype) fail(op, "attribute 'dtype' is required");
      const std::int64_t size = attrs.get_int("size");
      if (size < 0) fail(op, "negative size " + std::to_string(size));
      return {TensorType::contiguous(*dtype, {size}), *dtype};
    }
    default:
      fail(op, "not a source op");
  }
}

Inferred infer_elementwise(const Graph& g, OpKind op, const std::vector<ValueId>& in,
                           const Attributes& attrs) {
  // Operands that take part in promotion and broadcasting.
  std::vector<ValueId> promoted(in.begin(), in.end());
  std::vector<const TensorType*> shapes;
  for (ValueId v : in) shapes.push_back(&g.type(v));

  switch (op) {
    case OpKind::Cast: {
      const auto dtype = attrs.get_dtype("dtype");
      if (!dtype) fail(op, "attribute 'dtype' is required");
      return {TensorType::contiguous(*dtype, g.type(in[0]).sizes), g.type(in[0]).dtype};
    }
    case OpKind::Where:
      require_bool(op, g, in[0], "condition");
      promoted.erase(promoted.begin());
      break;
    case OpKind::MaskedFill: {
      require_bool(op, g, in[1], "mask");
      require_rank0(op, g, in[2], "value");
      const DType t = g.type(in[0]).dtype;
      return {TensorType::contiguous(t, broadcast_all(op, {shapes[0], shapes[1]})), t};
    }
    case OpKind::Clamp:
      check_optional_count(op, in, 1, attrs, {"has_min", "has_max"});
      if (in.size() == 1) fail(op, "at least one of min and max must be given");
      break;
    case OpKind::Lerp:
      promoted.pop_back();  // torch requires weight to match; it does not promote
      break;
    case OpKind::Gelu: {
      const std::string a = attrs.get_string("approximate", "none");
      if (a != "none" && a != "tanh") fail(op, "approximate must be \"none\" or \"tanh\", got \"" + a + "\"");
      break;
    }
    case OpKind::GeluBackward: {
      const std::string a = attrs.get_string("approximate", "none");
      if (a != "none" && a != "tanh") fail(op, "approximate must be \"none\" or \"tanh\", got \"" + a + "\"");
      break;
    }
    default:
      break;
  }

  std::vector<Operand> operands;
  for (ValueId v : promoted) operands.push_back(promotion_operand(g, v));
  DType common = result_type(operands);
  const std::vector<std::int64_t> sizes = broadcast_all(op, shapes);

  if (int_to_float(op) && !is_floating(common)) common = kDefaultFloat;
  if (floating_only(op) && !is_floating(common)) {
    fail(op, "expected a floating point input, got " + dname(common));
  }
  if (bitwise(op) && is_floating(common)) {
    fail(op, "not supported for floating point dtype " + dname(common));
  }
  if (op == OpKind::Neg && common == DType::kBool) {
    fail(op, "negation of a bool tensor is not supported; use logical_not");
  }
  if (op == OpKind::Sub && common == DType::kBool) {
    fail(op, "subtraction of bool tensors is not supported; use logical_xor");
  }
  if ((op == OpKind::Add || op == OpKind::Sub) && !is_floating(common)) {
    const AttrValue* alpha = attrs.find("alpha");
    if (alpha && std::holds_alternative<double>(*alpha)) {
      fail(op, "alpha must not be a floating point number for " + dname(common) + " inputs");
    }
  }
  if (op == OpKind::Addcdiv && !is_floating(common)) {
    fail(op, "integer division is not supported, got " + dname(common));
  }
  if (op == OpKind::Div) {
    const std::string mode = attrs.get_string("rounding_mode", "");
    if (mode.empty()) {
      if (!is_floating(common)) common = kDefaultFloat;  // true division
    } else if (mode != "trunc" && mode != "floor") {
      fail(op, "rounding_mode must be \"trunc\" or \"floor\", got \"" + mode + "\"");
    }
  }
  const DType out = bool_result(op) ? DType::kBool : common;
  return {TensorType::contiguous(out, sizes), common};
}

}  // namespace vtpu::ir::detail
