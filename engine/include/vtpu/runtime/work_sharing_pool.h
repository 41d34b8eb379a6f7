// A parallel-for for generated kernels in which the caller never waits for a
// helper thread that has not started yet.
//
// Why not ATen's parallel_for (OpenMP): its fork-join splits a range
// statically, one part per thread, and returns only when every thread has
// done its part. On a 2-core virtual machine a sleeping helper takes tens of
// microseconds (or a scheduler slice, when the Python thread holds the other
// core) to wake, so a 65k-element kernel that runs in ~20 us alone took
// ~100 us split in two: a Qwen3-style training step spent ~10 ms of its 23 ms
// of generated-kernel time waiting in joins, and ran faster with one thread.
//
// Here the range is cut into small chunks that threads claim one at a time
// from a counter. The caller starts claiming at once; helpers join when they
// wake, and a helper that wakes after the last chunk was claimed finds
// nothing to do. The caller waits only for chunks already claimed by a
// helper (each a fraction of the range), never for a helper to arrive. With
// no helper at all (none started, or a forked child) the caller runs every
// chunk itself.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace vtpu::runtime {

class WorkSharingPool {
 public:
  using Body = void (*)(std::int64_t begin, std::int64_t end, void* context);

  explicit WorkSharingPool(int helpers);
  ~WorkSharingPool();  // stops and joins the helpers
  WorkSharingPool(const WorkSharingPool&) = delete;
  WorkSharingPool& operator=(const WorkSharingPool&) = delete;

  // Runs body over [0, total) in chunks of at least `grain` elements, on the
  // calling thread and up to `threads - 1` helpers (started here when the
  // pool has fewer); returns when every element has been processed. Ranges
  // of at most `grain` elements, a single thread, or a pool busy with
  // another caller's range run inline.
  void run(std::int64_t total, std::int64_t grain, int threads, Body body, void* context);

  // Helper threads started so far (read by the caller of run, or when idle).
  int helpers() const { return static_cast<int>(threads_.size()); }
  // Ranges split across threads so far (not those run inline).
  std::uint64_t shared_runs() const { return shared_runs_.load(std::memory_order_relaxed); }
  // Chunks run by helpers so far (0 when helpers never joined in time).
  std::uint64_t helper_chunks() const { return helper_chunks_.load(std::memory_order_relaxed); }

 private:
  struct Job {
    Body body = nullptr;
    void* context = nullptr;
    std::int64_t total = 0;
    std::int64_t chunk = 0;
    std::int64_t chunks = 0;
    int participants = 0;  // helpers with an index below this join
  };

  void helper_loop(int index);
  // Claims and runs chunks of job_ until none is left; returns how many ran.
  std::int64_t work();

  std::mutex run_mutex_;  // one shared range at a time
  Job job_;               // written only while closed and no helper is inside
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<bool> open_{false};
  std::atomic<int> inside_{0};  // helpers that may be reading job_
  std::atomic<std::int64_t> next_chunk_{0};
  std::atomic<std::int64_t> done_chunks_{0};

  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stopping_{false};

  std::atomic<std::uint64_t> shared_runs_{0};
  std::atomic<std::uint64_t> helper_chunks_{0};
  std::vector<std::thread> threads_;
};

}  // namespace vtpu::runtime
