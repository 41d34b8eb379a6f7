// Fused mode's background compiler: builds a pattern's fused kernel off the
// issuing thread (through the KernelProvider, so the compile cache and its
// tiers serve it) and keeps the pattern table the window looks kernels up in.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

#include "vtpu/compiler/launch_abi.h"
#include "vtpu/ir/graph.h"

namespace vtpu::bridge {

struct PatternState {
  compiler::VtpuKernelFn fn = nullptr;
  bool failed = false;  // the pattern stays on single-op kernels
};

class BackgroundCompiler {
 public:
  ~BackgroundCompiler();
  // Queues `graph` for building; its result lands in `patterns[pattern]`.
  void submit(std::string pattern, ir::Graph graph);
  // Blocks until the queue is empty and nothing is being built.
  void wait_idle();

  std::mutex patterns_mutex;
  std::unordered_map<std::string, PatternState> patterns;  // guarded by patterns_mutex
  std::unordered_map<std::string, bool> requested;         // guarded by patterns_mutex
  std::atomic<std::uint64_t> compiles{0};

 private:
  void loop();
  std::mutex mutex_;
  std::condition_variable ready_, idle_;
  std::deque<std::pair<std::string, ir::Graph>> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  std::thread worker_;
};

BackgroundCompiler& fused_compiler();

// VTPU_FUSED_COMPILE=sync: a new pattern's kernel is built at once, in the
// flush that first sees it.
bool fused_compile_in_foreground();

}  // namespace vtpu::bridge
