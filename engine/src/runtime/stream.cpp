#include "vtpu/runtime/stream.h"

#include <chrono>

namespace vtpu::runtime {

Stream::Stream(std::function<void()> on_worker_start) {
  worker_ = std::thread([this, start = std::move(on_worker_start)]() mutable {
    worker_loop(std::move(start));
  });
  // The id is needed by on_worker_thread() before the first task runs.
  worker_id_ = worker_.get_id();
}

Stream::~Stream() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  if (worker_.joinable()) worker_.join();
}

std::uint64_t Stream::enqueue(Task task) {
  std::uint64_t sequence;
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
    sequence = enqueued_.fetch_add(1, std::memory_order_acq_rel) + 1;
    wake = worker_sleeping_;
  }
  if (wake) work_ready_.notify_one();
  return sequence;
}

void Stream::worker_loop(std::function<void()> on_worker_start) {
  if (on_worker_start) {
    try {
      on_worker_start();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!first_error_) first_error_ = std::current_exception();
    }
  }
  std::deque<Task> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (queue_.empty() && !stopping_) {
        // Spin briefly before sleeping: a producer issuing small ops back to
        // back would otherwise pay a futex wake-up per op.
        lock.unlock();
        const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
        while (std::chrono::steady_clock::now() < spin_until &&
               enqueued_.load(std::memory_order_acquire) ==
                   completed_.load(std::memory_order_acquire)) {
          std::this_thread::yield();
        }
        lock.lock();
        worker_sleeping_ = true;
        work_ready_.wait(lock, [this] { return !queue_.empty() || stopping_; });
        worker_sleeping_ = false;
      }
      if (queue_.empty() && stopping_) return;
      batch.swap(queue_);
    }
    while (!batch.empty()) {
      try {
        batch.front()();
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!first_error_) first_error_ = std::current_exception();
      }
      // Destroy the task (and the buffers it holds) before announcing it done,
      // so that memory statistics read after a synchronize are exact.
      batch.pop_front();
      const std::uint64_t done = completed_.fetch_add(1, std::memory_order_seq_cst) + 1;
      // Wake waiters as soon as the earliest task one waits for has run, not
      // once per batch: a later task of the batch may itself wait on a thread
      // that waits for this one (events across streams). A waiter publishes
      // its target before its last predicate check (both seq_cst), so either
      // it sees this increment or this load sees its target. Resetting the
      // target under the lock means a waiter that wakes short of its own
      // target publishes it again before sleeping.
      if (waiters_.load(std::memory_order_seq_cst) > 0 && done >= wake_at_.load(std::memory_order_seq_cst)) {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          wake_at_.store(UINT64_MAX, std::memory_order_seq_cst);
        }
        waiter_wakeups_.fetch_add(1, std::memory_order_relaxed);
        work_done_.notify_all();
      }
    }
  }
}

void Stream::wait_for(std::uint64_t sequence) const {
  if (completed_.load(std::memory_order_acquire) >= sequence) return;
  std::unique_lock<std::mutex> lock(mutex_);
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  while (completed_.load(std::memory_order_seq_cst) < sequence) {
    std::uint64_t earliest = wake_at_.load(std::memory_order_seq_cst);
    while (sequence < earliest &&
           !wake_at_.compare_exchange_weak(earliest, sequence, std::memory_order_seq_cst)) {
    }
    if (completed_.load(std::memory_order_seq_cst) >= sequence) break;
    work_done_.wait(lock);
  }
  waiters_.fetch_sub(1, std::memory_order_seq_cst);
}

void Stream::synchronize() {
  wait_for(enqueued_.load(std::memory_order_acquire));
  if (std::exception_ptr error = take_error()) std::rethrow_exception(error);
}

bool Stream::query() const {
  return completed_.load(std::memory_order_acquire) == enqueued_.load(std::memory_order_acquire);
}

bool Stream::has_pending_error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return first_error_ != nullptr;
}

std::exception_ptr Stream::take_error() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::exception_ptr error = first_error_;
  first_error_ = nullptr;
  return error;
}

}  // namespace vtpu::runtime
