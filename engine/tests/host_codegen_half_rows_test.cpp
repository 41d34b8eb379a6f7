// Contiguous float16 rows of the reduction kernels convert their values 16 at
// a time with the x86 conversion instructions (vtpu_half_lanes_segment);
// strided rows keep vtpu_load's integer conversion. Both must give the same
// bits: every float16 pattern (NaNs, infinities, subnormals, signed zeros)
// is reduced once in a contiguous row and once in a row of stride 2, by
// sum, mean and amax, in rows of a whole number of lane groups, rows with a
// remainder, one long row split into segments on threads, and columns
// (whose groups of 32 neighbouring outputs convert likewise; narrow ones of a
// column-major input through the rows' helper); and once more column-major.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
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

struct HalfCase {
  std::string name;
  OpKind op;
  std::int64_t rows, n;
  std::int64_t dim = 1;  // 0: column reductions (groups of 32 neighbouring outputs)
};

TEST(HostCodegenHalfRows, ContiguousRowsGiveTheStridedRowsBits) {
  // Finite-only sums too: a row holding +inf and -inf is NaN either way.
  const std::vector<HalfCase> cases = {
      {"sum_groups", OpKind::Sum, 64, 1024},
      {"sum_remainder", OpKind::Sum, 61, 1070},   // 1070 = 66 groups of 16 + 14
      {"mean_remainder", OpKind::Mean, 65, 1007},
      {"amax_groups", OpKind::Amax, 128, 512},
      {"sum_long_row", OpKind::Sum, 1, 65536},    // two segments, on threads
      {"amax_long_row", OpKind::Amax, 1, 65536},
      {"sum_columns", OpKind::Sum, 300, 200, 0},  // 6 groups of 32 and 8 more
      {"amax_columns", OpKind::Amax, 256, 256, 0},
      // Narrow columns (fewer than 16): column-major ones are contiguous runs.
      {"mean_narrow_columns", OpKind::Mean, 70000, 5, 0},  // a sum would overflow
      {"amax_narrow_columns", OpKind::Amax, 3001, 3, 0},
  };
  // The same logical values in three layouts: contiguous, every other
  // element (stride 2: vtpu_load's conversion), and column-major (a
  // transposed input: rows walk across memory, columns are contiguous runs).
  const char* const layouts[] = {"contiguous", "strided", "column_major"};
  auto strides_of = [](const HalfCase& c, const std::string& layout) -> std::vector<std::int64_t> {
    if (layout == "contiguous") return {c.n, 1};
    if (layout == "strided") return {2 * c.n, 2};
    return {1, c.rows};
  };
  std::vector<GeneratedKernel> kernels;
  for (const auto& c : cases)
    for (const char* layout : layouts) {
      const TensorType in{DType::kFloat16, {c.rows, c.n}, strides_of(c, layout)};
      kernels.push_back(generate_host_kernel(ir::single_op(c.op, {in}, {{"dims", std::vector<std::int64_t>{c.dim}}, {"keepdim", false}}),
                                             c.name + "_" + layout));
    }
  const auto library = KernelLibrary::load(testing::compile_once(host_translation_unit(kernels)));
  std::mt19937 rng(5);
  for (const auto& c : cases) {
    // Every 16-bit pattern (repeated to fill the rows), shuffled; finite
    // ones only for sums (a row holding +inf and -inf is NaN either way),
    // no NaNs for amax over many outputs (every output would be NaN).
    std::vector<std::uint16_t> patterns;
    for (std::uint32_t p = 0; p < 65536; ++p) {
      const bool finite = (p & 0x7c00u) != 0x7c00u, nan = !finite && (p & 0x3ffu) != 0;
      if (c.op == OpKind::Amax ? (!nan || c.rows == 1) : finite) patterns.push_back(static_cast<std::uint16_t>(p));
    }
    std::vector<std::uint16_t> values(static_cast<std::size_t>(c.rows * c.n));
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = patterns[i % patterns.size()];
    std::shuffle(values.begin(), values.end(), rng);
    if (values.size() < patterns.size()) {  // a random sample: not the lowest patterns alone
      std::uniform_int_distribution<std::size_t> pick(0, patterns.size() - 1);
      for (auto& v : values) v = patterns[pick(rng)];
    }
    std::vector<std::uint16_t> strided(2 * values.size(), 0x7e00u);  // NaN between: a wrong read shows
    for (std::size_t i = 0; i < values.size(); ++i) strided[2 * i] = values[i];
    std::vector<std::uint16_t> column_major(values.size());
    for (std::int64_t r = 0; r < c.rows; ++r)
      for (std::int64_t k = 0; k < c.n; ++k)
        column_major[static_cast<std::size_t>(k * c.rows + r)] = values[static_cast<std::size_t>(r * c.n + k)];

    for (VtpuParallelFor parallel_for : {static_cast<VtpuParallelFor>(nullptr), &testing::threaded_for}) {
      std::vector<std::vector<std::uint16_t>> outs;
      for (const char* layout : layouts) {
        const std::string name = layout;
        const std::vector<std::int64_t> strides = strides_of(c, name);
        std::vector<std::uint16_t> out(static_cast<std::size_t>(c.dim == 1 ? c.rows : c.n), 0xffffu);
        VtpuTensorArg args[2] = {};
        args[0].data = out.data();
        args[0].sizes[0] = c.rows;
        args[0].sizes[1] = c.n;
        args[0].strides[0] = c.dim == 1 ? 1 : 0;
        args[0].strides[1] = c.dim == 1 ? 0 : 1;
        args[1].data = name == "contiguous" ? values.data() : name == "strided" ? strided.data() : column_major.data();
        args[1].sizes[0] = c.rows;
        args[1].sizes[1] = c.n;
        args[1].strides[0] = strides[0];
        args[1].strides[1] = strides[1];
        VtpuLaunchArgs launch{kLaunchAbiVersion, 2, 2, args, nullptr, parallel_for, nullptr, nullptr};
        library.get(c.name + "_" + layout)(&launch);
        outs.push_back(std::move(out));
      }
      EXPECT_EQ(outs[0], outs[1]) << c.name << (parallel_for ? " threaded" : " serial");
      EXPECT_EQ(outs[0], outs[2]) << c.name << " column-major" << (parallel_for ? " threaded" : " serial");
      // Not a vacuous comparison: the sums are not all one value.
      if (outs[0].size() > 1) EXPECT_GT(std::count_if(outs[0].begin(), outs[0].end(), [&](std::uint16_t v) { return v != outs[0][0]; }), 0)
          << c.name;
    }
  }
}

}  // namespace
}  // namespace vtpu::compiler
