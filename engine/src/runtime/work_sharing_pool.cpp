#include "vtpu/runtime/work_sharing_pool.h"

#include <algorithm>

namespace vtpu::runtime {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}


// Chunks per thread: small enough that a late helper still finds work in a
// long range, and that the caller's wait for a helper's last chunk is short.
constexpr std::int64_t kChunksPerThread = 4;

// More helpers than any host's cores would only add wake-ups.
constexpr int kMaxHelpers = 255;

// Polls `done` briefly, then yields: a helper that is still inside a chunk
// may need this core to finish it.
template <typename Done>
void wait_until(Done done) {
  for (int spins = 0; !done(); ++spins) {
    if (spins < 4096) cpu_relax();
    else std::this_thread::yield();
  }
}

}  // namespace

WorkSharingPool::WorkSharingPool(int helpers) {
  threads_.reserve(static_cast<std::size_t>(std::max(helpers, 0)));
  for (int i = 0; i < helpers; ++i) threads_.emplace_back([this, i] { helper_loop(i); });
}

WorkSharingPool::~WorkSharingPool() {
  {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    stopping_.store(true, std::memory_order_seq_cst);
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

std::int64_t WorkSharingPool::work() {
  std::int64_t ran = 0;
  for (std::int64_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed); c < job_.chunks;
       c = next_chunk_.fetch_add(1, std::memory_order_relaxed)) {
    const std::int64_t begin = c * job_.chunk;
    job_.body(begin, std::min(job_.total, begin + job_.chunk), job_.context);
    done_chunks_.fetch_add(1, std::memory_order_release);
    ++ran;
  }
  return ran;
}

void WorkSharingPool::run(std::int64_t total, std::int64_t grain, int threads, Body body, void* context) {
  if (total <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  std::unique_lock<std::mutex> lock(run_mutex_, std::try_to_lock);
  if (threads <= 1 || total <= grain || !lock.owns_lock()) {
    body(0, total, context);
    return;
  }
  // More threads asked for than there are (torch.set_num_threads raised
  // after the first launch): start the missing helpers. No range is open
  // while run_mutex_ is held, and helpers never touch threads_.
  const int wanted = std::min(threads - 1, kMaxHelpers);
  while (helpers() < wanted) {
    const int index = helpers();
    threads_.emplace_back([this, index] { helper_loop(index); });
  }
  const int participants = std::min(threads - 1, helpers());
  const std::int64_t per_chunk = (total + (participants + 1) * kChunksPerThread - 1) / ((participants + 1) * kChunksPerThread);
  job_.body = body;
  job_.context = context;
  job_.total = total;
  job_.chunk = std::max(grain, per_chunk);
  job_.chunks = (total + job_.chunk - 1) / job_.chunk;
  job_.participants = participants;
  next_chunk_.store(0, std::memory_order_relaxed);
  done_chunks_.store(0, std::memory_order_relaxed);
  // Publish: job_ is complete before any helper can see the range open.
  open_.store(true, std::memory_order_seq_cst);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> sleep_lock(sleep_mutex_);
    wake_.notify_all();
  }
  work();
  // Only chunks a helper has claimed can still be running.
  wait_until([&] { return done_chunks_.load(std::memory_order_acquire) >= job_.chunks; });
  // Close, then wait for helpers that entered to leave before job_ can be
  // rewritten. A helper that enters after this sees the range closed (it
  // increments inside_ before it reads open_) and touches nothing.
  open_.store(false, std::memory_order_seq_cst);
  wait_until([&] { return inside_.load(std::memory_order_seq_cst) == 0; });
  shared_runs_.fetch_add(1, std::memory_order_relaxed);
}

void WorkSharingPool::helper_loop(int index) {
  std::uint64_t seen = generation_.load(std::memory_order_seq_cst);
  while (!stopping_.load(std::memory_order_acquire)) {
    std::uint64_t now = generation_.load(std::memory_order_seq_cst);
    // An idle helper sleeps at once. It used to poll for 30 us first, to
    // catch back-to-back ranges; on the 2-core host that polling took the
    // core the Python and stream threads needed whenever ranges came every
    // ~100 us (decoding: the helper spun ~16% of the process's CPU samples,
    // and 64-token greedy decoding ran 2.13 against 1.76 ms per token,
    // medians of 5 processes each), and training steps were no faster with
    // it (Qwen3-style fused step 59.4-59.9 against 51.6-51.8 ms). A caller
    // never waits for a helper to wake (run()), so a late helper only
    // shares less of a range.
    if (now == seen) {
      std::unique_lock<std::mutex> lock(sleep_mutex_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      wake_.wait(lock, [&] {
        return stopping_.load(std::memory_order_seq_cst) || generation_.load(std::memory_order_seq_cst) != seen;
      });
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      continue;
    }
    seen = now;
    inside_.fetch_add(1, std::memory_order_seq_cst);
    if (open_.load(std::memory_order_seq_cst) && index < job_.participants)
      helper_chunks_.fetch_add(static_cast<std::uint64_t>(work()), std::memory_order_relaxed);
    inside_.fetch_sub(1, std::memory_order_seq_cst);
  }
}

}  // namespace vtpu::runtime
