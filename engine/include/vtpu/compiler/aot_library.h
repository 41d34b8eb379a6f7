// The ahead-of-time kernel library: the single-op kernels strict mode needs
// most, generated and compiled when the package is built, so that these ops
// never compile at run time.
//
// The library is built by the same code generator, system compiler and flags
// as a run-time compile, and every kernel is registered under the cache key a
// run-time compile of the same graph would have (vtpu_aot_manifest(), inside
// the library, lists "key symbol" lines). A kernel whose key differs at run
// time (another compiler, other flags, another ISA) is simply not found there
// and compiles as usual; the results are bitwise the same either way, because
// the kernels are written not to depend on how the compiler vectorised them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vtpu/compiler/kernel_provider.h"
#include "vtpu/ir/graph.h"

namespace vtpu::compiler {

// The graphs the library holds, built exactly as the bridge builds them for
// single ops: elementwise ops on flat contiguous float32/bfloat16 tensors
// (and their scalar forms), common broadcasts, row reductions and softmax.
std::vector<ir::Graph> aot_kernel_set();

struct AotBuildResult {
  std::vector<std::uint8_t> shared_object;
  std::size_t kernels = 0;
};

// Generates and compiles `graphs` (those the generator refuses are skipped)
// into one shared object with its manifest. Keys come from `provider`, so they
// match what that provider looks up at run time.
AotBuildResult build_aot_library(const std::vector<ir::Graph>& graphs, KernelProvider& provider);

// Name of the manifest function inside the library.
inline constexpr const char* kAotManifestSymbol = "vtpu_aot_manifest";

}  // namespace vtpu::compiler
