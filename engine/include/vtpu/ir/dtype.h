// Element types of the IR and PyTorch's type-promotion rules over them. The
// rules live here, not in the bridge, so that every mode (and the engine's own
// tests) infers the same result dtype for an op without asking ATen.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string_view>

namespace vtpu::ir {

// The order is part of the canonical hash encoding: append, never reorder.
enum class DType : std::uint8_t {
  kBool,
  kUInt8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
};

inline constexpr int kNumDTypes = 10;

// torch.get_default_dtype(): what Python floats and int->float ops become.
inline constexpr DType kDefaultFloat = DType::kFloat32;

std::size_t itemsize(DType t);
std::string_view name(DType t);  // "float32", "bfloat16", "bool", ...
// Inverse of name(); nullopt for an unknown name.
std::optional<DType> dtype_from_name(std::string_view name);

bool is_floating(DType t);
bool is_integral(DType t);  // excludes bool, like torch's is_integral(includeBool=false)
bool is_signed(DType t);    // floating types and signed integers

// The type arithmetic runs in: float16/bfloat16 compute in float32, the rest
// in themselves (torch's opmath_type).
DType compute_type(DType t);

// torch.promote_types: the lattice join (bool < integers < floats;
// uint8+int8 -> int16; float16+bfloat16 -> float32).
DType promote_types(DType a, DType b);

// How an operand takes part in torch.result_type. Dimensioned tensors decide
// within a category (bool < integral < floating); zero-dim tensors and then
// wrapped numbers (Python scalars) only raise the category, never the width:
// float32 tensor + double scalar -> float32, int32 tensor + 2.5 -> float32.
enum class OperandClass : std::uint8_t { kTensor, kZeroDim, kWrappedNumber };

struct Operand {
  DType dtype;
  OperandClass cls = OperandClass::kTensor;
};

// torch.result_type over the operands (at least one).
DType result_type(std::span<const Operand> operands);
DType result_type(std::initializer_list<Operand> operands);

}  // namespace vtpu::ir
