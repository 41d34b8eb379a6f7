// Python's arithmetic on the numbers of a compiled graph with symbolic sizes
// (`past_len + seq`, `n // heads`, `torch.sym_max(a, b)`), for the native
// graph program (graph_program.cpp). Free of ATen and Python headers: the
// program converts its IValues to SizeNumber and back.
//
// The fast path of the common cases only: a result is returned only when
// int64/double arithmetic gives exactly what Python gives (bools count as
// ints, a float operand makes a float, floor division and modulo round toward
// negative infinity). Everything else — overflow past int64 (Python's ints
// grow), an int beyond 2^53 meeting a float or a true division (Python rounds
// the exact value once), division by zero, NaN to int, floats in `//`, `%`,
// `&`, `|` — gives no result, and the program calls the Python function the
// graph names instead, which computes (or raises) exactly as the Python
// program would.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace vtpu::bridge {

enum class SizeOp { kAdd, kSub, kMul, kTrueDiv, kFloorDiv, kMod, kNeg, kEq, kNe, kLt, kLe, kGt, kGe,
                    kAnd, kOr, kMax, kMin, kNot, kFloat, kInt, kFloor, kCeil, kSum };

struct SizeNumber {
  enum class Kind { kInt, kFloat, kBool } kind = Kind::kInt;
  std::int64_t i = 0;  // kInt, and kBool as 0/1
  double f = 0.0;      // kFloat

  static SizeNumber of_int(std::int64_t v) { return {Kind::kInt, v, 0.0}; }
  static SizeNumber of_float(double v) { return {Kind::kFloat, 0, v}; }
  static SizeNumber of_bool(bool v) { return {Kind::kBool, v ? 1 : 0, 0.0}; }
};

// codegen.py's names ("add", "floordiv", "max", "sum", ...); std::invalid_argument for others.
SizeOp parse_size_op(const std::string& name);
// Operand count; 0 for kSum, which takes any number.
std::size_t size_op_arity(SizeOp op);
// Python's result, or nullopt where this fast path cannot promise it.
std::optional<SizeNumber> apply_size_op(SizeOp op, const SizeNumber* operands, std::size_t count);

}  // namespace vtpu::bridge
