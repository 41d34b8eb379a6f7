// The process-wide vtpu device state the bridge shares between its parts:
// the engine allocator and stream, the execution mode and the metrics.
// No ATen headers here, so every bridge file can include it cheaply.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "vtpu/runtime/allocator.h"
#include "vtpu/runtime/stream.h"

namespace vtpu::bridge {

enum class Mode { kDebug, kStrict, kFused };

// A child forked after the device started has no stream worker and no pool
// threads (fork copies only the calling thread): device work there would
// wait forever. As CUDA does, such a child may not use the device: these
// raise RuntimeError ("Cannot re-initialize vtpu in forked subprocess").
bool in_forked_child();
void check_not_in_forked_child();

const char* mode_name(Mode mode);
// Throws std::invalid_argument naming the accepted modes.
Mode parse_mode(const std::string& name);

// Where device time goes, by the kind of kernel a stream task ran.
enum class KernelClass { kGenerated, kFused, kExtern, kHostPath, kOther, kCount };
const char* kernel_class_name(KernelClass c);
// From a launch's op name: "fused_kernel", an IR op name (a generated
// kernel), "aten::..." (matrix work is extern, the rest the host-kernel path).
KernelClass classify_kernel(const std::string& op);

struct MetricsSnapshot {
  std::uint64_t ops = 0;
  std::uint64_t kernels_launched = 0;
  std::uint64_t compiles = 0;
  std::uint64_t cache_misses = 0;
  std::map<std::string, std::uint64_t> cache_hits;         // memory, disk, shared
  std::map<std::string, std::uint64_t> host_fallback_ops;  // aten op name -> count
  // aten op name -> count of its host-path kernels run on one thread (runs_serially)
  std::map<std::string, std::uint64_t> host_serial_ops;
  std::map<std::string, std::uint64_t> syncs;              // reason -> count
  std::map<std::string, double> device_seconds;            // kernel class -> time on the stream
  // op name -> (seconds on the stream, tasks); only while per-op timing is on.
  std::map<std::string, std::pair<double, std::uint64_t>> device_seconds_by_op;
};

class Metrics {
 public:
  void count_op() { ops_.fetch_add(1, std::memory_order_relaxed); }
  void count_kernel() { kernels_.fetch_add(1, std::memory_order_relaxed); }
  void count_host_fallback(const std::string& op_name);
  void count_host_serial(const std::string& op_name);
  void count_sync(const char* reason);
  void add_device_time(KernelClass c, std::uint64_t nanoseconds, const std::string& op) {
    device_ns_[static_cast<int>(c)].fetch_add(nanoseconds, std::memory_order_relaxed);
    if (per_op_timing_.load(std::memory_order_relaxed)) add_op_time(op, nanoseconds);
  }
  // Per-op device time (VTPU_PROFILE_OPS=1 or torch_vtpu.profile_ops()): off
  // by default, since it takes a lock per task on the stream's worker.
  void set_per_op_timing(bool on) { per_op_timing_.store(on, std::memory_order_relaxed); }
  bool per_op_timing() const { return per_op_timing_.load(std::memory_order_relaxed); }
  MetricsSnapshot snapshot() const;
  void reset();

 private:
  std::atomic<std::uint64_t> ops_{0};
  std::atomic<std::uint64_t> kernels_{0};
  std::atomic<std::uint64_t> device_ns_[static_cast<int>(KernelClass::kCount)] = {};
  std::atomic<bool> per_op_timing_{false};
  void add_op_time(const std::string& op, std::uint64_t nanoseconds);
  mutable std::mutex mutex_;
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> op_ns_;  // op -> (ns, tasks)
  std::map<std::string, std::uint64_t> host_fallback_ops_;
  std::map<std::string, std::uint64_t> host_serial_ops_;
  std::map<std::string, std::uint64_t> syncs_;
};

class DeviceContext {
 public:
  static DeviceContext& get();

  runtime::Allocator& allocator() { return allocator_; }
  runtime::Stream& stream() { return *stream_; }
  Metrics& metrics() { return metrics_; }

  Mode mode() const { return mode_.load(std::memory_order_acquire); }
  // Entering debug drains the stream first, so that debug's inline execution
  // never overtakes work that strict mode queued earlier.
  void set_mode(Mode mode);

  // Runs `kernel` now (debug) or enqueues it (strict, fused), counting it.
  // In fused mode a pending window is flushed first (reason "unfused_op"):
  // the kernel must run after the ops recorded before it.
  // The op's Python call site is captured here, on the issuing thread; an
  // error of the kernel is raised as "[op] message (issued at file:line in
  // fn)": at once in debug, at the next synchronisation otherwise.
  void launch(std::function<void()> kernel, std::string op = {});

  // Before debug mode writes device memory on the calling thread: waits for
  // work other threads still have queued (issued before this thread's switch
  // to debug, or in another mode), which may use a block the write reuses
  // (freed blocks are reused in stream order). Raises nothing; not counted.
  void wait_for_queued_work();

  // Waits for the stream and raises the first asynchronous error, counting
  // the synchronisation under `reason`. `op` (optional) names the op that
  // needs it, for torch.vtpu.set_sync_debug_mode's warning or error, which
  // comes first (sync_debug.h).
  void synchronize(const char* reason, const char* op = nullptr);
  // Runs `wait` (a blocking wait on the stream) with the GIL released when
  // held: a queued task may need it.
  void wait_blocking(const std::function<void()>& wait);
  // Re-raises the first error of an asynchronous kernel, if any, as the op's
  // own exception annotated with its call site (and clears it).
  void raise_async_error();

  // Enqueues `kernel` as launch() does but without flushing the fused
  // window: the window's own flush uses it. Does not count a kernel.
  void enqueue_task(std::function<void()> kernel, std::string op);

  // Fused mode's pending window (fused_window.cpp) registers how to flush
  // it; `pending` tells launch()/synchronize() cheaply whether to call it.
  // The flusher counts its flush under `reason` when `count` is true.
  using WindowFlusher = void (*)(const char* reason, bool count);
  void set_window_flusher(WindowFlusher flusher) { window_flusher_ = flusher; }
  // Called under the window's lock. Each span of time in which the window
  // holds work that is not yet on the stream is an epoch: blocks freed then
  // may be written by that work later, so they stay cached (not returned to
  // the host) until the work issued when the epoch closed has run.
  void set_window_pending(bool pending);
  bool window_pending() const { return window_pending_.load(std::memory_order_acquire); }
  void flush_window(const char* reason, bool count = true) {
    if (window_pending_.load(std::memory_order_acquire) && window_flusher_ != nullptr) window_flusher_(reason, count);
  }


 private:
  DeviceContext();
  runtime::Allocator allocator_;
  Metrics metrics_;
  // Asynchronous errors owed to the thread that issued the failing op, when
  // another thread's synchronisation raised them first (raise_async_error).
  std::mutex owed_errors_mutex_;
  std::map<std::uint64_t, std::exception_ptr> owed_errors_;
  std::atomic<Mode> mode_;
  std::atomic<bool> window_pending_{false};
  // The allocator's stream clock (set_window_pending, allocator_stamp).
  std::uint64_t allocator_stamp() const;
  bool allocator_idle(std::uint64_t stamp) const;
  std::atomic<std::uint64_t> open_epoch_{0};     // 0: no work waiting in the window
  std::uint64_t epochs_ = 0;                      // under the window's lock
  std::atomic<std::uint64_t> closed_epoch_{0};   // the last epoch whose work was issued
  std::atomic<std::uint64_t> issued_at_close_{0};  // the stream's count when it closed
  WindowFlusher window_flusher_ = nullptr;
  // Last member: the worker is joined (drained) before the allocator dies.
  std::unique_ptr<runtime::Stream> stream_;
};

// Set by the Python module: runs a blocking wait with the GIL released when
// the calling thread holds it. Without it a queued task that needs the GIL
// (dropping the last reference to a Python-owned tensor) would deadlock
// against a Python thread waiting for the stream.
void set_blocking_wait_wrapper(std::function<void(const std::function<void()>&)> wrapper);

// Set by the ATen side: per-thread set-up for the stream's worker (ATen's
// thread-local dispatch state). Called once when the worker starts.
void set_worker_start_hook(std::function<void()> hook);

}  // namespace vtpu::bridge
