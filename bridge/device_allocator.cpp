// Adapter from the engine's caching allocator to c10::Allocator, registered
// for PrivateUse1: every vtpu storage, torch.UntypedStorage(..., device="vtpu")
// included, is served by it.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cstring>

#include "aten_bridge.h"
#include "device_context.h"
#include "vtpu/runtime/error.h"

namespace vtpu::bridge {
namespace {

void free_device_memory(void* ptr) { DeviceContext::get().allocator().deallocate(ptr); }

class DeviceAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nullptr;
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
};

DeviceAllocator g_device_allocator;

}  // namespace

c10::Allocator* device_allocator() { return &g_device_allocator; }

// Registered at load time, before any vtpu tensor can exist.
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_device_allocator);

}  // namespace vtpu::bridge
