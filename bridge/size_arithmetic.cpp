// Python's number semantics for the native graph program's size arithmetic
// (size_arithmetic.h). Each branch follows what CPython does for the same
// operator on int, float and bool, so the native program computes the sizes
// the Python program would.
#include "size_arithmetic.h"

#include <cmath>
#include <limits>

namespace vtpu::bridge {
namespace {

using Kind = SizeNumber::Kind;
using Error = SizeArithmeticError;

bool is_float(const SizeNumber& n) { return n.kind == Kind::kFloat; }
double as_float(const SizeNumber& n) { return is_float(n) ? n.f : static_cast<double>(n.i); }

std::int64_t checked(bool overflowed, std::int64_t value) {
  if (overflowed) throw Error(Error::Kind::kOverflow, "size arithmetic overflows int64");
  return value;
}

// add, sub, mul: a float operand makes a float, otherwise an int (bool + bool is an int too).
SizeNumber additive(SizeOp op, const SizeNumber& a, const SizeNumber& b) {
  if (is_float(a) || is_float(b)) {
    const double x = as_float(a), y = as_float(b);
    return SizeNumber::of_float(op == SizeOp::kAdd ? x + y : op == SizeOp::kSub ? x - y : x * y);
  }
  std::int64_t r = 0;
  const bool overflowed = op == SizeOp::kAdd   ? __builtin_add_overflow(a.i, b.i, &r)
                          : op == SizeOp::kSub ? __builtin_sub_overflow(a.i, b.i, &r)
                                               : __builtin_mul_overflow(a.i, b.i, &r);
  return SizeNumber::of_int(checked(overflowed, r));
}

void require_ints(const SizeNumber& a, const SizeNumber& b, const char* what) {
  if (is_float(a) || is_float(b))
    throw Error(Error::Kind::kType, std::string(what) + " of a float in the native program's size arithmetic");
}

SizeNumber floor_divide(const SizeNumber& a, const SizeNumber& b) {
  require_ints(a, b, "floor division");
  if (b.i == 0) throw Error(Error::Kind::kZeroDivision, "integer division or modulo by zero");
  if (a.i == std::numeric_limits<std::int64_t>::min() && b.i == -1) checked(true, 0);
  std::int64_t q = a.i / b.i;
  if (a.i % b.i != 0 && ((a.i < 0) != (b.i < 0))) --q;  // C++ truncates, Python floors
  return SizeNumber::of_int(q);
}

SizeNumber modulo(const SizeNumber& a, const SizeNumber& b) {
  require_ints(a, b, "modulo");
  if (b.i == 0) throw Error(Error::Kind::kZeroDivision, "integer division or modulo by zero");
  if (b.i == -1) return SizeNumber::of_int(0);  // also INT64_MIN % -1, which C++ leaves undefined
  std::int64_t r = a.i % b.i;
  if (r != 0 && ((r < 0) != (b.i < 0))) r += b.i;  // the sign of the divisor, as Python
  return SizeNumber::of_int(r);
}

SizeNumber compare(SizeOp op, const SizeNumber& a, const SizeNumber& b) {
  int order = 0;  // -1, 0, 1; NaN compares unequal and unordered
  bool unordered = false;
  if (is_float(a) || is_float(b)) {
    const double x = as_float(a), y = as_float(b);
    unordered = std::isnan(x) || std::isnan(y);
    order = x < y ? -1 : x > y ? 1 : 0;
  } else {
    order = a.i < b.i ? -1 : a.i > b.i ? 1 : 0;
  }
  switch (op) {
    case SizeOp::kEq: return SizeNumber::of_bool(!unordered && order == 0);
    case SizeOp::kNe: return SizeNumber::of_bool(unordered || order != 0);
    case SizeOp::kLt: return SizeNumber::of_bool(!unordered && order < 0);
    case SizeOp::kLe: return SizeNumber::of_bool(!unordered && order <= 0);
    case SizeOp::kGt: return SizeNumber::of_bool(!unordered && order > 0);
    default: return SizeNumber::of_bool(!unordered && order >= 0);
  }
}

// operator.and_ / or_: logical on two bools, bitwise on ints, a TypeError on floats.
SizeNumber bitwise(SizeOp op, const SizeNumber& a, const SizeNumber& b) {
  require_ints(a, b, op == SizeOp::kAnd ? "& " : "| ");
  const std::int64_t r = op == SizeOp::kAnd ? (a.i & b.i) : (a.i | b.i);
  return a.kind == Kind::kBool && b.kind == Kind::kBool ? SizeNumber::of_bool(r != 0) : SizeNumber::of_int(r);
}

// torch.sym_max / sym_min on plain numbers: builtins.max/min, made a float
// when either operand is one.
SizeNumber extremum(SizeOp op, const SizeNumber& a, const SizeNumber& b) {
  const bool pick_b = op == SizeOp::kMax ? compare(SizeOp::kGt, b, a).i != 0 : compare(SizeOp::kLt, b, a).i != 0;
  const SizeNumber& winner = pick_b ? b : a;
  if (is_float(a) || is_float(b)) return SizeNumber::of_float(as_float(winner));
  return winner;
}

// torch.sym_int / math.trunc (toward zero), math.floor and math.ceil: an int
// from a float, an int unchanged.
SizeNumber to_int(const SizeNumber& a, double (*round)(double)) {
  if (!is_float(a)) return SizeNumber::of_int(a.i);
  if (std::isnan(a.f)) throw Error(Error::Kind::kValue, "cannot convert float NaN to integer");
  const double t = round(a.f);
  if (!(t >= -9223372036854775808.0 && t < 9223372036854775808.0))
    throw Error(Error::Kind::kOverflow, "cannot convert float " + std::to_string(a.f) + " to an int64 size");
  return SizeNumber::of_int(static_cast<std::int64_t>(t));
}

}  // namespace

SizeOp parse_size_op(const std::string& name) {
  static const struct { const char* name; SizeOp op; } kOps[] = {
      {"add", SizeOp::kAdd}, {"sub", SizeOp::kSub}, {"mul", SizeOp::kMul}, {"truediv", SizeOp::kTrueDiv},
      {"floordiv", SizeOp::kFloorDiv}, {"mod", SizeOp::kMod}, {"neg", SizeOp::kNeg}, {"eq", SizeOp::kEq},
      {"ne", SizeOp::kNe}, {"lt", SizeOp::kLt}, {"le", SizeOp::kLe}, {"gt", SizeOp::kGt}, {"ge", SizeOp::kGe},
      {"and", SizeOp::kAnd}, {"or", SizeOp::kOr}, {"max", SizeOp::kMax}, {"min", SizeOp::kMin},
      {"not", SizeOp::kNot}, {"float", SizeOp::kFloat}, {"int", SizeOp::kInt}, {"floor", SizeOp::kFloor},
      {"ceil", SizeOp::kCeil}};
  for (const auto& entry : kOps)
    if (name == entry.name) return entry.op;
  throw std::invalid_argument("unknown size arithmetic " + name);
}

std::size_t size_op_arity(SizeOp op) {
  return op == SizeOp::kNeg || op == SizeOp::kNot || op == SizeOp::kFloat || op == SizeOp::kInt ||
                 op == SizeOp::kFloor || op == SizeOp::kCeil
             ? 1 : 2;
}

SizeNumber apply_size_op(SizeOp op, const SizeNumber& a, const SizeNumber& b) {
  switch (op) {
    case SizeOp::kAdd:
    case SizeOp::kSub:
    case SizeOp::kMul: return additive(op, a, b);
    case SizeOp::kTrueDiv:
      if (as_float(b) == 0.0) throw Error(Error::Kind::kZeroDivision, "division by zero");
      return SizeNumber::of_float(as_float(a) / as_float(b));
    case SizeOp::kFloorDiv: return floor_divide(a, b);
    case SizeOp::kMod: return modulo(a, b);
    case SizeOp::kNeg:
      if (is_float(a)) return SizeNumber::of_float(-a.f);
      return SizeNumber::of_int(checked(a.i == std::numeric_limits<std::int64_t>::min(), -a.i));
    case SizeOp::kEq:
    case SizeOp::kNe:
    case SizeOp::kLt:
    case SizeOp::kLe:
    case SizeOp::kGt:
    case SizeOp::kGe: return compare(op, a, b);
    case SizeOp::kAnd:
    case SizeOp::kOr: return bitwise(op, a, b);
    case SizeOp::kMax:
    case SizeOp::kMin: return extremum(op, a, b);
    case SizeOp::kNot: return SizeNumber::of_bool(is_float(a) ? a.f == 0.0 : a.i == 0);
    case SizeOp::kFloat: return SizeNumber::of_float(as_float(a));
    case SizeOp::kInt: return to_int(a, [](double v) { return std::trunc(v); });
    case SizeOp::kFloor: return to_int(a, [](double v) { return std::floor(v); });
    case SizeOp::kCeil: return to_int(a, [](double v) { return std::ceil(v); });
  }
  throw std::invalid_argument("unknown size arithmetic");
}

}  // namespace vtpu::bridge
