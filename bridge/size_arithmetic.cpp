// Python's number semantics for the native graph program's size arithmetic
// (size_arithmetic.h). Each branch follows what CPython does for the same
// operator on int, float and bool; where int64/double arithmetic could differ
// from it, the branch gives no result and the caller asks Python.
#include "size_arithmetic.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace vtpu::bridge {
namespace {

using Kind = SizeNumber::Kind;
using Result = std::optional<SizeNumber>;

constexpr std::int64_t kExactInDouble = std::int64_t{1} << 53;

bool is_float(const SizeNumber& n) { return n.kind == Kind::kFloat; }
double as_float(const SizeNumber& n) { return is_float(n) ? n.f : static_cast<double>(n.i); }
// An int that a double holds exactly, so a float operation on it rounds once, as Python's.
bool exact_in_double(const SizeNumber& n) { return is_float(n) || (n.i >= -kExactInDouble && n.i <= kExactInDouble); }

// add, sub, mul: a float operand makes a float (Python converts the int with
// one rounding, as the cast does), otherwise an int (bool + bool is an int too).
Result additive(SizeOp op, const SizeNumber& a, const SizeNumber& b) {
  if (is_float(a) || is_float(b)) {
    const double x = as_float(a), y = as_float(b);
    return SizeNumber::of_float(op == SizeOp::kAdd ? x + y : op == SizeOp::kSub ? x - y : x * y);
  }
  std::int64_t r = 0;
  const bool overflowed = op == SizeOp::kAdd   ? __builtin_add_overflow(a.i, b.i, &r)
                          : op == SizeOp::kSub ? __builtin_sub_overflow(a.i, b.i, &r)
                                               : __builtin_mul_overflow(a.i, b.i, &r);
  if (overflowed) return std::nullopt;
  return SizeNumber::of_int(r);
}

Result floor_divide(const SizeNumber& a, const SizeNumber& b) {
  if (is_float(a) || is_float(b) || b.i == 0) return std::nullopt;
  if (a.i == std::numeric_limits<std::int64_t>::min() && b.i == -1) return std::nullopt;
  std::int64_t q = a.i / b.i;
  if (a.i % b.i != 0 && ((a.i < 0) != (b.i < 0))) --q;  // C++ truncates, Python floors
  return SizeNumber::of_int(q);
}

Result modulo(const SizeNumber& a, const SizeNumber& b) {
  if (is_float(a) || is_float(b) || b.i == 0) return std::nullopt;
  if (b.i == -1) return SizeNumber::of_int(0);  // also INT64_MIN % -1, which C++ leaves undefined
  std::int64_t r = a.i % b.i;
  if (r != 0 && ((r < 0) != (b.i < 0))) r += b.i;  // the sign of the divisor, as Python
  return SizeNumber::of_int(r);
}

Result compare(SizeOp op, const SizeNumber& a, const SizeNumber& b) {
  int order = 0;  // -1, 0, 1; NaN compares unequal and unordered
  bool unordered = false;
  if (is_float(a) || is_float(b)) {
    // Python compares an int with a float exactly; a double holds ints to 2^53.
    if (!exact_in_double(a) || !exact_in_double(b)) return std::nullopt;
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

// operator.and_ / or_: logical on two bools, bitwise on ints (floats: Python's TypeError).
Result bitwise(SizeOp op, const SizeNumber& a, const SizeNumber& b) {
  if (is_float(a) || is_float(b)) return std::nullopt;
  const std::int64_t r = op == SizeOp::kAnd ? (a.i & b.i) : (a.i | b.i);
  return a.kind == Kind::kBool && b.kind == Kind::kBool ? SizeNumber::of_bool(r != 0) : SizeNumber::of_int(r);
}

// torch.sym_max / sym_min on plain numbers: builtins.max/min (the first
// operand unless the second is strictly beyond it), made a float when either
// operand is one.
Result extremum(SizeOp op, const SizeNumber& a, const SizeNumber& b) {
  const Result beyond = compare(op == SizeOp::kMax ? SizeOp::kGt : SizeOp::kLt, b, a);
  if (!beyond) return std::nullopt;
  const SizeNumber& winner = beyond->i != 0 ? b : a;
  if (is_float(a) || is_float(b)) return SizeNumber::of_float(as_float(winner));
  return winner;
}

// torch.sym_int / math.trunc (toward zero), math.floor and math.ceil: an int
// from a float (Python's grows past int64; NaN and inf raise), an int unchanged.
Result to_int(const SizeNumber& a, double (*round)(double)) {
  if (!is_float(a)) return SizeNumber::of_int(a.i);
  const double t = round(a.f);
  if (!(t >= -9223372036854775808.0 && t < 9223372036854775808.0)) return std::nullopt;
  return SizeNumber::of_int(static_cast<std::int64_t>(t));
}

// torch.sym_sum: sum(operands), Python's left fold from int 0.
Result sum(const SizeNumber* operands, std::size_t count) {
  Result total = SizeNumber::of_int(0);
  for (std::size_t i = 0; i < count && total; ++i) total = additive(SizeOp::kAdd, *total, operands[i]);
  return total;
}

}  // namespace

SizeOp parse_size_op(const std::string& name) {
  static const struct { const char* name; SizeOp op; } kOps[] = {
      {"add", SizeOp::kAdd}, {"sub", SizeOp::kSub}, {"mul", SizeOp::kMul}, {"truediv", SizeOp::kTrueDiv},
      {"floordiv", SizeOp::kFloorDiv}, {"mod", SizeOp::kMod}, {"neg", SizeOp::kNeg}, {"eq", SizeOp::kEq},
      {"ne", SizeOp::kNe}, {"lt", SizeOp::kLt}, {"le", SizeOp::kLe}, {"gt", SizeOp::kGt}, {"ge", SizeOp::kGe},
      {"and", SizeOp::kAnd}, {"or", SizeOp::kOr}, {"max", SizeOp::kMax}, {"min", SizeOp::kMin},
      {"not", SizeOp::kNot}, {"float", SizeOp::kFloat}, {"int", SizeOp::kInt}, {"floor", SizeOp::kFloor},
      {"ceil", SizeOp::kCeil}, {"sum", SizeOp::kSum}};
  for (const auto& entry : kOps)
    if (name == entry.name) return entry.op;
  throw std::invalid_argument("unknown size arithmetic " + name);
}

std::size_t size_op_arity(SizeOp op) {
  switch (op) {
    case SizeOp::kSum: return 0;
    case SizeOp::kNeg:
    case SizeOp::kNot:
    case SizeOp::kFloat:
    case SizeOp::kInt:
    case SizeOp::kFloor:
    case SizeOp::kCeil: return 1;
    default: return 2;
  }
}

std::optional<SizeNumber> apply_size_op(SizeOp op, const SizeNumber* operands, std::size_t count) {
  if (op == SizeOp::kSum) return sum(operands, count);
  if (count != size_op_arity(op)) return std::nullopt;
  const SizeNumber& a = operands[0];
  const SizeNumber& b = count > 1 ? operands[1] : operands[0];
  switch (op) {
    case SizeOp::kAdd:
    case SizeOp::kSub:
    case SizeOp::kMul: return additive(op, a, b);
    case SizeOp::kTrueDiv:
      // Python divides two ints exactly and rounds once; two doubles do the
      // same only for ints a double holds exactly.
      if (!exact_in_double(a) || !exact_in_double(b) || as_float(b) == 0.0) return std::nullopt;
      return SizeNumber::of_float(as_float(a) / as_float(b));
    case SizeOp::kFloorDiv: return floor_divide(a, b);
    case SizeOp::kMod: return modulo(a, b);
    case SizeOp::kNeg:
      if (is_float(a)) return SizeNumber::of_float(-a.f);
      if (a.i == std::numeric_limits<std::int64_t>::min()) return std::nullopt;
      return SizeNumber::of_int(-a.i);
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
    case SizeOp::kSum: break;
  }
  return std::nullopt;
}

}  // namespace vtpu::bridge
