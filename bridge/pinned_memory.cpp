#include "pinned_memory.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

namespace vtpu::bridge {
namespace {

// Live pinned blocks by start address; a pointer is pinned when it falls in one.
struct PinnedBlocks {
  std::mutex mutex;
  std::map<std::uintptr_t, std::size_t> sizes;
};

PinnedBlocks& pinned_blocks() {
  static PinnedBlocks* blocks = new PinnedBlocks;  // leaked: blocks may be freed during exit
  return *blocks;
}

void free_pinned(void* ptr) {
  if (ptr == nullptr) return;
  {
    PinnedBlocks& blocks = pinned_blocks();
    std::lock_guard<std::mutex> lock(blocks.mutex);
    blocks.sizes.erase(reinterpret_cast<std::uintptr_t>(ptr));
  }
  c10::free_cpu(ptr);
}

class PinnedMemoryAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t nbytes) override {
    void* ptr = nbytes == 0 ? nullptr : c10::alloc_cpu(nbytes);
    if (ptr != nullptr) {
      PinnedBlocks& blocks = pinned_blocks();
      std::lock_guard<std::mutex> lock(blocks.mutex);
      blocks.sizes[reinterpret_cast<std::uintptr_t>(ptr)] = nbytes;
    }
    return {ptr, ptr, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

}  // namespace

c10::Allocator* pinned_memory_allocator() {
  static PinnedMemoryAllocator allocator;
  return &allocator;
}

bool is_pinned_pointer(const void* ptr) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  PinnedBlocks& blocks = pinned_blocks();
  std::lock_guard<std::mutex> lock(blocks.mutex);
  auto after = blocks.sizes.upper_bound(address);
  if (after == blocks.sizes.begin()) return false;
  const auto& [start, size] = *std::prev(after);
  return address < start + size;
}

}  // namespace vtpu::bridge
