// A float16 kernel whose every output moves an input's stored bits (a
// .contiguous() of a permuted tensor, its negation) takes no lane groups:
// they converted values nothing read and kept the copy scalar (an attention
// head split ran 6x the CPU's time). The bits must be the input's, signalling
// NaNs included, in the permuted order; a kernel that computes in float16
// keeps its lane groups.
#include <gtest/gtest.h>

#include <cstdint>
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

TEST(HostCodegenHalfCopies, PermutedCopiesMoveTheBitsWithoutLaneGroups) {
  // x: a [2, 4, 3, 64] float16 tensor viewed as transpose(1, 2): [2, 3, 4, 64].
  const TensorType permuted{DType::kFloat16, {2, 3, 4, 64}, {768, 64, 192, 1}};
  const auto copy = ir::single_op(OpKind::Cast, {permuted}, {{"dtype", DType::kFloat16}});
  const auto negated = ir::single_op(OpKind::Neg, {permuted});
  const auto sum = ir::single_op(OpKind::Add, {permuted, permuted});
  const GeneratedKernel kernels[] = {generate_host_kernel(copy, "copy"), generate_host_kernel(negated, "neg"),
                                     generate_host_kernel(sum, "sum")};
  EXPECT_EQ(kernels[0].source.find("vtpu_half_lanes_load"), std::string::npos);
  EXPECT_EQ(kernels[1].source.find("vtpu_half_lanes_load"), std::string::npos);
  EXPECT_NE(kernels[2].source.find("vtpu_half_lanes_load"), std::string::npos);  // computes: lanes
  const auto library = KernelLibrary::load(testing::compile_once(host_translation_unit(
      std::vector<GeneratedKernel>(std::begin(kernels), std::end(kernels)))));

  std::vector<std::uint16_t> x(2 * 4 * 3 * 64);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<std::uint16_t>(i * 40503u + 0x7c01u);
  x[5] = 0x7c01;  // signalling NaNs: copies and negations keep them
  x[200] = 0xfd55;
  for (const char* name : {"copy", "neg"}) {
    std::vector<std::uint16_t> out(x.size(), 0);
    VtpuTensorArg args[2] = {};
    args[0].data = out.data();
    args[1].data = x.data();
    const std::int64_t contiguous[4] = {768, 256, 64, 1};
    for (int d = 0; d < 4; ++d) {
      args[0].sizes[d] = args[1].sizes[d] = permuted.sizes[static_cast<std::size_t>(d)];
      args[0].strides[d] = contiguous[d];
      args[1].strides[d] = permuted.strides[static_cast<std::size_t>(d)];
    }
    VtpuLaunchArgs l{kLaunchAbiVersion, 4, 2, args, nullptr, nullptr, nullptr, nullptr};
    library.get(name)(&l);
    const std::uint16_t flip = std::string(name) == "neg" ? 0x8000u : 0u;
    for (std::int64_t a = 0; a < 2; ++a)
      for (std::int64_t b = 0; b < 3; ++b)
        for (std::int64_t c = 0; c < 4; ++c)
          for (std::int64_t d = 0; d < 64; ++d) {
            const std::uint16_t want = static_cast<std::uint16_t>(x[static_cast<std::size_t>(a * 768 + b * 64 + c * 192 + d)] ^ flip);
            ASSERT_EQ(out[static_cast<std::size_t>(a * 768 + b * 256 + c * 64 + d)], want) << name << " at " << a << b << c << d;
          }
  }
}

}  // namespace
}  // namespace vtpu::compiler
