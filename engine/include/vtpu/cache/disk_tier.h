// The local-directory tier (default ~/.cache/vtpu, VTPU_CACHE_DIR), shared by
// every process of the user on this machine.
//
// Directory layout (flat; names are derived from validated hex keys only):
//   <key>.entry       a complete, checksummed entry (entry_codec.h)
//   <key>.lock        per-key build lock (flock), see get_or_create()
//   .tmp.<key>.*      an entry being written; renamed to <key>.entry when done
//   .trim.lock        serialises eviction/clear between processes
// Anything else in the directory is left alone.
//
// Crash safety: an entry is written to a temp file in the same directory,
// fsync'ed, then renamed over <key>.entry, so readers see the old file or the
// whole new one. Every read verifies the checksum anyway (a disk can still
// flip bits, a user can still truncate); a bad entry is deleted, counted in
// corrupt_discarded and reported as a miss. Temp files of killed writers are
// found by trim()/clear() (a live writer holds a flock on its temp file) and
// deleted; they are never read.
//
// LRU: each file's mtime is its last use, stamped on write and on every hit.
// trim() (run after every write) deletes the least recently used entries
// until the files total at most max_bytes.
//
// Stats: entries/bytes are read from the directory (so they include other
// processes' entries); hits, misses, corrupt_discarded and evictions count
// what this object did.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "vtpu/cache/tier.h"

namespace vtpu::cache {

class DiskTier final : public CacheTier {
 public:
  static constexpr std::uint64_t kDefaultMaxBytes = std::uint64_t{2} << 30;  // 2 GiB

  struct Options {
    std::string dir;
    std::uint64_t max_bytes = kDefaultMaxBytes;

    // dir: $VTPU_CACHE_DIR, else ~/.cache/vtpu. max_bytes: $VTPU_CACHE_MAX_BYTES
    // (e.g. "512MiB", parsed by runtime::parse_memory_size), else 2 GiB.
    // Throws Error(kInvalidArgument) naming the variable on a malformed size.
    static Options from_env();
  };

  // Creates the directory (mode 0700) if needed; throws Error(kRuntime) if it
  // cannot, or if the path is not a directory.
  explicit DiskTier(Options options);

  std::string name() const override { return "disk"; }
  std::shared_ptr<const Entry> get(const Key& key) override;
  void put(const Key& key, std::shared_ptr<const Entry> entry) override;
  bool remove(const Key& key) override;
  TierStats stats() const override;
  void clear() override;

  // Cross-process build-once: a verified entry is returned at once; otherwise
  // takes <key>.lock, looks again (another process may have just built it),
  // and only then calls `build`, writes the result and releases the lock.
  // Waiters therefore block while one process builds, then read its entry.
  std::shared_ptr<const Entry> get_or_create(const Key& key,
                                             const std::function<Entry()>& build) override;

  bool coordinates_builds() const override { return true; }

  // Enforces the size bound (LRU) and deletes temp files left by dead writers.
  void trim();

  const std::string& dir() const noexcept { return dir_; }
  std::uint64_t max_bytes() const noexcept { return max_bytes_; }
  std::string entry_path(const Key& key) const;
  std::string lock_path(const Key& key) const;

 private:
  // Reads and verifies; deletes a bad entry; stamps the use time on success.
  // Does not touch the hit/miss counters (callers decide what counts).
  std::shared_ptr<const Entry> load(const Key& key);
  void write(const Key& key, const Entry& entry);

  const std::string dir_;
  const std::uint64_t max_bytes_;
  std::atomic<std::uint64_t> hits_{0};
  std::atomic<std::uint64_t> misses_{0};
  std::atomic<std::uint64_t> corrupt_discarded_{0};
  std::atomic<std::uint64_t> evictions_{0};
  std::atomic<std::uint64_t> temp_counter_{0};
};

}  // namespace vtpu::cache
