// Compile-cache keys: 128 bits, spelled as 32 lowercase hex digits.
//
// The caller decides what goes into a key (DESIGN.md "Compile cache": canonical
// IR with shapes, dtypes and layout classes; target and ISA; compiler identity
// and flags; vtpu version) and passes those parts to make_key(). The hex
// spelling doubles as the on-disk file name, which is why a Key can only hold
// validated hex: nothing else can reach a path.
#pragma once

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include "vtpu/cache/hash128.h"

namespace vtpu::cache {

class Key {
 public:
  static constexpr std::size_t kHexLength = 32;

  explicit Key(const Hash128& hash) : hex_(hash.hex()) {}

  // Throws Error(kInvalidArgument) unless `hex` is exactly 32 lowercase hex digits.
  static Key from_hex(std::string_view hex);

  // True when `text` is a valid key spelling (used to recognise entry files).
  static bool is_valid_hex(std::string_view text) noexcept;

  const std::string& hex() const noexcept { return hex_; }

  friend bool operator==(const Key&, const Key&) = default;
  friend auto operator<=>(const Key&, const Key&) = default;

 private:
  explicit Key(std::string hex) : hex_(std::move(hex)) {}
  std::string hex_;
};

// Hashes the parts with hash128(). Each part is prefixed with its length (8
// bytes, little-endian) and the part count ends the stream, so {"ab", "c"},
// {"a", "bc"} and {"abc"} all give different keys.
Key make_key(std::span<const std::string_view> parts);
Key make_key(std::initializer_list<std::string_view> parts);

}  // namespace vtpu::cache

template <>
struct std::hash<vtpu::cache::Key> {
  std::size_t operator()(const vtpu::cache::Key& key) const noexcept {
    return std::hash<std::string>{}(key.hex());
  }
};
