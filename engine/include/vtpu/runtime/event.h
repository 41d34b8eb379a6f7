// Stream events: a marker recorded into a stream; it completes when the
// stream reaches it, and remembers when that happened (for elapsed_time).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

namespace vtpu::runtime {

class Stream;

class Event {
 public:
  explicit Event(bool enable_timing = false);

  // Enqueues the marker; recording again moves the event to the new point.
  void record(Stream& stream);
  // True when never recorded or when the stream has passed the marker.
  bool query() const;
  // Blocks until the marker has been passed.
  void synchronize() const;
  // Makes `stream` wait for this event. Streams are in order, so on the same
  // stream this is free; on another stream the waiting task blocks its worker.
  void block(Stream& stream) const;
  // Milliseconds between this event and `end`; both recorded with timing and
  // completed, else Error(kInvalidArgument).
  double elapsed_ms(const Event& end) const;
  bool recorded() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
  bool enable_timing_;
};

}  // namespace vtpu::runtime
