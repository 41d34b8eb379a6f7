// 16-bit float conversions: exhaustive round trips and torch's rounding of
// chosen values (printed from torch .half()/.bfloat16()).
#include "vtpu/ir/half.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

namespace vtpu::ir {
namespace {

TEST(IrHalfTest, EveryHalfRoundTripsThroughFloat) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = half_bits_to_float(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(half_bits_to_float(float_to_half_bits(f))));
      continue;
    }
    EXPECT_EQ(float_to_half_bits(f), bits) << std::hex << b;
  }
}

TEST(IrHalfTest, EveryBFloat16RoundTripsThroughFloat) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = bfloat16_bits_to_float(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bfloat16_bits_to_float(float_to_bfloat16_bits(f))));
      continue;
    }
    EXPECT_EQ(float_to_bfloat16_bits(f), bits) << std::hex << b;
  }
}

TEST(IrHalfTest, HalfRoundsToNearestEvenLikeTorch) {
  auto h = [](float f) { return half_bits_to_float(float_to_half_bits(f)); };
  EXPECT_EQ(h(1.0f / 3.0f), 0.333251953125f);
  EXPECT_EQ(h(65519.0f), 65504.0f);
  EXPECT_TRUE(std::isinf(h(65520.0f)));  // the tie above the max rounds to inf
  EXPECT_EQ(h(1e-8f), 0.0f);
  EXPECT_EQ(h(6e-8f), 0x1p-24f);             // smallest subnormal
  EXPECT_EQ(h(0x1p-25f), 0.0f);              // exact tie rounds to even (0)
  EXPECT_EQ(h(0x1.8p-24f), 0x1p-23f);        // 1.5 ulp ties to even (2 ulp)
  EXPECT_EQ(h(1.0f + 0x1p-11f), 1.0f);       // tie between 1 and 1+2^-10 -> even
  EXPECT_EQ(h(1.0f + 0x1.8p-10f), 1.0f + 0x1p-9f);
  EXPECT_EQ(float_to_half_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half_bits(std::numeric_limits<float>::infinity()), 0x7c00);
}

TEST(IrHalfTest, BFloat16RoundsToNearestEvenLikeTorch) {
  auto b = [](float f) { return bfloat16_bits_to_float(float_to_bfloat16_bits(f)); };
  EXPECT_EQ(b(1.0f / 3.0f), 0.333984375f);
  EXPECT_EQ(b(257.0f), 256.0f);  // tie -> even
  EXPECT_EQ(b(259.0f), 260.0f);  // tie -> even, upwards
  EXPECT_EQ(b(3.0f), 3.0f);
  // The largest finite float rounds to inf, but NaN must stay NaN.
  EXPECT_TRUE(std::isinf(b(std::numeric_limits<float>::max())));
  EXPECT_TRUE(std::isnan(b(std::bit_cast<float>(0x7f800001u))));
}

}  // namespace
}  // namespace vtpu::ir
