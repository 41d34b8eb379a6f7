// One level of the compile cache. CompileCache stacks tiers fastest first
// (memory, then disk, then the optional shared tier) and reads through / writes back.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "vtpu/cache/entry.h"
#include "vtpu/cache/key.h"

namespace vtpu::cache {

struct TierStats {
  std::uint64_t entries = 0;            // entries stored now
  std::uint64_t bytes = 0;              // bytes stored now (what the size bound limits)
  std::uint64_t hits = 0;               // counters below: this tier object, since creation
  std::uint64_t misses = 0;
  std::uint64_t corrupt_discarded = 0;  // entries that failed verification and were deleted
  std::uint64_t evictions = 0;          // entries removed to stay under the size bound
  std::uint64_t refused = 0;            // shared tier: entries whose signature did not verify
  std::uint64_t errors = 0;             // shared tier: requests the store failed (unreachable, ...)
};

class CacheTier {
 public:
  virtual ~CacheTier() = default;

  // Short name used in stats ("memory", "disk").
  virtual std::string name() const = 0;

  // The entry, or nullptr on a miss. Never returns an unverified entry.
  virtual std::shared_ptr<const Entry> get(const Key& key) = 0;

  // Stores (replacing any previous value). May evict other entries.
  virtual void put(const Key& key, std::shared_ptr<const Entry> entry) = 0;

  // True when an entry was present.
  virtual bool remove(const Key& key) = 0;

  virtual TierStats stats() const = 0;

  // Removes every entry. The hit/miss/eviction counters are left alone: they
  // describe this object's history, not the contents.
  virtual void clear() = 0;

  // The entry for `key`, calling `build` and storing its result on a miss.
  // The base version does get-then-put; tiers shared between processes
  // override it so that concurrent callers build once. Exceptions from `build`
  // propagate unchanged and nothing is stored.
  virtual std::shared_ptr<const Entry> get_or_create(const Key& key,
                                                     const std::function<Entry()>& build);

  // True for a tier whose get_or_create() makes cooperating processes build a
  // key once (the disk tier's file lock). CompileCache builds through the
  // last such tier and consults the tiers below it (the shared tier) from
  // inside that build, so N local processes fetch or compile a kernel once.
  virtual bool coordinates_builds() const { return false; }
};

}  // namespace vtpu::cache
