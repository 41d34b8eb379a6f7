// Stream events: completion queries, synchronization, timing, and ordering
// work across two streams with block().
#include "vtpu/runtime/event.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gate.h"
#include "vtpu/runtime/error.h"
#include "vtpu/runtime/stream.h"

namespace vtpu::runtime {
namespace {

using namespace std::chrono_literals;

using testing::Gate;

void expect_invalid_argument(const Event& start, const Event& end) {
  try {
    start.elapsed_ms(end);
    ADD_FAILURE() << "elapsed_ms should throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  }
}

TEST(EventTest, UnrecordedEventIsComplete) {
  Event event;
  EXPECT_FALSE(event.recorded());
  EXPECT_TRUE(event.query());
  event.synchronize();  // must return at once
}

TEST(EventTest, QueryIsFalseUntilStreamPassesTheMarker) {
  Stream stream;
  Gate gate;
  stream.enqueue(gate.task());
  Event event;
  event.record(stream);
  const bool recorded = event.recorded();
  const bool done_while_blocked = event.query();
  gate.open();
  EXPECT_TRUE(recorded);
  EXPECT_FALSE(done_while_blocked);

  event.synchronize();
  EXPECT_TRUE(event.query());
}

TEST(EventTest, RecordingAgainMovesTheMarker) {
  Stream stream;
  Event event;
  event.record(stream);
  event.synchronize();
  ASSERT_TRUE(event.query());

  Gate gate;
  stream.enqueue(gate.task());
  event.record(stream);
  const bool done_while_blocked = event.query();
  gate.open();
  EXPECT_FALSE(done_while_blocked);
  event.synchronize();
  EXPECT_TRUE(event.query());
}

TEST(EventTest, SynchronizeWaitsForEarlierWork) {
  Stream stream;
  std::atomic<bool> done{false};
  stream.enqueue([&] {
    std::this_thread::sleep_for(10ms);
    done = true;
  });
  Event event;
  event.record(stream);
  event.synchronize();
  EXPECT_TRUE(done.load());
}

TEST(EventTest, ElapsedMsMeasuresWorkBetweenEvents) {
  Stream stream;
  Event start(/*enable_timing=*/true);
  Event end(/*enable_timing=*/true);
  start.record(stream);
  stream.enqueue([] { std::this_thread::sleep_for(20ms); });
  end.record(stream);
  end.synchronize();
  const double ms = start.elapsed_ms(end);
  EXPECT_GE(ms, 15.0);
  EXPECT_LT(ms, 5000.0);  // sanity: a unit mix-up would be far off
  EXPECT_LE(end.elapsed_ms(start), -15.0);
}

TEST(EventTest, ElapsedMsRequiresTimingRecordingAndCompletion) {
  Stream stream;
  {  // timing disabled on one or both
    Event plain_a, plain_b;
    Event timed(true);
    plain_a.record(stream);
    plain_b.record(stream);
    timed.record(stream);
    stream.synchronize();
    expect_invalid_argument(plain_a, plain_b);
    expect_invalid_argument(timed, plain_b);
    expect_invalid_argument(plain_a, timed);
  }
  {  // not recorded
    Event a(true), b(true);
    expect_invalid_argument(a, b);
    a.record(stream);
    a.synchronize();
    expect_invalid_argument(a, b);
  }
  {  // recorded but not yet completed
    Gate gate;
    Event a(true), b(true);
    a.record(stream);
    stream.enqueue(gate.task());
    b.record(stream);
    expect_invalid_argument(a, b);
    gate.open();
    b.synchronize();
    EXPECT_NO_THROW(a.elapsed_ms(b));
  }
}

TEST(EventTest, BlockOrdersWorkAcrossStreams) {
  Stream producer;
  Stream consumer;
  Gate gate;
  std::mutex mutex;
  std::vector<std::string> order;
  auto log = [&](const char* what) {
    std::lock_guard<std::mutex> lock(mutex);
    order.emplace_back(what);
  };

  producer.enqueue(gate.task());
  producer.enqueue([&] { log("producer"); });
  Event ready;
  ready.record(producer);
  ready.block(consumer);
  consumer.enqueue([&] { log("consumer"); });

  // The consumer must be held back by the event, not merely slow.
  std::this_thread::sleep_for(10ms);
  const bool consumer_idle_early = consumer.query();
  gate.open();
  consumer.synchronize();
  producer.synchronize();

  EXPECT_FALSE(consumer_idle_early);
  EXPECT_EQ(order, (std::vector<std::string>{"producer", "consumer"}));
}

// Two streams signalling each other: `a` passes marker `ea`, then waits for
// `eb`, which `b` records only after it has seen `ea`. Waiters must be woken as
// soon as a marker is passed, not when the worker's whole batch is finished.
TEST(EventTest, CrossStreamHandshakeDoesNotDeadlock) {
  Stream a;
  Stream b;
  Gate gate;
  a.enqueue(gate.task());  // holds `a` so the next two tasks share one batch
  Event ea;
  ea.record(a);
  ea.block(b);  // b's worker is now asleep in a.wait_for(ea)
  Event eb;
  eb.record(b);
  eb.block(a);
  std::atomic<bool> a_done{false};
  a.enqueue([&] { a_done = true; });
  // Let b's worker reach its wait before `a` can pass the marker.
  std::this_thread::sleep_for(10ms);
  gate.open();
  a.synchronize();
  b.synchronize();
  EXPECT_TRUE(a_done.load());
  EXPECT_TRUE(ea.query());
  EXPECT_TRUE(eb.query());
}

TEST(EventTest, BlockOnSameStreamOrUnrecordedIsFree) {
  Stream stream;
  Event unrecorded;
  unrecorded.block(stream);  // nothing to wait for: no task is added
  EXPECT_EQ(stream.enqueued(), 0u);

  Event event;
  event.record(stream);
  event.block(stream);  // same stream: in-order already
  EXPECT_EQ(stream.enqueued(), 1u);
  stream.synchronize();
}

}  // namespace
}  // namespace vtpu::runtime
