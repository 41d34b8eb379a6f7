// Generated max_pool2d kernels (host_codegen_pooling.cpp) against the
// reference interpreter: random shapes over kernel sizes, strides, padding,
// dilation and ceil_mode, 3- and 4-dim inputs, float32/float64/bfloat16,
// strided operands, ties and NaN/-inf data; bitwise the same serial and
// threaded; the interpreter against hand-computed ATen results; out-of-range
// indices in the backward reported without writing outside dx.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernel_test_support.h"
#include "test_kernel_cache.h"
#include "vtpu/compiler/host_codegen.h"
#include "vtpu/compiler/kernel_library.h"
#include "vtpu/compiler/launch_abi.h"
#include "vtpu/compiler/system_compiler.h"
#include "vtpu/ir/interpreter.h"
#include "vtpu/runtime/error.h"

namespace vtpu::compiler {
namespace {

using testing::kGuard;
using testing::kGuardByte;
using testing::Output;
using testing::launch_outputs;
using testing::split_launches;
using testing::tensor_arg;
using testing::threaded_for;

using ir::Attributes;
using ir::DType;
using ir::OpKind;
using ir::TensorType;

TensorType dense(DType dtype, std::vector<std::int64_t> sizes) { return TensorType::contiguous(dtype, std::move(sizes)); }

// Values drawn from a few integers (ties are common), with a sprinkling of
// NaN and -inf when `specials`, over the whole strided extent.
ir::Buffer random_data(const TensorType& type, std::mt19937& rng, bool specials) {
  const std::int64_t extent = type.storage_extent();
  std::vector<double> values(static_cast<std::size_t>(extent));
  std::uniform_int_distribution<int> small(-4, 4), pick(0, 40);
  for (auto& v : values) {
    v = small(rng) * 0.5;
    const int p = pick(rng);
    if (specials && p == 0) v = std::numeric_limits<double>::quiet_NaN();
    if (specials && p == 1) v = -std::numeric_limits<double>::infinity();
  }
  ir::Buffer buffer = ir::Buffer::zeros(type);
  const ir::Buffer flat = ir::make_buffer(type.dtype, {extent}, values);
  std::memcpy(buffer.bytes.data(), flat.bytes.data(), flat.bytes.size());
  return buffer;
}

Attributes pool_attrs(std::vector<std::int64_t> k, std::vector<std::int64_t> s, std::vector<std::int64_t> p,
                      std::vector<std::int64_t> d, bool ceil_mode) {
  return {{"kernel_size", k}, {"stride", s}, {"padding", p}, {"dilation", d}, {"ceil_mode", ceil_mode}};
}

// The type of x with its dims stored in reverse order (a non-contiguous layout).
TensorType reversed_layout(DType dtype, const std::vector<std::int64_t>& sizes) {
  TensorType t = dense(dtype, sizes);
  std::int64_t stride = 1;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    t.strides[d] = stride;
    stride *= sizes[d];
  }
  return t;
}

struct Case {
  std::string symbol;
  ir::Graph graph;
  std::vector<ir::Buffer> inputs;
};


class HostCodegenPooling : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    std::vector<GeneratedKernel> kernels;
    for (const auto& c : cases()) kernels.push_back(generate_host_kernel(c.graph, c.symbol));
    library() = std::make_unique<KernelLibrary>(KernelLibrary::load(testing::compile_once(host_translation_unit(kernels))));
  }
  static void TearDownTestSuite() { library().reset(); }
  static std::unique_ptr<KernelLibrary>& library() {
    static std::unique_ptr<KernelLibrary> lib;
    return lib;
  }
  static std::vector<Case>& cases();

  static std::vector<Output> launch(const Case& c, VtpuParallelFor parallel_for, VtpuKernelStatus* status,
                                    std::uint8_t fill = 0, std::vector<ir::Buffer> inputs = {}) {
    if (inputs.empty()) inputs = c.inputs;
    return launch_outputs(*library(), c.symbol, c.graph, std::move(inputs), parallel_for, status, fill);
  }
};

std::vector<Case>& HostCodegenPooling::cases() {
  static std::vector<Case> all = [] {
    std::vector<Case> cs;
    std::mt19937 rng(11);
    // Each configuration gives a forward case (values and indices) and the
    // backward of the indices it computes, on a random grad.
    auto add = [&](const std::string& name, TensorType x, const Attributes& attrs, bool specials) {
      Case fwd;
      fwd.symbol = "pool" + std::to_string(cs.size()) + "_" + name;
      const auto xi = fwd.graph.add_input(x);
      const auto values = fwd.graph.add_node(OpKind::MaxPool2d, {xi}, attrs);
      fwd.graph.mark_output(values);
      fwd.graph.mark_output(fwd.graph.add_node(OpKind::MaxPool2dIndices, {xi}, attrs));
      fwd.inputs = {random_data(x, rng, specials)};
      const auto forward_out = ir::interpret(fwd.graph, fwd.inputs);
      const TensorType pooled = fwd.graph.type(values);

      Case bwd;
      bwd.symbol = "poolb" + std::to_string(cs.size()) + "_" + name;
      const auto g = bwd.graph.add_input(dense(x.dtype, pooled.sizes));
      const auto bx = bwd.graph.add_input(x);
      const auto bi = bwd.graph.add_input(dense(DType::kInt64, pooled.sizes));
      bwd.graph.mark_output(bwd.graph.add_node(OpKind::MaxPool2dBackward, {g, bx, bi}, attrs));
      // Fractional grads, so that accumulated sums round.
      std::vector<double> grad(static_cast<std::size_t>(pooled.numel()));
      std::uniform_real_distribution<double> real(-1, 1);
      for (auto& v : grad) v = real(rng);
      bwd.inputs = {ir::make_buffer(x.dtype, pooled.sizes, grad), fwd.inputs[0], forward_out[1]};
      cs.push_back(std::move(fwd));
      cs.push_back(std::move(bwd));
    };
    const DType f32 = DType::kFloat32, f64 = DType::kFloat64, bf16 = DType::kBFloat16;
    add("f32_2x2", dense(f32, {3, 4, 8, 10}), pool_attrs({2, 2}, {2, 2}, {0, 0}, {1, 1}, false), false);
    add("f32_2x2_odd", dense(f32, {2, 3, 9, 7}), pool_attrs({2, 2}, {2, 2}, {0, 0}, {1, 1}, false), true);
    add("f32_2x2_ceil", dense(f32, {2, 3, 9, 7}), pool_attrs({2, 2}, {2, 2}, {0, 0}, {1, 1}, true), true);
    add("f32_3x3_s2_p1", dense(f32, {2, 5, 11, 12}), pool_attrs({3, 3}, {2, 2}, {1, 1}, {1, 1}, false), true);
    add("f32_3x3_s1_p1_overlap", dense(f32, {2, 3, 6, 6}), pool_attrs({3, 3}, {1, 1}, {1, 1}, {1, 1}, false), false);
    add("f32_3x2_dil", dense(f32, {1, 2, 13, 11}), pool_attrs({3, 2}, {2, 1}, {1, 1}, {2, 3}, true), true);
    add("f32_rank3", dense(f32, {6, 10, 9}), pool_attrs({2, 3}, {2, 3}, {0, 1}, {1, 1}, true), true);
    add("f32_reversed", reversed_layout(f32, {3, 4, 10, 8}), pool_attrs({2, 2}, {2, 2}, {1, 0}, {1, 1}, false), true);
    add("f64_3x3", dense(f64, {2, 3, 10, 10}), pool_attrs({3, 3}, {2, 2}, {1, 1}, {1, 1}, true), true);
    add("bf16_2x2", dense(bf16, {2, 3, 8, 8}), pool_attrs({2, 2}, {2, 2}, {0, 0}, {1, 1}, false), true);
    add("bf16_3x3_overlap", dense(bf16, {2, 2, 9, 9}), pool_attrs({3, 3}, {1, 1}, {1, 1}, {1, 1}, false), false);
    add("f32_empty_batch", dense(f32, {0, 3, 8, 8}), pool_attrs({2, 2}, {2, 2}, {0, 0}, {1, 1}, false), false);
    add("f32_large", dense(f32, {8, 32, 32, 32}), pool_attrs({2, 2}, {2, 2}, {0, 0}, {1, 1}, false), false);
    // Random geometries.
    std::uniform_int_distribution<std::int64_t> k(1, 4), s(1, 3), dil(1, 2), hw(4, 13), c(1, 4);
    for (int i = 0; i < 12; ++i) {
      const std::int64_t kh = k(rng), kw = k(rng);
      const std::int64_t ph = std::uniform_int_distribution<std::int64_t>(0, kh / 2)(rng);
      const std::int64_t pw = std::uniform_int_distribution<std::int64_t>(0, kw / 2)(rng);
      const DType dt = i % 3 == 0 ? bf16 : f32;
      add("random" + std::to_string(i), dense(dt, {2, c(rng), hw(rng) + 8, hw(rng) + 8}),
          pool_attrs({kh, kw}, {s(rng), s(rng)}, {ph, pw}, {dil(rng), dil(rng)}, i % 2 == 0), i % 4 != 1);
    }
    return cs;
  }();
  return all;
}

TEST_F(HostCodegenPooling, EveryKernelMatchesTheInterpreterBitwise) {
  for (const auto& c : cases()) {
    VtpuKernelStatus status{};
    const auto got = launch(c, nullptr, &status, 0x5a);
    const auto expected = ir::interpret(c.graph, c.inputs);
    EXPECT_EQ(status.code, kVtpuOk) << c.symbol;
    ASSERT_EQ(got.size(), expected.size()) << c.symbol;
    for (std::size_t o = 0; o < got.size(); ++o) {
      EXPECT_TRUE(got[o].guards_intact()) << c.symbol;
      EXPECT_EQ(got[o].bytes(), expected[o].bytes) << c.symbol << " output " << o;
    }
  }
}

TEST_F(HostCodegenPooling, ThreadedLaunchIsBitwiseTheSerialOne) {
  split_launches() = 0;
  for (const auto& c : cases()) {
    const auto serial = launch(c, nullptr, nullptr);
    const auto threaded = launch(c, &threaded_for, nullptr);
    for (std::size_t o = 0; o < serial.size(); ++o) EXPECT_EQ(serial[o].bytes(), threaded[o].bytes()) << c.symbol;
  }
  EXPECT_GE(split_launches().load(), 2);  // the large cases ran on several threads
}

// The interpreter against results worked out by hand from ATen's rules.
TEST(HostCodegenPoolingSemantics, InterpreterGivesAtensValuesAndIndices) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // One 3x4 plane, 2x2 windows, stride 2, ceil_mode: the second window row
  // is the last input row alone. Ties keep the first; NaN wins, the last NaN
  // of a window wins.
  ir::Graph g;
  const auto x = g.add_input(dense(DType::kFloat32, {1, 3, 4}));
  const Attributes attrs = pool_attrs({2, 2}, {2, 2}, {0, 0}, {1, 1}, true);
  g.mark_output(g.add_node(OpKind::MaxPool2d, {x}, attrs));
  g.mark_output(g.add_node(OpKind::MaxPool2dIndices, {x}, attrs));
  const auto out = ir::interpret(g, {ir::make_buffer(DType::kFloat32, {1, 3, 4},
                                                     {1, 5, nan, 2,  //
                                                      5, 0, 3, nan,  //
                                                      -7, -9, 4, 4})});
  ASSERT_EQ(out[0].type.sizes, (std::vector<std::int64_t>{1, 2, 2}));
  const auto values = ir::to_doubles(out[0]);
  EXPECT_EQ(values[0], 5);
  EXPECT_TRUE(std::isnan(values[1]));
  EXPECT_EQ(values[2], -7);
  EXPECT_EQ(values[3], 4);
  EXPECT_EQ(ir::to_doubles(out[1]), (std::vector<double>{1, 7, 8, 10}));

  // Backward of overlapping windows: grads of windows sharing a maximum add.
  ir::Graph b;
  const auto grad = b.add_input(dense(DType::kFloat32, {1, 2, 2}));
  const auto bx = b.add_input(dense(DType::kFloat32, {1, 3, 4}));
  const auto bi = b.add_input(dense(DType::kInt64, {1, 2, 2}));
  b.mark_output(b.add_node(OpKind::MaxPool2dBackward, {grad, bx, bi}, attrs));
  const auto dx = ir::interpret(b, {ir::make_buffer(DType::kFloat32, {1, 2, 2}, {0.5, 0.25, 2, 3}),
                                    ir::make_buffer(DType::kFloat32, {1, 3, 4}, std::vector<double>(12, 0)),
                                    ir::make_int_buffer(DType::kInt64, {1, 2, 2}, {1, 1, -1, 10})});
  EXPECT_EQ(ir::to_doubles(dx[0]), (std::vector<double>{0, 0.75, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0}));
}

TEST_F(HostCodegenPooling, OutOfRangeIndexIsReportedAndSkipped) {
  for (const std::string name : {"f32_2x2", "bf16_3x3_overlap", "f32_reversed", "f32_large"}) {
    const Case* c = nullptr;
    for (const auto& k : cases())
      if (k.symbol.rfind("poolb", 0) == 0 && k.symbol.size() > name.size() &&
          k.symbol.compare(k.symbol.size() - name.size(), name.size(), name) == 0)
        c = &k;
    ASSERT_NE(c, nullptr) << name;
    std::vector<ir::Buffer> inputs = c->inputs;
    const auto& x = inputs[1].type;
    const std::int64_t plane = x.sizes[x.rank() - 2] * x.sizes[x.rank() - 1];
    const std::int64_t bad = plane + 3;
    std::memcpy(inputs[2].bytes.data() + 8 * (inputs[2].type.numel() - 1), &bad, 8);
    EXPECT_THROW(ir::interpret(c->graph, inputs), runtime::Error) << c->symbol;
    for (VtpuParallelFor pf : {static_cast<VtpuParallelFor>(nullptr), &threaded_for}) {
      VtpuKernelStatus status{};
      const auto got = launch(*c, pf, &status, 0x11, inputs);
      EXPECT_TRUE(got[0].guards_intact()) << c->symbol;
      EXPECT_EQ(status.code, kVtpuIndexOutOfRange) << c->symbol;
      EXPECT_EQ(status.operand, 2) << c->symbol;
      EXPECT_EQ(status.value, bad) << c->symbol;
      EXPECT_EQ(status.bound, plane) << c->symbol;
    }
  }
}

TEST(HostCodegenPoolingErrors, AtensInvalidGeometriesAreRejected) {
  auto rejects = [](const TensorType& x, const Attributes& attrs) {
    ir::Graph g;
    const auto xi = g.add_input(x);
    EXPECT_THROW(g.add_node(OpKind::MaxPool2d, {xi}, attrs), runtime::Error);
  };
  const TensorType x = dense(DType::kFloat32, {1, 2, 6, 6});
  rejects(x, pool_attrs({0, 2}, {2, 2}, {0, 0}, {1, 1}, false));     // kernel 0
  rejects(x, pool_attrs({2, 2}, {0, 2}, {0, 0}, {1, 1}, false));     // stride 0
  rejects(x, pool_attrs({2, 2}, {2, 2}, {0, 0}, {1, 0}, false));     // dilation 0
  rejects(x, pool_attrs({2, 2}, {2, 2}, {2, 0}, {1, 1}, false));     // pad above half the kernel
  rejects(x, pool_attrs({2}, {2, 2}, {0, 0}, {1, 1}, false));        // one entry
  rejects(x, pool_attrs({7, 7}, {1, 1}, {0, 0}, {1, 1}, false));     // output too small
  rejects(dense(DType::kInt64, {1, 2, 6, 6}), pool_attrs({2, 2}, {2, 2}, {0, 0}, {1, 1}, false));
  rejects(dense(DType::kFloat32, {2, 6, 6, 1, 1}), pool_attrs({2, 2}, {2, 2}, {0, 0}, {1, 1}, false));
  rejects(dense(DType::kFloat32, {1, 0, 6, 6}), pool_attrs({2, 2}, {2, 2}, {0, 0}, {1, 1}, false));
}

}  // namespace
}  // namespace vtpu::compiler
