// Where the shared compile-cache tier keeps its bytes: a directory on a
// filesystem that several servers mount, or a Redis server. A store moves
// opaque byte strings under names; signing and verifying them is the shared
// tier's job (shared_tier.h), so nothing fetched from a store is trusted.
//
// Every method may throw runtime::Error(kRuntime) when the store cannot be
// reached or refuses the request; the shared tier turns that into a miss.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace vtpu::cache {

struct StoreUsage {
  bool counted = false;  // false when the store cannot tell cheaply (Redis)
  std::uint64_t entries = 0;
  std::uint64_t bytes = 0;
};

class ByteStore {
 public:
  virtual ~ByteStore() = default;

  // For messages and `python -m torch_vtpu cache stats`: "directory /mnt/cache".
  virtual std::string describe() const = 0;

  // The bytes stored under `name`, or nullopt when there are none.
  virtual std::optional<std::vector<std::uint8_t>> fetch(const std::string& name) = 0;

  // Replaces whatever `name` held; readers see the old bytes or the new, whole.
  virtual void store(const std::string& name, std::span<const std::uint8_t> bytes) = 0;

  // True when something was stored under `name`.
  virtual bool remove(const std::string& name) = 0;

  // Removes every name this kind of store gives vtpu entries, nothing else.
  virtual void clear() = 0;

  virtual StoreUsage usage() = 0;
};

// Names are "<32 hex>.vtpu" files in `dir`, which must exist (a shared mount
// is the administrator's to create). Throws Error(kInvalidArgument) otherwise.
std::unique_ptr<ByteStore> open_directory_store(const std::string& dir);

struct RedisAddress {
  std::string host;
  std::uint16_t port = 6379;
  std::string user;      // ACL user name; empty: AUTH with the password alone
  std::string password;  // empty: no AUTH
  int database = 0;

  // "redis://[[user]:password@]host[:port][/db]". Throws Error(kInvalidArgument)
  // naming what is wrong (TLS "rediss://" is not supported).
  static RedisAddress parse(std::string_view url);
  std::string describe() const;  // without the password
};

// Connects lazily, on the first request; `timeout` bounds connecting and
// each request. Values are stored under "vtpu:entry:<name>".
std::unique_ptr<ByteStore> open_redis_store(RedisAddress address, std::chrono::milliseconds timeout);

}  // namespace vtpu::cache
