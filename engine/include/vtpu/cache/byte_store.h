// Where the shared compile-cache tier keeps its bytes: a directory on a
// filesystem that several servers mount, or a Redis server. A store moves
// opaque byte strings under names; signing and verifying them is the shared
// tier's job (shared_tier.h), so nothing fetched from a store is trusted.
//
// Every method may throw StoreUnavailable when the store as a whole cannot be
// used (unreachable, timed out, not mounted, refused our credentials): the
// shared tier then rests. Any other runtime::Error is about one entry or one
// request (a name that is not a regular file, a read-only mount refusing a
// write, a Redis key of another type): counted, and the store is asked again
// for the next key. Either way the lookup is a miss, never a failure.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "vtpu/runtime/error.h"

namespace vtpu::cache {

// Kernels are kilobytes to a few megabytes; anything a store offers beyond
// this is refused before it is read (a special file, a hostile server).
inline constexpr std::size_t kMaxStoredEntryBytes = std::size_t{64} << 20;

class StoreUnavailable : public runtime::Error {
 public:
  explicit StoreUnavailable(const std::string& message) : runtime::Error(runtime::ErrorKind::kRuntime, message) {}
};

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

// Names are "<32 hex>.vtpu" files in `dir`. A directory that does not exist
// (yet: a mount that comes later) makes requests throw StoreUnavailable, as
// an unreachable server does. Throws Error(kInvalidArgument) for an empty path.
std::unique_ptr<ByteStore> open_directory_store(const std::string& dir);

struct RedisAddress {
  std::string host;
  std::uint16_t port = 6379;
  std::string user;      // ACL user name; empty: AUTH with the password alone
  std::string password;  // empty: no AUTH
  int database = 0;
  bool tls = false;      // "rediss://"

  // "redis[s]://[[user]:password@]host[:port][/db]", user and password
  // percent-decoded. Throws Error(kInvalidArgument) naming what is wrong, with
  // the password masked.
  static RedisAddress parse(std::string_view url);
  std::string describe() const;  // without the password
};

// TLS settings of a "rediss://" store (VTPU_SHARED_CACHE_TLS_CA, _CERT, _KEY).
// The server's certificate must verify against the trusted CAs and name the
// URL's host.
struct TlsOptions {
  std::string ca_file;    // PEM bundle of trusted CAs; empty: the system's trust store
  std::string cert_file;  // client certificate chain (PEM), for servers that ask for one
  std::string key_file;   // its private key (PEM); empty: in cert_file
};

// `url` with any password replaced by "***", for messages.
std::string redact_url(std::string_view url);

// Connects lazily, on the first request; `timeout` bounds connecting and each
// whole request (not each read). Values are stored under "vtpu:entry:<name>".
// `tls` applies to a "rediss://" address only.
std::unique_ptr<ByteStore> open_redis_store(RedisAddress address, std::chrono::milliseconds timeout,
                                            TlsOptions tls = {});

}  // namespace vtpu::cache
