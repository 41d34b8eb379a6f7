#include "fused_compiler.h"

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "generated_kernels.h"
#include "vtpu/compiler/kernel_provider.h"

namespace vtpu::bridge {

BackgroundCompiler::~BackgroundCompiler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void BackgroundCompiler::wait_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void BackgroundCompiler::submit(std::string pattern, ir::Graph graph) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!worker_.joinable()) worker_ = std::thread([this] { loop(); });
  queue_.emplace_back(std::move(pattern), std::move(graph));
  ready_.notify_one();
}

void BackgroundCompiler::loop() {
  for (;;) {
    std::pair<std::string, ir::Graph> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    PatternState state;
    try {
      compiler::KernelProvider* provider = generated_kernel_provider();
      state.fn = provider == nullptr ? nullptr : provider->get(job.second);
    } catch (const std::exception& e) {
      // The pattern keeps running on single-op kernels (same results).
      std::fprintf(stderr, "vtpu: fused kernel unavailable, its ops stay unfused: %s\n", e.what());
      state.fn = nullptr;
    }
    state.failed = state.fn == nullptr;
    ++compiles;
    {
      std::lock_guard<std::mutex> lock(patterns_mutex);
      patterns[job.first] = state;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      busy_ = false;
    }
    idle_.notify_all();
  }
}

BackgroundCompiler& fused_compiler() {
  // Leaked on purpose, like the device context: kernels stay loaded to exit.
  static auto* compiler = new BackgroundCompiler();
  return *compiler;
}

bool fused_compile_in_foreground() {
  static const bool foreground = [] {
    const char* env = std::getenv("VTPU_FUSED_COMPILE");
    return env != nullptr && std::string(env) == "sync";
  }();
  return foreground;
}

}  // namespace vtpu::bridge
