// Skinny GEMM: values against a double-precision product, the documented
// summation order bit for bit, the same bits whatever the column blocks and
// threads, and the BLAS's bias/alpha/beta rules.
#include "vtpu/runtime/skinny_gemm.h"

#include "vtpu/ir/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

namespace vtpu::runtime {
namespace {

struct Problem {
  std::int64_t rows, k, n;
  std::vector<float> a, w, bias, c;  // w is n x k (nn.Linear's weight); B = w^T
  explicit Problem(std::int64_t rows_, std::int64_t k_, std::int64_t n_, unsigned seed = 1)
      : rows(rows_), k(k_), n(n_), a(rows_ * k_), w(n_ * k_), bias(rows_ * n_), c(rows_ * n_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    for (auto* v : {&a, &w, &bias})
      for (float& x : *v) x = normal(rng);
  }
  SkinnyGemm gemm() {
    SkinnyGemm g;
    g.rows = rows;
    g.k = k;
    g.n = n;
    g.a = a.data();
    g.a_row_stride = k;
    g.b = w.data();
    g.b_k_stride = 1;
    g.b_n_stride = k;
    g.c = c.data();
    g.c_row_stride = n;
    return g;
  }
};

// The order skinny_gemm.h promises, written out one lane at a time.
float reference_dot(const float* x, const float* w, std::int64_t k, int lanes) {
  float acc[16] = {};
  const std::int64_t body = k - k % lanes;
  for (std::int64_t j = 0; j < body; ++j) acc[j % lanes] += x[j] * w[j];
  float s8[8];
  for (int i = 0; i < 8; ++i) s8[i] = lanes == 16 ? acc[i] + acc[i + 8] : acc[i];
  float s4[4];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  float s = (s4[0] + s4[2]) + (s4[1] + s4[3]);
  for (std::int64_t j = body; j < k; ++j) s += x[j] * w[j];
  return s;
}

std::uint32_t bits(float v) {
  std::uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

TEST(SkinnyGemmTest, MatchesADoubleProductAndItsOwnOrderBitForBit) {
  for (std::int64_t rows = 1; rows <= kSkinnyGemmMaxRows; ++rows) {
    for (std::int64_t k : {1, 7, 8, 15, 16, 17, 33, 256, 1001}) {
      Problem p(rows, k, 37, static_cast<unsigned>(rows * 1000 + k));
      SkinnyGemm g = p.gemm();
      ASSERT_TRUE(skinny_gemm_accepts(g));
      skinny_gemm_columns(g, 0, p.n);
      const int lanes = rows == 1 ? 16 : 8;
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t col = 0; col < p.n; ++col) {
          const float* x = &p.a[r * k];
          const float* w = &p.w[col * k];
          double exact = 0, magnitude = 0;
          for (std::int64_t j = 0; j < k; ++j) {
            exact += static_cast<double>(x[j]) * w[j];
            magnitude += std::fabs(static_cast<double>(x[j]) * w[j]);
          }
          const float got = p.c[r * p.n + col];
          ASSERT_NEAR(got, exact, 1e-6 * magnitude + 1e-30) << rows << "x" << k << " r" << r << " c" << col;
          ASSERT_EQ(bits(got), bits(reference_dot(x, w, k, lanes))) << rows << "x" << k << " r" << r << " c" << col;
        }
      }
    }
  }
}

// bfloat16: operands widened exactly, the float32 order above, one rounding.
TEST(SkinnyGemmTest, BFloat16RoundsTheFloat32ProductOnce) {
  for (std::int64_t rows : {1, 3, 8}) {
    for (std::int64_t k : {5, 16, 40, 257}) {
      Problem p(rows, k, 19, static_cast<unsigned>(rows * 31 + k));
      const auto to_bf16 = [](const std::vector<float>& v) {
        std::vector<std::uint16_t> out(v.size());
        for (std::size_t i = 0; i < v.size(); ++i) out[i] = ir::float_to_bfloat16_bits(v[i]);
        return out;
      };
      const std::vector<std::uint16_t> a = to_bf16(p.a), w = to_bf16(p.w), bias = to_bf16(p.bias);
      std::vector<std::uint16_t> c(p.c.size(), 0xFFFF);
      for (bool with_bias : {false, true}) {
        SkinnyGemm g = p.gemm();
        g.dtype = SkinnyGemmDtype::kBFloat16;
        g.a = a.data();
        g.b = w.data();
        g.c = c.data();
        if (with_bias) {
          g.bias = bias.data();
          g.bias_row_stride = 0;  // a row vector
          g.bias_n_stride = 1;
          g.alpha = 0.5f;
        }
        skinny_gemm_columns(g, 0, p.n);
        for (std::int64_t r = 0; r < rows; ++r) {
          for (std::int64_t col = 0; col < p.n; ++col) {
            std::vector<float> x(k), y(k);
            for (std::int64_t j = 0; j < k; ++j) {
              x[j] = ir::bfloat16_bits_to_float(a[r * k + j]);
              y[j] = ir::bfloat16_bits_to_float(w[col * k + j]);
            }
            float want = reference_dot(x.data(), y.data(), k, rows == 1 ? 16 : 8);
            if (with_bias) want = ir::bfloat16_bits_to_float(bias[col]) + 0.5f * want;
            ASSERT_EQ(c[r * p.n + col], ir::float_to_bfloat16_bits(want)) << rows << "x" << k << " " << with_bias;
          }
        }
      }
    }
  }
}

TEST(SkinnyGemmTest, ColumnBlocksAndThreadsGiveTheSameBits) {
  Problem p(3, 300, 97);
  SkinnyGemm g = p.gemm();
  skinny_gemm_columns(g, 0, p.n);
  const std::vector<float> whole = p.c;
  for (std::int64_t block : {1, 5, 32, 96}) {
    std::fill(p.c.begin(), p.c.end(), -1.0f);
    for (std::int64_t begin = 0; begin < p.n; begin += block)
      skinny_gemm_columns(g, begin, std::min(p.n, begin + block));
    for (std::size_t i = 0; i < whole.size(); ++i) ASSERT_EQ(bits(p.c[i]), bits(whole[i])) << block << " " << i;
  }
  std::fill(p.c.begin(), p.c.end(), -1.0f);
  std::thread helper([&] { skinny_gemm_columns(g, 40, p.n); });
  skinny_gemm_columns(g, 0, 40);
  helper.join();
  for (std::size_t i = 0; i < whole.size(); ++i) ASSERT_EQ(bits(p.c[i]), bits(whole[i])) << i;
}

TEST(SkinnyGemmTest, BiasAlphaAndBetaFollowTheBlas) {
  Problem p(2, 40, 9);
  SkinnyGemm plain = p.gemm();
  skinny_gemm_columns(plain, 0, p.n);
  const std::vector<float> product = p.c;
  // A full (rows x n) bias, a row vector broadcast over rows, beta and alpha.
  struct Case {
    std::int64_t row_stride;
    float alpha, beta;
  };
  for (const Case& c : {Case{p.n, 1.0f, 1.0f}, Case{0, 1.0f, 1.0f}, Case{p.n, -2.0f, 0.5f}, Case{0, 3.0f, 1.0f}}) {
    SkinnyGemm g = p.gemm();
    g.bias = p.bias.data();
    g.bias_row_stride = c.row_stride;
    g.bias_n_stride = 1;
    g.alpha = c.alpha;
    g.beta = c.beta;
    skinny_gemm_columns(g, 0, p.n);
    for (std::int64_t r = 0; r < p.rows; ++r) {
      for (std::int64_t col = 0; col < p.n; ++col) {
        const float bias = p.bias[r * c.row_stride + col];
        const float scaled = c.alpha == 1.0f ? product[r * p.n + col] : c.alpha * product[r * p.n + col];
        const float want = (c.beta == 1.0f ? bias : c.beta * bias) + scaled;
        ASSERT_EQ(bits(p.c[r * p.n + col]), bits(want)) << c.row_stride << " " << c.alpha << " " << c.beta;
      }
    }
  }
  // beta = 0: the bias is not read, so a NaN in it does not reach C.
  std::fill(p.bias.begin(), p.bias.end(), std::numeric_limits<float>::quiet_NaN());
  SkinnyGemm g = p.gemm();
  g.bias = p.bias.data();
  g.bias_row_stride = p.n;
  g.bias_n_stride = 1;
  g.beta = 0.0f;
  skinny_gemm_columns(g, 0, p.n);
  for (std::size_t i = 0; i < product.size(); ++i) ASSERT_EQ(bits(p.c[i]), bits(product[i])) << i;
}

TEST(SkinnyGemmTest, NonFiniteValuesPropagateAsInADotProduct) {
  Problem p(1, 20, 3);
  p.a[4] = std::numeric_limits<float>::infinity();
  p.w[0 * 20 + 4] = 0.0f;  // inf * 0: NaN in column 0
  p.w[2 * 20 + 3] = std::numeric_limits<float>::quiet_NaN();
  SkinnyGemm g = p.gemm();
  skinny_gemm_columns(g, 0, p.n);
  EXPECT_TRUE(std::isnan(p.c[0]));
  EXPECT_TRUE(std::isinf(p.c[1]));
  EXPECT_TRUE(std::isnan(p.c[2]));
}

TEST(SkinnyGemmTest, RefusesShapesAndLayoutsItDoesNotTake) {
  Problem p(1, 8, 4);
  SkinnyGemm g = p.gemm();
  EXPECT_TRUE(skinny_gemm_accepts(g));
  g.rows = 0;
  EXPECT_FALSE(skinny_gemm_accepts(g));
  g.rows = kSkinnyGemmMaxRows + 1;
  EXPECT_FALSE(skinny_gemm_accepts(g));
  g = p.gemm();
  g.b_k_stride = 4;  // row-major B
  g.b_n_stride = 1;
  EXPECT_FALSE(skinny_gemm_accepts(g));
  g = p.gemm();
  g.c = nullptr;
  EXPECT_FALSE(skinny_gemm_accepts(g));
  g = p.gemm();
  g.alpha = 0.0f;  // the BLAS reads neither A nor B then
  EXPECT_FALSE(skinny_gemm_accepts(g));
}

TEST(SkinnyGemmTest, AScaledProductWithoutABiasHasMklsSignOfZero) {
  Problem p(1, 16, 4);
  std::fill(p.a.begin(), p.a.end(), 0.0f);  // every product +0
  SkinnyGemm g = p.gemm();
  g.alpha = -1.0f;
  skinny_gemm_columns(g, 0, p.n);
  for (float v : p.c) EXPECT_EQ(bits(v), bits(0.0f));  // -1 * (+0) + 0 = +0
  g.bias = p.bias.data();
  g.bias_n_stride = 1;
  g.beta = 0.0f;  // a bias not read: the same
  skinny_gemm_columns(g, 0, p.n);
  for (float v : p.c) EXPECT_EQ(bits(v), bits(0.0f));
}

}  // namespace
}  // namespace vtpu::runtime
