// Device guard for PrivateUse1: one device (vtpu:0) with one in-order stream.
// Events map onto the engine's stream events, which gives torch.Event and
// torch.Stream on "vtpu" their record/wait/query/elapsed_time semantics.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "device_context.h"
#include "vtpu/runtime/error.h"
#include "vtpu/runtime/event.h"

namespace vtpu::bridge {
namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(index == 0 || index == -1,
              "vtpu: invalid device index ", static_cast<int>(index),
                   "; this process has 1 vtpu device (vtpu:0)");
}

runtime::Event* as_event(void* event) { return static_cast<runtime::Event*>(event); }

class VtpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device device) const override {
    check_index(device.index());
    return c10::Device(kType, 0);
  }
  c10::Device getDevice() const override { return c10::Device(kType, 0); }
  void setDevice(c10::Device device) const override { check_index(device.index()); }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device device) const override {
    check_index(device.index());  // torch.accelerator.current_stream(1) must not answer for vtpu:0
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kType, 0));
  }
  c10::Stream getNewStream(c10::Device device, int) const override {
    // One hardware queue: every stream is the default stream. Work stays
    // correct (in order); it just does not overlap.
    return getStream(device);
  }
  c10::Stream exchangeStream(c10::Stream) const override { return getStream(c10::Device(kType, 0)); }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }

  void record(void** event, const c10::Stream&, const c10::DeviceIndex index,
              const c10::EventFlag) const override {
    check_index(index);
    if (*event == nullptr) *event = new runtime::Event(/*enable_timing=*/true);
    // Fused mode: the event marks everything issued before it, so the
    // pending window goes to the stream first (an event recorded past
    // unflushed work completed before that work ran: a timing of it with
    // start/end events measured nothing).
    DeviceContext& context = DeviceContext::get();
    context.flush_window("event_record");
    as_event(*event)->record(context.stream());
    // Debug mode runs every op before it returns: an event recorded after
    // them is complete at once (query() true, elapsed_time usable), not when
    // the stream's worker reaches the marker.
    if (context.mode() == Mode::kDebug) {
      runtime::Event* recorded = as_event(*event);
      context.wait_blocking([recorded] { recorded->synchronize(); });
    }
  }
  void block(void*, const c10::Stream&) const override {
    // Single in-order stream: anything enqueued after the wait already runs
    // after the event's marker.
  }
  bool queryEvent(void* event) const override {
    return event == nullptr || as_event(event)->query();
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete as_event(event);
  }
  void synchronizeEvent(void* event) const override {
    DeviceContext& context = DeviceContext::get();
    if (event != nullptr) {
      runtime::Event* recorded = as_event(event);
      context.wait_blocking([recorded] { recorded->synchronize(); });
    }
    // A synchronisation point like stream and device synchronize: a kernel
    // that failed asynchronously raises here (CUDA's event synchronize
    // reports earlier asynchronous errors too).
    context.raise_async_error();
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK_WITH(ValueError, start != nullptr && end != nullptr,
                     "vtpu: elapsed_time needs both events recorded");
    try {
      return as_event(start)->elapsed_ms(*as_event(end));
    } catch (const runtime::Error& e) {
      TORCH_CHECK_WITH(ValueError, false, e.what());
    }
  }
  bool queryStream(const c10::Stream&) const override {
    // Pending fused work is work the stream has not done; flushing it lets
    // a loop polling query() finish (no other flush point may ever come).
    DeviceContext::get().flush_window("stream_query");
    return DeviceContext::get().stream().query();
  }
  void synchronizeStream(const c10::Stream&) const override {
    DeviceContext::get().synchronize("stream_synchronize");
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    check_index(index);
    DeviceContext::get().synchronize("device_synchronize");
  }
};

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, VtpuGuardImpl);

}  // namespace vtpu::bridge
