// Float32 transcendental functions for generated kernels, written so that the
// compiler vectorises them: straight-line arithmetic (fma, bit casts, selects),
// no calls, no branches. The same source runs in the vector body and in the
// scalar remainder of a loop, and kernels are built with -ffp-contract=off,
// so an element's result never depends on where in the loop (or on which
// thread) it was computed.
//
// This file is both a header (the engine's accuracy tests include it) and the
// source text pasted into every generated kernel (CMake embeds it), so it must
// stay self-contained. Double precision uses <cmath>.
//
// Accuracy against a correctly rounded result, measured by
// engine/tests/kernel_math_test.cpp: exp, log <= 1.05 ulp, tanh, erf <= 2 ulp,
// sigmoid <= 2.5 ulp over their whole float range. ATen's vectorised kernels (SLEEF,
// 1.0 ulp) land within the OpInfo tolerance of these.
//
// Method: exp reduces x = n ln2 + r (ln2 split in two parts so that n*ln2_hi
// is exact) and evaluates a degree-6 polynomial of r, then scales by 2^n in
// two steps so that results in the subnormal range are rounded once; log
// splits x = m 2^e with m in [sqrt(1/2), sqrt(2)); tanh uses an odd
// polynomial below 0.625 and 1 - 2/(e^{2|x|} + 1) above; erf an odd
// polynomial below 0.921875 and 1 - exp(q(|x|)) above. The polynomial
// coefficients for exp, log and small-|x| tanh are Cephes' published single
// precision ones; erf's were fitted for vTPU (least squares on Chebyshev
// nodes, numpy, double precision).
#pragma once

#include <cmath>
#include <cstdint>

// Empty for the host; the cuda target's kernels define it as __device__ so
// that its kernels compute these functions with the same operations, and so
// the same bits, as the host's (engine/src/compiler/cuda_codegen.cpp).
// (Forcing these helpers inline on the host sped up a 48-op sigmoid/tanh
// chain 9x but made a fused GELU-backward-and-sum reduction of compiled mode
// 6x slower: left to GCC. A kernel's element function is always inlined.)
#ifndef VTPU_KERNEL_FN
#define VTPU_KERNEL_FN
#endif

static inline VTPU_KERNEL_FN float vtpu_f32_from_bits(uint32_t u) { return __builtin_bit_cast(float, u); }
static inline VTPU_KERNEL_FN uint32_t vtpu_f32_bits(float f) { return __builtin_bit_cast(uint32_t, f); }

static inline VTPU_KERNEL_FN float vtpu_exp(float x) {
  // Clamp first (NaN goes to the low end; it is restored at the end) so that
  // n stays in [-150, 129] and the integer conversions are defined.
  float xc = x > -104.0f ? x : -104.0f;
  xc = xc < 89.0f ? xc : 89.0f;
  // Round to nearest integer by the 1.5 * 2^23 trick (plain arithmetic).
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = std::fma(n, -0.693145751953125f, xc);
  r = std::fma(n, -1.428606765330187045e-06f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  const float e_r = std::fma(p, r * r, r) + 1.0f;
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni / 2;
  const int32_t n2 = ni - n1;
  const float scaled = e_r * vtpu_f32_from_bits(static_cast<uint32_t>(n1 + 127) << 23) *
                       vtpu_f32_from_bits(static_cast<uint32_t>(n2 + 127) << 23);
  return x != x ? x : scaled;
}

static inline VTPU_KERNEL_FN float vtpu_log(float x) {
  // Subnormal inputs are scaled into the normal range first.
  const bool subnormal = x < 1.17549435e-38f;
  const float xs = subnormal ? x * 8388608.0f : x;
  const uint32_t u = vtpu_f32_bits(xs);
  int32_t e = static_cast<int32_t>((u >> 23) & 0xffu) - 127 - (subnormal ? 23 : 0);
  float m = vtpu_f32_from_bits((u & 0x007fffffu) | 0x3f800000u);  // [1, 2)
  const bool high = m > 1.41421356237f;
  m = high ? m * 0.5f : m;
  e = high ? e + 1 : e;
  const float f = m - 1.0f;
  const float z = f * f;
  float p = 7.0376836292e-2f;
  p = std::fma(p, f, -1.1514610310e-1f);
  p = std::fma(p, f, 1.1676998740e-1f);
  p = std::fma(p, f, -1.2420140846e-1f);
  p = std::fma(p, f, 1.4249322787e-1f);
  p = std::fma(p, f, -1.6668057665e-1f);
  p = std::fma(p, f, 2.0000714765e-1f);
  p = std::fma(p, f, -2.4999993993e-1f);
  p = std::fma(p, f, 3.3333331174e-1f);
  const float ef = static_cast<float>(e);
  float y = f * z * p;
  y = std::fma(ef, -2.12194440e-4f, y);
  y = std::fma(z, -0.5f, y);
  float result = std::fma(ef, 0.693359375f, f + y);
  result = x == INFINITY ? x : result;
  result = x == 0.0f ? -INFINITY : result;
  result = x < 0.0f ? NAN : result;
  return x != x ? x : result;
}

static inline VTPU_KERNEL_FN float vtpu_copysign_of(float magnitude, float sign_source) {
  return vtpu_f32_from_bits((vtpu_f32_bits(magnitude) & 0x7fffffffu) | (vtpu_f32_bits(sign_source) & 0x80000000u));
}

static inline VTPU_KERNEL_FN float vtpu_tanh(float x) {
  const float a = vtpu_f32_from_bits(vtpu_f32_bits(x) & 0x7fffffffu);
  const float s = x * x;
  float p = -5.70498872745e-3f;
  p = std::fma(p, s, 2.06390887954e-2f);
  p = std::fma(p, s, -5.37397155531e-2f);
  p = std::fma(p, s, 1.33314422036e-1f);
  p = std::fma(p, s, -3.33332819422e-1f);
  const float small = std::fma(x * s, p, x);
  const float large = vtpu_copysign_of(1.0f - 2.0f / (vtpu_exp(2.0f * a) + 1.0f), x);
  const float result = a < 0.625f ? small : large;  // NaN takes the second branch and stays NaN
  return x == 0.0f ? x : result;                    // keeps the sign of -0
}

// A NaN input comes back as it is: -x flips a NaN's sign bit, and which of
// two NaN operands a product returns is the compiler's choice (it may commute
// x * sigmoid(x)), so silu(NaN) took either sign depending on the kernel it
// was fused into (fused and strict differed in the sign bit).
static inline VTPU_KERNEL_FN float vtpu_sigmoid(float x) {
  const float s = 1.0f / (1.0f + vtpu_exp(-x));
  return x != x ? x : s;
}

static inline VTPU_KERNEL_FN float vtpu_erf(float x) {
  const float s = x * x;
  float p = -6.04715129489755e-4f;
  p = std::fma(p, s, 5.005624409689818e-3f);
  p = std::fma(p, s, -2.677640087673995e-2f);
  p = std::fma(p, s, 1.1282139748214363e-1f);
  p = std::fma(p, s, -3.761253383275778e-1f);
  p = std::fma(p, s, 1.283791602507274e-1f);
  const float small = std::fma(x, p, x);
  float t = vtpu_f32_from_bits(vtpu_f32_bits(x) & 0x7fffffffu);
  t = t < 3.92f ? t : 3.92f;  // erf rounds to 1 beyond; NaN is restored below
  float q = 1.6369182179109154e-6f;
  q = std::fma(q, t, -4.601827284182816e-5f);
  q = std::fma(q, t, 5.961714173087497e-4f);
  q = std::fma(q, t, -4.755216836426313e-3f);
  q = std::fma(q, t, 2.640468492291263e-2f);
  q = std::fma(q, t, -1.1004408412727679e-1f);
  q = std::fma(q, t, -6.318717429800289e-1f);
  q = std::fma(q, t, -1.1302023723530337f);
  q = std::fma(q, t, 3.1142617901769147e-4f);
  const float large = vtpu_copysign_of(1.0f - vtpu_exp(q), x);
  const float result = (s < 0.921875f * 0.921875f) ? small : large;
  return x != x ? x : result;
}

// Double precision and anything else: the C library.
template <typename T> static inline VTPU_KERNEL_FN T vtpu_exp(T x) { return std::exp(x); }
template <typename T> static inline VTPU_KERNEL_FN T vtpu_log(T x) { return std::log(x); }
template <typename T> static inline VTPU_KERNEL_FN T vtpu_tanh(T x) { return std::tanh(x); }
template <typename T> static inline VTPU_KERNEL_FN T vtpu_erf(T x) { return std::erf(x); }
template <typename T> static inline VTPU_KERNEL_FN T vtpu_sigmoid(T x) {
  const T s = T(1) / (T(1) + std::exp(-x));
  return x != x ? x : s;  // a NaN keeps its sign (see the float version)
}
