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

// The combine and identity of a reduction, in double.
struct Reducer {
  Combine combine;
  double identity;
};
Reducer reducer_of(OpKind op) {
  if (op == OpKind::Amax) return {[](double a, double b) { return (std::isnan(a) || a > b) ? a : b; }, -INFINITY};
  if (op == OpKind::Prod) return {[](double a, double b) { return a * b; }, 1.0};
  return {[](double a, double b) { return a + b; }, 0.0};
}

// spread_values, with a NaN for amax and factors near 1 for prod (so the
// product stays finite).
ir::Buffer values_for(OpKind op, const TensorType& type, std::mt19937& rng) {
  ir::Buffer in = spread_values(type, rng, op == OpKind::Amax);
  if (op == OpKind::Prod) {
    auto* v = reinterpret_cast<double*>(in.bytes.data());
    for (std::int64_t i = 0; i < type.storage_extent(); ++i) v[i] = 1.0 + std::ldexp(v[i], -24);
  }
  return in;
}

void expect_same_bits(const std::vector<double>& want, const std::vector<double>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (std::size_t o = 0; o < want.size(); ++o)
    EXPECT_TRUE(std::memcmp(&want[o], &got[o], sizeof(double)) == 0 || (std::isnan(want[o]) && std::isnan(got[o])))
        << what << " output " << o << ": " << got[o] << " against " << want[o];
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
    const auto [combine, identity] = reducer_of(c.op);
    ir::Buffer in = values_for(c.op, c.input, rng);
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
      expect_same_bits(expected, out, c.name + (parallel_for ? " threaded" : " serial"));
      if (c.op == OpKind::Amax) EXPECT_TRUE(std::isnan(out[0])) << c.name;
      // One output's segments went out to several threads.
      if (parallel_for != nullptr && c.splits) EXPECT_GT(testing::split_launches().load(), splits_before) << c.name;
    }
  }
}

// Narrow columns (host_codegen_narrow_columns.h): a kept innermost dim of
// fewer than 16 elements reduces each output's elements, in row-major order
// of the reduced dims, in the documented order above; 16 or more keep the
// sequential order per output.
struct ColumnCase {
  std::string name;
  OpKind op;
  TensorType input;  // float64
  std::vector<std::int64_t> dims;
  bool narrow;
  bool splits;  // few groups of outputs and columns of several segments
};

TEST(HostCodegenLongRows, NarrowColumnsFollowTheDocumentedOrder) {
  auto f64 = [](std::vector<std::int64_t> sizes) { return TensorType::contiguous(DType::kFloat64, std::move(sizes)); };
  const std::int64_t tall = 3 * kSegment + 5;
  const std::vector<ColumnCase> cases = {
      {"tall", OpKind::Sum, f64({tall, 4}), {0}, true, true},
      {"tall_one_column", OpKind::Sum, f64({tall, 1}), {0}, true, true},
      {"short", OpKind::Sum, f64({37, 5}), {0}, true, false},
      {"mean_15", OpKind::Mean, f64({1000, 15}), {0}, true, false},
      {"amax_nan", OpKind::Amax, f64({2 * kSegment + 3, 3}), {0}, true, true},
      {"prod", OpKind::Prod, f64({kSegment + 9, 2}), {0}, true, true},
      // Column-major storage: the reduced elements of an output are not one
      // run of a stride, and each row is strided.
      {"transposed", OpKind::Sum, TensorType{DType::kFloat64, {40000, 3}, {1, 40000}}, {0}, true, true},
      // Two reduced dims, nested in memory and not (dims 0 and 1 swapped).
      {"two_dims", OpKind::Sum, f64({300, 200, 4}), {0, 1}, true, true},
      {"two_dims_not_nested", OpKind::Sum, TensorType{DType::kFloat64, {300, 200, 4}, {4, 1200, 1}}, {0, 1}, true, true},
      // A kept leading dim: several groups of outputs.
      {"groups", OpKind::Sum, f64({5, 9000, 6}), {1}, true, false},
      // Sixteen columns are not narrow: each output in sequential order.
      {"wide", OpKind::Sum, f64({3000, 16}), {0}, false, false},
  };
  std::vector<GeneratedKernel> kernels;
  for (const auto& c : cases)
    kernels.push_back(generate_host_kernel(ir::single_op(c.op, {c.input}, {{"dims", c.dims}, {"keepdim", true}}),
                                           "cols_" + c.name));
  const auto library = KernelLibrary::load(testing::compile_once(host_translation_unit(kernels)));
  std::mt19937 rng(31);
  for (const auto& c : cases) {
    const auto [combine, identity] = reducer_of(c.op);
    ir::Buffer in = values_for(c.op, c.input, rng);
    const auto* values = reinterpret_cast<const double*>(in.bytes.data());
    const auto rank = static_cast<std::size_t>(c.input.rank());
    std::vector<bool> reduced(rank, false);
    for (auto d : c.dims) reduced[static_cast<std::size_t>(d)] = true;
    // Outputs in row-major order of the kept dims; each output's elements in
    // row-major order of the reduced dims.
    std::vector<std::int64_t> kept_sizes, reduced_sizes;
    for (std::size_t d = 0; d < rank; ++d) (reduced[d] ? reduced_sizes : kept_sizes).push_back(c.input.sizes[d]);
    auto product = [](const std::vector<std::int64_t>& v) {
      std::int64_t p = 1;
      for (auto x : v) p *= x;
      return p;
    };
    const std::int64_t outputs = product(kept_sizes), count = product(reduced_sizes);
    auto coords = [](std::int64_t index, const std::vector<std::int64_t>& sizes) {
      std::vector<std::int64_t> out(sizes.size());
      for (std::size_t k = sizes.size(); k-- > 0;) {
        out[k] = index % sizes[k];
        index /= sizes[k];
      }
      return out;
    };
    std::vector<double> expected;
    for (std::int64_t o = 0; o < outputs; ++o) {
      const auto kc = coords(o, kept_sizes);
      std::vector<double> elements;
      for (std::int64_t e = 0; e < count; ++e) {
        const auto rc = coords(e, reduced_sizes);
        std::int64_t offset = 0;
        for (std::size_t d = 0, ki = 0, ri = 0; d < rank; ++d)
          offset += (reduced[d] ? rc[ri++] : kc[ki++]) * c.input.strides[d];
        elements.push_back(values[offset]);
      }
      double value = identity;
      if (c.narrow) {
        value = documented(elements, identity, combine);
      } else {
        for (double v : elements) value = combine(value, v);
      }
      if (c.op == OpKind::Mean) value /= static_cast<double>(count);
      expected.push_back(value);
    }
    const TensorType out_type = TensorType::contiguous(DType::kFloat64, [&] {
      std::vector<std::int64_t> sizes = c.input.sizes;
      for (std::size_t d = 0; d < rank; ++d)
        if (reduced[d]) sizes[d] = 1;
      return sizes;
    }());
    for (VtpuParallelFor parallel_for : {static_cast<VtpuParallelFor>(nullptr), &testing::threaded_for}) {
      std::vector<double> out(static_cast<std::size_t>(outputs), -1.0);
      VtpuTensorArg args[2] = {};
      args[0].data = out.data();
      args[1] = testing::tensor_arg(in.bytes.data(), c.input);
      for (std::size_t d = 0; d < rank; ++d) {
        args[0].sizes[d] = c.input.sizes[d];
        args[0].strides[d] = reduced[d] ? 0 : out_type.strides[d];
      }
      const int splits_before = testing::split_launches().load();
      VtpuLaunchArgs launch{kLaunchAbiVersion, static_cast<std::int32_t>(rank), 2, args, nullptr, parallel_for, nullptr, nullptr};
      library.get("cols_" + c.name)(&launch);
      expect_same_bits(expected, out, c.name + (parallel_for ? " threaded" : " serial"));
      if (parallel_for != nullptr && c.splits) EXPECT_GT(testing::split_launches().load(), splits_before) << c.name;
    }
  }
}

}  // namespace
}  // namespace vtpu::compiler
