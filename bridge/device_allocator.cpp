// Adapter from the engine's caching allocator to c10::DeviceAllocator,
// registered for PrivateUse1: every vtpu storage, torch.UntypedStorage(...,
// device="vtpu") included, is served by it, and torch.accelerator's memory
// functions (memory_allocated, memory_stats, empty_cache, the resets,
// get_memory_info) read and drive it as torch.vtpu's do.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Exception.h>

#include <cstring>

#include "aten_bridge.h"
#include "device_context.h"
#include "vtpu/runtime/error.h"

#include <atomic>

namespace vtpu::bridge {
namespace {

void free_device_memory(void* ptr) { DeviceContext::get().allocator().deallocate(ptr); }

// Set by the first request for device memory (of any size: an empty tensor
// asks too), never cleared: every vtpu tensor, hence every vtpu backward,
// passes here first.
std::atomic<bool> g_device_memory_requested{false};

void check_device_index(c10::DeviceIndex device) {
  TORCH_CHECK(device == 0 || device == -1, "vtpu: invalid device index ",
                   static_cast<int>(device), "; this process has 1 vtpu device (vtpu:0)");
}

// The aggregate entry of one of CUDA's statistics: a gauge (current, peak)
// and its counters since the last reset of accumulated statistics.
void set_stat(c10::CachingAllocator::StatArray& stat, std::size_t current, std::size_t peak, std::uint64_t allocated,
              std::uint64_t freed) {
  auto& all = stat[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  all.current = static_cast<int64_t>(current);
  all.peak = static_cast<int64_t>(peak);
  all.allocated = static_cast<int64_t>(allocated);
  all.freed = static_cast<int64_t>(freed);
}

class DeviceAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nullptr;
    check_not_in_forked_child();
    if (!g_device_memory_requested.load(std::memory_order_relaxed))
      g_device_memory_requested.store(true, std::memory_order_relaxed);
    try {
      ptr = DeviceContext::get().allocator().allocate(nbytes);
    } catch (const runtime::OutOfMemoryError& e) {
      // torch.OutOfMemoryError on the Python side; nothing was allocated.
      TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
    }
    return {ptr, ptr, &free_device_memory, c10::Device(kVtpu, 0)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_device_memory; }

  // Device memory is host memory on the host target, but a copy inside the
  // device must still respect the stream order; callers of copy_data (storage
  // clone) synchronise first.
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    DeviceContext::get().synchronize("storage_copy");
    std::memcpy(dest, src, count);
  }

  bool initialized() override { return true; }

  void emptyCache(c10::MempoolId_t) override {
    // Queued kernels may still use freed blocks; they return to the cache
    // when done (as torch.vtpu.empty_cache()).
    DeviceContext::get().synchronize("empty_cache");
    DeviceContext::get().allocator().empty_cache();
  }

  // One in-order stream: a block is reused only by work queued after it.
  void recordStream(const c10::DataPtr&, c10::Stream) override {}

  // The engine's statistics as the aggregate entries of CUDA's layout (what
  // torch.accelerator.memory_stats() flattens: "allocated_bytes.all.current",
  // ...). Every block is its own host allocation (a segment), never split:
  // active equals allocated, and the inactive-split entries stay zero. The
  // engine rounds requests to its size classes and does not keep what was
  // asked for, so requested_bytes reports the rounded bytes. Current and peak
  // values are gauges a reset of accumulated statistics leaves alone (the
  // allocation count used to be allocations - frees, negative after one).
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    check_device_index(device);
    const runtime::AllocatorStats s = DeviceContext::get().allocator().stats();
    c10::CachingDeviceAllocator::DeviceStats d;
    set_stat(d.allocation, s.live_blocks, s.peak_live_blocks, s.allocations, s.frees);
    set_stat(d.active, s.live_blocks, s.peak_live_blocks, s.allocations, s.frees);
    set_stat(d.segment, s.segments, s.peak_segments, s.host_allocations, s.host_frees);
    set_stat(d.allocated_bytes, s.allocated_bytes, s.peak_allocated_bytes, s.allocated_bytes_total,
             s.freed_bytes_total);
    set_stat(d.active_bytes, s.allocated_bytes, s.peak_allocated_bytes, s.allocated_bytes_total,
             s.freed_bytes_total);
    set_stat(d.requested_bytes, s.allocated_bytes, s.peak_allocated_bytes, s.allocated_bytes_total,
             s.freed_bytes_total);
    set_stat(d.reserved_bytes, s.reserved_bytes, s.peak_reserved_bytes, s.reserved_bytes_total,
             s.released_bytes_total);
    d.num_ooms = static_cast<int64_t>(s.out_of_memory);
    d.num_device_alloc = static_cast<int64_t>(s.host_allocations);
    d.num_device_free = static_cast<int64_t>(s.host_frees);
    return d;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check_device_index(device);
    DeviceContext::get().allocator().reset_accumulated_stats();
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    check_device_index(device);
    DeviceContext::get().allocator().reset_peak_stats();
  }

  // (free, total): the capacity (VTPU_MEMORY_LIMIT or a share of RAM) less
  // what the allocator holds, as torch.vtpu.mem_get_info().
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    check_device_index(device);
    const std::size_t total = DeviceContext::get().allocator().capacity();
    const std::size_t reserved = DeviceContext::get().allocator().stats().reserved_bytes;
    return {total > reserved ? total - reserved : 0, total};
  }
};

DeviceAllocator g_device_allocator;

}  // namespace

c10::Allocator* device_allocator() { return &g_device_allocator; }

bool device_memory_ever_requested() { return g_device_memory_requested.load(std::memory_order_relaxed); }

// Registered at load time, before any vtpu tensor can exist.
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_device_allocator);

}  // namespace vtpu::bridge
