// The compile cache (DESIGN.md "Compile cache"): tiers stacked fastest first,
// read-through and write-back.
//
//   lookup: ask each tier in order; a hit is copied into the faster tiers
//           above it (so the next lookup hits memory);
//   build:  on a miss in the tiers above it, the disk tier coordinates the
//           build (a per-key file lock, so N local processes build a kernel
//           once); inside it the shared tier, if any, is asked first, and
//           only then is the kernel compiled and written into every tier.
//
// Cache-only mode (VTPU_CACHE_ONLY=1, for servers that must never compile):
// get_or_create() turns a miss into Error(kRuntime) naming the key. get() is a
// probe and keeps returning nullptr on a miss.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "vtpu/cache/entry.h"
#include "vtpu/cache/key.h"
#include "vtpu/cache/tier.h"

namespace vtpu::cache {

struct CacheStats {
  std::map<std::string, std::uint64_t> hits;  // by tier name ("memory", "disk")
  std::uint64_t misses = 0;                   // lookups no tier could answer
  std::uint64_t builds = 0;                   // calls of a build function
  std::uint64_t build_failures = 0;           // ... that threw
  std::vector<std::pair<std::string, TierStats>> tiers;  // each tier's own view, in order

  std::uint64_t hits_in(const std::string& tier) const {
    auto it = hits.find(tier);
    return it == hits.end() ? 0 : it->second;
  }
};

class CompileCache {
 public:
  // `tiers`: fastest first, non-empty, distinct names. Throws kInvalidArgument.
  explicit CompileCache(std::vector<std::shared_ptr<CacheTier>> tiers, bool cache_only = false);

  // The cache configured from the environment: MemoryTier, then
  // DiskTier(DiskTier::Options::from_env()), then SharedTier::from_env() when
  // VTPU_SHARED_CACHE is set; cache-only from VTPU_CACHE_ONLY.
  static std::unique_ptr<CompileCache> from_env();

  // VTPU_CACHE_ONLY: unset/""/"0"/"false"/"no"/"off" -> false, "1"/"true"/
  // "yes"/"on" -> true, anything else -> Error(kInvalidArgument).
  static bool cache_only_from_env();

  CompileCache(const CompileCache&) = delete;
  CompileCache& operator=(const CompileCache&) = delete;

  // Read-through lookup; nullptr on a miss (also in cache-only mode).
  std::shared_ptr<const Entry> get(const Key& key);

  // Writes into every tier.
  void put(const Key& key, Entry entry);

  // The entry for `key`; on a miss calls `build` (at most once across
  // cooperating processes, see above) and stores the result everywhere.
  // Exceptions from `build` propagate unchanged (counted in build_failures);
  // in cache-only mode a miss throws Error(kRuntime) instead of building.
  std::shared_ptr<const Entry> get_or_create(const Key& key, const std::function<Entry()>& build);

  CacheStats stats() const;

  // Empties the local tiers (up to the disk tier; the shared tier is the
  // fleet's). Counters are kept (they describe this process).
  void clear();

  bool cache_only() const noexcept { return cache_only_; }
  const std::vector<std::shared_ptr<CacheTier>>& tiers() const noexcept { return tiers_; }

 private:
  // Copies a hit found in tier `level` into tiers [0, level).
  void promote(const Key& key, const std::shared_ptr<const Entry>& entry, std::size_t level);
  [[noreturn]] void throw_cache_only_miss(const Key& key) const;

  const std::vector<std::shared_ptr<CacheTier>> tiers_;
  const bool cache_only_;
  std::vector<std::atomic<std::uint64_t>> hits_;  // parallel to tiers_
  std::atomic<std::uint64_t> misses_{0};
  std::atomic<std::uint64_t> builds_{0};
  std::atomic<std::uint64_t> build_failures_{0};
};

}  // namespace vtpu::cache
