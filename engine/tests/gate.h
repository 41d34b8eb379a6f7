// Test helper: holds a stream's worker inside a task until opened, so a test
// controls what is still pending. Opens itself on destruction, so a failed
// assertion cannot leave the stream's destructor waiting forever.
#pragma once

#include <atomic>
#include <future>

#include "vtpu/runtime/stream.h"

namespace vtpu::runtime::testing {

class Gate {
 public:
  Gate() : future_(promise_.get_future().share()) {}
  ~Gate() { open(); }
  Stream::Task task() const {
    return [f = future_] { f.wait(); };
  }
  void open() {
    if (!opened_.exchange(true)) promise_.set_value();
  }

 private:
  std::promise<void> promise_;
  std::shared_future<void> future_;
  std::atomic<bool> opened_{false};
};

}  // namespace vtpu::runtime::testing
