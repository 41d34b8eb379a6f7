// A float max or min along rows runs its whole lane groups in vectors
// (vtpu_extremum_groups) and starts over in vtpu_max's own steps when a group
// held a NaN. Both paths must give the documented order's bits: element i of
// a segment goes to lane i % 16, each lane steps vtpu_max(lane, x) (a NaN
// already held stays, a new NaN is taken, else a > b ? a : b, so which zero of
// +0/-0 wins depends on the order), the lanes are combined pairwise
// (8, 4, 2, 1 apart), segments of 32768 in order from the identity. The test
// computes that order here and compares bits: rows of every length up to
// three groups and beyond, rows of signed zeros alone, infinities, NaNs of
// distinct payloads and signs in the groups and in the remainder, float32,
// float64, bfloat16 and float16 (whose contiguous rows load through F16C),
// contiguous and stride-2 rows, a long row on threads, and a fused kernel
// (-x).amax whose row is the fused fast row, also storing -x over x.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
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

// vtpu_max / vtpu_min of the kernels, in double (every input value of every
// dtype tested is exact in double, and the step only picks one of its operands).
double step(double a, double b, bool max) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  return (max ? a > b : a < b) ? a : b;
}

// The documented order of one row.
double reference(const std::vector<double>& row, bool max) {
  const double init = max ? -INFINITY : INFINITY;
  constexpr std::int64_t kSegment = 32768;
  const auto n = static_cast<std::int64_t>(row.size());
  double acc = init;
  for (std::int64_t b = 0;; b += kSegment) {
    const std::int64_t len = std::min(kSegment, n - b);
    double lanes[16];
    for (double& l : lanes) l = init;
    for (std::int64_t i = 0; i < len; ++i) lanes[i % 16] = step(lanes[i % 16], row[static_cast<std::size_t>(b + i)], max);
    for (int w = 8; w > 0; w /= 2)
      for (int l = 0; l < w; ++l) lanes[l] = step(lanes[l], lanes[l + w], max);
    if (n <= kSegment) return lanes[0];
    acc = step(acc, lanes[0], max);
    if (b + kSegment >= n) return acc;
  }
}

// A value's bits in `dtype` (16-bit: the upper half of the float's bits for
// bfloat16; float16 by its fields). Every value is exact in the dtype.
std::uint64_t bits_of(double v, DType dtype) {
  if (dtype == DType::kFloat64) {
    std::uint64_t u;
    std::memcpy(&u, &v, 8);
    return u;
  }
  const float f = static_cast<float>(v);
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if (dtype == DType::kFloat32) return u;
  if (dtype == DType::kBFloat16) return u >> 16;
  // float16: sign, exponent rebiased, 10 mantissa bits (values chosen normal,
  // zero, infinite or NaN).
  const std::uint32_t sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xffu, mant = u & 0x7fffffu;
  if (exp == 0xffu) return sign | 0x7c00u | (mant >> 13);
  if (exp == 0) return sign;
  return sign | ((exp - 127 + 15) << 10) | (mant >> 13);
}

double value_of(std::uint64_t bits, DType dtype) {
  if (dtype == DType::kFloat64) {
    double d;
    std::memcpy(&d, &bits, 8);
    return d;
  }
  std::uint32_t u = static_cast<std::uint32_t>(bits);
  if (dtype == DType::kBFloat16) u <<= 16;
  if (dtype == DType::kFloat16) {
    const std::uint32_t sign = (u & 0x8000u) << 16, exp = (u >> 10) & 0x1fu, mant = u & 0x3ffu;
    u = exp == 0x1fu ? sign | 0x7f800000u | (mant << 13) : exp == 0 ? sign : sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A quiet NaN of `dtype` with payload `k` (1..7) and a sign, as a double
// whose conversions keep it (the payload in the dtype's top mantissa bits).
double nan_with(int k, bool negative, DType dtype) {
  std::uint64_t bits = 0;
  switch (dtype) {
    case DType::kFloat64: bits = 0x7ff8000000000000ull | (static_cast<std::uint64_t>(k) << 48); break;
    case DType::kFloat32: bits = 0x7fc00000u | (static_cast<std::uint32_t>(k) << 19); break;
    case DType::kBFloat16: bits = 0x7fc0u | static_cast<std::uint32_t>(k) << 3; break;
    default: bits = 0x7e00u | static_cast<std::uint32_t>(k) << 6; break;
  }
  if (negative) bits |= dtype == DType::kFloat64 ? 0x8000000000000000ull : dtype == DType::kFloat32 ? 0x80000000u : 0x8000u;
  return value_of(bits, dtype);
}

std::size_t itemsize_of(DType dtype) {
  return dtype == DType::kFloat64 ? 8 : dtype == DType::kFloat32 ? 4 : 2;
}

// The row's values: mostly a palette where order matters (signed zeros,
// infinities, small integers that repeat), with 0, 1 or 2 NaNs in some rows.
std::vector<double> make_row(std::int64_t n, int kind, DType dtype, std::mt19937& rng) {
  std::uniform_int_distribution<int> pick(0, 9);
  std::vector<double> row(static_cast<std::size_t>(n));
  for (auto& v : row) {
    const int p = pick(rng);
    if (kind == 0) v = p < 5 ? 0.0 : -0.0;  // zeros alone: only the order decides the sign
    else v = p == 0 ? INFINITY : p == 1 ? -INFINITY : p < 4 ? (p == 2 ? 0.0 : -0.0) : static_cast<double>(p - 6);
  }
  if (n > 0 && kind >= 2) {
    std::uniform_int_distribution<std::int64_t> at(0, n - 1);
    for (int k = 0; k < kind - 1; ++k) row[static_cast<std::size_t>(at(rng))] = nan_with(k + 1 + kind, k % 2 == 1, dtype);
  }
  if (n > 0 && kind == 4) row.back() = nan_with(7, true, dtype);  // a NaN in the remainder
  return row;
}

struct Launch {
  std::vector<std::uint8_t> in, out;
};

TEST(HostCodegenExtremumRows, FollowVtpuMaxsStepsInTheLaneOrder) {
  const DType dtypes[] = {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16};
  const std::vector<std::int64_t> lengths = {1, 7, 15, 16, 17, 31, 32, 33, 47, 48, 49, 100, 1000, 70000};
  constexpr std::int64_t kRowsPerKind = 6;
  constexpr int kKinds = 5;  // zeros alone; palette; palette with 1, 2 NaNs; and one more in the remainder
  std::vector<GeneratedKernel> kernels;
  // Kernels are generic in the sizes (read at launch): one per dtype, op and
  // layout, launched at every length.
  auto name_of = [](DType dtype, bool max, int stride) {
    return std::string(max ? "amax_" : "amin_") + std::string(ir::name(dtype)) + "_s" + std::to_string(stride);
  };
  for (DType dtype : dtypes)
    for (bool max : {true, false})
      for (int stride : {1, 2}) {
        const TensorType in{dtype, {30, 100}, {stride * 100, stride}};
        kernels.push_back(generate_host_kernel(
            ir::single_op(max ? OpKind::Amax : OpKind::Amin, {in}, {{"dims", std::vector<std::int64_t>{1}}, {"keepdim", false}}),
            name_of(dtype, max, stride)));
      }
  // The fused row: (-x).amax over rows of float32, one stored output.
  {
    ir::Graph g;
    const auto x = g.add_input(TensorType::contiguous(DType::kFloat32, {30, 100}));
    const auto neg = g.add_node(OpKind::Neg, {x}, {});
    g.mark_output(g.add_node(OpKind::Amax, {neg}, {{"dims", std::vector<std::int64_t>{1}}, {"keepdim", false}}));
    kernels.push_back(generate_host_kernel(g, "fused_neg_amax"));
  }
  // The same storing -x too: a kernel with a stored result must not evaluate
  // a row twice (launched in place below, a second evaluation would read -x).
  {
    ir::Graph g;
    const auto x = g.add_input(TensorType::contiguous(DType::kFloat32, {30, 100}));
    const auto neg = g.add_node(OpKind::Neg, {x}, {});
    g.mark_output(g.add_node(OpKind::Amax, {neg}, {{"dims", std::vector<std::int64_t>{1}}, {"keepdim", false}}));
    g.mark_output(neg);
    kernels.push_back(generate_host_kernel(g, "fused_neg_amax_storing_neg"));
  }
  const auto library = KernelLibrary::load(testing::compile_once(host_translation_unit(kernels)));

  std::mt19937 rng(11);
  int checked_rows = 0, nan_results = 0, negative_zero_results = 0;
  for (DType dtype : dtypes)
    for (bool max : {true, false})
      for (std::int64_t n : lengths) {
        const std::int64_t rows = n > 1000 ? kKinds : kRowsPerKind * kKinds;
        std::vector<std::vector<double>> values;
        for (std::int64_t r = 0; r < rows; ++r) values.push_back(make_row(n, static_cast<int>(r % kKinds), dtype, rng));
        for (int stride : {1, 2})
          for (VtpuParallelFor parallel_for : {static_cast<VtpuParallelFor>(nullptr), &testing::threaded_for}) {
            const std::size_t size = itemsize_of(dtype);
            // Between the elements of a stride-2 row: NaNs, which a wrong read shows.
            std::vector<std::uint8_t> in(static_cast<std::size_t>(rows * n * stride) * size, 0xff);
            for (std::int64_t r = 0; r < rows; ++r)
              for (std::int64_t i = 0; i < n; ++i) {
                const std::uint64_t b = bits_of(values[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)], dtype);
                std::memcpy(in.data() + static_cast<std::size_t>((r * n + i) * stride) * size, &b, size);
              }
            std::vector<std::uint8_t> out(static_cast<std::size_t>(rows) * size, 0);
            VtpuTensorArg args[2] = {};
            args[0].data = out.data();
            args[0].sizes[0] = rows;
            args[0].sizes[1] = n;
            args[0].strides[0] = 1;
            args[1].data = in.data();
            args[1].sizes[0] = rows;
            args[1].sizes[1] = n;
            args[1].strides[0] = stride * n;
            args[1].strides[1] = stride;
            VtpuLaunchArgs launch{kLaunchAbiVersion, 2, 2, args, nullptr, parallel_for, nullptr, nullptr};
            library.get(name_of(dtype, max, stride))(&launch);
            for (std::int64_t r = 0; r < rows; ++r) {
              const double expected = reference(values[static_cast<std::size_t>(r)], max);
              std::uint64_t got = 0;
              std::memcpy(&got, out.data() + static_cast<std::size_t>(r) * size, size);
              ASSERT_EQ(got, bits_of(expected, dtype))
                  << name_of(dtype, max, stride) << " n " << n << " row " << r << (parallel_for ? " threaded" : " serial");
              ++checked_rows;
              nan_results += std::isnan(expected);
              negative_zero_results += expected == 0.0 && std::signbit(expected);
            }
          }
      }
  // Not vacuous: NaN rows and -0 results (order-dependent) were among them.
  EXPECT_GT(nan_results, 100);
  EXPECT_GT(negative_zero_results, 100);
  EXPECT_GT(checked_rows, 10000);

  // The fused kernel reads x and reduces -x: the documented order of -x.
  for (std::int64_t n : lengths) {
    const std::int64_t rows = n > 1000 ? kKinds : kRowsPerKind * kKinds;
    std::vector<float> in(static_cast<std::size_t>(rows * n));
    std::vector<std::vector<double>> negated;
    for (std::int64_t r = 0; r < rows; ++r) {
      auto row = make_row(n, static_cast<int>(r % kKinds), DType::kFloat32, rng);
      std::vector<double> neg(row.size());
      for (std::size_t i = 0; i < row.size(); ++i) {
        in[static_cast<std::size_t>(r * n) + i] = static_cast<float>(row[i]);
        neg[i] = -row[i];  // a NaN's sign flips too, as the kernel's sign-bit flip
      }
      negated.push_back(std::move(neg));
    }
    for (VtpuParallelFor parallel_for : {static_cast<VtpuParallelFor>(nullptr), &testing::threaded_for}) {
      std::vector<float> out(static_cast<std::size_t>(rows), 0.0f);
      std::vector<VtpuTensorArg> args(2);
      args[0] = {};
      args[0].data = out.data();
      args[0].sizes[0] = rows;
      args[0].sizes[1] = n;
      args[0].strides[0] = 1;
      args[1] = testing::tensor_arg(in.data(), TensorType::contiguous(DType::kFloat32, {rows, n}));
      VtpuLaunchArgs launch{kLaunchAbiVersion, 2, 2, args.data(), nullptr, parallel_for, nullptr, nullptr};
      library.get("fused_neg_amax")(&launch);
      for (std::int64_t r = 0; r < rows; ++r)
        ASSERT_EQ(bits_of(out[static_cast<std::size_t>(r)], DType::kFloat32),
                  bits_of(reference(negated[static_cast<std::size_t>(r)], true), DType::kFloat32))
            << "fused (-x).amax n " << n << " row " << r;
      // In place: -x stored over x.
      std::vector<float> x_then_neg = in;
      args.resize(3);
      args[2] = testing::tensor_arg(x_then_neg.data(), TensorType::contiguous(DType::kFloat32, {rows, n}));
      args[1] = args[2];
      VtpuLaunchArgs in_place{kLaunchAbiVersion, 2, 3, args.data(), nullptr, parallel_for, nullptr, nullptr};
      library.get("fused_neg_amax_storing_neg")(&in_place);
      for (std::int64_t r = 0; r < rows; ++r) {
        ASSERT_EQ(bits_of(out[static_cast<std::size_t>(r)], DType::kFloat32),
                  bits_of(reference(negated[static_cast<std::size_t>(r)], true), DType::kFloat32))
            << "fused (-x).amax storing -x in place, n " << n << " row " << r;
        for (std::int64_t i = 0; i < n; ++i)
          ASSERT_EQ(bits_of(x_then_neg[static_cast<std::size_t>(r * n + i)], DType::kFloat32),
                    bits_of(negated[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)], DType::kFloat32))
              << "-x stored in place, n " << n << " row " << r << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace vtpu::compiler
