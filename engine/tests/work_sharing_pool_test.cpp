// Work-sharing pool: every element is processed exactly once, with helpers
// that join, join late or not at all, from concurrent callers, and the pool
// stops cleanly.
#include "vtpu/runtime/work_sharing_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace vtpu::runtime {
namespace {

struct Coverage {
  std::vector<std::atomic<int>> hits;
  std::atomic<int> calls{0};
  std::chrono::microseconds delay{0};
  explicit Coverage(std::int64_t n) : hits(static_cast<std::size_t>(n)) {}
};

void count_range(std::int64_t begin, std::int64_t end, void* context) {
  auto* c = static_cast<Coverage*>(context);
  c->calls.fetch_add(1);
  for (std::int64_t i = begin; i < end; ++i) c->hits[static_cast<std::size_t>(i)].fetch_add(1);
  if (c->delay.count() > 0) std::this_thread::sleep_for(c->delay);
}

void expect_each_once(const Coverage& c) {
  for (std::size_t i = 0; i < c.hits.size(); ++i) ASSERT_EQ(c.hits[i].load(), 1) << "element " << i;
}

TEST(WorkSharingPoolTest, EveryElementOnceForManySizesAndGrains) {
  WorkSharingPool pool(3);
  for (std::int64_t total : {1, 2, 7, 63, 64, 65, 1000, 4097, 100000}) {
    for (std::int64_t grain : {1, 16, 1000}) {
      Coverage c(total);
      pool.run(total, grain, 4, &count_range, &c);
      expect_each_once(c);
    }
  }
}

TEST(WorkSharingPoolTest, SmallRangesAndOneThreadRunInlineAsOneCall) {
  WorkSharingPool pool(1);
  Coverage small(100);
  pool.run(100, 100, 2, &count_range, &small);
  EXPECT_EQ(small.calls.load(), 1);
  expect_each_once(small);
  Coverage single(10000);
  pool.run(10000, 1, 1, &count_range, &single);
  EXPECT_EQ(single.calls.load(), 1);
  expect_each_once(single);
  EXPECT_EQ(pool.shared_runs(), 0u);
}

TEST(WorkSharingPoolTest, RangesSplitIntoChunksThatHelpersShare) {
  WorkSharingPool pool(1);
  // Chunks long enough that the helper wakes while some are left.
  for (int attempt = 0; attempt < 20 && pool.helper_chunks() == 0; ++attempt) {
    Coverage c(64);
    c.delay = std::chrono::milliseconds(2);
    pool.run(64, 1, 2, &count_range, &c);
    expect_each_once(c);
    EXPECT_EQ(c.calls.load(), 8);  // (1 + 1 helper) x 4 chunks per thread
  }
  EXPECT_GT(pool.helper_chunks(), 0u);
  EXPECT_GT(pool.shared_runs(), 0u);
}

TEST(WorkSharingPoolTest, AskingForMoreThreadsStartsHelpers) {
  // torch.set_num_threads(1) before the first launch, raised later.
  WorkSharingPool pool(0);
  Coverage inline_run(5000);
  pool.run(5000, 10, 1, &count_range, &inline_run);
  expect_each_once(inline_run);
  EXPECT_EQ(inline_run.calls.load(), 1);
  EXPECT_EQ(pool.helpers(), 0);
  Coverage c(5000);
  pool.run(5000, 10, 3, &count_range, &c);
  expect_each_once(c);
  EXPECT_EQ(pool.helpers(), 2);
  EXPECT_EQ(c.calls.load(), 12);  // (1 + 2 helpers) x 4 chunks per thread
}

TEST(WorkSharingPoolTest, BackToBackRangesNeverLoseOrRepeatWork) {
  // Helpers wake late and find ranges closed, or join the next one: each
  // range must still be processed exactly once.
  WorkSharingPool pool(2);
  for (int round = 0; round < 2000; ++round) {
    const std::int64_t total = 1 + (round * 37) % 300;
    Coverage c(total);
    pool.run(total, 4, 3, &count_range, &c);
    expect_each_once(c);
  }
}

TEST(WorkSharingPoolTest, ConcurrentCallersEachGetTheirRangeDone) {
  // One caller shares the pool; the other finds it busy and runs inline.
  WorkSharingPool pool(2);
  std::atomic<bool> failed{false};
  auto caller = [&] {
    for (int round = 0; round < 500; ++round) {
      Coverage c(257);
      pool.run(257, 8, 3, &count_range, &c);
      for (auto& h : c.hits)
        if (h.load() != 1) failed = true;
    }
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  EXPECT_FALSE(failed.load());
}

TEST(WorkSharingPoolTest, StopsWhileHelpersSleep) {
  auto pool = std::make_unique<WorkSharingPool>(3);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // helpers go to sleep
  Coverage c(1000);
  pool->run(1000, 10, 4, &count_range, &c);
  expect_each_once(c);
  pool.reset();  // joins; the test hangs if a helper missed the stop
  SUCCEED();
}

}  // namespace
}  // namespace vtpu::runtime
