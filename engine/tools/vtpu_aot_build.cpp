// Build-time tool: generates and compiles the ahead-of-time kernel library.
//   vtpu_aot_build OUTPUT.so
// Uses the run-time code generator, compiler and flags (VTPU_CXX), so the
// keys in the library's manifest are the ones strict mode looks up.
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>

#include "vtpu/cache/compile_cache.h"
#include "vtpu/cache/memory_tier.h"
#include "vtpu/compiler/aot_library.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT.so\n", argv[0]);
    return 2;
  }
  try {
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::shared_ptr<vtpu::cache::CacheTier>> tiers{std::make_shared<vtpu::cache::MemoryTier>()};
    vtpu::compiler::KernelProvider provider(std::make_unique<vtpu::cache::CompileCache>(std::move(tiers)));
    const auto result = vtpu::compiler::build_aot_library(vtpu::compiler::aot_kernel_set(), provider);
    // Written beside the target and renamed: a failed build leaves no half file.
    const std::filesystem::path out(argv[1]);
    const std::filesystem::path tmp = out.string() + ".tmp";
    {
      std::ofstream file(tmp, std::ios::binary | std::ios::trunc);
      file.write(reinterpret_cast<const char*>(result.shared_object.data()),
                 static_cast<std::streamsize>(result.shared_object.size()));
      if (!file) throw std::runtime_error("cannot write " + tmp.string());
    }
    std::filesystem::rename(tmp, out);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("vtpu: ahead-of-time kernel library: %zu kernels, %.1f s -> %s\n", result.kernels, seconds,
                out.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vtpu_aot_build: %s\n", e.what());
    return 1;
  }
}
