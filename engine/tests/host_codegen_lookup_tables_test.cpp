// 16-bit transcendental ops read lookup tables (host_codegen.cpp, "Lookup
// tables"): a kernel fills a table of its 65536 results on its first launch
// from the same expression it would compute per element. These tests run
// every bit pattern of float16 and bfloat16 through the kernel with tables
// and through the same graph's kernel spelled as computed
// (LookupTables::kComputed), in each loop the kernels choose at launch
// (dense, strided, threaded), in fused chains whose operand is a rounded
// intermediate, and with broadcast operands in float16's lane groups: the
// bits must be equal everywhere.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "kernel_test_support.h"
#include "test_kernel_cache.h"
#include "vtpu/compiler/host_codegen.h"
#include "vtpu/compiler/kernel_library.h"
#include "vtpu/compiler/launch_abi.h"
#include "vtpu/ir/graph.h"

namespace vtpu::compiler {
namespace {

using ir::DType;
using ir::OpKind;
using ir::TensorType;

struct UnaryCase {
  OpKind op;
  ir::Attributes attrs;
  std::string name;
};

std::vector<UnaryCase> unary_cases() {
  std::vector<UnaryCase> cases;
  for (OpKind op : {OpKind::Exp, OpKind::Exp2, OpKind::Log, OpKind::Log2, OpKind::Log10, OpKind::Log1p,
                    OpKind::Expm1, OpKind::Sin, OpKind::Cos, OpKind::Tan, OpKind::Asin, OpKind::Acos, OpKind::Atan,
                    OpKind::Sinh, OpKind::Cosh, OpKind::Tanh, OpKind::Sigmoid, OpKind::Silu, OpKind::Erf,
                    OpKind::Gelu})
    cases.push_back({op, {}, std::string(ir::name(op))});
  cases.push_back({OpKind::Gelu, {{"approximate", std::string("tanh")}}, "gelu_tanh"});
  return cases;
}

// Every 16-bit pattern once, as a 256 x 256 matrix.
std::vector<std::uint16_t> every_pattern() {
  std::vector<std::uint16_t> v(65536);
  for (std::uint32_t b = 0; b < 65536; ++b) v[b] = static_cast<std::uint16_t>(b);
  return v;
}

// Launches `symbol` on 16-bit tensors of `sizes` (outputs first, then
// inputs; each its own strides) and returns output 0's elements in
// row-major order of `sizes` (it is written contiguously).
std::vector<std::uint16_t> launch(const KernelLibrary& library, const std::string& symbol,
                                  const std::vector<std::int64_t>& sizes,
                                  const std::vector<std::pair<const std::uint16_t*, std::vector<std::int64_t>>>& inputs,
                                  VtpuParallelFor parallel_for) {
  std::int64_t numel = 1;
  for (std::int64_t s : sizes) numel *= s;
  std::vector<std::uint16_t> out(static_cast<std::size_t>(numel), 0xdeadu);
  std::vector<VtpuTensorArg> args(1 + inputs.size());
  std::vector<std::int64_t> contiguous(sizes.size(), 1);
  for (std::size_t d = sizes.size(); d-- > 1;) contiguous[d - 1] = contiguous[d] * sizes[d];
  auto describe = [&](VtpuTensorArg& arg, const void* data, const std::vector<std::int64_t>& strides) {
    arg.data = const_cast<void*>(data);
    for (std::size_t d = 0; d < sizes.size(); ++d) {
      arg.sizes[d] = sizes[d];
      arg.strides[d] = strides[d];
    }
  };
  describe(args[0], out.data(), contiguous);
  for (std::size_t i = 0; i < inputs.size(); ++i) describe(args[1 + i], inputs[i].first, inputs[i].second);
  VtpuLaunchArgs l{kLaunchAbiVersion, static_cast<std::int32_t>(sizes.size()), static_cast<std::int32_t>(args.size()),
                   args.data(), nullptr, parallel_for, nullptr, nullptr};
  library.get(symbol)(&l);
  return out;
}

TEST(HostCodegenLookupTables, EveryPatternGivesTheComputedBits) {
  const DType dtypes[] = {DType::kBFloat16, DType::kFloat16};
  std::vector<GeneratedKernel> kernels;
  for (DType dtype : dtypes)
    for (const auto& c : unary_cases()) {
      const ir::Graph graph = ir::single_op(c.op, {TensorType::contiguous(dtype, {256, 256})}, c.attrs);
      const std::string suffix = c.name + "_" + std::string(ir::name(dtype));
      kernels.push_back(generate_host_kernel(graph, "table_" + suffix, LookupTables::kUsed));
      kernels.push_back(generate_host_kernel(graph, "computed_" + suffix, LookupTables::kComputed));
      // Not vacuous: the first reads a table, the second does not.
      EXPECT_NE(kernels[kernels.size() - 2].source.find("lookup_table_v"), std::string::npos) << suffix;
      EXPECT_EQ(kernels.back().source.find("lookup_table_v"), std::string::npos) << suffix;
      // A transposed input (a graph's layout is part of its kernel).
      kernels.push_back(generate_host_kernel(ir::single_op(c.op, {TensorType{dtype, {256, 256}, {1, 256}}}, c.attrs),
                                             "strided_" + suffix, LookupTables::kUsed));
    }
  const auto library = KernelLibrary::load(testing::compile_once(host_translation_unit(kernels)));
  const std::vector<std::uint16_t> patterns = every_pattern();
  // The patterns transposed, read through strides {1, 256}: the same matrix.
  std::vector<std::uint16_t> column_major(patterns.size());
  for (std::size_t r = 0; r < 256; ++r)
    for (std::size_t c = 0; c < 256; ++c) column_major[c * 256 + r] = patterns[r * 256 + c];
  for (DType dtype : dtypes)
    for (const auto& c : unary_cases()) {
      const std::string suffix = c.name + "_" + std::string(ir::name(dtype));
      const auto computed = launch(library, "computed_" + suffix, {256, 256}, {{patterns.data(), {256, 1}}}, nullptr);
      EXPECT_GT(std::set<std::uint16_t>(computed.begin(), computed.end()).size(), 300u) << suffix;
      for (VtpuParallelFor parallel_for : {static_cast<VtpuParallelFor>(nullptr), &testing::threaded_for}) {
        const char* how = parallel_for ? " threaded" : " serial";
        EXPECT_EQ(launch(library, "table_" + suffix, {256, 256}, {{patterns.data(), {256, 1}}}, parallel_for),
                  computed)
            << suffix << how;
        EXPECT_EQ(launch(library, "strided_" + suffix, {256, 256}, {{column_major.data(), {1, 256}}}, parallel_for),
                  computed)
            << suffix << " strided" << how;
      }
    }
}

TEST(HostCodegenLookupTables, ChainsAndBroadcastOperandsGiveTheComputedBits) {
  // GELU's backward grad * G(x), G(x) from a table of floats, in both
  // dtypes. bfloat16 gelu(x * y): the product, rounded to bfloat16, indexes the
  // table. float16 sin(x) * cos(w) with w broadcast along rows (its lane
  // groups read the stored bits of a column, not of 16 neighbours), and
  // float16 tanh(x * y), whose rounded product is not an input: computed.
  struct Chain {
    std::string name;
    DType dtype;
    std::vector<std::vector<std::int64_t>> input_strides;
  };
  const std::vector<std::int64_t> sizes{64, 1024};
  const std::vector<Chain> chains{{"gelu_of_product", DType::kBFloat16, {{1024, 1}, {1024, 1}}},
                                  {"sin_times_cos_of_column", DType::kFloat16, {{1024, 1}, {1, 0}}},
                                  {"tanh_of_product", DType::kFloat16, {{1024, 1}, {1024, 1}}},
                                  {"gelu_backward_bfloat16", DType::kBFloat16, {{1024, 1}, {1024, 1}}},
                                  {"gelu_backward_float16", DType::kFloat16, {{1024, 1}, {1024, 1}}}};
  auto graph_of = [&](const Chain& chain) {
    ir::Graph g;
    const auto x = g.add_input(TensorType{chain.dtype, sizes, chain.input_strides[0]});
    const auto y = g.add_input(TensorType{chain.dtype, sizes, chain.input_strides[1]});
    if (chain.name == "gelu_of_product") {
      g.mark_output(g.add_node(OpKind::Gelu, {g.add_node(OpKind::Mul, {x, y}, {})}, {}));
    } else if (chain.name == "sin_times_cos_of_column") {
      g.mark_output(g.add_node(OpKind::Mul, {g.add_node(OpKind::Sin, {x}, {}), g.add_node(OpKind::Cos, {y}, {})}, {}));
    } else if (chain.name == "tanh_of_product") {
      g.mark_output(g.add_node(OpKind::Tanh, {g.add_node(OpKind::Mul, {x, y}, {})}, {}));
    } else {
      // grad y times G(x) read from a factor table (every x pattern: x below).
      g.mark_output(g.add_node(OpKind::GeluBackward, {y, x}, {}));
    }
    return g;
  };
  std::vector<GeneratedKernel> kernels;
  for (const auto& chain : chains) {
    const ir::Graph graph = graph_of(chain);
    kernels.push_back(generate_host_kernel(graph, "table_" + chain.name, LookupTables::kUsed));
    kernels.push_back(generate_host_kernel(graph, "computed_" + chain.name, LookupTables::kComputed));
    const bool expects_table = chain.name != "tanh_of_product";
    EXPECT_EQ(kernels[kernels.size() - 2].source.find("lookup_table_v") != std::string::npos, expects_table)
        << chain.name;
  }
  const auto library = KernelLibrary::load(testing::compile_once(host_translation_unit(kernels)));
  // x: every pattern once (40503 is odd, so i * 40503 permutes them); y: another order.
  std::vector<std::uint16_t> x(64 * 1024), y(64 * 1024);
  for (std::uint32_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<std::uint16_t>(i * 40503u);
    y[i] = static_cast<std::uint16_t>((i * 2654435761u) >> 7);
  }
  for (const auto& chain : chains) {
    const std::vector<std::pair<const std::uint16_t*, std::vector<std::int64_t>>> inputs{
        {x.data(), chain.input_strides[0]}, {y.data(), chain.input_strides[1]}};
    const auto computed = launch(library, "computed_" + chain.name, sizes, inputs, nullptr);
    EXPECT_GT(std::set<std::uint16_t>(computed.begin(), computed.end()).size(), 1000u) << chain.name;
    for (VtpuParallelFor parallel_for : {static_cast<VtpuParallelFor>(nullptr), &testing::threaded_for})
      EXPECT_EQ(launch(library, "table_" + chain.name, sizes, inputs, parallel_for), computed)
          << chain.name << (parallel_for ? " threaded" : " serial");
  }
}

}  // namespace
}  // namespace vtpu::compiler
