// DType properties and torch's promotion rules (c10/core/ScalarType.h and
// ATen's ResultTypeState, re-derived from their documented behaviour).
#include "vtpu/ir/dtype.h"

#include <array>

#include "vtpu/runtime/error.h"

namespace vtpu::ir {
namespace {

struct Info {
  std::string_view name;
  std::size_t itemsize;
};

constexpr std::array<Info, kNumDTypes> kInfo = {{
    {"bool", 1},
    {"uint8", 1},
    {"int8", 1},
    {"int16", 2},
    {"int32", 4},
    {"int64", 8},
    {"float16", 2},
    {"bfloat16", 2},
    {"float32", 4},
    {"float64", 8},
}};

const Info& info(DType t) {
  const auto i = static_cast<std::size_t>(t);
  if (i >= kInfo.size()) {
    throw runtime::Error(runtime::ErrorKind::kInvalidArgument,
                         "[dtype] invalid dtype code " + std::to_string(i));
  }
  return kInfo[i];
}

// Width rank among floats; float16 and bfloat16 share a rank and are not
// ordered, which is why their join is float32.
int float_rank(DType t) {
  switch (t) {
    case DType::kFloat16:
    case DType::kBFloat16: return 1;
    case DType::kFloat32: return 2;
    default: return 3;
  }
}

// c10's combine_categories: `lower` (a lower-priority operand class) only
// matters when it raises the category of `higher`.
std::optional<DType> combine(std::optional<DType> higher, std::optional<DType> lower) {
  if (!higher) return lower;
  if (!lower) return higher;
  if (is_floating(*higher)) return higher;
  if (*higher == DType::kBool || is_floating(*lower)) return promote_types(*higher, *lower);
  return higher;
}

}  // namespace

std::size_t itemsize(DType t) { return info(t).itemsize; }
std::string_view name(DType t) { return info(t).name; }

std::optional<DType> dtype_from_name(std::string_view n) {
  for (std::size_t i = 0; i < kInfo.size(); ++i) {
    if (kInfo[i].name == n) return static_cast<DType>(i);
  }
  return std::nullopt;
}

bool is_floating(DType t) {
  return t == DType::kFloat16 || t == DType::kBFloat16 || t == DType::kFloat32 ||
         t == DType::kFloat64;
}

bool is_integral(DType t) {
  return t == DType::kUInt8 || t == DType::kInt8 || t == DType::kInt16 ||
         t == DType::kInt32 || t == DType::kInt64;
}

bool is_signed(DType t) {
  return is_floating(t) || (is_integral(t) && t != DType::kUInt8);
}

DType compute_type(DType t) {
  return (t == DType::kFloat16 || t == DType::kBFloat16) ? DType::kFloat32 : t;
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::kBool) return b;
  if (b == DType::kBool) return a;
  const bool fa = is_floating(a), fb = is_floating(b);
  if (fa && fb) {
    const int ra = float_rank(a), rb = float_rank(b);
    if (ra == rb) return DType::kFloat32;  // float16 + bfloat16
    return ra > rb ? a : b;
  }
  if (fa) return a;
  if (fb) return b;
  // Both integers. uint8 has no signed type of its width: with int8 the join
  // is int16; with a wider signed type, that type.
  if (a == DType::kUInt8 || b == DType::kUInt8) {
    const DType s = a == DType::kUInt8 ? b : a;
    return s == DType::kInt8 ? DType::kInt16 : s;
  }
  return itemsize(a) > itemsize(b) ? a : b;
}

DType result_type(std::span<const Operand> operands) {
  if (operands.empty()) {
    throw runtime::Error(runtime::ErrorKind::kInvalidArgument,
                         "[result_type] needs at least one operand");
  }
  std::optional<DType> dim, zero, wrapped;
  auto join = [](std::optional<DType>& acc, DType t) {
    acc = acc ? promote_types(*acc, t) : t;
  };
  for (const Operand& op : operands) {
    switch (op.cls) {
      case OperandClass::kTensor: join(dim, op.dtype); break;
      case OperandClass::kZeroDim: join(zero, op.dtype); break;
      case OperandClass::kWrappedNumber:
        // A Python float is a double but counts as the default float dtype.
        join(wrapped, is_floating(op.dtype) ? kDefaultFloat : op.dtype);
        break;
    }
  }
  return *combine(dim, combine(zero, wrapped));
}

DType result_type(std::initializer_list<Operand> operands) {
  return result_type(std::span<const Operand>(operands.begin(), operands.size()));
}

}  // namespace vtpu::ir
