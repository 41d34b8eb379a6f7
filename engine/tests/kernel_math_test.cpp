// Accuracy of the generated kernels' float math (kernel_math.h) against the
// C library's double precision result, in ulps of the float result, over a
// dense sample of all float bit patterns plus the special values.
#include "../src/compiler/kernel_math.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Error of `got` in units of the last place of the correctly rounded result.
double ulp_error(float got, double exact) {
  if (std::isnan(exact)) return std::isnan(got) ? 0.0 : INFINITY;
  const float rounded = static_cast<float>(exact);
  if (std::isinf(rounded)) return got == rounded ? 0.0 : INFINITY;
  double ulp = std::nextafter(std::fabs(rounded), INFINITY) - std::fabs(rounded);
  if (std::fabs(rounded) < FLT_MIN) ulp = std::ldexp(1.0, -149);  // subnormal spacing
  return std::fabs(static_cast<double>(got) - exact) / ulp;
}

template <typename F, typename Exact>
double worst_error(F f, Exact exact, float lo, float hi) {
  double worst = 0.0;
  // A stride coprime with 2^32 visits every exponent and many mantissas.
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 251) {
    const float x = from_bits(static_cast<uint32_t>(bits));
    if (!(x >= lo && x <= hi)) continue;
    worst = std::max(worst, ulp_error(f(x), exact(static_cast<double>(x))));
  }
  return worst;
}

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(KernelMath, ExpWithinOneUlp) {
  EXPECT_LE(worst_error([](float x) { return vtpu_exp(x); }, [](double x) { return std::exp(x); }, -kInf, kInf),
            1.05);
}

TEST(KernelMath, LogWithinOneUlp) {
  EXPECT_LE(worst_error([](float x) { return vtpu_log(x); }, [](double x) { return std::log(x); }, 0.0f, kInf), 1.0);
}

TEST(KernelMath, TanhWithinTwoUlp) {
  EXPECT_LE(worst_error([](float x) { return vtpu_tanh(x); }, [](double x) { return std::tanh(x); }, -kInf, kInf),
            2.0);
}

TEST(KernelMath, SigmoidWithinTwoAndAHalfUlp) {
  // Below -87 e^-x overflows float and the result flushes to 0, as in ATen's
  // vectorised 1 / (1 + exp(-x)).
  EXPECT_LE(worst_error([](float x) { return vtpu_sigmoid(x); },
                        [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, -87.0f, kInf),
            2.5);
}

TEST(KernelMath, ErfWithinTwoUlp) {
  EXPECT_LE(worst_error([](float x) { return vtpu_erf(x); }, [](double x) { return std::erf(x); }, -kInf, kInf),
            2.0);
}

TEST(KernelMath, Exp2Log2Log1pExpm1WithinTheirBounds) {
  // Bounds measured over all 2^32 inputs when they were written: 0.95, 1.16,
  // 0.90, 0.95 ulp.
  EXPECT_LE(worst_error([](float x) { return vtpu_exp2(x); }, [](double x) { return std::exp2(x); }, -kInf, kInf),
            1.0);
  EXPECT_LE(worst_error([](float x) { return vtpu_log2(x); }, [](double x) { return std::log2(x); }, 0.0f, kInf),
            1.2);
  EXPECT_LE(worst_error([](float x) { return vtpu_log1p(x); }, [](double x) { return std::log1p(x); }, -1.0f, kInf),
            1.0);
  EXPECT_LE(worst_error([](float x) { return vtpu_expm1(x); }, [](double x) { return std::expm1(x); }, -kInf, kInf),
            1.0);
}

TEST(KernelMath, AtanAndAtan2WithinHalfAnUlpAndAFraction) {
  EXPECT_LE(worst_error([](float x) { return vtpu_atan(x); }, [](double x) { return std::atan(x); }, -kInf, kInf),
            0.51);
  // Pairs: y from the dense sample, x = y times a spread of ratios and
  // independent magnitudes.
  double worst = 0.0;
  const float ratios[] = {-7.5f, -1.0f, -0.3f, -1e-3f, 1e-3f, 0.41f, 1.0f, 2.4142f, 1e5f, -1e-30f};
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 4099) {
    const float y = from_bits(static_cast<uint32_t>(bits));
    if (!std::isfinite(y)) continue;
    for (float r : ratios) {
      const float x = y * r;
      worst = std::max(worst, ulp_error(vtpu_atan2(y, x), std::atan2(static_cast<double>(y), static_cast<double>(x))));
      worst = std::max(worst, ulp_error(vtpu_atan2(x, y), std::atan2(static_cast<double>(x), static_cast<double>(y))));
    }
  }
  EXPECT_LE(worst, 0.51);
}

// sin and cos reduce in double and round once: within half an ulp and a
// hair on the vectorised path (|x| <= 2^24), the C library beyond it. The
// bound is tight: evaluated in float, or with pi/2 in two parts, they fail.
TEST(KernelMath, SinAndCosWithinHalfAnUlpAndAHair) {
  const float two24 = 16777216.0f;
  EXPECT_LE(worst_error([](float x) { return vtpu_sin_reduced(x); }, [](double x) { return std::sin(x); }, -two24,
                        two24),
            0.501);
  EXPECT_LE(worst_error([](float x) { return vtpu_cos_reduced(x); }, [](double x) { return std::cos(x); }, -two24,
                        two24),
            0.501);
  // Near multiples of pi/2 the reduced argument loses the leading bits:
  // the floats nearest k pi/2 for many k, where a short pi/2 shows.
  double worst = 0.0;
  for (int k = 1; k < 200000; k += 7) {
    const float near = static_cast<float>(k * 1.5707963267948966);
    for (float x : {near, std::nextafter(near, 0.0f), std::nextafter(near, kInf)}) {
      worst = std::max(worst, ulp_error(vtpu_sin(x), std::sin(static_cast<double>(x))));
      worst = std::max(worst, ulp_error(vtpu_cos(x), std::cos(static_cast<double>(x))));
    }
  }
  EXPECT_LE(worst, 0.501);
  // The library's arguments: beyond 2^24, inf and NaN give what std:: gives.
  for (float x : {std::nextafter(two24, kInf), -33554432.0f, 1e30f, -FLT_MAX, kInf, -kInf,
                  std::numeric_limits<float>::quiet_NaN()}) {
    SCOPED_TRACE(x);
    EXPECT_TRUE(vtpu_trig_needs_library(x));
    const float s = vtpu_sin(x), c = vtpu_cos(x);
    EXPECT_TRUE(std::isnan(x) || std::isinf(x) ? std::isnan(s) && std::isnan(c) : s == std::sin(x) && c == std::cos(x));
  }
  EXPECT_FALSE(vtpu_trig_needs_library(two24));
  EXPECT_FALSE(vtpu_trig_needs_library(-two24));
  // Signed zeros: sin keeps the sign, cos is 1.
  EXPECT_TRUE(std::signbit(vtpu_sin(-0.0f)) && vtpu_sin(-0.0f) == 0.0f);
  EXPECT_TRUE(!std::signbit(vtpu_sin(0.0f)) && vtpu_sin(0.0f) == 0.0f);
  EXPECT_EQ(vtpu_cos(-0.0f), 1.0f);
  EXPECT_EQ(vtpu_sin(-1e-45f), -1e-45f);  // subnormals: sin x = x
}

TEST(KernelMath, SpecialValuesOfTheLibmReplacements) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {0.0f, -0.0f, kInf, -kInf, 1.0f, -1.0f, 1e-45f, -1e-45f, FLT_MAX, -FLT_MAX, 0.5f, -2.0f};
  for (float v : specials) {
    SCOPED_TRACE(v);
    auto same = [](float got, double want) {
      const float w = static_cast<float>(want);
      return std::isnan(w) ? std::isnan(got) : (got == w && std::signbit(got) == std::signbit(w));
    };
    EXPECT_TRUE(same(vtpu_exp2(v), std::exp2(static_cast<double>(v))) ||
                std::fabs(vtpu_exp2(v) - static_cast<float>(std::exp2(static_cast<double>(v)))) <= 1e-45f);
    EXPECT_TRUE(same(vtpu_log2(v), std::log2(static_cast<double>(v))) || std::fabs(v) == 1e-45f);
    EXPECT_TRUE(same(vtpu_log1p(v), std::log1p(static_cast<double>(v))));
    EXPECT_TRUE(same(vtpu_expm1(v), std::expm1(static_cast<double>(v))));
    EXPECT_TRUE(same(vtpu_atan(v), std::atan(static_cast<double>(v))));
    for (float w : specials) {
      SCOPED_TRACE(w);
      EXPECT_TRUE(same(vtpu_atan2(v, w), std::atan2(static_cast<double>(v), static_cast<double>(w))));
    }
    EXPECT_TRUE(std::isnan(vtpu_log1p(nan)) && std::isnan(vtpu_expm1(nan)) && std::isnan(vtpu_exp2(nan)) &&
                std::isnan(vtpu_log2(nan)) && std::isnan(vtpu_atan2(nan, v)) && std::isnan(vtpu_atan2(v, nan)));
  }
  for (int e = -149; e <= 127; ++e) EXPECT_EQ(vtpu_log2(std::ldexp(1.0f, e)), static_cast<float>(e));
}

TEST(KernelMath, SpecialValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(vtpu_exp(nan)));
  EXPECT_EQ(vtpu_exp(kInf), kInf);
  EXPECT_EQ(vtpu_exp(-kInf), 0.0f);
  EXPECT_EQ(vtpu_exp(0.0f), 1.0f);
  EXPECT_EQ(vtpu_exp(100.0f), kInf);
  EXPECT_GT(vtpu_exp(-100.0f), 0.0f);  // subnormal, not flushed

  EXPECT_TRUE(std::isnan(vtpu_log(nan)));
  EXPECT_TRUE(std::isnan(vtpu_log(-1.0f)));
  EXPECT_EQ(vtpu_log(0.0f), -kInf);
  EXPECT_EQ(vtpu_log(-0.0f), -kInf);
  EXPECT_EQ(vtpu_log(kInf), kInf);
  EXPECT_EQ(vtpu_log(1.0f), 0.0f);
  EXPECT_NEAR(vtpu_log(1e-45f), std::log(static_cast<double>(1e-45f)), 1e-5);  // smallest subnormal

  EXPECT_TRUE(std::isnan(vtpu_tanh(nan)));
  EXPECT_EQ(vtpu_tanh(kInf), 1.0f);
  EXPECT_EQ(vtpu_tanh(-kInf), -1.0f);
  EXPECT_TRUE(std::signbit(vtpu_tanh(-0.0f)));

  EXPECT_TRUE(std::isnan(vtpu_sigmoid(nan)));
  EXPECT_EQ(vtpu_sigmoid(kInf), 1.0f);
  EXPECT_EQ(vtpu_sigmoid(-kInf), 0.0f);

  EXPECT_TRUE(std::isnan(vtpu_erf(nan)));
  EXPECT_EQ(vtpu_erf(kInf), 1.0f);
  EXPECT_EQ(vtpu_erf(-kInf), -1.0f);
  EXPECT_TRUE(std::signbit(vtpu_erf(-0.0f)));
}

// Double precision goes to the C library unchanged.
TEST(KernelMath, DoubleUsesTheCLibrary) {
  EXPECT_EQ(vtpu_exp(0.5), std::exp(0.5));
  EXPECT_EQ(vtpu_tanh(0.5), std::tanh(0.5));
  EXPECT_EQ(vtpu_erf(0.5), std::erf(0.5));
  EXPECT_EQ(vtpu_log1p(0.5), std::log1p(0.5));
  EXPECT_EQ(vtpu_atan2(0.5, -2.0), std::atan2(0.5, -2.0));
}

}  // namespace
