#include "vtpu/runtime/event.h"

#include <atomic>

#include "vtpu/runtime/error.h"
#include "vtpu/runtime/stream.h"

namespace vtpu::runtime {

struct Event::State {
  Stream* stream = nullptr;
  std::uint64_t sequence = 0;
  // Written by the worker when it passes the marker, read after wait_for.
  std::atomic<std::int64_t> timestamp_ns{0};
};

Event::Event(bool enable_timing) : state_(std::make_shared<State>()), enable_timing_(enable_timing) {}

void Event::record(Stream& stream) {
  // A fresh state per record: a task of an earlier record must not overwrite
  // the timestamp of the later one.
  auto state = std::make_shared<State>();
  state->stream = &stream;
  std::weak_ptr<State> weak = state;
  state->sequence = stream.enqueue([weak] {
    if (auto s = weak.lock()) {
      s->timestamp_ns.store(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now().time_since_epoch())
                                .count(),
                            std::memory_order_release);
    }
  });
  state_ = std::move(state);
}

bool Event::recorded() const { return state_->stream != nullptr; }

bool Event::query() const {
  if (!state_->stream) return true;
  return state_->stream->completed() >= state_->sequence;
}

void Event::synchronize() const {
  if (state_->stream) state_->stream->wait_for(state_->sequence);
}

void Event::block(Stream& stream) const {
  if (!state_->stream || state_->stream == &stream) return;
  auto state = state_;
  stream.enqueue([state] { state->stream->wait_for(state->sequence); });
}

double Event::elapsed_ms(const Event& end) const {
  if (!enable_timing_ || !end.enable_timing_)
    throw Error(ErrorKind::kInvalidArgument,
                "[event] elapsed_time needs both events created with enable_timing=True");
  if (!recorded() || !end.recorded())
    throw Error(ErrorKind::kInvalidArgument, "[event] elapsed_time needs both events recorded");
  if (!query() || !end.query())
    throw Error(ErrorKind::kInvalidArgument,
                "[event] elapsed_time needs both events completed; synchronize first");
  const auto start_ns = state_->timestamp_ns.load(std::memory_order_acquire);
  const auto end_ns = end.state_->timestamp_ns.load(std::memory_order_acquire);
  return static_cast<double>(end_ns - start_ns) / 1e6;
}

}  // namespace vtpu::runtime
