// The ahead-of-time kernel library: a provider with the library attached
// serves its kernels without compiling, the kernels give bitwise the results
// of the same kernels compiled one by one at run time, and graphs outside the
// library still compile.
#include "vtpu/compiler/aot_library.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "vtpu/cache/memory_tier.h"
#include "vtpu/compiler/host_codegen.h"
#include "vtpu/ir/graph.h"
#include "vtpu/runtime/error.h"

namespace vtpu::compiler {
namespace {

std::unique_ptr<cache::CompileCache> memory_cache() {
  std::vector<std::shared_ptr<cache::CacheTier>> tiers = {std::make_shared<cache::MemoryTier>()};
  return std::make_unique<cache::CompileCache>(std::move(tiers));
}

ir::TensorType flat(std::int64_t n) { return ir::TensorType::contiguous(ir::DType::kFloat32, {n}); }

// out = f(in) for a one-input kernel over n contiguous floats, serially.
std::vector<float> run_unary(VtpuKernelFn fn, const std::vector<float>& in) {
  std::vector<float> out(in.size(), 0.0f), copy = in;
  VtpuTensorArg args[2] = {};
  args[0].data = out.data();
  args[1].data = copy.data();
  for (auto& a : args) {
    a.sizes[0] = static_cast<std::int64_t>(in.size());
    a.strides[0] = 1;
  }
  VtpuLaunchArgs launch{kLaunchAbiVersion, 1, 2, args, nullptr, nullptr, nullptr, nullptr};
  fn(&launch);
  return out;
}

TEST(AotLibrary, ServesItsKernelsWithoutCompilingAndMatchesRunTimeCompilesBitwise) {
  const std::vector<ir::Graph> graphs = {ir::single_op(ir::OpKind::Exp, {flat(8)}),
                                         ir::single_op(ir::OpKind::Tanh, {flat(8)}),
                                         ir::single_op(ir::OpKind::Gelu, {flat(8)}, {{"approximate", std::string("none")}})};
  KernelProvider builder(memory_cache());
  const AotBuildResult built = build_aot_library(graphs, builder);
  EXPECT_EQ(built.kernels, graphs.size());

  KernelProvider with_aot(memory_cache());
  EXPECT_EQ(with_aot.attach_aot(std::make_shared<KernelLibrary>(KernelLibrary::load(built.shared_object))),
            graphs.size());
  KernelProvider runtime_only(memory_cache());

  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> input(1003);  // not a multiple of any vector width
  for (float& v : input) v = dist(rng);
  for (const ir::Graph& graph : graphs) {
    // Another size, same shape-generic kernel.
    const ir::Graph resized = ir::single_op(graph.nodes().back().op, {flat(1003)}, graph.nodes().back().attrs);
    const std::vector<float> aot = run_unary(with_aot.get(resized), input);
    const std::vector<float> compiled = run_unary(runtime_only.get(resized), input);
    EXPECT_EQ(std::memcmp(aot.data(), compiled.data(), aot.size() * sizeof(float)), 0)
        << ir::name(graph.nodes().back().op);
  }
  EXPECT_EQ(with_aot.stats().compiles, 0u);
  EXPECT_EQ(with_aot.stats().aot_hits, graphs.size());
  EXPECT_EQ(runtime_only.stats().compiles, graphs.size());

  // Outside the library: compiled as usual.
  with_aot.get(ir::single_op(ir::OpKind::Sin, {flat(4)}));
  EXPECT_EQ(with_aot.stats().compiles, 1u);
}

TEST(AotLibrary, TheShippedSetIsGeneratable) {
  // Every graph of the shipped set is one the generator accepts (a refused
  // one would silently compile at run time instead).
  for (const ir::Graph& graph : aot_kernel_set()) {
    const std::string symbol = KernelProvider::symbol_for(graph);
    EXPECT_NO_THROW(generate_host_kernel(graph, symbol)) << ir::name(graph.nodes().back().op);
  }
}

TEST(AotLibrary, ALibraryWithoutManifestIsRefused) {
  KernelProvider provider(memory_cache());
  const auto bytes = provider.compile("extern \"C\" int not_a_kernel_library() { return 1; }\n");
  EXPECT_THROW(provider.attach_aot(std::make_shared<KernelLibrary>(KernelLibrary::load(bytes))), runtime::Error);
}

}  // namespace
}  // namespace vtpu::compiler
