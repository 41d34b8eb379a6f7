// The helpers that generated kernels of every target share: the few
// operations whose torch semantics differ from <cmath>'s or from a plain cast.
// Each function carries VTPU_KERNEL_FN (empty on the host, __device__ for the
// cuda target, kernel_math.h), so that both targets compute the same bits.
// They need the target's vtpu_half/vtpu_bf16 types and vtpu_load/vtpu_to_*
// conversions defined first.
#include "host_codegen_internal.h"

namespace vtpu::compiler::detail {

const char* const kPortableHelpersSource = R"HELPERS(
template <typename To> struct vtpu_store_t { template <typename From> static VTPU_KERNEL_FN To of(From v) { return (To)v; } };
template <> struct vtpu_store_t<vtpu_bf16> { template <typename From> static VTPU_KERNEL_FN vtpu_bf16 of(From v) { return vtpu_to_bf16((float)v); } };
template <> struct vtpu_store_t<vtpu_half> { template <typename From> static VTPU_KERNEL_FN vtpu_half of(From v) { return vtpu_to_half((float)v); } };
template <> struct vtpu_store_t<bool> { template <typename From> static VTPU_KERNEL_FN bool of(From v) { return v != From(0); } };
// v rounded to T's precision and read back in its compute type: what a trip
// through memory gives a later op. bfloat16's rounding stays in 32-bit lanes
// (vtpu_round_bf16); spelled through the 16-bit type, GCC packed and widened
// every rounded intermediate of a fused kernel (a bfloat16 AdamW step ran
// 1.7x longer in the pack, widen and shift instructions).
template <typename T> struct vtpu_round_t { template <typename From> static VTPU_KERNEL_FN auto of(From v) { return vtpu_load(vtpu_store_t<T>::of(v)); } };
template <> struct vtpu_round_t<vtpu_bf16> { template <typename From> static VTPU_KERNEL_FN float of(From v) { return vtpu_round_bf16((float)v); } };
template <typename T> static inline VTPU_KERNEL_FN T vtpu_max(T a, T b) { if constexpr (std::is_floating_point_v<T>) { if (a != a) return a; if (b != b) return b; } return a > b ? a : b; }
template <typename T> static inline VTPU_KERNEL_FN T vtpu_min(T a, T b) { if constexpr (std::is_floating_point_v<T>) { if (a != a) return a; if (b != b) return b; } return a < b ? a : b; }
// vtpu_max and vtpu_min as the combines of reductions: the host's lane loops
// recognise them by kVtpuExtremum (vtpu_extremum_groups) and take a faster
// path with the same bits.
struct vtpu_max_combine {
  static constexpr int kVtpuExtremum = 1;
  template <typename T> VTPU_KERNEL_FN T operator()(T a, T b) const { return vtpu_max(a, b); }
};
struct vtpu_min_combine {
  static constexpr int kVtpuExtremum = -1;
  template <typename T> VTPU_KERNEL_FN T operator()(T a, T b) const { return vtpu_min(a, b); }
};
// relu(-0.0) is -0.0 and relu(NaN) NaN, as ATen's clamp_min(x, 0) gives.
template <typename T> static inline VTPU_KERNEL_FN T vtpu_relu(T a) { return a < T(0) ? T(0) : a; }
// A float converted to an integer type as x86's truncating conversion does it
// (what ATen's CPU kernels get): through 32 bits for types up to 32 bits
// (64 for uint32, as GCC converts it), through 64 bits for the 64-bit types;
// NaN and values out of that range give the minimum of that width, which the
// narrowing then wraps. A plain static_cast is undefined there, and GCC folded
// float -> int -> float into a trunc inside one fused kernel (fused mode gave
// -1.0 for uint8(-1.5) read back as a float; strict, storing it, 255).
template <typename To, typename From> static inline VTPU_KERNEL_FN To vtpu_float_to_int(From x) {
  const double d = static_cast<double>(x);
  if constexpr (sizeof(To) == 8) {
    if constexpr (std::is_unsigned_v<To>) {
      if (d >= 9223372036854775808.0 && d < 18446744073709551616.0)
        return static_cast<To>(static_cast<uint64_t>(static_cast<int64_t>(d - 9223372036854775808.0)) ^ (uint64_t(1) << 63));
    }
    const int64_t w = (d >= -9223372036854775808.0 && d < 9223372036854775808.0) ? static_cast<int64_t>(d) : INT64_MIN;
    return static_cast<To>(w);
  } else if constexpr (sizeof(To) == 4 && std::is_unsigned_v<To>) {
    const int64_t w = (d >= -9223372036854775808.0 && d < 9223372036854775808.0) ? static_cast<int64_t>(d) : INT64_MIN;
    return static_cast<To>(w);
  } else {
    const int32_t w = (d > -2147483649.0 && d < 2147483648.0) ? static_cast<int32_t>(d) : INT32_MIN;
    return static_cast<To>(w);
  }
}
// Signed integer +, -, * and negation wrap, as in ATen's kernels. The host
// compiles with -fwrapv; nvcc has no such switch for device code, where an
// overflow is undefined and was optimised on (x + y > x became y > 0), so
// both targets go through unsigned arithmetic, which wraps by definition.
// Types narrower than int are promoted to int, where their results cannot
// overflow (and unsigned 16-bit products could: 65535 * 65535 as int).
template <typename T> static inline VTPU_KERNEL_FN T vtpu_wrap_add(T a, T b) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T> && sizeof(T) >= sizeof(int)) return T(std::make_unsigned_t<T>(a) + std::make_unsigned_t<T>(b));
  else return T(a + b);
}
template <typename T> static inline VTPU_KERNEL_FN T vtpu_wrap_sub(T a, T b) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T> && sizeof(T) >= sizeof(int)) return T(std::make_unsigned_t<T>(a) - std::make_unsigned_t<T>(b));
  else return T(a - b);
}
template <typename T> static inline VTPU_KERNEL_FN T vtpu_wrap_mul(T a, T b) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T> && sizeof(T) >= sizeof(int)) return T(std::make_unsigned_t<T>(a) * std::make_unsigned_t<T>(b));
  else return T(a * b);
}
template <typename T> static inline VTPU_KERNEL_FN T vtpu_wrap_neg(T a) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T> && sizeof(T) >= sizeof(int)) return T(std::make_unsigned_t<T>(0) - std::make_unsigned_t<T>(a));
  else return T(-a);
}
template <typename T> static inline VTPU_KERNEL_FN T vtpu_sign(T a) { if constexpr (std::is_floating_point_v<T>) { if (a != a) return T(0); } return T((T(0) < a) - (a < T(0))); }
template <typename T> static inline VTPU_KERNEL_FN T vtpu_floor_div(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) { return std::floor(a / b); }
  else { T q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) --q; return q; }
}
template <typename T> static inline VTPU_KERNEL_FN T vtpu_remainder(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) { T r = std::fmod(a, b); if (r != 0 && ((r < 0) != (b < 0))) r += b; return r; }
  else { T r = a % b; if (r != 0 && ((r < 0) != (b < 0))) r += b; return r; }
}
template <typename T> static inline VTPU_KERNEL_FN T vtpu_fmod(T a, T b) { if constexpr (std::is_floating_point_v<T>) return std::fmod(a, b); else return a % b; }
// Integer powers are exact (squaring, wrapping like torch); negative exponents
// give 0 except for bases 1 and -1, as in ATen's integer pow.
// Floating powers take ATen's CPU shortcuts for the common exponents (x for 1,
// x*x for 2, sqrt for 0.5, ...): the same bits as ATen, and several times faster than
// std::pow; the exponent is loop-invariant, so the compiler unswitches the loop.
template <typename T> static inline VTPU_KERNEL_FN T vtpu_pow(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (b == T(1)) return a;  // ATen copies the base for 1 and fills 1 for 0
    if (b == T(0)) return T(1);
    if (b == T(2)) return a * a;
    if (b == T(0.5)) return std::sqrt(a);
    if (b == T(3)) return a * a * a;
    if (b == T(-0.5)) return T(1) / std::sqrt(a);
    if (b == T(-1)) return T(1) / a;
    if (b == T(-2)) return T(1) / (a * a);
    return std::pow(a, b);
  }
  else {
    if (b < 0) { if (a == 1) return 1; if (a == -1) return ((-b) % 2) ? T(-1) : T(1); return 0; }
    using U = std::make_unsigned_t<T>;
    U result = 1, base = static_cast<U>(a);
    for (T e = b; e > 0; e >>= 1) { if (e & 1) result *= base; base *= base; }
    return static_cast<T>(result);
  }
}
// bfloat16's pow by 3 and by -2 rounds x * x to bfloat16 before the third
// factor or the reciprocal, as ATen's reduced-float kernel computes them in
// bfloat16 arithmetic (float16's computes in float, as vtpu_pow does).
static inline VTPU_KERNEL_FN float vtpu_pow_bf16(float a, float b) {
  if (b == 3.0f) return vtpu_round_bf16(a * a) * a;
  if (b == -2.0f) return 1.0f / vtpu_round_bf16(a * a);
  return vtpu_pow(a, b);
}
// float16's pow by 0.5 and -0.5 is pow itself in ATen (its other shortcuts
// are float's): pow(-inf, 0.5) is inf, pow(-0.0, -0.5) +inf.
static inline VTPU_KERNEL_FN float vtpu_pow_half(float a, float b) {
  if (b == 0.5f || b == -0.5f) return std::pow(a, b);
  return vtpu_pow(a, b);
}
template <typename T> static inline VTPU_KERNEL_FN T vtpu_pow_tensor(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) return std::pow(a, b);
  else return vtpu_pow(a, b);
}
)HELPERS";

}  // namespace vtpu::compiler::detail
