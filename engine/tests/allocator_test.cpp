// Caching allocator: alignment, exact statistics, cache reuse, capacity limits
// and recovery after out-of-memory.
#include "vtpu/runtime/allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "vtpu/runtime/error.h"

namespace vtpu::runtime {
namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

bool aligned(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % Allocator::kAlignment == 0;
}

// Compares every field, so a test notices any counter that moves unexpectedly.
void expect_same_stats(const AllocatorStats& a, const AllocatorStats& b) {
  EXPECT_EQ(a.allocated_bytes, b.allocated_bytes);
  EXPECT_EQ(a.reserved_bytes, b.reserved_bytes);
  EXPECT_EQ(a.peak_allocated_bytes, b.peak_allocated_bytes);
  EXPECT_EQ(a.peak_reserved_bytes, b.peak_reserved_bytes);
  EXPECT_EQ(a.allocations, b.allocations);
  EXPECT_EQ(a.frees, b.frees);
  EXPECT_EQ(a.cache_hits, b.cache_hits);
  EXPECT_EQ(a.out_of_memory, b.out_of_memory);
}

TEST(AllocatorTest, ZeroSizeReturnsNullAndChangesNoStats) {
  Allocator alloc(MiB);
  const AllocatorStats before = alloc.stats();
  EXPECT_EQ(alloc.allocate(0), nullptr);
  expect_same_stats(before, alloc.stats());
}

TEST(AllocatorTest, RoundSizeClasses) {
  EXPECT_EQ(Allocator::round_size(0), 0u);
  EXPECT_EQ(Allocator::round_size(1), 64u);
  EXPECT_EQ(Allocator::round_size(64), 64u);
  EXPECT_EQ(Allocator::round_size(65), 128u);
  EXPECT_EQ(Allocator::round_size(Allocator::kSmallLimit), Allocator::kSmallLimit);
  // Above the small limit requests round to the large granule.
  EXPECT_EQ(Allocator::round_size(Allocator::kSmallLimit + 1), 2 * MiB);
  EXPECT_EQ(Allocator::round_size(3 * MiB - 1), 3 * MiB);
}

TEST(AllocatorTest, PointersAre64ByteAlignedForManySizes) {
  Allocator alloc(256 * MiB);
  const std::size_t sizes[] = {1,    7,    63,         64,          65,          100,
                               1000, 4097, 64 * KiB + 3, MiB - 1,   MiB,         MiB + 1,
                               3 * MiB + 5};
  std::vector<void*> ptrs;
  for (std::size_t n : sizes) {
    void* p = alloc.allocate(n);
    ASSERT_NE(p, nullptr) << n;
    EXPECT_TRUE(aligned(p)) << "size " << n << " -> " << p;
    std::memset(p, 0xAB, n);  // the whole requested range must be usable
    ptrs.push_back(p);
  }
  for (void* p : ptrs) alloc.deallocate(p);
  EXPECT_EQ(alloc.stats().allocated_bytes, 0u);
}

// CUDA's statistics: block and segment gauges survive a reset of the
// accumulated counters (the bridge used to derive the live-block count from
// allocations - frees, which went negative after a reset), and the byte
// totals count from the reset.
TEST(AllocatorTest, GaugesSurviveAResetOfAccumulatedCounters) {
  Allocator alloc(64 * MiB);
  void* a = alloc.allocate(100);   // -> 128
  void* b = alloc.allocate(1000);  // -> 1024
  alloc.reset_accumulated_stats();
  AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.live_blocks, 2u);
  EXPECT_EQ(s.peak_live_blocks, 2u);
  EXPECT_EQ(s.segments, 2u);
  EXPECT_EQ(s.allocations, 0u);
  EXPECT_EQ(s.allocated_bytes_total, 0u);
  EXPECT_EQ(s.host_allocations, 0u);

  alloc.deallocate(a);
  alloc.deallocate(b);
  s = alloc.stats();
  EXPECT_EQ(s.live_blocks, 0u);
  EXPECT_EQ(s.segments, 2u);  // cached, still reserved
  EXPECT_EQ(s.frees, 2u);
  EXPECT_EQ(s.freed_bytes_total, 1152u);

  void* c = alloc.allocate(120);  // the cached 128-byte block
  s = alloc.stats();
  EXPECT_EQ(s.live_blocks, 1u);
  EXPECT_EQ(s.allocated_bytes_total, 128u);
  EXPECT_EQ(s.host_allocations, 0u);

  alloc.empty_cache();  // the idle 1024-byte block goes back to the host
  s = alloc.stats();
  EXPECT_EQ(s.segments, 1u);
  EXPECT_EQ(s.peak_segments, 2u);
  EXPECT_EQ(s.host_frees, 1u);
  EXPECT_EQ(s.released_bytes_total, 1024u);

  alloc.reset_peak_stats();
  s = alloc.stats();
  EXPECT_EQ(s.peak_live_blocks, 1u);
  EXPECT_EQ(s.peak_segments, 1u);
  alloc.deallocate(c);
}

TEST(AllocatorTest, StatsExactAfterAllocFreeSequence) {
  Allocator alloc(64 * MiB);
  void* a = alloc.allocate(100);   // -> 128
  void* b = alloc.allocate(1000);  // -> 1024
  AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.allocated_bytes, 1152u);
  EXPECT_EQ(s.reserved_bytes, 1152u);
  EXPECT_EQ(s.peak_allocated_bytes, 1152u);
  EXPECT_EQ(s.allocations, 2u);

  alloc.deallocate(a);  // goes to the cache: reserved stays
  s = alloc.stats();
  EXPECT_EQ(s.allocated_bytes, 1024u);
  EXPECT_EQ(s.reserved_bytes, 1152u);
  EXPECT_EQ(s.peak_allocated_bytes, 1152u);
  EXPECT_EQ(s.frees, 1u);

  void* c = alloc.allocate(3 * MiB - 1);  // -> 3 MiB, a fresh block
  s = alloc.stats();
  EXPECT_EQ(s.allocated_bytes, 1024u + 3 * MiB);
  EXPECT_EQ(s.reserved_bytes, 1152u + 3 * MiB);
  EXPECT_EQ(s.peak_allocated_bytes, 1024u + 3 * MiB);
  EXPECT_EQ(s.peak_reserved_bytes, 1152u + 3 * MiB);
  EXPECT_EQ(s.cache_hits, 0u);

  alloc.deallocate(b);
  alloc.deallocate(c);
  s = alloc.stats();
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.reserved_bytes, 1152u + 3 * MiB);
  EXPECT_EQ(s.peak_allocated_bytes, 1024u + 3 * MiB);
  EXPECT_EQ(s.allocations, 3u);
  EXPECT_EQ(s.frees, 3u);

  // Peaks restart from the current values.
  alloc.reset_peak_stats();
  s = alloc.stats();
  EXPECT_EQ(s.peak_allocated_bytes, 0u);
  EXPECT_EQ(s.peak_reserved_bytes, 1152u + 3 * MiB);
}

TEST(AllocatorTest, FreedBlockIsReusedAsCacheHit) {
  Allocator alloc(64 * MiB);
  void* small = alloc.allocate(256);
  alloc.deallocate(small);
  // 200 bytes rounds to the same 256-byte class.
  void* again = alloc.allocate(200);
  EXPECT_EQ(again, small);
  AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.cache_hits, 1u);
  EXPECT_EQ(s.reserved_bytes, 256u);
  EXPECT_EQ(s.allocated_bytes, 256u);
  EXPECT_TRUE(alloc.owns(again));

  void* large = alloc.allocate(2 * MiB);
  alloc.deallocate(large);
  void* large_again = alloc.allocate(2 * MiB - 100);
  EXPECT_EQ(large_again, large);
  s = alloc.stats();
  EXPECT_EQ(s.cache_hits, 2u);
  EXPECT_EQ(s.reserved_bytes, 256u + 2 * MiB);
  EXPECT_EQ(s.allocated_bytes, 256u + 2 * MiB);
  alloc.deallocate(again);
  alloc.deallocate(large_again);
}

TEST(AllocatorTest, EmptyCacheDropsReservedToAllocated) {
  Allocator alloc(64 * MiB);
  void* keep = alloc.allocate(4 * KiB);
  void* small = alloc.allocate(512);
  void* large = alloc.allocate(2 * MiB);
  alloc.deallocate(small);
  alloc.deallocate(large);
  ASSERT_GT(alloc.stats().reserved_bytes, alloc.stats().allocated_bytes);

  alloc.empty_cache();
  AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.reserved_bytes, s.allocated_bytes);
  EXPECT_EQ(s.allocated_bytes, 4 * KiB);
  // The live block is untouched and still owned.
  EXPECT_TRUE(alloc.owns(keep));
  alloc.deallocate(keep);
  EXPECT_EQ(alloc.stats().allocated_bytes, 0u);
}

TEST(AllocatorTest, HugeRequestsThrowAndAllocatorKeepsWorking) {
  Allocator alloc(16 * MiB);
  void* live = alloc.allocate(1000);
  const AllocatorStats before = alloc.stats();

  const std::size_t huge[] = {std::numeric_limits<std::size_t>::max() / 2,
                              std::numeric_limits<std::size_t>::max(),  // rounding overflows
                              32 * MiB};                                // just over capacity
  for (std::size_t n : huge) {
    EXPECT_THROW(alloc.allocate(n), OutOfMemoryError) << n;
  }
  // The error is also an Error of kind kOutOfMemory (what the bridge maps).
  try {
    alloc.allocate(32 * MiB);
    ADD_FAILURE() << "expected OutOfMemoryError";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfMemory);
  }

  AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.out_of_memory, 4u);
  EXPECT_EQ(s.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(s.reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(s.allocations, before.allocations);

  void* after = alloc.allocate(4 * KiB);
  ASSERT_NE(after, nullptr);
  EXPECT_TRUE(aligned(after));
  s = alloc.stats();
  EXPECT_EQ(s.allocated_bytes, 1024u + 4 * KiB);
  EXPECT_EQ(s.allocations, before.allocations + 1);
  alloc.deallocate(live);
  alloc.deallocate(after);
  EXPECT_EQ(alloc.stats().allocated_bytes, 0u);
}

TEST(AllocatorTest, OverLimitReleasesCacheAndSucceedsWhenItFits) {
  Allocator alloc(4 * MiB);
  void* big = alloc.allocate(3 * MiB);
  alloc.deallocate(big);  // 3 MiB now sits in the cache
  ASSERT_EQ(alloc.stats().reserved_bytes, 3 * MiB);

  // 2 MiB cannot reuse the 3 MiB block (> 25% waste) and 3 + 2 > 4 MiB, so the
  // allocator must drop its cache rather than fail.
  void* p = alloc.allocate(2 * MiB);
  ASSERT_NE(p, nullptr);
  AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.out_of_memory, 0u);
  EXPECT_EQ(s.allocated_bytes, 2 * MiB);
  EXPECT_EQ(s.reserved_bytes, 2 * MiB);
  alloc.deallocate(p);
}

TEST(AllocatorTest, ConcurrentAllocFreeLeavesNothingAllocated) {
  Allocator alloc(256 * MiB);
  constexpr int kThreads = 4;
  constexpr int kIters = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&alloc, t] {
      std::vector<void*> held;
      for (int i = 0; i < kIters; ++i) {
        const std::size_t n = 1 + static_cast<std::size_t>((i * 37 + t * 101) % 8192);
        void* p = alloc.allocate(n);
        static_cast<unsigned char*>(p)[0] = static_cast<unsigned char>(t);
        held.push_back(p);
        if (held.size() > 8) {  // keep a few live so threads interleave reuse
          alloc.deallocate(held.front());
          held.erase(held.begin());
        }
      }
      for (void* p : held) alloc.deallocate(p);
    });
  }
  for (auto& th : threads) th.join();
  const AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.allocations, std::uint64_t{kThreads} * kIters);
  EXPECT_EQ(s.frees, std::uint64_t{kThreads} * kIters);
  EXPECT_LE(s.peak_reserved_bytes, alloc.capacity());
}

TEST(AllocatorTest, SetCapacityChangesTheLimit) {
  Allocator alloc(MiB);
  EXPECT_EQ(alloc.capacity(), MiB);
  EXPECT_THROW(alloc.allocate(2 * MiB), OutOfMemoryError);

  alloc.set_capacity(4 * MiB);
  EXPECT_EQ(alloc.capacity(), 4 * MiB);
  void* p = alloc.allocate(2 * MiB);
  ASSERT_NE(p, nullptr);

  // Lowering below what is live refuses new fresh blocks, but keeps live ones.
  alloc.set_capacity(2 * MiB);
  EXPECT_THROW(alloc.allocate(MiB), OutOfMemoryError);
  EXPECT_TRUE(alloc.owns(p));
  alloc.deallocate(p);
  EXPECT_EQ(alloc.stats().allocated_bytes, 0u);
}

TEST(AllocatorTest, NullAndForeignPointersAreIgnored) {
  Allocator alloc(MiB);
  void* mine = alloc.allocate(128);
  const AllocatorStats before = alloc.stats();

  alloc.deallocate(nullptr);
  int on_stack = 0;
  alloc.deallocate(&on_stack);
  std::vector<char> heap(256);
  alloc.deallocate(heap.data());
  EXPECT_FALSE(alloc.owns(&on_stack));
  expect_same_stats(before, alloc.stats());

  // A double free is also ignored: the block is already in the cache.
  alloc.deallocate(mine);
  alloc.deallocate(mine);
  const AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.frees, 1u);
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.reserved_bytes, 128u);
}

// With a stream clock, emptying the cache returns only blocks whose queued
// users have run: a block freed (by one thread) after its kernel was queued
// stays cached while another thread empties the cache, and is still reused
// for new requests (stream order makes that safe).
TEST(AllocatorTest, EmptyCacheKeepsBlocksWhoseQueuedUsersHaveNotRun) {
  Allocator allocator(std::size_t{1} << 30);
  std::uint64_t issued = 0, completed = 0;
  allocator.set_stream_clock([&] { return issued; }, [&](std::uint64_t stamp) { return completed >= stamp; });
  void* a = allocator.allocate(4096);
  void* b = allocator.allocate(4096);
  issued = 3;  // kernels 1..3 queued, reading a
  allocator.deallocate(a);
  completed = 2;
  allocator.empty_cache();
  EXPECT_EQ(allocator.stats().reserved_bytes, 2 * Allocator::round_size(4096)) << "a went back while kernel 3 may read it";
  completed = 3;
  allocator.empty_cache();
  EXPECT_EQ(allocator.stats().reserved_bytes, Allocator::round_size(4096));
  // A busy block is still reused at once.
  issued = 7;
  allocator.deallocate(b);
  allocator.empty_cache();
  EXPECT_EQ(allocator.allocate(4096), b);
  allocator.deallocate(b);
  completed = 7;
  allocator.empty_cache();
  EXPECT_EQ(allocator.stats().reserved_bytes, 0u);
}

}  // namespace
}  // namespace vtpu::runtime

namespace vtpu::runtime {
namespace {

TEST(AllocatorTest, SmallClassesCoverEverySizeWithBoundedWaste) {
  std::size_t previous_class = 0;
  for (std::size_t r = Allocator::kAlignment; r <= Allocator::kSmallLimit; r += Allocator::kAlignment) {
    const std::size_t cls = Allocator::small_class(r);
    ASSERT_LT(cls, Allocator::kSmallClasses) << r;
    ASSERT_GE(Allocator::small_class_bound(cls), r) << r;
    if (cls > 0) ASSERT_LT(Allocator::small_class_bound(cls - 1), r) << r;
    ASSERT_GE(cls, previous_class) << r;
    previous_class = cls;
    const std::size_t rounded = Allocator::round_size(r);
    ASSERT_EQ(rounded, Allocator::small_class_bound(cls)) << r;
    ASSERT_EQ(Allocator::small_class(rounded), cls) << r;
    if (r <= Allocator::kExactClassLimit) {
      ASSERT_EQ(rounded, r) << "sizes up to 4 KiB keep 64-byte classes";
    } else {
      ASSERT_LE(static_cast<double>(rounded), 1.125 * static_cast<double>(r)) << r;
    }
  }
  EXPECT_EQ(Allocator::small_class_bound(Allocator::kSmallClasses - 1), Allocator::kSmallLimit);
  EXPECT_EQ(Allocator::round_size(5000), 5120u);
}

TEST(AllocatorTest, ABlockServesEveryRequestOfItsClass) {
  Allocator alloc(64 * MiB);
  void* block = alloc.allocate(5000);  // class (4608, 5120]: a 5120-byte block
  EXPECT_EQ(alloc.stats().allocated_bytes, 5120u);
  alloc.deallocate(block);
  void* again = alloc.allocate(4700);
  EXPECT_EQ(again, block);
  EXPECT_EQ(alloc.stats().cache_hits, 1u);
  EXPECT_EQ(alloc.stats().reserved_bytes, 5120u);
  alloc.deallocate(again);
  void* other_class = alloc.allocate(4500);  // (4096, 4608]: a block of its own
  EXPECT_NE(other_class, block);
  EXPECT_EQ(alloc.stats().reserved_bytes, 5120u + 4608u);
  alloc.deallocate(other_class);
}

TEST(AllocatorTest, ReservedMemoryStaysBoundedWhenSizesKeepChanging) {
  // A server's varying shapes: one live tensor at a time, thousands of distinct
  // sizes. With exact-size reuse every size left a cached block behind
  // (hundreds of MB here); now the cache holds a few blocks per class.
  Allocator alloc(std::size_t{8} << 30);
  std::uint64_t seed = 12345;
  std::size_t largest = 0;
  for (int i = 0; i < 20000; ++i) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    const std::size_t bytes = 64 * (1 + (seed >> 33) % 4000);  // 64 B .. 256 KB
    void* a = alloc.allocate(bytes);
    void* b = alloc.allocate(bytes / 2 + 64);
    alloc.deallocate(a);
    alloc.deallocate(b);
    largest = std::max(largest, alloc.stats().reserved_bytes);
  }
  EXPECT_LT(largest, std::size_t{16} << 20) << "reserved grew with the number of distinct sizes";
  EXPECT_GT(alloc.stats().cache_hits, 30000u);
}

}  // namespace
}  // namespace vtpu::runtime
