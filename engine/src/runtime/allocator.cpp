#include "vtpu/runtime/allocator.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <iterator>
#include <string>

#include "vtpu/runtime/error.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace vtpu::runtime {
namespace {

std::string human_bytes(std::size_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(n);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.2f %s", value, units[unit]);
  return buffer;
}

// glibc keeps freed heap memory for its own reuse; after the cache was
// emptied the user asked for memory back (empty_cache, memory pressure), so
// return the free pages to the OS as well.
void return_free_pages_to_os() {
#if defined(__GLIBC__)
  ::malloc_trim(0);
#endif
}

}  // namespace

Allocator::Allocator(std::size_t capacity_bytes) : capacity_(capacity_bytes), small_free_(kSmallClasses) {}

Allocator::~Allocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cache_locked(/*everything=*/true);
  // Live blocks at process exit belong to tensors that outlive the allocator
  // (static destruction order); freeing them here would be a use-after-free
  // hazard for their owners, so they are left to the OS.
}

std::size_t Allocator::round_size(std::size_t nbytes) {
  if (nbytes == 0) return 0;
  if (nbytes <= kSmallLimit) {
    const std::size_t aligned = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
    // Above 4 KiB a block has its class's size, so any cached block of the
    // class serves any request of it (at most 12.5% more than asked).
    return aligned <= kExactClassLimit ? aligned : small_class_bound(small_class(aligned));
  }
  return (nbytes + kLargeGranule - 1) / kLargeGranule * kLargeGranule;
}

std::size_t Allocator::small_class(std::size_t rounded) {
  if (rounded <= kExactClassLimit) return rounded == 0 ? 0 : (rounded - 1) / kAlignment;
  const std::size_t octave = static_cast<std::size_t>(std::bit_width(rounded - 1) - 1);  // 12 .. 19
  const std::size_t base = std::size_t{1} << octave;
  return kExactClassLimit / kAlignment + (octave - 12) * 8 + (rounded - 1 - base) / (base / 8);
}

std::size_t Allocator::small_class_bound(std::size_t cls) {
  if (cls < kExactClassLimit / kAlignment) return (cls + 1) * kAlignment;
  const std::size_t k = cls - kExactClassLimit / kAlignment;
  const std::size_t base = kExactClassLimit << (k / 8);
  return base + (k % 8 + 1) * (base / 8);
}

void* Allocator::take_cached_locked(std::size_t rounded, std::size_t* block_size) {
  *block_size = rounded;
  if (rounded <= kSmallLimit) {
    std::vector<Cached>& blocks = small_free_[small_class(rounded)];  // all of size `rounded`
    if (blocks.empty()) return nullptr;
    void* ptr = blocks.back().ptr;
    blocks.pop_back();
    return ptr;
  }
  // Best fit, but never hand out a block more than 25% larger than asked:
  // that waste would be invisible to the user yet count against capacity.
  auto it = large_free_.lower_bound(rounded);
  if (it == large_free_.end() || it->first > rounded + rounded / 4) return nullptr;
  void* ptr = it->second.ptr;
  *block_size = it->first;  // the block keeps its true size in the accounting
  large_free_.erase(it);
  return ptr;
}

namespace {
// Where an out-of-memory message sends the user: the capacity is a setting.
constexpr const char* kCapacityOrigin =
    " (the capacity is VTPU_MEMORY_LIMIT or torch.vtpu.set_memory_limit / set_per_process_memory_fraction "
    "when set, else 80% of host memory)";
}  // namespace

void* Allocator::allocate(std::size_t nbytes) {
  if (nbytes == 0) return nullptr;
  const std::size_t rounded = round_size(nbytes);
  std::unique_lock<std::mutex> lock(mutex_);
  if (rounded < nbytes || rounded > capacity_) {
    ++stats_.out_of_memory;
    throw OutOfMemoryError("vtpu out of memory: tried to allocate " + human_bytes(nbytes) +
                           "; device capacity is " + human_bytes(capacity_) + kCapacityOrigin);
  }
  std::size_t block = rounded;
  void* ptr = take_cached_locked(rounded, &block);
  if (ptr != nullptr) {
    ++stats_.cache_hits;
    live_[ptr] = block;
    stats_.allocated_bytes += block;
  } else {
    if (stats_.reserved_bytes + rounded > capacity_) release_cache_guarded(lock);
    if (stats_.reserved_bytes + rounded > capacity_) {
      ++stats_.out_of_memory;
      throw OutOfMemoryError("vtpu out of memory: tried to allocate " + human_bytes(nbytes) +
                             "; " + human_bytes(stats_.allocated_bytes) + " already allocated, " +
                             human_bytes(capacity_) + " capacity" + kCapacityOrigin);
    }
    ptr = std::aligned_alloc(kAlignment, rounded);
    if (ptr == nullptr) {
      release_cache_guarded(lock);
      ptr = std::aligned_alloc(kAlignment, rounded);
    }
    if (ptr == nullptr) {
      ++stats_.out_of_memory;
      throw OutOfMemoryError("vtpu out of memory: the host refused " + human_bytes(rounded));
    }
    live_[ptr] = rounded;
    stats_.reserved_bytes += rounded;
    stats_.allocated_bytes += rounded;
    ++stats_.segments;
    ++stats_.host_allocations;
    stats_.reserved_bytes_total += rounded;
    block = rounded;
  }
  ++stats_.allocations;
  stats_.allocated_bytes_total += block;
  stats_.live_blocks = live_.size();
  stats_.peak_live_blocks = std::max(stats_.peak_live_blocks, stats_.live_blocks);
  stats_.peak_segments = std::max(stats_.peak_segments, stats_.segments);
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  return ptr;
}

void Allocator::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  // Taken outside the lock: the clock reads the stream's counters only.
  const std::uint64_t mark = stamp_ ? stamp_() : 0;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return;  // not ours: ignoring beats corrupting the heap
  const std::size_t block = it->second;
  live_.erase(it);
  stats_.allocated_bytes -= block;
  stats_.live_blocks = live_.size();
  ++stats_.frees;
  stats_.freed_bytes_total += block;
  // Reuse needs no stamp (the stream runs work in order); returning the
  // block to the host does.
  const Cached cached{ptr, mark, block};
  if (block <= kSmallLimit) {
    small_free_[small_class(block)].push_back(cached);
  } else {
    large_free_.emplace(block, cached);
  }
}

void Allocator::set_stream_clock(std::function<std::uint64_t()> stamp, std::function<bool(std::uint64_t)> idle) {
  std::lock_guard<std::mutex> lock(mutex_);
  stamp_ = std::move(stamp);
  idle_ = std::move(idle);
}

void Allocator::set_release_guard(std::function<void()> guard) {
  std::lock_guard<std::mutex> lock(mutex_);
  release_guard_ = std::move(guard);
}

void Allocator::release_cache_guarded(std::unique_lock<std::mutex>& lock) {
  const bool nothing_cached = large_free_.empty() && std::all_of(small_free_.begin(), small_free_.end(),
                                                                  [](const auto& blocks) { return blocks.empty(); });
  if (nothing_cached) return;
  // Cached blocks may still be read or written by queued work (frees are
  // stream-ordered): let that work finish before the memory goes back to the
  // host. The guard may block, so the lock is not held across it.
  if (std::function<void()> guard = release_guard_) {
    lock.unlock();
    guard();
    lock.lock();
  }
  release_cache_locked();
}

void Allocator::release_cache_locked(bool everything) {
  auto idle = [&](const Cached& c) { return everything || !idle_ || idle_(c.stamp); };
  bool released = false;
  for (std::vector<Cached>& blocks : small_free_) {
    const auto first_idle = std::partition(blocks.begin(), blocks.end(), [&](const Cached& c) { return !idle(c); });
    for (auto b = first_idle; b != blocks.end(); ++b) {
      std::free(b->ptr);
      note_released_locked(b->size);
      released = true;
    }
    blocks.erase(first_idle, blocks.end());
  }
  for (auto it = large_free_.begin(); it != large_free_.end();) {
    if (!idle(it->second)) {
      ++it;
      continue;
    }
    std::free(it->second.ptr);
    note_released_locked(it->first);
    it = large_free_.erase(it);
    released = true;
  }
  if (released && !everything) return_free_pages_to_os();
}

void Allocator::note_released_locked(std::size_t bytes) {
  stats_.reserved_bytes -= bytes;
  --stats_.segments;
  ++stats_.host_frees;
  stats_.released_bytes_total += bytes;
}

void Allocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cache_locked();
}

AllocatorStats Allocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void Allocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
  stats_.peak_live_blocks = stats_.live_blocks;
  stats_.peak_segments = stats_.segments;
}

void Allocator::reset_accumulated_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.allocations = 0;
  stats_.frees = 0;
  stats_.allocated_bytes_total = 0;
  stats_.freed_bytes_total = 0;
  stats_.host_allocations = 0;
  stats_.host_frees = 0;
  stats_.reserved_bytes_total = 0;
  stats_.released_bytes_total = 0;
  stats_.cache_hits = 0;
  stats_.out_of_memory = 0;
}

std::size_t Allocator::capacity() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return capacity_;
}

void Allocator::set_capacity(std::size_t capacity_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  capacity_ = capacity_bytes;
}

bool Allocator::owns(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_.count(const_cast<void*>(ptr)) != 0;
}

}  // namespace vtpu::runtime
