#include "device_context.h"
#include "env_knobs.h"

#include "device_trace.h"

#include <c10/util/Exception.h>
#include <pthread.h>

#include <chrono>

#include <cstdlib>
#include <stdexcept>

#include "call_site.h"
#include "stream_task.h"
#include "sync_debug.h"
#include "vtpu/runtime/memory_size.h"

namespace vtpu::bridge {
namespace {

std::atomic<bool> forked_child{false};

std::function<void()>& worker_start_hook() {
  static std::function<void()> hook;
  return hook;
}

Mode initial_mode() {
  const char* env = std::getenv("VTPU_MODE");
  if (env == nullptr || *env == '\0') return Mode::kStrict;
  try {
    return parse_mode(env);
  } catch (const std::invalid_argument&) {
    // An unusable VTPU_MODE must not make `import torch_vtpu` fail with an
    // opaque error; Python re-validates it and warns.
    return Mode::kStrict;
  }
}

std::function<void(const std::function<void()>&)>& blocking_wait_wrapper() {
  static std::function<void(const std::function<void()>&)> wrapper;
  return wrapper;
}

}  // namespace

void set_blocking_wait_wrapper(std::function<void(const std::function<void()>&)> wrapper) {
  blocking_wait_wrapper() = std::move(wrapper);
}

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::kDebug: return "debug";
    case Mode::kStrict: return "strict";
    case Mode::kFused: return "fused";
  }
  return "strict";
}

Mode parse_mode(const std::string& name) {
  if (name == "debug") return Mode::kDebug;
  if (name == "strict") return Mode::kStrict;
  if (name == "fused") return Mode::kFused;
  throw std::invalid_argument("unknown vtpu mode '" + name +
                              "': expected one of 'debug', 'strict', 'fused'");
}

void Metrics::count_host_fallback(const std::string& op_name) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++host_fallback_ops_[op_name];
}

void Metrics::count_host_serial(const std::string& op_name) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++host_serial_ops_[op_name];
}

void Metrics::count_sync(const char* reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++syncs_[reason];
}

void Metrics::add_op_time(const std::string& op, std::uint64_t nanoseconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& [ns, tasks] = op_ns_[op.empty() ? std::string("(copy or fill)") : op];
  ns += nanoseconds;
  ++tasks;
}

MetricsSnapshot Metrics::snapshot() const {
  MetricsSnapshot s;
  s.ops = ops_.load();
  s.kernels_launched = kernels_.load();
  s.cache_hits = {{"memory", 0}, {"disk", 0}, {"shared", 0}};
  for (int c = 0; c < static_cast<int>(KernelClass::kCount); ++c)
    s.device_seconds[kernel_class_name(static_cast<KernelClass>(c))] = static_cast<double>(device_ns_[c].load()) / 1e9;
  std::lock_guard<std::mutex> lock(mutex_);
  s.host_fallback_ops = host_fallback_ops_;
  s.host_serial_ops = host_serial_ops_;
  s.syncs = syncs_;
  for (const auto& [op, t] : op_ns_) s.device_seconds_by_op[op] = {static_cast<double>(t.first) / 1e9, t.second};
  return s;
}

void Metrics::reset() {
  ops_ = 0;
  kernels_ = 0;
  for (auto& ns : device_ns_) ns = 0;
  std::lock_guard<std::mutex> lock(mutex_);
  host_fallback_ops_.clear();
  host_serial_ops_.clear();
  syncs_.clear();
  op_ns_.clear();
}

void set_worker_start_hook(std::function<void()> hook) { worker_start_hook() = std::move(hook); }

namespace {
// A malformed VTPU_MEMORY_LIMIT is said once and the default capacity used:
// the context is made while `import torch` autoloads the backend.
std::size_t initial_capacity() {
  std::string ignored;
  const std::size_t capacity = runtime::default_device_capacity(0.8, &ignored);
  if (!ignored.empty())
    TORCH_WARN(ignored, "; using the default capacity, 80% of host memory (",
               capacity >> 20, " MiB). Sizes look like 8GiB, 512MB or 1073741824.");
  return capacity;
}
}  // namespace

DeviceContext::DeviceContext()
    : allocator_(initial_capacity()),
      mode_(initial_mode()),
      stream_(std::make_unique<runtime::Stream>([] {
        if (worker_start_hook()) worker_start_hook()();
      })) {
  if (env_switch("VTPU_PROFILE_OPS", false)) metrics_.set_per_op_timing(true);
  // The stream's worker exists from here on; a fork copies only its caller.
  pthread_atfork(nullptr, nullptr, [] { forked_child.store(true, std::memory_order_relaxed); });
  // Before cached blocks return to the host, queued work that may still use
  // them (they were freed when their owner dropped them) must have run. On
  // the worker itself everything queued before the running task is done.
  allocator_.set_stream_clock([this] { return allocator_stamp(); },
                              [this](std::uint64_t stamp) { return allocator_idle(stamp); });
  allocator_.set_release_guard([this] {
    if (stream_->on_worker_thread()) return;
    // The pending window refers to freed blocks by address: run it first.
    flush_window("memory_release");
    const std::uint64_t target = stream_->enqueued();
    auto wait = [&] { stream_->wait_for(target); };
    if (blocking_wait_wrapper()) blocking_wait_wrapper()(wait);
    else wait();
  });
}

bool in_forked_child() { return forked_child.load(std::memory_order_relaxed); }

void check_not_in_forked_child() {
  TORCH_CHECK(!in_forked_child(),
              "Cannot re-initialize vtpu in forked subprocess. To use vtpu with multiprocessing, you must use the "
              "'spawn' start method");
}

DeviceContext& DeviceContext::get() {
  // Leaked on purpose: tensors still alive during interpreter shutdown free
  // into the allocator after static destructors would have run.
  static DeviceContext* context = new DeviceContext();
  return *context;
}

namespace {
// A stamp that names a window epoch rather than a stream count.
constexpr std::uint64_t kEpochStamp = std::uint64_t{1} << 63;
}  // namespace

void DeviceContext::set_window_pending(bool pending) {
  const bool was = window_pending_.load(std::memory_order_relaxed);
  if (pending && !was) {
    open_epoch_.store(++epochs_, std::memory_order_release);
  } else if (!pending && was) {
    // The epoch's work is on the stream now: record how far the stream's
    // count reached, then close it (readers load the epoch first).
    issued_at_close_.store(stream_->enqueued(), std::memory_order_release);
    closed_epoch_.store(open_epoch_.load(std::memory_order_relaxed), std::memory_order_release);
    open_epoch_.store(0, std::memory_order_release);
  }
  window_pending_.store(pending, std::memory_order_release);
}

std::uint64_t DeviceContext::allocator_stamp() const {
  if (const std::uint64_t epoch = open_epoch_.load(std::memory_order_acquire); epoch != 0) return kEpochStamp | epoch;
  return stream_->enqueued();
}

bool DeviceContext::allocator_idle(std::uint64_t stamp) const {
  if ((stamp & kEpochStamp) != 0) {
    if (closed_epoch_.load(std::memory_order_acquire) < (stamp & ~kEpochStamp)) return false;
    return stream_->completed() >= issued_at_close_.load(std::memory_order_acquire);
  }
  return stream_->completed() >= stamp;
}

void DeviceContext::set_mode(Mode mode) {
  if (mode != Mode::kFused) flush_window("mode_change");
  if (mode == Mode::kDebug && mode_.load() != Mode::kDebug) synchronize("mode_change");
  mode_.store(mode, std::memory_order_release);
}

void DeviceContext::launch(std::function<void()> kernel, std::string op) {
  metrics_.count_kernel();
  // A kernel launched from inside a stream task (nested op) must not wait
  // for itself; its errors are named by the enclosing task.
  if (stream_->on_worker_thread()) {
    kernel();
    return;
  }
  flush_window("unfused_op");
  enqueue_task(std::move(kernel), std::move(op));
}

const char* kernel_class_name(KernelClass c) {
  switch (c) {
    case KernelClass::kGenerated: return "generated";
    case KernelClass::kFused: return "fused";
    case KernelClass::kExtern: return "extern";
    case KernelClass::kHostPath: return "host_path";
    default: return "other";
  }
}

KernelClass classify_kernel(const std::string& op) {
  if (op.empty()) return KernelClass::kOther;  // copies, fills on ATen's kernels
  // "fused_kernel", or "fused[n]:ops" with VTPU_PROFILE_FUSED_NAMES=1.
  if (op.rfind("fused", 0) == 0) return KernelClass::kFused;
  if (op.rfind("aten::", 0) != 0) return KernelClass::kGenerated;
  // Matrix work: GEMM, convolution and attention kernels (oneDNN/MKL in ATen).
  static const char* const kExterns[] = {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm",
                                         "aten::matmul", "aten::linear", "aten::convolution", "aten::_convolution",
                                         "aten::conv", "aten::_scaled_dot_product", "aten::_flash_attention",
                                         "aten::mkldnn", "aten::_mkldnn"};
  for (const char* prefix : kExterns)
    if (op.rfind(prefix, 0) == 0) return KernelClass::kExtern;
  return KernelClass::kHostPath;
}

void DeviceContext::enqueue_task(std::function<void()> kernel, std::string op) {
  check_not_in_forked_child();
  const CallSite site = capture_call_site();
  const KernelClass kind = classify_kernel(op);
  // Under torch.profiler the task is also a device activity of the op issuing it.
  const bool traced = device_trace_active();
  const std::uint64_t correlation = traced ? device_trace_correlation() : 0;
  if (mode() == Mode::kDebug) {
    wait_for_queued_work();
    const auto start = std::chrono::steady_clock::now();
    const std::int64_t trace_start = traced ? device_trace_now_ns() : 0;
    try {
      kernel();
    } catch (...) {
      if (traced) record_device_activity(op, trace_start, device_trace_now_ns(), correlation);
      rethrow_annotated(std::current_exception(), op, site);
    }
    if (traced) record_device_activity(op, trace_start, device_trace_now_ns(), correlation);
    metrics_.add_device_time(kind, static_cast<std::uint64_t>((std::chrono::steady_clock::now() - start).count()), op);
    return;
  }
  // Naming the error needs the GIL (file and line of the site), which the
  // worker must not take: it is done at the synchronisation that raises it.
  const std::uint64_t issuer = current_thread_token();
  stream_->enqueue([this, kernel = std::move(kernel), op = std::move(op), site, kind, traced, correlation, issuer] {
    const auto start = std::chrono::steady_clock::now();
    const std::int64_t trace_start = traced ? device_trace_now_ns() : 0;
    try {
      run_stream_task(kernel);
    } catch (...) {
      if (traced) record_device_activity(op, trace_start, device_trace_now_ns(), correlation);
      metrics_.add_device_time(kind, static_cast<std::uint64_t>((std::chrono::steady_clock::now() - start).count()), op);
      throw PendingOpError(std::current_exception(), op, site, issuer);
    }
    if (traced) record_device_activity(op, trace_start, device_trace_now_ns(), correlation);
    metrics_.add_device_time(kind, static_cast<std::uint64_t>((std::chrono::steady_clock::now() - start).count()), op);
  });
}

void DeviceContext::wait_for_queued_work() {
  if (stream_->on_worker_thread()) return;
  if (const std::uint64_t queued = stream_->enqueued(); stream_->completed() < queued)
    wait_blocking([&] { stream_->wait_for(queued); });
}

void DeviceContext::synchronize(const char* reason, const char* op) {
  check_not_in_forked_child();
  // A task on the stream's own thread waits for nothing.
  if (!stream_->on_worker_thread()) check_host_sync(reason, op);
  metrics_.count_sync(reason);
  if (stream_->on_worker_thread()) return;
  flush_window(reason, /*count=*/false);
  const std::uint64_t target = stream_->enqueued();
  wait_blocking([&] { stream_->wait_for(target); });
  raise_async_error();
}

void DeviceContext::wait_blocking(const std::function<void()>& wait) {
  if (blocking_wait_wrapper()) {
    blocking_wait_wrapper()(wait);
  } else {
    wait();
  }
}

void DeviceContext::raise_async_error() {
  issue_kept_warnings();
  const std::uint64_t me = current_thread_token();
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(owed_errors_mutex_);
    if (auto it = owed_errors_.find(me); it != owed_errors_.end()) {
      error = it->second;
      owed_errors_.erase(it);
    }
  }
  if (!error) error = stream_->take_error();
  if (!error) return;
  try {
    std::rethrow_exception(error);
  } catch (const PendingOpError& pending) {
    // Raised where the first synchronisation happens; when that is another
    // Python thread, the Python thread that issued the op is owed it too (it
    // would read what the failed kernel did not write, with no error: on
    // CUDA every thread of the context sees it). Its next synchronisation
    // raises it. Not between a Python thread and autograd's worker (no
    // Python frames): an error autograd's thread takes reaches the caller of
    // backward(), and one it issued is the backward caller's to see; owing
    // it to the long-lived worker raised it again in a later, unrelated
    // backward (found by the full suite).
    if (pending.issuer != me && pending.site.has_frame() && capture_call_site().has_frame()) {
      std::lock_guard<std::mutex> lock(owed_errors_mutex_);
      owed_errors_.emplace(pending.issuer, error);
    }
    rethrow_annotated(pending.original, pending.op, pending.site);
  }
}

}  // namespace vtpu::bridge
