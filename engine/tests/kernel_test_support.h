// Test support shared by the code generators' kernel tests: an output
// buffer with guard bytes on both sides (a kernel writing out of bounds is
// caught), a launch argument describing a tensor, a parallel_for on real
// threads, and the launch of a graph's kernel into fresh guarded outputs.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "vtpu/compiler/kernel_library.h"
#include "vtpu/compiler/launch_abi.h"
#include "vtpu/ir/graph.h"
#include "vtpu/ir/interpreter.h"
#include "vtpu/ir/tensor_type.h"

namespace vtpu::compiler::testing {

constexpr std::size_t kGuard = 64;
constexpr std::uint8_t kGuardByte = 0xA5;

// The output in contiguous storage with guard bytes on both sides.
struct Output {
  ir::TensorType type;
  std::vector<std::uint8_t> storage;
  std::uint8_t* data() { return storage.data() + kGuard; }
  std::size_t size() const { return storage.size() - 2 * kGuard; }
  bool guards_intact() const {
    for (std::size_t i = 0; i < kGuard; ++i)
      if (storage[i] != kGuardByte || storage[storage.size() - 1 - i] != kGuardByte) return false;
    return true;
  }
  std::vector<std::uint8_t> bytes() const {
    return {storage.begin() + kGuard, storage.end() - static_cast<std::ptrdiff_t>(kGuard)};
  }
};

inline VtpuTensorArg tensor_arg(void* data, const ir::TensorType& t) {
  VtpuTensorArg arg{};
  arg.data = data;
  for (std::size_t d = 0; d < t.sizes.size(); ++d) {
    arg.sizes[d] = t.sizes[d];
    arg.strides[d] = t.strides[d];
  }
  return arg;
}

// Launches that split their work (total > grain) under threaded_for.
inline std::atomic<int>& split_launches() {
  static std::atomic<int> count{0};
  return count;
}

// A VtpuParallelFor running up to five chunks on their own threads.
inline void threaded_for(std::int64_t total, std::int64_t grain, VtpuParallelBody body, void* context, void*) {
  std::vector<std::thread> threads;
  if (total > grain) ++split_launches();
  const std::int64_t chunk = std::max<std::int64_t>(grain, (total + 4) / 5);
  for (std::int64_t begin = 0; begin < total; begin += chunk)
    threads.emplace_back([=] { body(begin, std::min(total, begin + chunk), context); });
  for (auto& t : threads) t.join();
}

// Runs kernel `symbol` of `library` on `inputs` (the graph's inputs, in
// order) into one contiguous guarded output per graph output, every byte
// starting as `fill`: the launch contract of the single-op kernels (outputs,
// then inputs, each in its own rank).
inline std::vector<Output> launch_outputs(const KernelLibrary& library, const std::string& symbol,
                                          const ir::Graph& graph, std::vector<ir::Buffer> inputs,
                                          VtpuParallelFor parallel_for, VtpuKernelStatus* status,
                                          std::uint8_t fill = 0) {
  std::vector<Output> outs;
  for (ir::ValueId id : graph.outputs()) {
    Output out;
    out.type = graph.type(id);
    out.storage.assign(static_cast<std::size_t>(out.type.storage_extent() * ir::itemsize(out.type.dtype)) + 2 * kGuard,
                       fill);
    std::fill(out.storage.begin(), out.storage.begin() + kGuard, kGuardByte);
    std::fill(out.storage.end() - kGuard, out.storage.end(), kGuardByte);
    outs.push_back(std::move(out));
  }
  std::vector<VtpuTensorArg> args;
  for (auto& o : outs) args.push_back(tensor_arg(o.data(), o.type));
  for (auto& b : inputs) args.push_back(tensor_arg(b.bytes.data(), b.type));
  VtpuLaunchArgs launch_args{kLaunchAbiVersion, 0, static_cast<std::int32_t>(args.size()), args.data(), nullptr,
                             parallel_for, nullptr, status};
  library.get(symbol)(&launch_args);
  return outs;
}

}  // namespace vtpu::compiler::testing
