// The kernel provider: compile once, then serve from memory; a second
// provider over the same cache directory (a new process, in effect) loads the
// kernel from disk and compiles nothing.
#include "vtpu/compiler/kernel_provider.h"

#include <gtest/gtest.h>

#include "scoped_env.h"
#include "temp_dir.h"
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "vtpu/cache/disk_tier.h"
#include "vtpu/cache/memory_tier.h"
#include "vtpu/compiler/host_codegen.h"
#include "vtpu/compiler/system_compiler.h"
#include "vtpu/ir/graph.h"
#include "vtpu/runtime/error.h"

namespace vtpu::compiler {
namespace {

using vtpu::testing::TempDir;

std::unique_ptr<cache::CompileCache> local_cache(const std::string& dir) {
  cache::DiskTier::Options options;
  options.dir = dir;
  std::vector<std::shared_ptr<cache::CacheTier>> tiers = {std::make_shared<cache::MemoryTier>(),
                                                           std::make_shared<cache::DiskTier>(options)};
  return std::make_unique<cache::CompileCache>(std::move(tiers));
}

ir::Graph add_graph(std::vector<std::int64_t> sizes) {
  const auto t = ir::TensorType::contiguous(ir::DType::kFloat32, std::move(sizes));
  return ir::single_op(ir::OpKind::Add, {t, t});
}

void run_add(VtpuKernelFn fn, std::vector<float>& out, std::vector<float>& a, std::vector<float>& b) {
  VtpuTensorArg args[3] = {};
  float* data[3] = {out.data(), a.data(), b.data()};
  for (int t = 0; t < 3; ++t) {
    args[t].data = data[t];
    args[t].sizes[0] = static_cast<std::int64_t>(out.size());
    args[t].strides[0] = 1;
  }
  VtpuLaunchArgs launch{kLaunchAbiVersion, 1, 3, args, nullptr, nullptr, nullptr, nullptr};
  fn(&launch);
}

TEST(SystemCompilerTest, ACompilerThatWritesNothingIsAnErrorNotACacheEntry) {
  // VTPU_CXX=/bin/true "compiled" 186-byte entries into the cache, and every later
  // process failed to load them with no word of the compiler (found by a review).
  if (!std::filesystem::exists("/bin/true")) GTEST_SKIP() << "/bin/true is not here";
  SystemCompiler fake("/bin/true");
  try {
    fake.compile("extern \"C\" void f() {}");
    FAIL() << "an empty output was accepted";
  } catch (const runtime::Error& e) {
    EXPECT_NE(std::string(e.what()).find("VTPU_CXX"), std::string::npos) << e.what();
  }
}

TEST(SystemCompilerTest, AHungCompilerIsKilledAtTheTimeout) {
  // A compiler that never returned hung the program's first kernel build forever.
  TempDir tmp;
  const std::string script = tmp.sub("hung-cc");
  {
    std::ofstream out(script);
    out << "#!/bin/sh\n"
           "case \"$1\" in --version) echo hung-cc 1.0; exit 0;; esac\n"
           "sleep 30 &\n"  // a child of its own, as g++ starts cc1plus: must go too
           "wait\n";
  }
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  vtpu::testing::ScopedEnv timeout("VTPU_COMPILE_TIMEOUT", "1");
  SystemCompiler hung(script);
  const auto start = std::chrono::steady_clock::now();
  try {
    hung.compile("extern \"C\" void f() {}");
    FAIL() << "a hung compiler returned";
  } catch (const runtime::Error& e) {
    EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "retried, or not killed";
  vtpu::testing::ScopedEnv bad("VTPU_COMPILE_TIMEOUT", "soon");
  EXPECT_THROW(hung.compile("int x;"), runtime::Error);
}

TEST(KernelProviderTest, CompilesOnceThenServesFromMemoryAndDisk) {
  TempDir dir;
  KernelProvider first(local_cache(dir.path()));
  VtpuKernelFn fn = first.get(add_graph({8}));
  EXPECT_EQ(first.stats().compiles, 1u);
  // Another size: the same shape-generic kernel.
  EXPECT_EQ(first.get(add_graph({1000})), fn);
  EXPECT_EQ(first.stats().compiles, 1u);

  std::vector<float> a(5, 1.5f), b(5, 2.0f), out(5, 0.0f);
  run_add(fn, out, a, b);
  for (float v : out) EXPECT_EQ(v, 3.5f);

  KernelProvider second(local_cache(dir.path()));
  VtpuKernelFn again = second.get(add_graph({3}));
  EXPECT_EQ(second.stats().compiles, 0u);
  EXPECT_EQ(second.cache_stats().hits_in("disk"), 1u);
  run_add(again, out, a, b);
  for (float v : out) EXPECT_EQ(v, 3.5f);
}

// x + 3.0, optionally after a dead x * 2.0 (a fused window's dropped
// temporary): the graph as the fused window builds it.
ir::Graph add_three_after(bool dead_multiply) {
  ir::Graph g;
  const ir::ValueId x = g.add_input(ir::TensorType::contiguous(ir::DType::kFloat32, {4}));
  if (dead_multiply) g.add_node(ir::OpKind::Mul, {x, g.add_node(ir::OpKind::Constant, {}, {{"value", 2.0}})});
  g.mark_output(g.add_node(ir::OpKind::Add, {x, g.add_node(ir::OpKind::Constant, {}, {{"value", 3.0}})}));
  return g;
}

TEST(KernelProviderTest, GraphsDifferingInDeadNodesGetTheirOwnKernels) {
  // The launch scalars are numbered over every node, dead ones included, so
  // the kernel of the graph without the dead multiply read 2.0 as its
  // constant when served for the graph with it (found by review: x + 6.0).
  for (bool dead_first : {false, true}) {
    TempDir dir;  // a fresh provider per order
    KernelProvider provider(local_cache(dir.path()));
    for (bool dead : {dead_first, !dead_first}) {
      const ir::Graph g = add_three_after(dead);
      VtpuKernelFn fn = provider.get(g);
      const std::vector<double> scalars = launch_scalars(g);
      std::vector<float> x = {1, 2, 3, 4}, out(4, 0.0f);
      VtpuTensorArg args[2] = {};
      float* data[2] = {out.data(), x.data()};
      for (int t = 0; t < 2; ++t) {
        args[t].data = data[t];
        args[t].sizes[0] = 4;
        args[t].strides[0] = 1;
      }
      VtpuLaunchArgs launch{kLaunchAbiVersion, 1, 2, args, scalars.data(), nullptr, nullptr, nullptr};
      fn(&launch);
      EXPECT_EQ(out, (std::vector<float>{4, 5, 6, 7})) << "dead multiply: " << dead;
    }
  }
}

TEST(KernelProviderTest, KeysSeparateDtypesAndRanks) {
  TempDir dir;
  KernelProvider provider(local_cache(dir.path()));
  const auto f32 = provider.key_for(add_graph({4}));
  const auto f32_rank2 = provider.key_for(add_graph({2, 2}));
  const auto f64 = provider.key_for(ir::single_op(
      ir::OpKind::Add, {ir::TensorType::contiguous(ir::DType::kFloat64, {4}), ir::TensorType::contiguous(ir::DType::kFloat64, {4})}));
  EXPECT_NE(f32.hex(), f32_rank2.hex());
  EXPECT_NE(f32.hex(), f64.hex());
  EXPECT_EQ(f32.hex(), provider.key_for(add_graph({77})).hex());
}

// Libraries loaded from memory one after another must each keep their own
// identity (the loader must not mistake a new image for an earlier one).
TEST(KernelProviderTest, ManyKernelsLoadSideBySide) {
  TempDir dir;
  KernelProvider provider(local_cache(dir.path()));
  const auto t = ir::TensorType::contiguous(ir::DType::kFloat32, {4});
  std::vector<VtpuKernelFn> fns;
  for (ir::OpKind op : {ir::OpKind::Add, ir::OpKind::Mul, ir::OpKind::Sub, ir::OpKind::Maximum})
    fns.push_back(provider.get(ir::single_op(op, {t, t})));
  std::vector<float> a = {1, 2, 3, 4}, b = {4, 3, 2, 1}, out(4);
  const std::vector<std::vector<float>> expected = {{5, 5, 5, 5}, {4, 6, 6, 4}, {-3, -1, 1, 3}, {4, 3, 3, 4}};
  for (std::size_t k = 0; k < fns.size(); ++k) {
    run_add(fns[k], out, a, b);
    EXPECT_EQ(out, expected[k]) << k;
  }
}

}  // namespace
}  // namespace vtpu::compiler
