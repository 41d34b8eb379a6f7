#include "pinned_memory.h"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

namespace vtpu::bridge {
namespace {

// Live pinned blocks by start address; a pointer is pinned when it falls in
// one. No block is cached: each is the CPU allocator's until it is freed, so
// every statistic's active and allocated values are the same.
struct PinnedBlocks {
  std::mutex mutex;
  std::map<std::uintptr_t, std::size_t> sizes;
  at::HostStats stats;
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
    auto it = blocks.sizes.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it != blocks.sizes.end()) {
      blocks.stats.active_requests.decrease(1);
      blocks.stats.active_bytes.decrease(it->second);
      blocks.stats.allocations.decrease(1);
      blocks.stats.allocated_bytes.decrease(it->second);
      ++blocks.stats.num_host_free;
      blocks.sizes.erase(it);
    }
  }
  c10::free_cpu(ptr);
}

// Also vtpu's host allocator (at::getHostAllocator(PrivateUse1)), which
// torch.accelerator.empty_host_cache() and the host-memory statistics call:
// without one registered, empty_host_cache() dereferenced a null allocator and
// the process died (SIGSEGV) once vtpu had been used.
class PinnedMemoryAllocator final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(std::size_t nbytes) override {
    void* ptr = nbytes == 0 ? nullptr : c10::alloc_cpu(nbytes);
    if (ptr != nullptr) {
      PinnedBlocks& blocks = pinned_blocks();
      std::lock_guard<std::mutex> lock(blocks.mutex);
      blocks.sizes[reinterpret_cast<std::uintptr_t>(ptr)] = nbytes;
      blocks.stats.active_requests.increase(1);
      blocks.stats.active_bytes.increase(nbytes);
      blocks.stats.allocations.increase(1);
      blocks.stats.allocated_bytes.increase(nbytes);
      ++blocks.stats.num_host_alloc;
    }
    return {ptr, ptr, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  // Copies from pinned memory hold the source's storage until they ran, and
  // a freed block is not cached for reuse: nothing to wait for.
  bool record_event(void* ptr, void*, c10::Stream) override { return is_pinned_pointer(ptr); }
  void empty_cache() override {}  // nothing is cached
  at::HostStats get_stats() override {
    PinnedBlocks& blocks = pinned_blocks();
    std::lock_guard<std::mutex> lock(blocks.mutex);
    return blocks.stats;
  }
  void reset_accumulated_stats() override {
    for_each_stat([](at::HostStats& stats, at::Stat& stat) {
      stat.reset_accumulated();
      stats.num_host_alloc = 0;
      stats.num_host_free = 0;
    });
  }
  void reset_peak_stats() override {
    for_each_stat([](at::HostStats&, at::Stat& stat) { stat.reset_peak(); });
  }

 private:
  // The four statistics this allocator keeps, under the blocks' lock.
  template <typename Fn>
  static void for_each_stat(Fn fn) {
    PinnedBlocks& blocks = pinned_blocks();
    std::lock_guard<std::mutex> lock(blocks.mutex);
    at::HostStats& s = blocks.stats;
    for (at::Stat* stat : {&s.active_requests, &s.active_bytes, &s.allocations, &s.allocated_bytes}) fn(s, *stat);
  }
};

PinnedMemoryAllocator* host_allocator() {
  static PinnedMemoryAllocator allocator;
  return &allocator;
}

}  // namespace

c10::Allocator* pinned_memory_allocator() { return host_allocator(); }

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

// Registered at load time, before any vtpu tensor can exist.
REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, vtpu::bridge::host_allocator())
