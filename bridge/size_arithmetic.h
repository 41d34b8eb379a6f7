// Python's arithmetic on the numbers of a compiled graph with symbolic sizes
// (`past_len + seq`, `n // heads`, `torch.sym_max(a, b)`), for the native
// graph program (graph_program.cpp). Free of ATen and Python headers: the
// program converts its IValues to SizeNumber and back.
//
// Semantics are Python's for int (int64 here: sizes never come near its
// range, and overflow raises instead of wrapping), float and bool: bools
// count as ints in arithmetic, any float operand makes the result a float,
// floor division and modulo round toward negative infinity.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace vtpu::bridge {

enum class SizeOp { kAdd, kSub, kMul, kTrueDiv, kFloorDiv, kMod, kNeg, kEq, kNe, kLt, kLe, kGt, kGe,
                    kAnd, kOr, kMax, kMin, kNot, kFloat, kInt, kFloor, kCeil };

struct SizeNumber {
  enum class Kind { kInt, kFloat, kBool } kind = Kind::kInt;
  std::int64_t i = 0;  // kInt, and kBool as 0/1
  double f = 0.0;      // kFloat

  static SizeNumber of_int(std::int64_t v) { return {Kind::kInt, v, 0.0}; }
  static SizeNumber of_float(double v) { return {Kind::kFloat, 0, v}; }
  static SizeNumber of_bool(bool v) { return {Kind::kBool, v ? 1 : 0, 0.0}; }
};

// What Python raises: ZeroDivisionError, OverflowError, ValueError or TypeError.
struct SizeArithmeticError : std::runtime_error {
  enum class Kind { kZeroDivision, kOverflow, kValue, kType } kind;
  SizeArithmeticError(Kind k, const std::string& message) : std::runtime_error(message), kind(k) {}
};

// codegen.py's names ("add", "floordiv", "max", ...); std::invalid_argument for others.
SizeOp parse_size_op(const std::string& name);
std::size_t size_op_arity(SizeOp op);
// `b` is ignored by unary operations.
SizeNumber apply_size_op(SizeOp op, const SizeNumber& a, const SizeNumber& b);

}  // namespace vtpu::bridge
