// Where generated kernels come from: the graph's shape-generic key is looked
// up in the compile cache (in-process, then the local directory); on a miss
// the host code generator and the system compiler build it once (per key
// across processes) and the shared object is stored for everyone after.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "vtpu/cache/compile_cache.h"
#include "vtpu/compiler/kernel_library.h"
#include "vtpu/compiler/launch_abi.h"
#include "vtpu/compiler/system_compiler.h"
#include "vtpu/ir/graph.h"

namespace vtpu::compiler {

struct ProviderStats {
  std::uint64_t compiles = 0;          // kernels this process compiled
  double compile_seconds = 0;
  std::uint64_t loaded = 0;            // kernels resolved (any source)
  std::uint64_t memory_hits = 0;       // served by the already-loaded kernels
  std::uint64_t aot_hits = 0;          // first served by the ahead-of-time library
  std::uint64_t aot_kernels = 0;       // kernels the attached library holds
};

class KernelProvider {
 public:
  explicit KernelProvider(std::unique_ptr<cache::CompileCache> cache);

  // The kernel for `graph` (an elementwise graph the host generator accepts).
  // Throws Error(kInvalidArgument) for graphs it cannot generate and
  // Error(kRuntime) when compiling or loading fails.
  VtpuKernelFn get(const ir::Graph& graph);

  // The cache key of `graph`: its generated source (so the canonical
  // shape-generic IR and the generator's own version), target, ISA, compiler
  // identity and flags, launch ABI and vtpu versions.
  cache::Key key_for(const ir::Graph& graph);

  // Serves the kernels of an ahead-of-time library (aot_library.h) before
  // the cache and the compiler. Returns how many kernels it lists; throws
  // Error(kInvalidArgument) when the library has no manifest.
  std::size_t attach_aot(std::shared_ptr<KernelLibrary> library);

  // Compiles a translation unit with this provider's compiler and flags.
  std::vector<std::uint8_t> compile(const std::string& source);

  // The kernel's symbol: named after the graph's shape-generic hash.
  static std::string symbol_for(const ir::Graph& graph);

  ProviderStats stats() const;
  cache::CacheStats cache_stats() const { return cache_->stats(); }
  cache::CompileCache& cache() { return *cache_; }

 private:
  const SystemCompiler& compiler();
  static std::string source_for(const ir::Graph& graph, const std::string& symbol);
  cache::Key key_for_source(const std::string& source);

  std::unique_ptr<cache::CompileCache> cache_;
  mutable std::mutex mutex_;  // the maps below and compiler_'s creation
  std::mutex build_mutex_;     // one build at a time (kernel_provider.cpp)
  std::unique_ptr<SystemCompiler> compiler_;  // found on first use
  struct Loaded {
    std::shared_ptr<KernelLibrary> library;
    VtpuKernelFn fn;
  };
  std::unordered_map<std::string, Loaded> loaded_;  // by symbol (the IR's generic hash)
  std::shared_ptr<KernelLibrary> aot_library_;
  std::unordered_map<std::string, std::string> aot_symbols_;  // key hex -> symbol
  std::atomic<std::uint64_t> aot_hits_{0};
  std::atomic<std::uint64_t> compiles_{0};
  std::atomic<std::uint64_t> memory_hits_{0};
  std::atomic<std::uint64_t> compile_nanoseconds_{0};
};

// "0.1.0": part of every key, so an upgrade never loads an older kernel.
inline constexpr const char* kVtpuVersion = "0.1.0";

}  // namespace vtpu::compiler
