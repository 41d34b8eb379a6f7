// float16 and bfloat16 <-> float32 conversions, round-to-nearest-even. The
// engine stores 16-bit floats as raw bits and computes in float32; these are
// the reference conversions the interpreter (and generated code) must match.
#pragma once

#include <cstdint>

namespace vtpu::ir {

std::uint16_t float_to_half_bits(float value);
float half_bits_to_float(std::uint16_t bits);

std::uint16_t float_to_bfloat16_bits(float value);
float bfloat16_bits_to_float(std::uint16_t bits);

}  // namespace vtpu::ir
