// One level of the compile cache. CompileCache stacks tiers fastest first
// (memory, then disk; a shared tier later) and reads through / writes back.
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
};

}  // namespace vtpu::cache
