// Turns generated C++ source into a shared object with the system compiler
// (VTPU_CXX, else c++). Its identity (the compiler's version text) and flags
// are part of every compile-cache key: a different compiler is a different kernel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vtpu::compiler {

class SystemCompiler {
 public:
  // Reads VTPU_CXX; throws Error(kRuntime) when the compiler cannot be run.
  SystemCompiler();
  explicit SystemCompiler(std::string executable);

  const std::string& executable() const { return executable_; }
  // First line of `<cxx> --version`: names compiler and version.
  const std::string& identity() const { return identity_; }
  const std::vector<std::string>& flags() const { return flags_; }

  // The shared object's bytes. Throws Error(kRuntime) with the compiler's
  // diagnostics when compilation fails.
  std::vector<std::uint8_t> compile(const std::string& source) const;

 private:
  std::string executable_;
  std::string identity_;
  std::vector<std::string> flags_;
};

}  // namespace vtpu::compiler
