// DType properties and promotion against PyTorch: the tables below were
// printed by torch 2.x (torch.promote_types / torch.result_type) and pasted.
#include "vtpu/ir/dtype.h"

#include <gtest/gtest.h>

#include "vtpu/runtime/error.h"

namespace vtpu::ir {
namespace {

using enum DType;
constexpr DType kAll[] = {kBool,    kUInt8,    kInt8,    kInt16,   kInt32,
                          kInt64,   kFloat16,  kBFloat16, kFloat32, kFloat64};

TEST(IrDTypeTest, Properties) {
  EXPECT_EQ(itemsize(kBool), 1u);
  EXPECT_EQ(itemsize(kBFloat16), 2u);
  EXPECT_EQ(itemsize(kInt64), 8u);
  EXPECT_EQ(name(kFloat32), "float32");
  EXPECT_EQ(name(kBFloat16), "bfloat16");
  for (DType t : kAll) EXPECT_EQ(dtype_from_name(name(t)), t);
  EXPECT_FALSE(dtype_from_name("complex64").has_value());
  EXPECT_TRUE(is_floating(kFloat16));
  EXPECT_FALSE(is_floating(kInt32));
  EXPECT_TRUE(is_integral(kUInt8));
  EXPECT_FALSE(is_integral(kBool));
  EXPECT_FALSE(is_signed(kUInt8));
  EXPECT_EQ(compute_type(kFloat16), kFloat32);
  EXPECT_EQ(compute_type(kBFloat16), kFloat32);
  EXPECT_EQ(compute_type(kFloat64), kFloat64);
  EXPECT_EQ(compute_type(kInt8), kInt8);
  EXPECT_THROW(itemsize(static_cast<DType>(42)), runtime::Error);
}

TEST(IrDTypeTest, PromoteTypesMatchesTorchTable) {
  // torch.promote_types(kAll[row], kAll[col]).
  constexpr DType kTable[10][10] = {
      {kBool, kUInt8, kInt8, kInt16, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64},
      {kUInt8, kUInt8, kInt16, kInt16, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64},
      {kInt8, kInt16, kInt8, kInt16, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64},
      {kInt16, kInt16, kInt16, kInt16, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64},
      {kInt32, kInt32, kInt32, kInt32, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64},
      {kInt64, kInt64, kInt64, kInt64, kInt64, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64},
      {kFloat16, kFloat16, kFloat16, kFloat16, kFloat16, kFloat16, kFloat16, kFloat32, kFloat32, kFloat64},
      {kBFloat16, kBFloat16, kBFloat16, kBFloat16, kBFloat16, kBFloat16, kFloat32, kBFloat16, kFloat32, kFloat64},
      {kFloat32, kFloat32, kFloat32, kFloat32, kFloat32, kFloat32, kFloat32, kFloat32, kFloat32, kFloat64},
      {kFloat64, kFloat64, kFloat64, kFloat64, kFloat64, kFloat64, kFloat64, kFloat64, kFloat64, kFloat64},
  };
  for (int r = 0; r < 10; ++r) {
    for (int c = 0; c < 10; ++c) {
      EXPECT_EQ(promote_types(kAll[r], kAll[c]), kTable[r][c])
          << name(kAll[r]) << " + " << name(kAll[c]);
    }
  }
}

TEST(IrDTypeTest, WrappedNumbersMatchTorch) {
  // torch.result_type(ones(2, dtype=row), s) and (ones((), dtype=row), s)
  // for the Python scalars s = True, 1, 1.5.
  constexpr DType kTable[10][6] = {
      {kBool, kInt64, kFloat32, kBool, kInt64, kFloat32},
      {kUInt8, kUInt8, kFloat32, kUInt8, kUInt8, kFloat32},
      {kInt8, kInt8, kFloat32, kInt8, kInt8, kFloat32},
      {kInt16, kInt16, kFloat32, kInt16, kInt16, kFloat32},
      {kInt32, kInt32, kFloat32, kInt32, kInt32, kFloat32},
      {kInt64, kInt64, kFloat32, kInt64, kInt64, kFloat32},
      {kFloat16, kFloat16, kFloat16, kFloat16, kFloat16, kFloat16},
      {kBFloat16, kBFloat16, kBFloat16, kBFloat16, kBFloat16, kBFloat16},
      {kFloat32, kFloat32, kFloat32, kFloat32, kFloat32, kFloat32},
      {kFloat64, kFloat64, kFloat64, kFloat64, kFloat64, kFloat64},
  };
  constexpr DType kScalars[3] = {kBool, kInt64, kFloat64};  // how Python scalars wrap
  for (int r = 0; r < 10; ++r) {
    for (int s = 0; s < 3; ++s) {
      const Operand wrapped{kScalars[s], OperandClass::kWrappedNumber};
      EXPECT_EQ(result_type({{kAll[r]}, wrapped}), kTable[r][s]) << name(kAll[r]) << " tensor";
      EXPECT_EQ(result_type({{kAll[r], OperandClass::kZeroDim}, wrapped}), kTable[r][3 + s])
          << name(kAll[r]) << " zero-dim";
    }
  }
}

TEST(IrDTypeTest, ZeroDimTensorsMatchTorch) {
  // torch.result_type(ones(2, dtype=row), ones((), dtype=col)).
  constexpr DType kTable[10][10] = {
      {kBool, kUInt8, kInt8, kInt16, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64},
      {kUInt8, kUInt8, kUInt8, kUInt8, kUInt8, kUInt8, kFloat16, kBFloat16, kFloat32, kFloat64},
      {kInt8, kInt8, kInt8, kInt8, kInt8, kInt8, kFloat16, kBFloat16, kFloat32, kFloat64},
      {kInt16, kInt16, kInt16, kInt16, kInt16, kInt16, kFloat16, kBFloat16, kFloat32, kFloat64},
      {kInt32, kInt32, kInt32, kInt32, kInt32, kInt32, kFloat16, kBFloat16, kFloat32, kFloat64},
      {kInt64, kInt64, kInt64, kInt64, kInt64, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64},
      {kFloat16, kFloat16, kFloat16, kFloat16, kFloat16, kFloat16, kFloat16, kFloat16, kFloat16, kFloat16},
      {kBFloat16, kBFloat16, kBFloat16, kBFloat16, kBFloat16, kBFloat16, kBFloat16, kBFloat16, kBFloat16, kBFloat16},
      {kFloat32, kFloat32, kFloat32, kFloat32, kFloat32, kFloat32, kFloat32, kFloat32, kFloat32, kFloat32},
      {kFloat64, kFloat64, kFloat64, kFloat64, kFloat64, kFloat64, kFloat64, kFloat64, kFloat64, kFloat64},
  };
  for (int r = 0; r < 10; ++r) {
    for (int c = 0; c < 10; ++c) {
      EXPECT_EQ(result_type({{kAll[r]}, {kAll[c], OperandClass::kZeroDim}}), kTable[r][c])
          << name(kAll[r]) << " tensor, " << name(kAll[c]) << " zero-dim";
    }
  }
}

TEST(IrDTypeTest, ResultTypeCombinesAllThreeClasses) {
  // int8 tensor + float64 zero-dim + int scalar -> float64 (the zero-dim
  // raises the category and keeps its width); only wrapped -> default float.
  EXPECT_EQ(result_type({{kInt8}, {kFloat64, OperandClass::kZeroDim},
                         {kInt64, OperandClass::kWrappedNumber}}),
            kFloat64);
  EXPECT_EQ(result_type({{kFloat64, OperandClass::kWrappedNumber}}), kFloat32);
  EXPECT_EQ(result_type({{kInt8, OperandClass::kZeroDim}, {kInt64, OperandClass::kZeroDim}}), kInt64);
  EXPECT_THROW(result_type(std::span<const Operand>{}), runtime::Error);
}

}  // namespace
}  // namespace vtpu::ir
