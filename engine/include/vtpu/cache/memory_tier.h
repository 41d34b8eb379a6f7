// The in-process tier: a thread-safe LRU map of shared entries. A hit hands
// out the stored shared_ptr, so repeated lookups of a kernel copy nothing.
#pragma once

#include <cstddef>
#include <list>
#include <mutex>
#include <unordered_map>

#include "vtpu/cache/tier.h"

namespace vtpu::cache {

class MemoryTier final : public CacheTier {
 public:
  // Loaded kernels no longer need their bytes once dlopen'ed, so the default
  // bound is modest; it only caps what a long-running process keeps around.
  static constexpr std::size_t kDefaultMaxBytes = std::size_t{256} << 20;

  explicit MemoryTier(std::size_t max_bytes = kDefaultMaxBytes) : max_bytes_(max_bytes) {}

  std::string name() const override { return "memory"; }
  std::shared_ptr<const Entry> get(const Key& key) override;
  void put(const Key& key, std::shared_ptr<const Entry> entry) override;
  bool remove(const Key& key) override;
  TierStats stats() const override;
  void clear() override;

  std::size_t max_bytes() const noexcept { return max_bytes_; }

 private:
  struct Slot {
    Key key;
    std::shared_ptr<const Entry> entry;
    std::size_t bytes;
  };
  using Lru = std::list<Slot>;  // front = most recently used

  void erase_locked(Lru::iterator it);

  const std::size_t max_bytes_;
  mutable std::mutex mutex_;
  Lru lru_;
  std::unordered_map<Key, Lru::iterator> index_;
  TierStats stats_;  // entries/bytes kept current; counters accumulate
};

}  // namespace vtpu::cache
