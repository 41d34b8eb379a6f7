// A 128-bit streaming hash for cache keys. Not cryptographic (the shared cache
// tier signs entries separately); what matters is that it is stable across
// processes, builds and platforms: values are fed as explicit little-endian
// words, never as pointers, padding or std::hash.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace vtpu::ir {

struct Hash128 {
  std::uint64_t hi = 0;
  std::uint64_t lo = 0;
  std::string hex() const;  // 32 lowercase hex digits, hi first
  bool operator==(const Hash128&) const = default;
};

class Hasher {
 public:
  explicit Hasher(std::uint64_t seed = 0);
  Hasher& add(std::uint64_t word);
  Hasher& add_signed(std::int64_t word) { return add(static_cast<std::uint64_t>(word)); }
  Hasher& add_double(double value);  // by bit pattern; every NaN hashes alike
  // Length-prefixed, so ("ab","c") and ("a","bc") differ.
  Hasher& add_bytes(const void* data, std::size_t size);
  Hasher& add_string(std::string_view text) { return add_bytes(text.data(), text.size()); }
  Hash128 finish() const;

 private:
  std::uint64_t a_;
  std::uint64_t b_;
  std::uint64_t words_ = 0;
};

}  // namespace vtpu::ir
