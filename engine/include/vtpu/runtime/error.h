// Engine errors. The engine never aborts: every failure is one of these
// exceptions, and the torch bridge maps each kind to the matching PyTorch type.
#pragma once

#include <stdexcept>
#include <string>

namespace vtpu::runtime {

enum class ErrorKind {
  kOutOfMemory,      // -> torch.OutOfMemoryError
  kInvalidArgument,  // -> ValueError / RuntimeError
  kRuntime,          // -> RuntimeError
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message)
      : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

class OutOfMemoryError : public Error {
 public:
  explicit OutOfMemoryError(const std::string& message)
      : Error(ErrorKind::kOutOfMemory, message) {}
};

}  // namespace vtpu::runtime
