// A target's compiled kernels by their generated source: an equal graph
// generates equal source, so it is compiled once per target object.
// Thread-safe; a compile runs outside the lock (two threads may compile the
// same source at once; the first result is kept).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "vtpu/targets/target.h"

namespace vtpu::targets::detail {

class KernelMemo {
 public:
  std::shared_ptr<const CompiledKernel> get_or_compile(
      const std::string& source, const std::function<std::shared_ptr<const CompiledKernel>()>& compile) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = kernels_.find(source); it != kernels_.end()) return it->second;
    }
    auto kernel = compile();
    std::lock_guard<std::mutex> lock(mutex_);
    return kernels_.emplace(source, std::move(kernel)).first->second;
  }

  // Drops the memo's references (a target releases its kernels before its
  // device context).
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    kernels_.clear();
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const CompiledKernel>> kernels_;
};

// The launch shape of a graph's kernel: outputs + inputs, the outputs' rank.
inline int launch_tensor_count(const ir::Graph& graph) {
  return static_cast<int>(graph.outputs().size() + graph.inputs().size());
}
inline int iteration_rank(const ir::Graph& graph) {
  return graph.outputs().empty() ? 0 : static_cast<int>(graph.type(graph.outputs().front()).rank());
}

// The symbol every target kernel is generated under (each lives in a module
// of its own).
inline constexpr const char* kKernelSymbol = "vtpu_target_kernel";

}  // namespace vtpu::targets::detail
