// An in-order device stream: tasks run one after another on a worker thread,
// in the order they were enqueued, from any number of producer threads (the
// Python thread and autograd's device thread both enqueue).
//
// A task that throws does not stop the stream: the first error is kept and
// rethrown by the next synchronize(), later tasks still run, and after the
// error has been raised the stream is clean again (the process stays usable).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace vtpu::runtime {

class Stream {
 public:
  using Task = std::function<void()>;

  // `on_worker_start` runs once on the worker thread before any task (the
  // bridge uses it to set up the thread-local state ATen kernels expect).
  explicit Stream(std::function<void()> on_worker_start = {});
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Returns the task's sequence number (1, 2, ...).
  std::uint64_t enqueue(Task task);

  // Blocks until every task enqueued so far has run, then rethrows the first
  // error raised by any of them (clearing it).
  void synchronize();
  // Blocks until task `sequence` has run; does not raise.
  void wait_for(std::uint64_t sequence) const;

  bool query() const;  // true when idle
  std::uint64_t enqueued() const { return enqueued_.load(std::memory_order_acquire); }
  std::uint64_t completed() const { return completed_.load(std::memory_order_acquire); }
  bool has_pending_error() const;
  // Times the worker woke blocked waiters so far (each wake-up serves every
  // waiter whose task has run).
  std::uint64_t waiter_wakeups() const { return waiter_wakeups_.load(std::memory_order_relaxed); }
  // Removes and returns the pending error (nullptr when none).
  std::exception_ptr take_error();
  bool on_worker_thread() const { return std::this_thread::get_id() == worker_id_; }

 private:
  void worker_loop(std::function<void()> on_worker_start);

  mutable std::mutex mutex_;
  mutable std::condition_variable work_ready_;
  mutable std::condition_variable work_done_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  bool worker_sleeping_ = false;
  std::atomic<std::uint64_t> enqueued_{0};
  std::atomic<std::uint64_t> completed_{0};
  // Threads blocked in wait_for; lets the worker skip the lock and the
  // notify after each task when nobody waits (the common case).
  mutable std::atomic<int> waiters_{0};
  // The smallest sequence a blocked waiter waits for (UINT64_MAX: none). The
  // worker wakes waiters only once that task has run: a synchronize at the
  // end of a training step waited through ~100-1,000 tasks, and a wake-up
  // after each one put the waiting thread on a core the worker or a pool
  // helper was using, once per task.
  mutable std::atomic<std::uint64_t> wake_at_{UINT64_MAX};
  std::atomic<std::uint64_t> waiter_wakeups_{0};
  std::exception_ptr first_error_;
  std::thread::id worker_id_;
  std::thread worker_;
};

}  // namespace vtpu::runtime
