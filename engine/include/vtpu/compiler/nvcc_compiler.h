// Turns generated CUDA C++ into a cubin for one GPU architecture with nvcc
// (VTPU_NVCC, else nvcc on PATH, else /usr/local/cuda/bin/nvcc). Its identity
// (nvcc's release line) and flags belong in a compile-cache key, as the
// system compiler's do.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace vtpu::compiler {

class NvccCompiler {
 public:
  // Throws Error(kRuntime) when nvcc cannot be run.
  NvccCompiler();
  explicit NvccCompiler(std::string executable);

  // nullptr (and why in `why_not`) when no nvcc runs on this machine.
  static std::unique_ptr<NvccCompiler> find(std::string* why_not);

  const std::string& executable() const { return executable_; }
  const std::string& identity() const { return identity_; }
  const std::vector<std::string>& flags() const { return flags_; }

  // The cubin's bytes for `arch` ("sm_90"). Throws Error(kRuntime) with
  // nvcc's diagnostics when compilation fails.
  std::vector<std::uint8_t> compile(const std::string& source, const std::string& arch) const;

 private:
  std::string executable_;
  std::string identity_;
  std::vector<std::string> flags_;
};

}  // namespace vtpu::compiler
