// Caching device allocator. Device memory on the host target is host memory;
// what makes it a *device* allocator is the capacity limit, the statistics and
// the caching that keeps repeated requests off malloc.
//
// Sizes are rounded to classes, so that the cache grows with the memory a
// program has live at once, not with how many distinct sizes it ever asked
// for (a server with varying batch and sequence lengths asks for thousands:
// with one class per 64 bytes its reserved memory grew to gigabytes over a
// 23 MB peak). Up to 4 KiB a class per 64 bytes; up to 1 MiB 8 classes per
// power of two (a block is at most 12.5% larger than asked); above, 1 MiB
// granules, and a cached block at most 25% larger than asked may be reused
// (it counts with its own size).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace vtpu::runtime {

// Gauges (current and peak) and counters (since the last
// reset_accumulated_stats), the shape of CUDA's caching allocator statistics.
struct AllocatorStats {
  std::size_t allocated_bytes = 0;       // live blocks, rounded sizes
  std::size_t reserved_bytes = 0;        // live + cached
  std::size_t peak_allocated_bytes = 0;
  std::size_t peak_reserved_bytes = 0;
  std::size_t live_blocks = 0;           // blocks handed out and not freed
  std::size_t peak_live_blocks = 0;
  std::size_t segments = 0;              // blocks taken from the host (live + cached)
  std::size_t peak_segments = 0;
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t allocated_bytes_total = 0;  // bytes handed out
  std::uint64_t freed_bytes_total = 0;      // bytes given back by their owners
  std::uint64_t host_allocations = 0;       // blocks taken from the host
  std::uint64_t host_frees = 0;             // blocks returned to the host
  std::uint64_t reserved_bytes_total = 0;   // their bytes
  std::uint64_t released_bytes_total = 0;
  std::uint64_t cache_hits = 0;          // requests served from the cache
  std::uint64_t out_of_memory = 0;       // requests refused for the capacity
};

class Allocator {
 public:
  static constexpr std::size_t kAlignment = 64;
  static constexpr std::size_t kSmallLimit = std::size_t{1} << 20;
  static constexpr std::size_t kLargeGranule = std::size_t{1} << 20;
  // Free lists of small blocks: 64 exact classes up to 4 KiB, then 8 per
  // power of two up to kSmallLimit.
  static constexpr std::size_t kExactClassLimit = 4096;
  static constexpr std::size_t kSmallClasses = kExactClassLimit / kAlignment + 8 * 8;

  explicit Allocator(std::size_t capacity_bytes);
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Returns nullptr for zero bytes. Throws OutOfMemoryError when the request
  // cannot fit under the capacity even after the cache is emptied; the
  // allocator stays consistent and later requests are served.
  void* allocate(std::size_t nbytes);
  void deallocate(void* ptr);

  // Called before cached blocks go back to the host under memory pressure:
  // the device waits there for queued work that may still use freed blocks
  // (a block is freed when its last owner drops it, not when its last queued
  // user ran; reuse is safe because the stream runs work in order).
  // empty_cache() callers synchronise themselves.
  void set_release_guard(std::function<void()> guard);

  // The device stream's order for returning memory to the host: `stamp` is
  // called when a block is freed (an opaque mark of the work that may still
  // use it: everything issued so far), `idle(mark)` when the cache is emptied
  // (whether that work has all run). A block freed by one thread while
  // another empties the cache stays cached until its queued users ran; reuse
  // for new requests needs no mark (the stream runs work in order). Without
  // a clock every cached block counts as idle (callers synchronise first).
  // Set once, before the allocator is shared between threads.
  void set_stream_clock(std::function<std::uint64_t()> stamp, std::function<bool(std::uint64_t)> idle);

  // Returns the idle cached blocks to the host (see set_stream_clock).
  void empty_cache();
  AllocatorStats stats() const;
  void reset_peak_stats();
  // Zeroes the counters (allocations, frees, their byte totals, host
  // allocations and releases, cache hits, out-of-memory refusals); the gauges
  // (current bytes, blocks, segments) and their peaks are left as they are.
  void reset_accumulated_stats();
  std::size_t capacity() const;
  void set_capacity(std::size_t capacity_bytes);
  bool owns(const void* ptr) const;

  // The size class a request is rounded to (exposed for tests).
  static std::size_t round_size(std::size_t nbytes);
  // The free list a small block of `rounded` bytes (<= kSmallLimit) is kept
  // in, and the largest size that list holds (exposed for tests).
  static std::size_t small_class(std::size_t rounded);
  static std::size_t small_class_bound(std::size_t cls);

 private:
  void* take_cached_locked(std::size_t rounded, std::size_t* block_size);
  // A cached block and the stream clock's stamp when it was freed.
  struct Cached {
    void* ptr;
    std::uint64_t stamp;
    std::size_t size;
  };
  // Frees the cached blocks whose users have all run (every one when
  // `everything`: the allocator's destruction).
  void release_cache_locked(bool everything = false);
  // A cached block of `bytes` went back to the host: the gauges and counters.
  void note_released_locked(std::size_t bytes);
  void release_cache_guarded(std::unique_lock<std::mutex>& lock);

  mutable std::mutex mutex_;
  std::size_t capacity_;
  AllocatorStats stats_;
  std::unordered_map<void*, std::size_t> live_;                   // ptr -> rounded size
  std::vector<std::vector<Cached>> small_free_;  // by small_class()
  std::multimap<std::size_t, Cached> large_free_;                    // best fit
  std::function<void()> release_guard_;
  std::function<std::uint64_t()> stamp_;
  std::function<bool(std::uint64_t)> idle_;
};

}  // namespace vtpu::runtime
