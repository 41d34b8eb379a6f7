#include "vtpu/cache/key.h"

#include <cstdint>

#include "vtpu/runtime/error.h"

namespace vtpu::cache {
namespace {

// A fixed seed separates key hashes from the entry checksums, which use the
// same function on different data.
constexpr std::uint64_t kKeySeed = 0x76747075'6b657931ull;  // "vtpukey1"

void append_u64_le(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

bool Key::is_valid_hex(std::string_view text) noexcept {
  if (text.size() != kHexLength) return false;
  for (char c : text)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

Key Key::from_hex(std::string_view hex) {
  if (!is_valid_hex(hex))
    throw runtime::Error(runtime::ErrorKind::kInvalidArgument,
                         "[compile cache] a key is 32 lowercase hex digits, got '" +
                             std::string(hex) + "'");
  return Key(std::string(hex));
}

Key make_key(std::span<const std::string_view> parts) {
  std::size_t total = 8;
  for (auto part : parts) total += 8 + part.size();
  std::string stream;
  stream.reserve(total);
  for (auto part : parts) {
    append_u64_le(stream, part.size());
    stream.append(part);
  }
  append_u64_le(stream, parts.size());
  return Key(hash128(stream.data(), stream.size(), kKeySeed));
}

Key make_key(std::initializer_list<std::string_view> parts) {
  return make_key(std::span<const std::string_view>(parts.begin(), parts.size()));
}

}  // namespace vtpu::cache
