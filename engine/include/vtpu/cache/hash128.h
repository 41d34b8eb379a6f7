// A 128-bit non-cryptographic hash (MurmurHash3-x64-128 construction), used for
// compile-cache keys and for the checksum of on-disk entries.
//
// Why not a cryptographic hash: keys only need to be collision-free for honest
// inputs (anyone who can write the local cache directory can already plant
// code there; the shared tier is protected by signatures instead), and the
// checksum only needs to catch torn writes and flipped bits. This is fast
// (one multiply chain per 8 bytes) and has no dependency.
//
// Stability: the output is part of the on-disk format and of every cache key.
// Changing it invalidates all caches; cache_key_test pins golden values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace vtpu::cache {

struct Hash128 {
  std::uint64_t hi = 0;
  std::uint64_t lo = 0;

  friend bool operator==(const Hash128&, const Hash128&) = default;

  // 32 lowercase hex digits, `hi` first.
  std::string hex() const;
};

// Hashes `size` bytes at `data`. Input is read as little-endian 64-bit words
// regardless of host byte order, so the result is the same on every host.
Hash128 hash128(const void* data, std::size_t size, std::uint64_t seed = 0);

}  // namespace vtpu::cache
