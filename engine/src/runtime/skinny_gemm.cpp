#include "vtpu/runtime/skinny_gemm.h"

#include <cstring>

#include "vtpu/ir/half.h"

namespace vtpu::runtime {
namespace {

// Eight floats, one AVX register or two SSE ones: the same lane arithmetic
// in either (GCC's vector extension, lowered per target).
using Vec8 = float __attribute__((vector_size(32)));
using U16x8 = std::uint16_t __attribute__((vector_size(16)));
using U32x8 = std::uint32_t __attribute__((vector_size(32)));

// bfloat16 as its bits; float32 as itself.
struct BFloat16 {
  std::uint16_t bits;
};

[[gnu::always_inline]] inline float to_float(float v) { return v; }
[[gnu::always_inline]] inline float to_float(BFloat16 v) {
  const std::uint32_t bits = static_cast<std::uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

[[gnu::always_inline]] inline void store(float* p, float v) { *p = v; }
[[gnu::always_inline]] inline void store(BFloat16* p, float v) { p->bits = ir::float_to_bfloat16_bits(v); }

// Eight consecutive elements as floats (bfloat16 widened exactly).
[[gnu::always_inline]] inline Vec8 load8(const float* p) {
  Vec8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline Vec8 load8(const BFloat16* p) {
  U16x8 half;
  std::memcpy(&half, p, sizeof half);
  const U32x8 wide = __builtin_convertvector(half, U32x8) << 16;
  Vec8 v;
  std::memcpy(&v, &wide, sizeof v);
  return v;
}

// Lanes of partial sums per dot product: element j of the summed dimension
// goes to lane j % lanes; the lanes are added in a fixed tree at the end,
// then the tail in order. One row of A: 16 lanes (a cache line of float32 B
// per step, two accumulators to hide the adds' latency). More rows: 8 lanes
// each, so that the partial sums of 8 rows stay in 8 AVX registers.
template <int R>
constexpr int kLanes = R == 1 ? 16 : 8;

template <int L>
[[gnu::always_inline]] inline float lane_sum(const Vec8* vectors) {
  float lanes[L];
  std::memcpy(lanes, vectors, sizeof lanes);
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = L == 16 ? lanes[i] + lanes[i + 8] : lanes[i];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// alpha * product + beta * bias in float32 with MKL's rounding steps: the
// product is scaled only when alpha is not 1, the bias added only when beta
// is not 0. A scaled product without a bias is added to +0, as MKL adds it to
// a cleared result: -1 * (+0) gives +0 there, not -0 (found by review).
template <typename T>
[[gnu::always_inline]] inline float finish(const SkinnyGemm& g, std::int64_t row, std::int64_t col, float product) {
  const bool with_bias = g.bias != nullptr && g.beta != 0.0f;
  float v = product;
  if (g.alpha != 1.0f) {
    v = g.alpha * product;
    if (!with_bias) v += 0.0f;
  }
  if (with_bias) {
    const float bias = to_float(static_cast<const T*>(g.bias)[row * g.bias_row_stride + col * g.bias_n_stride]);
    v = (g.beta == 1.0f ? bias : g.beta * bias) + v;
  }
  return v;
}

// C[r, col] = dot(A[r, :], B[:, col]) for R rows of A at once: each column
// of B is read once for all of them. Products and sums in float32.
template <typename T, int R>
[[gnu::always_inline]] inline void dot_columns(const SkinnyGemm& g, std::int64_t begin, std::int64_t end) {
  constexpr int L = kLanes<R>;
  constexpr int V = L / 8;  // vectors of lanes per row
  const T* a = static_cast<const T*>(g.a);
  const T* b = static_cast<const T*>(g.b);
  T* c = static_cast<T*>(g.c);
  const std::int64_t k = g.k;
  const std::int64_t body = k - k % L;
  for (std::int64_t col = begin; col < end; ++col) {
    const T* w = b + col * g.b_n_stride;
    Vec8 acc[R][V] = {};
    for (std::int64_t j = 0; j < body; j += L) {
      Vec8 wv[V];
      for (int v = 0; v < V; ++v) wv[v] = load8(w + j + 8 * v);
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) acc[r][v] += load8(a + r * g.a_row_stride + j + 8 * v) * wv[v];
    }
    for (int r = 0; r < R; ++r) {
      const T* x = a + r * g.a_row_stride;
      float s = lane_sum<L>(acc[r]);
      for (std::int64_t j = body; j < k; ++j) s += to_float(x[j]) * to_float(w[j]);
      store(c + r * g.c_row_stride + col, finish<T>(g, r, col, s));
    }
  }
}

template <typename T>
[[gnu::always_inline]] inline void columns(const SkinnyGemm& g, std::int64_t begin, std::int64_t end) {
  switch (g.rows) {
    case 1: dot_columns<T, 1>(g, begin, end); break;
    case 2: dot_columns<T, 2>(g, begin, end); break;
    case 3: dot_columns<T, 3>(g, begin, end); break;
    case 4: dot_columns<T, 4>(g, begin, end); break;
    case 5: dot_columns<T, 5>(g, begin, end); break;
    case 6: dot_columns<T, 6>(g, begin, end); break;
    case 7: dot_columns<T, 7>(g, begin, end); break;
    case 8: dot_columns<T, 8>(g, begin, end); break;
    default: break;
  }
}

}  // namespace

bool skinny_gemm_accepts(const SkinnyGemm& g) {
  // alpha = 0: the BLAS does not read A or B at all (NaN in them must not
  // reach C); not this kernel's case.
  return g.rows >= 1 && g.rows <= kSkinnyGemmMaxRows && g.k >= 0 && g.n >= 0 && g.a != nullptr &&
         g.b != nullptr && g.c != nullptr && g.b_k_stride == 1 && g.alpha != 0.0f;
}

// Compiled for AVX2 as well as the baseline; the loader picks one per
// machine. Without contraction (CMake: -ffp-contract=off) both give the
// same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
void skinny_gemm_columns(const SkinnyGemm& g, std::int64_t begin, std::int64_t end) {
  if (g.dtype == SkinnyGemmDtype::kBFloat16) columns<BFloat16>(g, begin, end);
  else columns<float>(g, begin, end);
}

}  // namespace vtpu::runtime
