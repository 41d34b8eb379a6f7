// The on-disk format of one cache entry: a fixed header, then a body.
//
//   header (40 bytes, little-endian):
//     magic "VTPUCACH" (8) | format version u32 | header size u32 |
//     body length u64 | body checksum: hash128 lo u64, hi u64
//   body:
//     key (u32 length + hex) | metadata count u32 | per item: u32 len + key,
//     u32 len + value | data length u64 + data bytes
//
// Why the key is inside the body: a file renamed or copied under another
// key's name would otherwise be loaded as that key's kernel.
// decode_entry() checks everything (magic, version, lengths against the bytes
// actually present, checksum, key, exact consumption of the body) because
// a torn write or a flipped bit must never reach dlopen.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "vtpu/cache/entry.h"
#include "vtpu/cache/key.h"

namespace vtpu::cache {

inline constexpr std::uint32_t kEntryFormatVersion = 1;
inline constexpr std::size_t kEntryHeaderSize = 40;

std::vector<std::uint8_t> encode_entry(const Key& key, const Entry& entry);

// The entry, or nullopt with the reason in `*why` (when non-null).
std::optional<Entry> decode_entry(std::span<const std::uint8_t> bytes, const Key& key,
                                  std::string* why = nullptr);

}  // namespace vtpu::cache
