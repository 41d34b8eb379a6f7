// Two 64-bit lanes, each absorbing every word through a multiply-rotate step
// with its own constants and feeding the other lane, then a cross-mixed
// avalanche finish. Designed here; the constants are words of the binary
// expansions of pi and e (low bit forced to 1 so multiplication is bijective).
#include "vtpu/ir/hash.h"

#include <bit>
#include <limits>

namespace vtpu::ir {
namespace {

constexpr std::uint64_t kPi0 = 0x243f6a8885a308d3ull;
constexpr std::uint64_t kPi1 = 0x13198a2e03707345ull;  // low bit set: odd
constexpr std::uint64_t kE0 = 0xb7e151628aed2a6bull;
constexpr std::uint64_t kE1 = 0xbf7158809cf4f3c7ull;

// A bijective 64-bit avalanche: xor-shifts and odd multipliers.
std::uint64_t avalanche(std::uint64_t x) {
  x ^= x >> 31;
  x *= 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  x *= kE1;
  x ^= x >> 32;
  return x;
}

}  // namespace

std::string Hash128::hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[15 - i] = kDigits[(hi >> (4 * i)) & 0xf];
    s[31 - i] = kDigits[(lo >> (4 * i)) & 0xf];
  }
  return s;
}

Hasher::Hasher(std::uint64_t seed) : a_(kPi0 ^ seed), b_(kE0 + seed * kPi1) {}

Hasher& Hasher::add(std::uint64_t w) {
  a_ = std::rotl((a_ ^ w) * kPi1, 27) + b_;
  b_ = std::rotl((b_ + w) * kE1, 33) ^ a_;
  ++words_;
  return *this;
}

Hasher& Hasher::add_double(double value) {
  if (value != value) value = std::numeric_limits<double>::quiet_NaN();  // one NaN pattern for all NaNs
  return add(std::bit_cast<std::uint64_t>(value));
}

Hasher& Hasher::add_bytes(const void* data, std::size_t size) {
  add(size);
  const auto* p = static_cast<const unsigned char*>(data);
  // Assemble little-endian words by hand so big-endian hosts agree.
  for (std::size_t i = 0; i < size; i += 8) {
    std::uint64_t w = 0;
    for (std::size_t j = 0; j < 8 && i + j < size; ++j) {
      w |= static_cast<std::uint64_t>(p[i + j]) << (8 * j);
    }
    add(w);
  }
  return *this;
}

Hash128 Hasher::finish() const {
  const std::uint64_t a = a_ ^ words_;
  const std::uint64_t b = b_ + words_ * kPi0;
  Hash128 h;
  h.hi = avalanche(a + avalanche(b));
  h.lo = avalanche(b ^ avalanche(a + kE0));
  return h;
}

}  // namespace vtpu::ir
