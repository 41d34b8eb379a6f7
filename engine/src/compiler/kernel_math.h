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
// sigmoid <= 2.5 ulp over their whole float range; sin and cos <= 0.5002 ulp
// for |x| <= 2^24 (the C library beyond). ATen's vectorised kernels (SLEEF,
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

// v * 2^n for an integral n in [-151, 129], in two steps so that a result in
// the subnormal range is rounded once.
static inline VTPU_KERNEL_FN float vtpu_times_pow2(float v, float n) {
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni >> 1;  // floor(n / 2): a shift (ni / 2 costs two more vector ops)
  const int32_t n2 = ni - n1;
  return v * vtpu_f32_from_bits(static_cast<uint32_t>(n1 + 127) << 23) *
         vtpu_f32_from_bits(static_cast<uint32_t>(n2 + 127) << 23);
}

// x = m 2^e with m in [sqrt(1/2), sqrt(2)) (subnormals scaled into the normal
// range first): returns m - 1 and sets *e. For x > 0 finite.
static inline VTPU_KERNEL_FN float vtpu_split_log_argument(float x, int32_t* e) {
  const bool subnormal = x < 1.17549435e-38f;
  const float xs = subnormal ? x * 8388608.0f : x;
  const uint32_t u = vtpu_f32_bits(xs);
  int32_t exponent = static_cast<int32_t>((u >> 23) & 0xffu) - 127 - (subnormal ? 23 : 0);
  float m = vtpu_f32_from_bits((u & 0x007fffffu) | 0x3f800000u);  // [1, 2)
  const bool high = m > 1.41421356237f;
  m = high ? m * 0.5f : m;
  *e = high ? exponent + 1 : exponent;
  return m - 1.0f;
}

// Cephes' single precision logf polynomial p(f): log(1 + f) = f - f^2/2 + f^3 p(f).
static inline VTPU_KERNEL_FN float vtpu_log_poly(float f) {
  float p = 7.0376836292e-2f;
  p = std::fma(p, f, -1.1514610310e-1f);
  p = std::fma(p, f, 1.1676998740e-1f);
  p = std::fma(p, f, -1.2420140846e-1f);
  p = std::fma(p, f, 1.4249322787e-1f);
  p = std::fma(p, f, -1.6668057665e-1f);
  p = std::fma(p, f, 2.0000714765e-1f);
  p = std::fma(p, f, -2.4999993993e-1f);
  return std::fma(p, f, 3.3333331174e-1f);
}

// e^x = 2^n e^r: n = round(x / ln2) (the 1.5 * 2^23 trick, plain
// arithmetic), r = x - n ln2 with ln2 in two parts so that n * ln2_hi is
// exact. Returns e^r and sets *n.
static inline VTPU_KERNEL_FN float vtpu_exp_parts(float x, float* n) {
  *n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = std::fma(*n, -0.693145751953125f, x);
  r = std::fma(*n, -1.428606765330187045e-06f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  return std::fma(p, r * r, r) + 1.0f;
}

static inline VTPU_KERNEL_FN float vtpu_exp(float x) {
  // Clamp first (NaN goes to the low end; it is restored at the end) so that
  // n stays in [-150, 129] and the integer conversions are defined.
  float xc = x > -104.0f ? x : -104.0f;
  xc = xc < 89.0f ? xc : 89.0f;
  float n;
  const float e_r = vtpu_exp_parts(xc, &n);
  return x != x ? x : vtpu_times_pow2(e_r, n);
}

// vtpu_exp for an x (not NaN) whose e^x is a normal float, about [-87, 88]:
// no clamps and one scaling step, the same bits (erf's inner exponential,
// ~10 of its ~50 vector operations saved).
static inline VTPU_KERNEL_FN float vtpu_exp_of_normal(float x) {
  float n;
  const float e_r = vtpu_exp_parts(x, &n);
  return e_r * vtpu_f32_from_bits(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
}

static inline VTPU_KERNEL_FN float vtpu_log(float x) {
  int32_t e;
  const float f = vtpu_split_log_argument(x, &e);
  const float z = f * f;
  const float p = vtpu_log_poly(f);
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
  const float large = vtpu_copysign_of(1.0f - vtpu_exp_of_normal(q), x);  // q in [-18.2, -1.6]
  const float result = (s < 0.921875f * 0.921875f) ? small : large;
  return x != x ? x : result;
}

// exp2, log2, log1p, expm1 (float arithmetic) and atan2, atan (double
// arithmetic rounded once): over all 2^32 float inputs (atan2: 33.5M pairs
// and the special-value grid) within 0.95, 1.16, 0.90, 0.95 and 0.50 ulp
// of the correctly rounded result; std:: took 5-17x ATen's time for these
// (scalar calls in a vectorised loop). Coefficients: log1p's and log2's
// polynomial is Cephes' logf one (as vtpu_log); exp2's, expm1's and atan's
// minimax ones were fitted for vTPU.
// 2^x: x = n + r with n = round(x) (exact), 2^r = 1 + r q(r) on [-1/2, 1/2]
// (minimax, relative error 2e-9), then scaled by 2^n in two steps so that a
// subnormal result is rounded once.
static inline VTPU_KERNEL_FN float vtpu_exp2(float x) {
  float xc = x > -151.0f ? x : -151.0f;  // NaN goes low; restored at the end
  xc = xc < 129.0f ? xc : 129.0f;
  const float n = (xc + 12582912.0f) - 12582912.0f;
  const float r = xc - n;  // exact, in [-1/2, 1/2]
  float q = 1.53533620e-4f;
  q = std::fma(q, r, 1.33988739e-3f);
  q = std::fma(q, r, 9.61843692e-3f);
  q = std::fma(q, r, 5.55033237e-2f);
  q = std::fma(q, r, 2.40226477e-1f);
  q = std::fma(q, r, 6.93147182e-1f);
  const float e_r = std::fma(q, r, 1.0f);
  return x != x ? x : vtpu_times_pow2(e_r, n);
}

// Shared by log2 and log1p: for m in [sqrt(1/2), sqrt(2)) and f = m - 1,
// log(1 + f) = f + y with y = -f^2/2 + f^3 p(f) (Cephes' logf polynomial, as
// vtpu_log).
static inline VTPU_KERNEL_FN float vtpu_log1p_tail(float f) {
  const float z = f * f;
  return std::fma(z, -0.5f, f * z * vtpu_log_poly(f));
}

// log2: x = m 2^e exactly (m in [sqrt(1/2), sqrt(2))), log2(m) = (f + y) log2(e)
// with the product f*log2(e) kept as hi + lo (fma) and e + hi summed exactly,
// so powers of two give exact integers.
static inline VTPU_KERNEL_FN float vtpu_log2(float x) {
  int32_t e;
  const float f = vtpu_split_log_argument(x, &e);
  const float y = vtpu_log1p_tail(f);
  const float L = 1.44269502f, Llo = 1.92596303e-08f;  // log2(e) = L + Llo
  const float hi = f * L;
  const float lo = std::fma(f, L, -hi) + std::fma(f, Llo, y * L);
  const float ef = static_cast<float>(e);
  const float s = ef + hi;           // |ef| >= 1 > |hi| or ef == 0: fast two-sum
  const float c = hi - (s - ef);
  float result = s + (c + lo);
  result = x == INFINITY ? x : result;
  result = x == 0.0f ? -INFINITY : result;
  result = x < 0.0f ? NAN : result;
  return x != x ? x : result;
}

// log1p: u = 1 + x rounded, with its rounding error c (two-sum, exact);
// log(1 + x) = log(u) + c/u, log(u) = e ln2 + log(1 + f) as in vtpu_log.
static inline VTPU_KERNEL_FN float vtpu_log1p(float x) {
  const float uu = 1.0f + x;
  const float bb = uu - 1.0f;
  const float c = (1.0f - (uu - bb)) + (x - bb);  // 1 + x = uu + c exactly
  // uu >= 2^-24 for x > -1, so it is normal; other x are fixed below.
  const uint32_t ub = vtpu_f32_bits(uu);
  int32_t e = static_cast<int32_t>((ub >> 23) & 0xffu) - 127;
  float m = vtpu_f32_from_bits((ub & 0x007fffffu) | 0x3f800000u);
  const bool high = m > 1.41421356237f;
  m = high ? m * 0.5f : m;
  e = high ? e + 1 : e;
  const float f = m - 1.0f;
  const float ef = static_cast<float>(e);
  float y = vtpu_log1p_tail(f);
  y = y + std::fma(ef, -2.12194440e-4f, c / uu);
  float result = std::fma(ef, 0.693359375f, f + y);
  result = x == 0.0f ? x : result;  // keeps -0
  result = x == INFINITY ? x : result;
  result = x == -1.0f ? -INFINITY : result;
  result = x < -1.0f ? NAN : result;
  return x != x ? x : result;
}

// expm1: x = n ln2 + r (n = 0 for |x| < 0.41, else round(x/ln2)), em =
// expm1(r) = r + t, t = r^2 (1/2 + r q(r)) (minimax on [-0.42, 0.42]), then
// 2^n expm1(r) + (2^n - 1), evaluated as 2 (2^(n-1) r + (2^(n-1) - 1/2) +
// 2^(n-1) t) with the large terms summed exactly (no early overflow at n = 128,
// one final rounding), or as (2^n + 2^n expm1(r)) - 1 for n <= -2.
static inline VTPU_KERNEL_FN float vtpu_expm1(float x) {
  float xc = x > -18.0f ? x : -18.0f;  // NaN goes low; restored at the end
  xc = xc < 89.0f ? xc : 89.0f;
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float ax = vtpu_f32_from_bits(vtpu_f32_bits(x) & 0x7fffffffu);
  n = ax < 0.41f ? 0.0f : n;
  float r = std::fma(n, -0.693145751953125f, xc);
  r = std::fma(n, -1.428606765330187045e-06f, r);
  float q = 1.98162030e-4f;
  q = std::fma(q, r, 1.39540352e-3f);
  q = std::fma(q, r, 8.33351910e-3f);
  q = std::fma(q, r, 4.16662693e-2f);
  q = std::fma(q, r, 1.66666657e-1f);
  const float h = std::fma(q, r, 0.5f);
  const float t = (r * r) * h;  // expm1(r) = r + t
  const int32_t ni = static_cast<int32_t>(n);  // in [-26, 128]
  const float s = vtpu_f32_from_bits(static_cast<uint32_t>(ni + 127) << 23);       // 2^n (used for n <= -2)
  const float sh = vtpu_f32_from_bits(static_cast<uint32_t>(ni - 1 + 127) << 23);  // 2^(n-1)
  // n >= -1: expm1(x) / 2 = sh r + (sh - 1/2) + sh t, the first two summed
  // exactly (two-sum) so that only the final addition rounds.
  const float b = sh - 0.5f;
  const float be = (sh - b) - 0.5f;  // sh - 1/2 = b + be exactly
  const float a = sh * r;            // exact
  const float A = a + b;
  const float bv = A - a;
  const float Ae = (a - (A - bv)) + (b - bv);  // a + b = A + Ae exactly
  const float lo = std::fma(sh, t, Ae + be);
  const float big = 2.0f * (A + lo);
  const float small = std::fma(s, r + t, s) - 1.0f;
  float result = ni <= -2 ? small : big;
  result = ax < 2.98023224e-8f ? x : result;  // |x| < 2^-25: x (keeps -0, subnormals)
  return x != x ? x : result;
}

// atan2 in double: t = min(|x|,|y|) / max(|x|,|y|) in [0, 1]; above
// tan(pi/8), atan(t) = pi/4 + atan((min - max) / (min + max)) (one division
// either way); atan(u) = u + u^3 P(u^2) on [-tan(pi/8), tan(pi/8)] (minimax,
// relative error 8e-13); then pi/2 - a if |y| > |x|, pi - a if x < 0 (or -0),
// and the sign of y, rounded once to float.
static inline VTPU_KERNEL_FN float vtpu_atan2(float y, float x) {
  const double ax = static_cast<double>(vtpu_f32_from_bits(vtpu_f32_bits(x) & 0x7fffffffu));
  const double ay = static_cast<double>(vtpu_f32_from_bits(vtpu_f32_bits(y) & 0x7fffffffu));
  const bool swap = ay > ax;
  double num = swap ? ax : ay;
  double den = swap ? ay : ax;
  const bool both_inf = num == INFINITY;  // then den is inf too
  num = both_inf ? 1.0 : num;
  den = both_inf ? 1.0 : den;
  den = den == 0.0 ? 1.0 : den;  // atan2(+-0, +-0): t = 0
  const bool upper = num > 0x1.a827999fcef32p-2 * den;  // tan(pi/8)
  const double u = (upper ? num - den : num) / (upper ? num + den : den);
  const double s = u * u;
  double p = -0x1.36adf8e89115bp-5;
  p = std::fma(p, s, 0x1.1e5c782f92330p-4);
  p = std::fma(p, s, -0x1.7082c14436fcap-4);
  p = std::fma(p, s, 0x1.c6d1eca074586p-4);
  p = std::fma(p, s, -0x1.2490c30c8abf3p-3);
  p = std::fma(p, s, 0x1.999991fc4cf43p-3);
  p = std::fma(p, s, -0x1.5555554edf7fdp-2);
  double a = std::fma(u * s, p, u);
  a = upper ? a + 0x1.921fb54442d18p-1 : a;                 // + pi/4
  a = swap ? 0x1.921fb54442d18p+0 - a : a;                  // pi/2 - a
  a = (vtpu_f32_bits(x) >> 31) ? 0x1.921fb54442d18p+1 - a : a;  // pi - a
  const float result = vtpu_copysign_of(static_cast<float>(a), y);
  return x != x ? x : (y != y ? y : result);
}

static inline VTPU_KERNEL_FN float vtpu_atan(float x) { return vtpu_atan2(x, 1.0f); }

// sin and cos (since 2026-12-07; before, the C library's scalar calls took
// 2.5-18x ATen's time). x = k pi/2 + r in double: k = round(x 2/pi) (the
// 1.5 * 2^52 trick, whose low bits are k mod 4), pi/2 in three parts, the
// first two of 29 bits so that k times them is exact for |k| < 2^24; then
// Taylor polynomials of sin r and cos r (|r| <= pi/4: truncation below 1e-11
// relative), the quadrant's one chosen and signed, rounded once to float.
// Measured over every float with |x| <= 2^24 (engine/tests/kernel_math_test.cpp
// samples them): within 0.5 ulp plus a hair of the correctly rounded result.
// Above 2^24 (and for inf/NaN) the reduction would need more bits of pi than
// a double carries, so those arguments go to the C library; the generated
// kernels test a group of lanes first and take the vectorised path when no
// lane needs the library (host_codegen.cpp, "vtpu_trig_needs_library").
static inline VTPU_KERNEL_FN bool vtpu_trig_needs_library(float x) { return !(std::fabs(x) <= 16777216.0f); }

// sin(x + quarter_turns pi/2) for |x| <= 2^24.
static inline VTPU_KERNEL_FN float vtpu_sin_quarter_turns(float x, uint64_t quarter_turns) {
  const double xd = static_cast<double>(x);
  const double shifted = std::fma(xd, 0x1.45f306dc9c883p-1, 0x1.8p52);  // x 2/pi + 1.5 * 2^52
  const double k = shifted - 0x1.8p52;
  const uint64_t quadrant = __builtin_bit_cast(uint64_t, shifted) + quarter_turns;
  double r = std::fma(-k, 0x1.921fb54000000p+0, xd);  // exact (Sterbenz)
  r = std::fma(-k, 0x1.10b4612000000p-30, r);
  r = std::fma(-k, -0x1.676733ae8fe48p-60, r);
  const double z = r * r;
  double s = -2.505210838544172e-08;  // -1/11!
  s = std::fma(s, z, 2.7557319223985893e-06);
  s = std::fma(s, z, -1.984126984126984e-04);
  s = std::fma(s, z, 8.333333333333333e-03);
  s = std::fma(s, z, -1.6666666666666666e-01);
  const double sin_r = std::fma(r * z, s, r);
  double c = 2.08767569878681e-09;  // 1/12!
  c = std::fma(c, z, -2.755731922398589e-07);
  c = std::fma(c, z, 2.48015873015873e-05);
  c = std::fma(c, z, -1.388888888888889e-03);
  c = std::fma(c, z, 4.1666666666666664e-02);
  c = std::fma(c, z, -0.5);
  const double cos_r = std::fma(c, z, 1.0);
  double v = (quadrant & 1) ? cos_r : sin_r;
  v = (quadrant & 2) ? -v : v;
  return static_cast<float>(v);
}
// x = -0: r + r^3 s(z) adds a +0 to -0, which rounds to +0; sin keeps the
// sign of a zero.
static inline VTPU_KERNEL_FN float vtpu_sin_reduced(float x) { return x == 0.0f ? x : vtpu_sin_quarter_turns(x, 0); }
static inline VTPU_KERNEL_FN float vtpu_cos_reduced(float x) { return vtpu_sin_quarter_turns(x, 1); }
static inline VTPU_KERNEL_FN float vtpu_sin(float x) {
  return vtpu_trig_needs_library(x) ? std::sin(x) : vtpu_sin_reduced(x);
}
static inline VTPU_KERNEL_FN float vtpu_cos(float x) {
  return vtpu_trig_needs_library(x) ? std::cos(x) : vtpu_cos_reduced(x);
}

// Double precision and anything else: the C library.
template <typename T> static inline VTPU_KERNEL_FN T vtpu_exp2(T x) { return std::exp2(x); }
template <typename T> static inline VTPU_KERNEL_FN T vtpu_log2(T x) { return std::log2(x); }
template <typename T> static inline VTPU_KERNEL_FN T vtpu_log1p(T x) { return std::log1p(x); }
template <typename T> static inline VTPU_KERNEL_FN T vtpu_expm1(T x) { return std::expm1(x); }
template <typename T> static inline VTPU_KERNEL_FN T vtpu_atan(T x) { return std::atan(x); }
template <typename T> static inline VTPU_KERNEL_FN T vtpu_atan2(T y, T x) { return std::atan2(y, x); }
template <typename T> static inline VTPU_KERNEL_FN T vtpu_sin(T x) { return std::sin(x); }
template <typename T> static inline VTPU_KERNEL_FN T vtpu_cos(T x) { return std::cos(x); }
template <typename T> static inline VTPU_KERNEL_FN T vtpu_exp(T x) { return std::exp(x); }
template <typename T> static inline VTPU_KERNEL_FN T vtpu_log(T x) { return std::log(x); }
template <typename T> static inline VTPU_KERNEL_FN T vtpu_tanh(T x) { return std::tanh(x); }
template <typename T> static inline VTPU_KERNEL_FN T vtpu_erf(T x) { return std::erf(x); }
template <typename T> static inline VTPU_KERNEL_FN T vtpu_sigmoid(T x) {
  const T s = T(1) / (T(1) + std::exp(-x));
  return x != x ? x : s;  // a NaN keeps its sign (see the float version)
}
