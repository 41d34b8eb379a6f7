#include "vtpu/cache/memory_tier.h"

#include "vtpu/runtime/error.h"

namespace vtpu::cache {

std::shared_ptr<const Entry> MemoryTier::get(const Key& key) {
  std::lock_guard lock(mutex_);
  auto found = index_.find(key);
  if (found == index_.end()) {
    ++stats_.misses;
    return nullptr;
  }
  lru_.splice(lru_.begin(), lru_, found->second);  // touch: move to front
  ++stats_.hits;
  return found->second->entry;
}

void MemoryTier::put(const Key& key, std::shared_ptr<const Entry> entry) {
  if (!entry)
    throw runtime::Error(runtime::ErrorKind::kInvalidArgument,
                         "[compile cache] put of a null entry for key " + key.hex());
  const std::size_t bytes = entry->footprint();
  std::lock_guard lock(mutex_);
  if (auto found = index_.find(key); found != index_.end()) erase_locked(found->second);
  lru_.push_front(Slot{key, std::move(entry), bytes});
  index_.emplace(key, lru_.begin());
  ++stats_.entries;
  stats_.bytes += bytes;
  // Evict from the cold end. The new entry is at the hot end, so it goes last:
  // only when it alone exceeds the bound (then it is not worth keeping).
  while (stats_.bytes > max_bytes_ && !lru_.empty()) {
    erase_locked(std::prev(lru_.end()));
    ++stats_.evictions;
  }
}

bool MemoryTier::remove(const Key& key) {
  std::lock_guard lock(mutex_);
  auto found = index_.find(key);
  if (found == index_.end()) return false;
  erase_locked(found->second);
  return true;
}

TierStats MemoryTier::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void MemoryTier::clear() {
  std::lock_guard lock(mutex_);
  lru_.clear();
  index_.clear();
  stats_.entries = 0;
  stats_.bytes = 0;
}

void MemoryTier::erase_locked(Lru::iterator it) {
  stats_.bytes -= it->bytes;
  --stats_.entries;
  index_.erase(it->key);
  lru_.erase(it);
}

}  // namespace vtpu::cache
