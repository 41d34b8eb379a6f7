// In-order stream: ordering (single and multiple producers), synchronization,
// error propagation and recovery, draining on destruction, the worker hook.
#include "vtpu/runtime/stream.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

#include "gate.h"
#include "vtpu/runtime/error.h"

namespace vtpu::runtime {
namespace {

using namespace std::chrono_literals;

using testing::Gate;

TEST(StreamTest, TasksRunInEnqueueOrder) {
  Stream stream;
  std::vector<int> order;  // only the worker writes it
  constexpr int kTasks = 1000;
  for (int i = 0; i < kTasks; ++i) {
    const std::uint64_t seq = stream.enqueue([&order, i] { order.push_back(i); });
    EXPECT_EQ(seq, static_cast<std::uint64_t>(i + 1));
  }
  stream.synchronize();
  std::vector<int> expected(kTasks);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(order, expected);
  EXPECT_EQ(stream.enqueued(), static_cast<std::uint64_t>(kTasks));
  EXPECT_EQ(stream.completed(), static_cast<std::uint64_t>(kTasks));
}

TEST(StreamTest, EachProducersTasksStayInOrder) {
  Stream stream;
  constexpr int kProducers = 4;
  constexpr int kPerProducer = 500;
  std::vector<std::pair<int, int>> order;  // (producer, index), worker-only
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kPerProducer; ++i)
        stream.enqueue([&order, p, i] { order.emplace_back(p, i); });
    });
  }
  for (auto& t : producers) t.join();
  stream.synchronize();

  ASSERT_EQ(order.size(), static_cast<std::size_t>(kProducers * kPerProducer));
  std::vector<int> next(kProducers, 0);
  for (const auto& [p, i] : order) {
    EXPECT_EQ(i, next[p]) << "producer " << p << " out of order";
    next[p] = i + 1;
  }
  for (int p = 0; p < kProducers; ++p) EXPECT_EQ(next[p], kPerProducer);
}

TEST(StreamTest, SynchronizeWaitsForAllTasks) {
  Stream stream;
  std::atomic<int> done{0};
  stream.enqueue([&] {
    std::this_thread::sleep_for(20ms);
    done.fetch_add(1);
  });
  for (int i = 0; i < 10; ++i) stream.enqueue([&] { done.fetch_add(1); });
  stream.synchronize();
  EXPECT_EQ(done.load(), 11);
  EXPECT_TRUE(stream.query());
}

TEST(StreamTest, TaskErrorIsRethrownOnceAndStreamStaysUsable) {
  Stream stream;
  std::vector<int> ran;
  stream.enqueue([&] { ran.push_back(1); });
  stream.enqueue([] { throw Error(ErrorKind::kInvalidArgument, "first failure"); });
  stream.enqueue([&] { ran.push_back(3); });
  // Only the first error is kept.
  stream.enqueue([] { throw Error(ErrorKind::kRuntime, "second failure"); });
  stream.enqueue([&] { ran.push_back(5); });

  try {
    stream.synchronize();
    ADD_FAILURE() << "synchronize should rethrow the task's error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_STREQ(e.what(), "first failure");
  }
  EXPECT_EQ(ran, (std::vector<int>{1, 3, 5}));  // later tasks still ran
  EXPECT_FALSE(stream.has_pending_error());
  EXPECT_NO_THROW(stream.synchronize());

  stream.enqueue([&] { ran.push_back(6); });
  EXPECT_NO_THROW(stream.synchronize());
  EXPECT_EQ(ran.back(), 6);
}

TEST(StreamTest, RethrownErrorKeepsItsDerivedType) {
  Stream stream;
  stream.enqueue([] { throw OutOfMemoryError("no room"); });
  EXPECT_THROW(stream.synchronize(), OutOfMemoryError);
  EXPECT_NO_THROW(stream.synchronize());
}

TEST(StreamTest, WaitForReturnsOnceThatTaskRanWithoutRaising) {
  Stream stream;
  Gate gate;
  std::atomic<bool> first_ran{false};
  const std::uint64_t first = stream.enqueue([&] { first_ran = true; });
  const std::uint64_t failing = stream.enqueue([] { throw Error(ErrorKind::kRuntime, "x"); });
  const std::uint64_t blocked = stream.enqueue(gate.task());

  stream.wait_for(first);
  EXPECT_TRUE(first_ran.load());
  EXPECT_GE(stream.completed(), first);
  EXPECT_NO_THROW(stream.wait_for(failing));  // wait_for never raises
  EXPECT_TRUE(stream.has_pending_error());
  EXPECT_LT(stream.completed(), blocked);  // the gated task is still pending

  gate.open();
  stream.wait_for(blocked);
  EXPECT_EQ(stream.completed(), blocked);
  EXPECT_NE(stream.take_error(), nullptr);
  EXPECT_EQ(stream.take_error(), nullptr);  // taking clears it
  EXPECT_NO_THROW(stream.synchronize());
}

TEST(StreamTest, AWaiterIsWokenOnceItsTaskRanNotAfterEveryTask) {
  // A synchronize waits through many tasks; waking it after each one took a
  // core from the worker once per task.
  Stream stream;
  Gate gate;
  stream.enqueue(gate.task());
  constexpr int kTasks = 500;
  std::uint64_t last = 0;
  for (int i = 0; i < kTasks; ++i) last = stream.enqueue([] {});
  std::thread waiter([&] { stream.wait_for(last); });
  std::this_thread::sleep_for(20ms);  // let it block behind the gate
  const std::uint64_t before = stream.waiter_wakeups();
  gate.open();
  waiter.join();
  EXPECT_EQ(stream.completed(), last);
  EXPECT_LE(stream.waiter_wakeups() - before, 2u);  // its own task's, and at most one stray
}

TEST(StreamTest, WaitersForDifferentTasksEachReturnWhenTheirsRan) {
  // The worker wakes everyone at the earliest target; a waiter short of its
  // own target must register it again before sleeping, or it would sleep on.
  Stream stream;
  Gate first_gate, second_gate;
  const std::uint64_t first = stream.enqueue(first_gate.task());
  const std::uint64_t second = stream.enqueue(second_gate.task());
  const std::uint64_t third = stream.enqueue([] {});
  std::promise<void> early_done, late_done;
  std::thread early([&] {
    stream.wait_for(first);
    early_done.set_value();
  });
  std::thread late([&] {
    stream.wait_for(third);
    late_done.set_value();
  });
  std::this_thread::sleep_for(20ms);  // both blocked
  first_gate.open();
  EXPECT_EQ(early_done.get_future().wait_for(5s), std::future_status::ready);
  auto late_future = late_done.get_future();
  EXPECT_EQ(late_future.wait_for(50ms), std::future_status::timeout);  // its task has not run
  EXPECT_LT(stream.completed(), second);
  second_gate.open();
  if (late_future.wait_for(5s) != std::future_status::ready) {
    ADD_FAILURE() << "a waiter for a later task was never woken";
    stream.wait_for(stream.enqueue([] {}));  // a fresh waiter's wake-up frees it, so the test ends
  }
  early.join();
  late.join();
  EXPECT_EQ(stream.completed(), third);
}

TEST(StreamTest, QueryIsTrueOnlyWhenIdle) {
  Stream stream;
  EXPECT_TRUE(stream.query());
  Gate gate;
  stream.enqueue(gate.task());
  const bool busy = !stream.query();
  gate.open();
  EXPECT_TRUE(busy);
  stream.synchronize();
  EXPECT_TRUE(stream.query());
}

TEST(StreamTest, TaskCanEnqueueOntoItsOwnStream) {
  Stream stream;
  std::vector<int> order;
  stream.enqueue([&] {
    order.push_back(1);
    stream.enqueue([&] { order.push_back(2); });
  });
  // The inner task did not exist when the first synchronize started, so it
  // is only covered by a second one (enqueued before the outer task finished).
  stream.synchronize();
  stream.synchronize();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_EQ(stream.completed(), 2u);
}

TEST(StreamTest, DestructorDrainsPendingTasks) {
  std::atomic<int> ran{0};
  {
    Stream stream;
    // The slow first task guarantees the rest are still queued at destruction.
    stream.enqueue([] { std::this_thread::sleep_for(10ms); });
    for (int i = 0; i < 100; ++i) stream.enqueue([&] { ran.fetch_add(1); });
  }
  EXPECT_EQ(ran.load(), 100);
}

TEST(StreamTest, WorkerStartHookRunsOnWorkerBeforeTasks) {
  std::atomic<bool> hook_ran{false};
  std::thread::id hook_thread;
  Stream stream([&] {
    hook_thread = std::this_thread::get_id();
    hook_ran = true;
  });
  bool hook_ran_first = false;
  std::thread::id task_thread;
  bool task_on_worker = false;
  stream.enqueue([&] {
    hook_ran_first = hook_ran.load();
    task_thread = std::this_thread::get_id();
    task_on_worker = stream.on_worker_thread();
  });
  stream.synchronize();
  EXPECT_TRUE(hook_ran_first);
  EXPECT_EQ(hook_thread, task_thread);
  EXPECT_NE(task_thread, std::this_thread::get_id());
  EXPECT_TRUE(task_on_worker);
  EXPECT_FALSE(stream.on_worker_thread());
}

TEST(StreamTest, WorkerStartHookErrorSurfacesOnSynchronize) {
  Stream stream([] { throw Error(ErrorKind::kRuntime, "hook failed"); });
  std::atomic<bool> task_ran{false};
  stream.enqueue([&] { task_ran = true; });
  EXPECT_THROW(stream.synchronize(), Error);
  EXPECT_TRUE(task_ran.load());
  EXPECT_NO_THROW(stream.synchronize());
}

}  // namespace
}  // namespace vtpu::runtime
