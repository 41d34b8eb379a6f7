// MurmurHash3-x64-128 construction, written for vTPU: two 64-bit lanes mixed
// block by block, the tail folded in, then a final avalanche of both lanes.
#include "vtpu/cache/hash128.h"

namespace vtpu::cache {
namespace {

constexpr std::uint64_t kMul1 = 0x87c37b91114253d5ull;
constexpr std::uint64_t kMul2 = 0x4cf5ad432745937full;

constexpr std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Little-endian load of up to 8 bytes; explicit so big-endian hosts agree.
std::uint64_t load_le(const unsigned char* p, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

// Per-word pre-mixing of each lane's input before it is xored in.
std::uint64_t scramble_a(std::uint64_t k) { return rotl(k * kMul1, 31) * kMul2; }
std::uint64_t scramble_b(std::uint64_t k) { return rotl(k * kMul2, 33) * kMul1; }

// Final avalanche: every input bit affects every output bit.
std::uint64_t avalanche(std::uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}

}  // namespace

Hash128 hash128(const void* data, std::size_t size, std::uint64_t seed) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  std::uint64_t a = seed;
  std::uint64_t b = seed;

  const std::size_t blocks = size / 16;
  for (std::size_t i = 0; i < blocks; ++i) {
    const unsigned char* block = bytes + 16 * i;
    a ^= scramble_a(load_le(block, 8));
    a = (rotl(a, 27) + b) * 5 + 0x52dce729;
    b ^= scramble_b(load_le(block + 8, 8));
    b = (rotl(b, 31) + a) * 5 + 0x38495ab5;
  }

  // Tail: up to 15 bytes, low 8 into lane a, the rest into lane b. Lanes are
  // not rotated/added here, so a short tail still reaches both through the
  // cross-additions below.
  const unsigned char* tail = bytes + 16 * blocks;
  const std::size_t rest = size % 16;
  if (rest > 8) b ^= scramble_b(load_le(tail + 8, rest - 8));
  if (rest > 0) a ^= scramble_a(load_le(tail, rest < 8 ? rest : 8));

  // Length is folded in so inputs differing only by trailing zero bytes differ.
  a ^= static_cast<std::uint64_t>(size);
  b ^= static_cast<std::uint64_t>(size);
  a += b;
  b += a;
  a = avalanche(a);
  b = avalanche(b);
  a += b;
  b += a;
  return Hash128{.hi = b, .lo = a};
}

std::string Hash128::hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[15 - i] = kDigits[(hi >> (4 * i)) & 0xf];
    out[31 - i] = kDigits[(lo >> (4 * i)) & 0xf];
  }
  return out;
}

}  // namespace vtpu::cache
