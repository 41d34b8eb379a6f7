// Kineto child profiler for vtpu device activities (see device_trace.h).
//
// torch.profiler with ProfilerActivity.PrivateUse1 asks Kineto for GPU-like
// activity types (kernels among them); Kineto configures a session of every
// registered child profiler that offers one, forwards the correlation id of
// each profiled op to it on the op's thread, and after the run asks each
// session for its activities. Ours are the stream tasks, each linked to the
// CPU op that issued it, which is how torch attributes device time to ops.
#include "device_trace.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include <IActivityProfiler.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/ApproximateClock.h>
#include <libkineto.h>
#include <output_base.h>
#include <torch/csrc/profiler/stubs/base.h>

namespace vtpu::bridge {
namespace {

struct DeviceActivity {
  std::string op;
  std::int64_t start_ns;
  std::int64_t end_ns;
  std::uint64_t correlation;
};

// What the running session collected; stream tasks append from the stream
// thread, the session drains it when Kineto processes the trace.
struct ActivityLog {
  std::mutex mutex;
  std::vector<DeviceActivity> activities;
  std::atomic<bool> recording{false};
};

ActivityLog& activity_log() {
  static ActivityLog* log = new ActivityLog;  // leaked: stream tasks may record during exit
  return *log;
}

// Correlation ids of the profiled ops this thread is inside, innermost last.
thread_local std::vector<std::uint64_t> correlation_stack;

class DeviceTraceSession final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    ActivityLog& log = activity_log();
    std::lock_guard<std::mutex> lock(log.mutex);
    log.activities.clear();
    log.recording.store(true, std::memory_order_relaxed);
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    ActivityLog& log = activity_log();
    std::lock_guard<std::mutex> lock(log.mutex);
    log.recording.store(false, std::memory_order_relaxed);
    collected_ = std::move(log.activities);
    log.activities.clear();
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override { processTrace(logger, nullptr, 0, 0); }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked_activity,
                    std::int64_t, std::int64_t) override {
    for (const DeviceActivity& a : collected_) {
      buffer_->emplace_activity(buffer_->span, libkineto::ActivityType::CONCURRENT_KERNEL,
                                a.op.empty() ? std::string("copy or fill") : a.op);
      libkineto::GenericTraceActivity& activity = libkineto::CpuTraceBuffer::toRef(buffer_->activities.back());
      activity.startTime = a.start_ns;
      activity.endTime = a.end_ns;
      activity.device = 0;    // vtpu:0
      activity.resource = 0;  // its one stream
      activity.id = static_cast<std::int32_t>(a.correlation);
      if (a.correlation != 0) {
        // A flow from the CPU op to its device work, as CUDA kernels have.
        activity.flow.id = a.correlation;
        activity.flow.type = libkineto::kLinkAsyncCpuGpu;
        activity.flow.start = false;
        if (linked_activity) activity.linked = linked_activity(static_cast<std::int32_t>(a.correlation));
      }
      logger.handleActivity(activity);
    }
    collected_.clear();
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{0, 0, "vtpu 0", "vtpu"});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    return {libkineto::ResourceInfo{0, 0, 0, "stream 0"}};
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }

  void pushCorrelationId(std::uint64_t id) override { correlation_stack.push_back(id); }
  void popCorrelationId() override {
    if (!correlation_stack.empty()) correlation_stack.pop_back();
  }

 private:
  std::vector<DeviceActivity> collected_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
};

class DeviceTraceProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override { return activities_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config&) override {
    if (!types.count(libkineto::ActivityType::CONCURRENT_KERNEL)) return nullptr;
    return std::make_unique<DeviceTraceSession>();
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(std::int64_t, std::int64_t,
                                                                 const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_ = "vtpu";
  std::set<libkineto::ActivityType> activities_{libkineto::ActivityType::CONCURRENT_KERNEL};
};

// The legacy profiler (torch.autograd.profiler.profile(use_device="vtpu",
// use_kineto=False)) times each op with a device event at its start and end.
class LegacyProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
 public:
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              std::int64_t* cpu_ns) const override {
    const c10::impl::DeviceGuardImplInterface* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
    if (device != nullptr) *device = 0;
    void* raw = nullptr;
    guard->record(&raw, guard->getStream(c10::Device(c10::DeviceType::PrivateUse1, 0)), 0,
                  c10::EventFlag::BACKEND_DEFAULT);
    *event = std::shared_ptr<void>(raw, [guard](void* e) { guard->destroyEvent(e, 0); });
    if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
  }

  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* start,
                const torch::profiler::impl::ProfilerVoidEventStub* end) const override {
    const c10::impl::DeviceGuardImplInterface* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
    guard->synchronizeEvent(end->get());
    return static_cast<float>(guard->elapsedTime(start->get(), end->get(), 0) * 1000.0);  // microseconds
  }

  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override { op(0); }
  void synchronize() const override {
    const c10::impl::DeviceGuardImplInterface* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
    guard->synchronizeDevice(0);
  }
};

}  // namespace

bool device_trace_active() { return activity_log().recording.load(std::memory_order_relaxed); }

std::uint64_t device_trace_correlation() { return correlation_stack.empty() ? 0 : correlation_stack.back(); }

std::int64_t device_trace_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void record_device_activity(const std::string& op, std::int64_t start_ns, std::int64_t end_ns,
                            std::uint64_t correlation) {
  ActivityLog& log = activity_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  if (!log.recording.load(std::memory_order_relaxed)) return;
  log.activities.push_back({op, start_ns, end_ns, correlation});
}

void register_device_trace() {
  libkineto::api().registerProfilerFactory([] { return std::make_unique<DeviceTraceProfiler>(); });
  static LegacyProfilerStubs legacy_stubs;
  torch::profiler::impl::registerPrivateUse1Methods(&legacy_stubs);
}

}  // namespace vtpu::bridge
