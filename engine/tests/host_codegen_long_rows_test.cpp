// Long rows of the reduction kernels (host_codegen_reduction.cpp): a row of
// more than kVtpuSegment (32768) elements is reduced in segments, each in 16
// interleaved lanes combined pairwise, the segments' results combined in
// order from the identity. The kernels split one long row's segments over
// threads (a whole-tensor sum has one output); these tests compute the
// documented order here, in float64 (where any other order shows in the
// result's bits), and compare it with the kernel run serially and threaded,
// over the loop shapes that reduce rows: unit-stride rows, a transposed
// input's blocked rows, a whole tensor as one merged row (nested and not
// nested in memory), and more outputs than the segments path takes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_support.h"
#include "test_kernel_cache.h"
#include "vtpu/compiler/host_codegen.h"
#include "vtpu/compiler/kernel_library.h"
#include "vtpu/compiler/launch_abi.h"
#include "vtpu/ir/graph.h"
#include "vtpu/ir/interpreter.h"

namespace vtpu::compiler {
namespace {

using ir::DType;
using ir::OpKind;
using ir::TensorType;

constexpr std::int64_t kSegment = 32768;

using Combine = std::function<double(double, double)>;

// One segment: element i to lane i % 16, the last group padded with the
// identity, lanes combined pairwise.
double segment(const std::vector<double>& row, std::int64_t begin, std::int64_t n, double identity,
               const Combine& combine) {
  double lanes[16];
  std::fill(lanes, lanes + 16, identity);
  for (std::int64_t i = 0; i < n; i += 16)
    for (int l = 0; l < 16; ++l)
      lanes[l] = combine(lanes[l], i + l < n ? row[static_cast<std::size_t>(begin + i + l)] : identity);
  for (int w = 8; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) lanes[l] = combine(lanes[l], lanes[l + w]);
  return lanes[0];
}

// The documented order of a whole row.
double documented(const std::vector<double>& row, double identity, const Combine& combine) {
  const auto n = static_cast<std::int64_t>(row.size());
  if (n <= kSegment) return segment(row, 0, n, identity, combine);
  double acc = identity;
  for (std::int64_t b = 0; b < n; b += kSegment) acc = combine(acc, segment(row, b, std::min(kSegment, n - b), identity, combine));
  return acc;
}

struct LongRowCase {
  std::string name;
  OpKind op;
  TensorType input;   // rank 2, float64
  bool whole;         // all dims reduced (one output); else dim 1
  bool splits;        // the segments path spreads the work (few outputs)
};

// Values spread over 40 binary orders of magnitude, so that summing them in
// any other order rounds differently.
ir::Buffer spread_values(const TensorType& type, std::mt19937& rng, bool with_nan) {
  ir::Buffer buffer = ir::Buffer::zeros(type);
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<double> values(static_cast<std::size_t>(type.storage_extent()));
  for (auto& v : values) v = std::ldexp(mantissa(rng), exponent(rng));
  if (with_nan) values[values.size() / 2 + 3] = std::numeric_limits<double>::quiet_NaN();
  std::memcpy(buffer.bytes.data(), values.data(), values.size() * sizeof(double));
  return buffer;
}

TEST(HostCodegenLongRows, FollowTheDocumentedSegmentOrderOnAnyThreads) {
  auto f64 = [](std::vector<std::int64_t> sizes) { return TensorType::contiguous(DType::kFloat64, std::move(sizes)); };
  const std::vector<LongRowCase> cases = {
      {"one_row", OpKind::Sum, f64({1, 3 * kSegment + 5}), false, true},
      {"one_segment_each", OpKind::Sum, f64({3, kSegment}), false, false},
      {"one_element_past", OpKind::Sum, f64({2, kSegment + 1}), false, true},
      {"mean", OpKind::Mean, f64({2, 2 * kSegment + 100}), false, true},
      {"amax_nan", OpKind::Amax, f64({1, 2 * kSegment + 7}), false, true},
      {"prod", OpKind::Prod, f64({1, kSegment + 40}), false, true},
      // A transposed input: neighbouring outputs' rows reduced side by side.
      {"blocked", OpKind::Sum, TensorType{DType::kFloat64, {3, 70000}, {1, 3}}, false, false},
      // The whole tensor, one merged row (row-major over both dims).
      {"whole", OpKind::Sum, f64({300, 400}), true, true},
      {"whole_not_nested", OpKind::Sum, TensorType{DType::kFloat64, {300, 400}, {1, 300}}, true, true},
      // Enough outputs to split over: the per-output path, segments inside.
      {"many_outputs", OpKind::Sum, f64({64, kSegment + 300}), false, false},
  };
  std::vector<GeneratedKernel> kernels;
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const auto& c = cases[k];
    const std::vector<std::int64_t> dims = c.whole ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{1};
    kernels.push_back(generate_host_kernel(ir::single_op(c.op, {c.input}, {{"dims", dims}, {"keepdim", false}}),
                                           "long_" + c.name));
  }
  const auto library = KernelLibrary::load(testing::compile_once(host_translation_unit(kernels)));
  std::mt19937 rng(29);
  for (const auto& c : cases) {
    const bool amax = c.op == OpKind::Amax, prod = c.op == OpKind::Prod;
    const Combine combine = amax ? Combine([](double a, double b) { return (std::isnan(a) || a > b) ? a : b; })
                            : prod ? Combine([](double a, double b) { return a * b; })
                                   : Combine([](double a, double b) { return a + b; });
    const double identity = amax ? -INFINITY : prod ? 1.0 : 0.0;
    ir::Buffer in = spread_values(c.input, rng, amax);
    if (prod) {  // factors near 1, so the product stays finite
      auto* v = reinterpret_cast<double*>(in.bytes.data());
      for (std::int64_t i = 0; i < c.input.storage_extent(); ++i) v[i] = 1.0 + std::ldexp(v[i], -24);
    }
    const auto* values = reinterpret_cast<const double*>(in.bytes.data());
    const std::int64_t rows = c.whole ? 1 : c.input.sizes[0];
    std::vector<double> expected;
    for (std::int64_t o = 0; o < rows; ++o) {
      std::vector<double> row;
      for (std::int64_t i0 = c.whole ? 0 : o; i0 < (c.whole ? c.input.sizes[0] : o + 1); ++i0)
        for (std::int64_t i1 = 0; i1 < c.input.sizes[1]; ++i1)
          row.push_back(values[i0 * c.input.strides[0] + i1 * c.input.strides[1]]);
      double value = combine(identity, documented(row, identity, combine));
      if (c.op == OpKind::Mean) value /= static_cast<double>(row.size());
      expected.push_back(value);
    }
    for (VtpuParallelFor parallel_for : {static_cast<VtpuParallelFor>(nullptr), &testing::threaded_for}) {
      std::vector<double> out(static_cast<std::size_t>(rows), -1.0);
      VtpuTensorArg args[2] = {};
      args[0].data = out.data();
      args[1] = testing::tensor_arg(in.bytes.data(), c.input);
      for (int d = 0; d < 2; ++d) args[0].sizes[d] = c.input.sizes[static_cast<std::size_t>(d)];
      args[0].strides[0] = c.whole ? 0 : 1;
      args[0].strides[1] = 0;
      const int splits_before = testing::split_launches().load();
      VtpuLaunchArgs launch{kLaunchAbiVersion, 2, 2, args, nullptr, parallel_for, nullptr, nullptr};
      library.get("long_" + c.name)(&launch);
      const char* how = parallel_for ? " threaded" : " serial";
      for (std::int64_t o = 0; o < rows; ++o) {
        const double want = expected[static_cast<std::size_t>(o)], got = out[static_cast<std::size_t>(o)];
        EXPECT_TRUE(std::memcmp(&want, &got, sizeof(double)) == 0 || (std::isnan(want) && std::isnan(got)))
            << c.name << how << " output " << o << ": " << got << " against " << want;
      }
      if (amax) EXPECT_TRUE(std::isnan(out[0])) << c.name;
      // One output's segments went out to several threads.
      if (parallel_for != nullptr && c.splits) EXPECT_GT(testing::split_launches().load(), splits_before) << c.name;
    }
  }
}

}  // namespace
}  // namespace vtpu::compiler
