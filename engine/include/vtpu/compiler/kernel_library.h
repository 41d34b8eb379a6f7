// A loaded shared object of generated kernels. Loaded from bytes (as stored
// in the compile cache), so nothing outside the cache needs to stay on disk.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vtpu/compiler/launch_abi.h"

namespace vtpu::compiler {

class KernelLibrary {
 public:
  // Throws Error(kRuntime) when the bytes are not a loadable shared object.
  static KernelLibrary load(const std::vector<std::uint8_t>& shared_object);
  static KernelLibrary open(const std::string& path);
  ~KernelLibrary();
  KernelLibrary(KernelLibrary&& other) noexcept;
  KernelLibrary& operator=(KernelLibrary&& other) noexcept;
  KernelLibrary(const KernelLibrary&) = delete;
  KernelLibrary& operator=(const KernelLibrary&) = delete;

  // nullptr when absent.
  VtpuKernelFn find(const std::string& symbol) const;
  // Throws Error(kInvalidArgument) naming the symbol when absent.
  VtpuKernelFn get(const std::string& symbol) const;

 private:
  explicit KernelLibrary(void* handle) : handle_(handle) {}
  void release() noexcept;
  void* handle_ = nullptr;
  int fd_ = -1;  // the in-memory image of load(), kept open while loaded
};

}  // namespace vtpu::compiler
