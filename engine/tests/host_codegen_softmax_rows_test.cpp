// A 16-bit softmax row of unit stride is converted once into float scratch
// (float16 16 at a time through F16C/AVX-512, vtpu_half_lanes_load), reduced
// and exponentiated there and written once from it (float16 through
// vtpu_half_lanes_store); a row of another stride converts each element in
// every pass. The kernel picks the row at launch from the strides, so the
// same kernel launched on a row-major and on a column-major copy of the same
// values runs both: they must give the same bits, in rows of whole lane
// groups and with remainders, with masked (-inf) entries, a fully masked row,
// +inf, NaN and large logits, serially and on threads. The same for the
// float16 softmax backward, whose unit rows read grad and output once.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
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

// The 16-bit pattern of a float (truncated: any pattern will do as an input).
std::uint16_t pattern_of(float f, DType dtype) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if (dtype == DType::kBFloat16) return static_cast<std::uint16_t>(u >> 16);
  const std::uint32_t sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xffu, mant = u & 0x7fffffu;
  if (exp == 0xffu) return static_cast<std::uint16_t>(sign | 0x7c00u | (mant >> 13));
  if (exp < 103) return static_cast<std::uint16_t>(sign);  // below float16's range: a zero
  if (exp > 142) return static_cast<std::uint16_t>(sign | 0x7bffu);  // beyond it: the largest
  if (exp < 113) return static_cast<std::uint16_t>(sign | ((0x400u | (mant >> 13)) >> (113 - exp)));  // subnormal
  return static_cast<std::uint16_t>(sign | ((exp - 112) << 10) | (mant >> 13));
}

// v, a rows x cols matrix in row-major order, in column-major order.
std::vector<std::uint16_t> transposed(const std::vector<std::uint16_t>& v, std::int64_t rows, std::int64_t cols) {
  std::vector<std::uint16_t> t(v.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      t[static_cast<std::size_t>(c * rows + r)] = v[static_cast<std::size_t>(r * cols + c)];
  return t;
}

TEST(HostCodegenSoftmaxRows, UnitRowsReadOnceGiveTheGeneralRowsBits) {
  const DType dtypes[] = {DType::kFloat16, DType::kBFloat16};
  std::vector<GeneratedKernel> kernels;
  for (DType dtype : dtypes)
    kernels.push_back(generate_host_kernel(
        ir::single_op(OpKind::Softmax, {TensorType::contiguous(dtype, {8, 40})}, {{"dim", std::int64_t{1}}}),
        std::string("softmax_") + std::string(ir::name(dtype))));
  const auto library = KernelLibrary::load(testing::compile_once(host_translation_unit(kernels)));
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 6.0f);
  for (DType dtype : dtypes)
    for (std::int64_t n : {16, 77, 2048 + 7}) {
      constexpr std::int64_t kRows = 24;
      std::vector<std::uint16_t> values(static_cast<std::size_t>(kRows * n));
      for (auto& v : values) v = pattern_of(normal(rng), dtype);
      auto at = [&](std::int64_t r, std::int64_t i) -> std::uint16_t& { return values[static_cast<std::size_t>(r * n + i)]; };
      const float inf = INFINITY;
      for (std::int64_t i = 0; i < n; i += 3) at(1, i) = pattern_of(-inf, dtype);  // masked entries
      for (std::int64_t i = 0; i < n; ++i) at(2, i) = pattern_of(-inf, dtype);      // a fully masked row
      at(3, 5) = pattern_of(inf, dtype);
      at(4, n - 1) = dtype == DType::kFloat16 ? 0x7e01 : 0x7fc1;  // NaN in the remainder
      for (std::int64_t i = 0; i < n; ++i) at(5, i) = pattern_of(normal(rng) * 1000.0f, dtype);
      std::vector<std::uint16_t> column_major = transposed(values, kRows, n);
      for (VtpuParallelFor parallel_for : {static_cast<VtpuParallelFor>(nullptr), &testing::threaded_for}) {
        auto launch = [&](bool unit) {
          std::vector<std::uint16_t> out(values.size(), 0xffffu);
          VtpuTensorArg args[2] = {};
          for (int t = 0; t < 2; ++t) {
            args[t].data = t == 0 ? static_cast<void*>(out.data()) : unit ? values.data() : column_major.data();
            args[t].sizes[0] = kRows;
            args[t].sizes[1] = n;
            args[t].strides[0] = unit ? n : 1;
            args[t].strides[1] = unit ? 1 : kRows;
          }
          VtpuLaunchArgs l{kLaunchAbiVersion, 2, 2, args, nullptr, parallel_for, nullptr, nullptr};
          library.get(std::string("softmax_") + std::string(ir::name(dtype)))(&l);
          return unit ? out : transposed(out, n, kRows);
        };
        const auto unit = launch(true), general = launch(false);
        EXPECT_EQ(unit, general) << ir::name(dtype) << " n " << n << (parallel_for ? " threaded" : " serial");
        // Not vacuous: many distinct results.
        EXPECT_GT(std::set<std::uint16_t>(unit.begin(), unit.end()).size(), 100u) << ir::name(dtype) << " n " << n;
      }
    }
}

TEST(HostCodegenSoftmaxRows, Float16BackwardRowsReadOnceGiveTheGeneralRowsBits) {
  // softmax_backward(grad, output) = output * (grad - sum(grad * output)):
  // a float16 unit-stride row converts grad and output once (F16C) into two
  // scratch rows; rows of other strides convert in both passes.
  const TensorType half{DType::kFloat16, {8, 40}, {40, 1}};
  const auto library = KernelLibrary::load(testing::compile_once(host_translation_unit(
      {generate_host_kernel(ir::single_op(OpKind::SoftmaxBackward, {half, half}, {{"dim", std::int64_t{1}}}),
                            "softmax_backward_float16")})));
  std::mt19937 rng(10);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> probability(0.0f, 0.2f);
  for (std::int64_t n : {16, 77, 2048 + 7}) {
    constexpr std::int64_t kRows = 12;
    std::vector<std::uint16_t> grad(static_cast<std::size_t>(kRows * n)), output(grad.size());
    for (std::size_t i = 0; i < grad.size(); ++i) {
      grad[i] = pattern_of(normal(rng) * 4.0f, DType::kFloat16);
      output[i] = pattern_of(probability(rng), DType::kFloat16);
    }
    grad[3] = 0x7c00;   // +inf
    grad[static_cast<std::size_t>(2 * n + 5)] = 0x7e01;  // NaN in row 2
    std::vector<std::uint16_t> grad_cm = transposed(grad, kRows, n), output_cm = transposed(output, kRows, n);
    for (VtpuParallelFor parallel_for : {static_cast<VtpuParallelFor>(nullptr), &testing::threaded_for}) {
      auto launch = [&](bool unit) {
        std::vector<std::uint16_t> out(grad.size(), 0xffffu);
        VtpuTensorArg args[3] = {};
        void* data[3] = {out.data(), unit ? grad.data() : grad_cm.data(), unit ? output.data() : output_cm.data()};
        for (int t = 0; t < 3; ++t) {
          args[t].data = data[t];
          args[t].sizes[0] = kRows;
          args[t].sizes[1] = n;
          args[t].strides[0] = unit ? n : 1;
          args[t].strides[1] = unit ? 1 : kRows;
        }
        VtpuLaunchArgs l{kLaunchAbiVersion, 2, 3, args, nullptr, parallel_for, nullptr, nullptr};
        library.get("softmax_backward_float16")(&l);
        return unit ? out : transposed(out, n, kRows);
      };
      const auto unit = launch(true), general = launch(false);
      EXPECT_EQ(unit, general) << "n " << n << (parallel_for ? " threaded" : " serial");
      EXPECT_GT(std::set<std::uint16_t>(unit.begin(), unit.end()).size(), 100u) << "n " << n;
    }
  }
}

}  // namespace
}  // namespace vtpu::compiler
