// Test support shared by the code generators' kernel tests: an output
// buffer with guard bytes on both sides (a kernel writing out of bounds is
// caught), and a launch argument describing a tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "vtpu/compiler/launch_abi.h"
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

}  // namespace vtpu::compiler::testing
