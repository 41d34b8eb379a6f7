#include "vtpu/compiler/kernel_provider.h"

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "vtpu/compiler/aot_library.h"
#include "vtpu/compiler/host_codegen.h"
#include "vtpu/ir/canonical.h"
#include "vtpu/ir/printer.h"
#include "vtpu/runtime/error.h"

namespace vtpu::compiler {
namespace {

// VTPU_LOG_COMPILES, read once: on/off spelled as every vtpu switch is
// (1/true/yes/on, 0/false/no/off, any case); anything else is said once on
// stderr and leaves logging off. It used to take only "1", so `true` was
// silently off.
bool log_compiles() {
  static const bool on = [] {
    const char* raw = std::getenv("VTPU_LOG_COMPILES");
    if (raw == nullptr) return false;
    std::string value;
    for (const char* c = raw; *c != '\0'; ++c)
      if (!std::isspace(static_cast<unsigned char>(*c)))
        value.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(*c))));
    if (value.empty() || value == "0" || value == "false" || value == "no" || value == "off") return false;
    if (value == "1" || value == "true" || value == "yes" || value == "on") return true;
    std::fprintf(stderr, "vtpu: VTPU_LOG_COMPILES=%s is not one of 1/true/yes/on or 0/false/no/off; using off\n",
                 raw);
    return false;
  }();
  return on;
}

// The host's instruction set, as far as -march=native can see it: the CPU
// model and its feature flags. Two machines that differ here get different
// keys, so a shared cache never hands one the other's -march=native code.
const std::string& host_isa() {
  static const std::string isa = [] {
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line, model, flags;
    while (std::getline(cpuinfo, line) && (model.empty() || flags.empty())) {
      if (model.empty() && line.rfind("model name", 0) == 0) model = line;
      if (flags.empty() && line.rfind("flags", 0) == 0) flags = line;
    }
#if defined(__x86_64__)
    const char* arch = "x86_64";
#elif defined(__aarch64__)
    const char* arch = "aarch64";
#else
    const char* arch = "unknown";
#endif
    return std::string(arch) + "|" + model + "|" + flags;
  }();
  return isa;
}

}  // namespace

KernelProvider::KernelProvider(std::unique_ptr<cache::CompileCache> cache) : cache_(std::move(cache)) {
  if (!cache_) throw runtime::Error(runtime::ErrorKind::kInvalidArgument, "[kernel provider] no cache");
}

const SystemCompiler& KernelProvider::compiler() {
  if (!compiler_) compiler_ = std::make_unique<SystemCompiler>();
  return *compiler_;
}

std::string KernelProvider::source_for(const ir::Graph& graph, const std::string& symbol) {
  return host_translation_unit({generate_host_kernel(graph, symbol)});
}

std::string KernelProvider::symbol_for(const ir::Graph& graph) {
  // Named after the graph's shape-generic hash: stable, and unique per kernel.
  // Dead nodes count: the source is generated from the graph as it is, and
  // its launch scalars are numbered over every node. With dead code dropped
  // from the hash, a fused window with a dropped temporary (x * 2.0 unused,
  // then x + 3.0) was served the kernel of the same graph without it, which
  // read the scalars one position off (x + 6.0), or past their end.
  return "vtpu_kernel_" +
         ir::hash(graph, ir::ShapeMode::kGeneric, ir::ScalarMode::kParameters, ir::DeadNodes::kKept).hex();
}

cache::Key KernelProvider::key_for_source(const std::string& source) {
  std::string flags;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& f : compiler().flags()) flags += f + " ";
  }
  const std::string abi = std::to_string(kLaunchAbiVersion);
  // The generated source itself is hashed, not just the IR: a change in the
  // code generator changes the key, so a cache never serves a kernel built
  // by an older generator.
  return cache::make_key({"vtpu-host-kernel", source, "target=host", host_isa(), compiler_->identity(), flags, abi,
                          kVtpuVersion});
}

cache::Key KernelProvider::key_for(const ir::Graph& graph) {
  return key_for_source(source_for(graph, symbol_for(graph)));
}

// The maps are guarded by mutex_, held only for lookups; builds are
// serialised by build_mutex_ so that a thread needing a kernel being compiled
// waits for it rather than compiling it twice, while lookups of kernels
// already loaded (strict mode's hot path) never wait for a compile running
// on another thread (fused mode's background compiles).
VtpuKernelFn KernelProvider::get(const ir::Graph& graph) {
  const std::string symbol = symbol_for(graph);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = loaded_.find(symbol); it != loaded_.end()) {
      ++memory_hits_;
      return it->second.fn;
    }
  }
  const std::string source = source_for(graph, symbol);
  const cache::Key key = key_for_source(source);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = loaded_.find(symbol); it != loaded_.end()) return it->second.fn;
    if (auto it = aot_symbols_.find(key.hex()); it != aot_symbols_.end()) {
      if (VtpuKernelFn fn = aot_library_->find(it->second)) {
        loaded_.emplace(symbol, Loaded{aot_library_, fn});
        ++aot_hits_;
        return fn;
      }
    }
  }
  std::lock_guard<std::mutex> build(build_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = loaded_.find(symbol); it != loaded_.end()) return it->second.fn;
  }
  // compiler_ exists from key_for_source on and is only read from here on.
  const SystemCompiler& system_compiler = *compiler_;
  auto entry = cache_->get_or_create(key, [&] {
    // VTPU_LOG_COMPILES: which graphs compile at run time (candidates for
    // the ahead-of-time library).
    if (log_compiles())
      std::fprintf(stderr, "vtpu: compiling %s\n%s\n", symbol.c_str(), ir::to_string(graph).c_str());
    // VTPU_DUMP_KERNELS=dir: the IR and the generated source of each compile.
    if (const char* dir = std::getenv("VTPU_DUMP_KERNELS"); dir != nullptr && *dir != '\0') {
      std::ofstream dump(std::string(dir) + "/" + symbol + ".cpp");
      dump << "/*\n" << ir::to_string(graph) << "*/\n" << source;
      // A debugging aid: say once that it wrote nothing, never fail the compile.
      static std::atomic<bool> said{false};
      if (!dump && !said.exchange(true))
        std::fprintf(stderr, "vtpu: VTPU_DUMP_KERNELS=%s: cannot write kernels there (does the directory exist?)\n",
                     dir);
    }
    const auto start = std::chrono::steady_clock::now();
    cache::Entry built;
    built.data = system_compiler.compile(source);
    built.metadata["symbol"] = symbol;
    built.metadata["compiler"] = system_compiler.identity();
    compile_nanoseconds_ += static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
    ++compiles_;
    return built;
  });
  auto library = std::make_shared<KernelLibrary>(KernelLibrary::load(entry->data));
  VtpuKernelFn fn = library->get(symbol);
  std::lock_guard<std::mutex> lock(mutex_);
  loaded_.emplace(symbol, Loaded{std::move(library), fn});
  return fn;
}

std::size_t KernelProvider::attach_aot(std::shared_ptr<KernelLibrary> library) {
  using Manifest = const char* (*)();
  auto manifest_fn = reinterpret_cast<Manifest>(library ? library->find(kAotManifestSymbol) : nullptr);
  if (manifest_fn == nullptr)
    throw runtime::Error(runtime::ErrorKind::kInvalidArgument, "[kernel provider] not a vtpu kernel library");
  std::unordered_map<std::string, std::string> symbols;
  std::istringstream lines(manifest_fn());
  std::string key, symbol;
  while (lines >> key >> symbol) symbols.emplace(key, symbol);
  std::lock_guard<std::mutex> lock(mutex_);
  aot_library_ = std::move(library);
  aot_symbols_ = std::move(symbols);
  return aot_symbols_.size();
}

std::vector<std::uint8_t> KernelProvider::compile(const std::string& source) {
  const SystemCompiler* system_compiler = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    system_compiler = &compiler();
  }
  return system_compiler->compile(source);
}

ProviderStats KernelProvider::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  ProviderStats s;
  s.compiles = compiles_.load();
  s.compile_seconds = static_cast<double>(compile_nanoseconds_.load()) / 1e9;
  s.loaded = loaded_.size();
  s.memory_hits = memory_hits_.load();
  s.aot_hits = aot_hits_.load();
  s.aot_kernels = aot_symbols_.size();
  return s;
}

}  // namespace vtpu::compiler
