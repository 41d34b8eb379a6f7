// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for signing entries of the
// shared compile-cache tier (DESIGN.md "Compile cache": entries fetched from
// other servers are code, so they are accepted only with a valid signature).
//
// Written from the standards; the engine takes no crypto dependency for one
// hash. Speed is not a concern: an entry is signed once when it is built and
// verified once per process when it is fetched.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

namespace vtpu::cache {

using Digest256 = std::array<std::uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, std::size_t size);
  void update(std::string_view text) { update(text.data(), text.size()); }
  // The digest of everything passed to update(); the object must not be used after.
  Digest256 finish();

 private:
  void compress(const std::uint8_t* block);

  std::array<std::uint32_t, 8> state_;
  std::array<std::uint8_t, 64> buffer_{};
  std::size_t buffered_ = 0;
  std::uint64_t total_bytes_ = 0;
};

Digest256 sha256(std::span<const std::uint8_t> bytes);

// HMAC-SHA256 of the concatenation of `parts` under `key` (any length).
Digest256 hmac_sha256(std::string_view key, std::initializer_list<std::span<const std::uint8_t>> parts);

// Compares in time independent of where the digests differ, so a forger cannot
// learn a valid signature byte by byte from response times.
bool digests_equal(const Digest256& a, const Digest256& b) noexcept;

std::string digest_hex(const Digest256& digest);

}  // namespace vtpu::cache
