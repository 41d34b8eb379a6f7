// The trait table, generated from VTPU_IR_OPS.
#include "vtpu/ir/op.h"

#include <array>

#include "vtpu/runtime/error.h"

namespace vtpu::ir {
namespace {

constexpr std::array<OpTraits, kNumOpKinds> kTraits = {{
#define VTPU_IR_OP_TRAITS(e, n, c, lo, hi) {n, OpCategory::c, lo, hi},
    VTPU_IR_OPS(VTPU_IR_OP_TRAITS)
#undef VTPU_IR_OP_TRAITS
}};

}  // namespace

const OpTraits& traits(OpKind op) {
  const auto i = static_cast<std::size_t>(op);
  if (i >= kTraits.size()) {
    throw runtime::Error(runtime::ErrorKind::kInvalidArgument,
                         "[op] invalid op kind code " + std::to_string(i));
  }
  return kTraits[i];
}

bool is_elementwise(OpKind op) {
  const OpCategory c = category(op);
  return c == OpCategory::kUnary || c == OpCategory::kBinary || c == OpCategory::kTernary;
}

std::string_view name(OpCategory c) {
  switch (c) {
    case OpCategory::kSource: return "source";
    case OpCategory::kUnary: return "unary";
    case OpCategory::kBinary: return "binary";
    case OpCategory::kTernary: return "ternary";
    case OpCategory::kReduction: return "reduction";
    case OpCategory::kNormalization: return "normalization";
    case OpCategory::kIndexing: return "indexing";
    case OpCategory::kExtern: return "extern";
  }
  return "?";
}

const char* runtime_scalar_attribute(OpKind op) {
  switch (op) {
    case OpKind::Add:
    case OpKind::Sub: return "alpha";
    case OpKind::Addcmul:
    case OpKind::Addcdiv: return "value";
    case OpKind::ThresholdBackward: return "threshold";
    default: return nullptr;
  }
}

}  // namespace vtpu::ir
