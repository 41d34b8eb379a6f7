// The shared tier of the compile cache (DESIGN.md "Compile cache"): below the
// local directory, a store that many servers read and write (a directory on
// a shared filesystem, or Redis), so a kernel compiled once anywhere is
// loaded everywhere.
//
// Entries there are code that another machine produced, so each is signed
// with HMAC-SHA256 under a key the servers share (VTPU_CACHE_KEY), and an
// entry whose signature does not verify is refused: counted, treated as a
// miss, never loaded (and replaced by the next put).
//
//   stored bytes: "VTPUSIG1" | HMAC (32 bytes) | encode_entry(key, entry)
//   HMAC over:    "vtpu shared cache entry" NUL | key hex | encode_entry bytes
//
// The key hex is signed too (and encode_entry repeats it), so a valid entry
// copied under another key's name is refused as well.
//
// The store failing never fails a lookup or a build: the tier counts the
// error and answers "miss". When the store as a whole is unavailable
// (StoreUnavailable: unreachable, timed out, not mounted) it is left alone for
// `retry_after` before it is asked again, so a dead server costs one timeout
// per interval, not one per kernel; a failure about one entry or one write (a
// read-only mount, a key of another type) leaves it in use.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "vtpu/cache/byte_store.h"
#include "vtpu/cache/tier.h"

namespace vtpu::cache {

class SharedTier final : public CacheTier {
 public:
  static constexpr std::size_t kMinSigningKeyBytes = 16;

  struct Options {
    std::chrono::milliseconds timeout{2000};
    std::chrono::milliseconds retry_after{30000};
  };

  // Throws Error(kInvalidArgument) for a null store or a signing key shorter
  // than kMinSigningKeyBytes.
  SharedTier(std::unique_ptr<ByteStore> store, std::string signing_key, Options options);

  // From VTPU_SHARED_CACHE (a directory, or redis://...), VTPU_CACHE_KEY and
  // VTPU_SHARED_CACHE_TIMEOUT (seconds, default 2); nullptr when
  // VTPU_SHARED_CACHE is unset or empty. Throws Error(kInvalidArgument) naming
  // the variable when the configuration is unusable (no key, a bad URL, a
  // directory that does not exist).
  static std::shared_ptr<SharedTier> from_env();

  std::string name() const override { return "shared"; }
  std::shared_ptr<const Entry> get(const Key& key) override;
  // Never throws for the store's failures (counted in stats().errors).
  void put(const Key& key, std::shared_ptr<const Entry> entry) override;
  bool remove(const Key& key) override;
  TierStats stats() const override;
  void clear() override;

  std::string describe() const { return store_->describe(); }
  // What the store holds (lists a directory: for diagnostics, not for
  // stats(), which metrics() calls often and which leaves entries/bytes 0).
  StoreUsage usage() { return store_->usage(); }

  // Called once for the first refused entry and once for the first store
  // failure, with a message saying what to check: a fleet with mismatched
  // keys or an unreachable store otherwise just compiles everywhere, quietly.
  // The bridge turns it into a Python warning. Set it before first use.
  using Notice = std::function<void(const std::string&)>;
  void set_notice(Notice notice) { notice_ = std::move(notice); }
  // The last store failure's message ("" if none), for diagnostics.
  std::string last_error() const;

  // The signed bytes this tier stores for an entry, and the reverse (nullopt
  // with the reason in *why for a refused or corrupt one). Public for tests.
  std::vector<std::uint8_t> seal(const Key& key, const Entry& entry) const;
  std::optional<Entry> open(const Key& key, std::span<const std::uint8_t> bytes, bool* refused,
                            std::string* why = nullptr) const;

 private:
  bool store_resting() const;
  void note_failure(const std::exception& e, bool store_down);
  void notice_once(std::atomic<bool>& flag, const std::string& message);

  const std::unique_ptr<ByteStore> store_;
  const std::string signing_key_;
  const Options options_;
  std::atomic<std::int64_t> resting_until_ns_{0};
  mutable std::mutex error_mutex_;
  std::string last_error_;
  Notice notice_;
  std::atomic<bool> refusal_noticed_{false};
  std::atomic<bool> failure_noticed_{false};
  std::atomic<std::uint64_t> hits_{0};
  std::atomic<std::uint64_t> misses_{0};
  std::atomic<std::uint64_t> refused_{0};
  std::atomic<std::uint64_t> corrupt_{0};
  std::atomic<std::uint64_t> errors_{0};
};

}  // namespace vtpu::cache
