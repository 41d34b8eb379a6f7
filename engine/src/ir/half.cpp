// 16-bit float conversions by bit manipulation. Written out rather than
// relying on _Float16/__bf16 so the results do not depend on the compiler,
// the ISA or its rounding-mode state.
#include "vtpu/ir/half.h"

#include <bit>

namespace vtpu::ir {

std::uint16_t float_to_half_bits(float value) {
  const std::uint32_t f = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (f >> 16) & 0x8000u;
  const std::uint32_t abs = f & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN; keep NaN quiet and non-zero
    const std::uint32_t mant = abs > 0x7f800000u ? (0x200u | ((abs >> 13) & 0x3ffu)) : 0;
    return static_cast<std::uint16_t>(sign | 0x7c00u | mant);
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal
    // Value in units of 2^-24 is abs_value * 2^24; shift the 24-bit
    // significand right and round half to even.
    const int exp = static_cast<int>(abs >> 23);  // biased float exponent
    if (exp < 102) return static_cast<std::uint16_t>(sign);  // < 2^-25: rounds to 0
    const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const int shift = 126 - exp;  // 14..24 (float bias 127, half unit 2^-24)
    const std::uint32_t q = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1);
    const std::uint32_t half = 1u << (shift - 1);
    const std::uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    return static_cast<std::uint16_t>(sign | r);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 23-bit mantissa to
  // 10 bits; a carry out of the mantissa correctly bumps the exponent.
  const std::uint32_t rebased = abs - (112u << 23);
  const std::uint32_t q = rebased >> 13;
  const std::uint32_t rem = rebased & 0x1fffu;
  const std::uint32_t r = q + ((rem > 0x1000u || (rem == 0x1000u && (q & 1u))) ? 1u : 0u);
  return static_cast<std::uint16_t>(sign | r);
}

float half_bits_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exp = (bits >> 10) & 0x1fu;
  std::uint32_t mant = bits & 0x3ffu;
  std::uint32_t f;
  if (exp == 0x1f) {
    f = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    f = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    f = sign;
  } else {  // subnormal half: normalise into a float
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400u) == 0);
    f = sign | ((112u - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(f);
}

std::uint16_t float_to_bfloat16_bits(float value) {
  const std::uint32_t f = std::bit_cast<std::uint32_t>(value);
  if ((f & 0x7fffffffu) > 0x7f800000u) {  // NaN: truncating could make it inf
    return static_cast<std::uint16_t>((f >> 16) | 0x40u);
  }
  const std::uint32_t lsb = (f >> 16) & 1u;
  return static_cast<std::uint16_t>((f + 0x7fffu + lsb) >> 16);
}

float bfloat16_bits_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

}  // namespace vtpu::ir
