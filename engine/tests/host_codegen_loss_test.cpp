// Generated nll_loss kernels (host_codegen_loss.cpp) against the reference
// interpreter: random shapes, with and without a class weight, ignored
// targets, every reduction, 1- and 2-dim inputs, float32/float64/bfloat16,
// int64 and uint8 targets, strided operands, empty batches, all-ignored
// batches (a NaN mean); bitwise the same serial and threaded; out-of-range
// targets reported through the status record without writing outside the
// outputs (guard bytes around them stay intact).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
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

// Data in [-3, 3] over the whole strided extent (weights in [0.1, 2]).
ir::Buffer random_data(const TensorType& type, std::mt19937& rng, double lo = -3.0, double hi = 3.0) {
  const std::int64_t extent = type.storage_extent();
  std::vector<double> values(static_cast<std::size_t>(extent));
  std::uniform_real_distribution<double> real(lo, hi);
  for (auto& v : values) v = real(rng);
  ir::Buffer buffer = ir::Buffer::zeros(type);
  const ir::Buffer flat = ir::make_buffer(type.dtype, {extent}, values);
  std::memcpy(buffer.bytes.data(), flat.bytes.data(), flat.bytes.size());
  return buffer;
}

// Targets in [0, classes), about a fifth of them `ignore` (when `hits`).
ir::Buffer random_target(const TensorType& type, std::int64_t classes, std::int64_t ignore, bool hits,
                         std::mt19937& rng) {
  const std::int64_t extent = type.storage_extent();
  std::vector<std::int64_t> values(static_cast<std::size_t>(extent));
  std::uniform_int_distribution<std::int64_t> pick(0, std::max<std::int64_t>(classes - 1, 0));
  std::uniform_int_distribution<int> fifth(0, 4);
  for (auto& v : values) v = hits && fifth(rng) == 0 ? ignore : pick(rng);
  ir::Buffer buffer = ir::Buffer::zeros(type);
  const ir::Buffer flat = ir::make_int_buffer(type.dtype, {extent}, values);
  std::memcpy(buffer.bytes.data(), flat.bytes.data(), flat.bytes.size());
  return buffer;
}

// Writes `value` at logical element `linear` of a (0- or 1-dim) target.
void set_target(ir::Buffer& b, std::int64_t linear, std::int64_t value) {
  const std::int64_t off = b.type.rank() == 0 ? 0 : linear * b.type.strides[0];
  if (b.type.dtype == DType::kInt64) std::memcpy(b.bytes.data() + off * 8, &value, 8);
  else b.bytes[static_cast<std::size_t>(off)] = static_cast<std::uint8_t>(value);
}

struct Case {
  std::string symbol;
  ir::Graph graph;
  std::vector<ir::Buffer> inputs;
  int target_operand;  // position of the target among the inputs
  std::int64_t classes;
};



Attributes nll_attrs(const std::string& reduction, std::int64_t ignore, bool weight) {
  return {{"reduction", reduction}, {"ignore_index", ignore}, {"has_weight", weight}};
}

class HostCodegenLoss : public ::testing::Test {
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

  // Launches the case on `inputs` (its own when empty); outputs start as `fill` bytes.
  static std::vector<Output> launch(const Case& c, VtpuParallelFor parallel_for, VtpuKernelStatus* status,
                                    std::uint8_t fill = 0, std::vector<ir::Buffer> inputs = {}) {
    if (inputs.empty()) inputs = c.inputs;
    return launch_outputs(*library(), c.symbol, c.graph, std::move(inputs), parallel_for, status, fill);
  }
};

std::vector<Case>& HostCodegenLoss::cases() {
  static std::vector<Case> all = [] {
    std::vector<Case> cs;
    std::mt19937 rng(7);
    // Forward: outputs [loss, total_weight] (or [loss] alone when !total).
    // Backward: its inputs are grad (random), x, target, the forward's
    // total weight on the same data, weight.
    auto add = [&](const std::string& name, TensorType x, DType target_dtype, bool weight, const std::string& reduction,
                   std::int64_t ignore, bool hits, bool total = true) {
      const std::int64_t classes = x.sizes.back();
      const bool two_dim = x.rank() == 2;
      const TensorType target = two_dim ? dense(target_dtype, {x.sizes[0]}) : dense(target_dtype, {});
      const TensorType w = dense(x.dtype, {classes});
      const Attributes attrs = nll_attrs(reduction, ignore, weight);
      Case fwd;
      fwd.symbol = "nll" + std::to_string(cs.size()) + "_" + name;
      fwd.target_operand = 1;
      fwd.classes = classes;
      std::vector<ir::ValueId> ids{fwd.graph.add_input(x), fwd.graph.add_input(target)};
      if (weight) ids.push_back(fwd.graph.add_input(w));
      fwd.graph.mark_output(fwd.graph.add_node(OpKind::NllLoss, ids, attrs));
      if (total) fwd.graph.mark_output(fwd.graph.add_node(OpKind::NllLossTotalWeight, ids, attrs));
      fwd.inputs = {random_data(x, rng), random_target(target, classes, ignore, hits, rng)};
      if (weight) fwd.inputs.push_back(random_data(w, rng, 0.1, 2.0));
      // The total weight of these inputs, for the backward.
      ir::Graph tw_graph;
      std::vector<ir::ValueId> tw_ids;
      for (const auto& b : fwd.inputs) tw_ids.push_back(tw_graph.add_input(b.type));
      tw_graph.mark_output(tw_graph.add_node(OpKind::NllLossTotalWeight, tw_ids, attrs));
      ir::Buffer total_weight = ir::interpret(tw_graph, fwd.inputs)[0];

      Case bwd;
      bwd.symbol = "nllb" + std::to_string(cs.size()) + "_" + name;
      bwd.target_operand = 2;
      bwd.classes = classes;
      const TensorType grad = dense(x.dtype, reduction == "none" && two_dim ? std::vector<std::int64_t>{x.sizes[0]}
                                                                            : std::vector<std::int64_t>{});
      std::vector<ir::ValueId> bids{bwd.graph.add_input(grad), bwd.graph.add_input(x), bwd.graph.add_input(target),
                                    bwd.graph.add_input(dense(x.dtype, {}))};
      if (weight) bids.push_back(bwd.graph.add_input(w));
      bwd.graph.mark_output(bwd.graph.add_node(OpKind::NllLossBackward, bids, attrs));
      bwd.inputs = {random_data(grad, rng), fwd.inputs[0], fwd.inputs[1], total_weight};
      if (weight) bwd.inputs.push_back(fwd.inputs[2]);
      cs.push_back(std::move(fwd));
      cs.push_back(std::move(bwd));
    };
    const DType f32 = DType::kFloat32, f64 = DType::kFloat64, bf16 = DType::kBFloat16;
    const DType i64 = DType::kInt64, u8 = DType::kUInt8;
    // Random shapes over every (dtype, weight, reduction, rank).
    std::uniform_int_distribution<std::int64_t> rows(1, 60), classes(2, 40);
    int k = 0;
    for (DType dt : {f32, f64, bf16})
      for (bool weight : {false, true})
        for (const char* reduction : {"none", "sum", "mean"}) {
          const std::string tag = std::string(ir::name(dt)) + (weight ? "_w_" : "_") + reduction;
          add(tag + "_2d", dense(dt, {rows(rng), classes(rng)}), i64, weight, reduction, -100, false);
          add(tag + "_2d_ignored", dense(dt, {rows(rng), classes(rng)}), i64, weight, reduction, -100, true);
          // An ignore_index that is a real class.
          add(tag + "_2d_ignore_class", dense(dt, {rows(rng), classes(rng)}), i64, weight, reduction, 1, true);
          add(tag + "_1d", dense(dt, {classes(rng)}), i64, weight, reduction, -100, false);
          add(tag + "_1d_ignored", dense(dt, {classes(rng)}), i64, weight, reduction, 0, (k++ % 2) == 0);
        }
    add("u8_target", dense(f32, {33, 7}), u8, true, "mean", 3, true);
    add("u8_target_none", dense(f32, {33, 7}), u8, false, "none", -100, false);
    add("strided_x", TensorType{f32, {12, 9}, {1, 12}}, i64, true, "sum", -100, true);
    add("strided_x_none", TensorType{f64, {12, 9}, {1, 12}}, i64, false, "none", -100, true);
    add("empty_batch_mean", dense(f32, {0, 5}), i64, false, "mean", -100, false);
    add("empty_batch_sum", dense(f32, {0, 5}), i64, true, "sum", -100, false);
    add("loss_only", dense(f32, {10, 4}), i64, true, "mean", -100, true, false);
    add("large_none", dense(f32, {50000, 10}), i64, true, "none", -100, true);
    add("large_mean", dense(f32, {50000, 10}), i64, true, "mean", -100, true);
    add("large_bf16_sum", dense(bf16, {40000, 3}), i64, false, "sum", -100, true);
    add("wide", dense(f32, {300, 1000}), i64, false, "mean", -100, true);
    return cs;
  }();
  return all;
}

const Case& find(const std::string& name) {
  for (const auto& c : HostCodegenLoss::cases()) {
    const std::string suffix = "_" + name;
    if (c.symbol.size() > suffix.size() && c.symbol.compare(c.symbol.size() - suffix.size(), suffix.size(), suffix) == 0)
      return c;
  }
  throw std::runtime_error("no case " + name);
}

TEST_F(HostCodegenLoss, EveryKernelMatchesTheInterpreterBitwise) {
  for (const auto& c : cases()) {
    VtpuKernelStatus status{};
    const auto got = launch(c, nullptr, &status);
    const auto expected = ir::interpret(c.graph, c.inputs);
    EXPECT_EQ(status.code, kVtpuOk) << c.symbol;
    ASSERT_EQ(got.size(), expected.size()) << c.symbol;
    for (std::size_t o = 0; o < got.size(); ++o) {
      EXPECT_TRUE(got[o].guards_intact()) << c.symbol;
      EXPECT_EQ(got[o].bytes(), expected[o].bytes) << c.symbol << " output " << o;
    }
  }
}

TEST_F(HostCodegenLoss, ThreadedLaunchIsBitwiseTheSerialOne) {
  split_launches() = 0;
  for (const auto& c : cases()) {
    const auto serial = launch(c, nullptr, nullptr);
    const auto threaded = launch(c, &threaded_for, nullptr);
    for (std::size_t o = 0; o < serial.size(); ++o) EXPECT_EQ(serial[o].bytes(), threaded[o].bytes()) << c.symbol;
  }
  EXPECT_GE(split_launches().load(), 3);  // the large cases ran on several threads
}

// Values against hand-computed ATen results (not only the interpreter).
TEST_F(HostCodegenLoss, MatchesAtenOnASmallExample) {
  // x = [[0, -1, -2], [-3, -4, -5], [-6, -7, -8]], target = [2, ignore, 0], weight = [1, 2, 0.5].
  ir::Graph g;
  const auto x = g.add_input(dense(DType::kFloat32, {3, 3}));
  const auto t = g.add_input(dense(DType::kInt64, {3}));
  const auto w = g.add_input(dense(DType::kFloat32, {3}));
  const Attributes attrs = nll_attrs("mean", -100, true);
  g.mark_output(g.add_node(OpKind::NllLoss, {x, t, w}, attrs));
  g.mark_output(g.add_node(OpKind::NllLossTotalWeight, {x, t, w}, attrs));
  const auto out = ir::interpret(g, {ir::make_buffer(DType::kFloat32, {3, 3}, {0, -1, -2, -3, -4, -5, -6, -7, -8}),
                                     ir::make_int_buffer(DType::kInt64, {3}, {2, -100, 0}),
                                     ir::make_buffer(DType::kFloat32, {3}, {1, 2, 0.5})});
  // -(-2 * 0.5 + -6 * 1) / (0.5 + 1)
  EXPECT_FLOAT_EQ(static_cast<float>(ir::to_doubles(out[0])[0]), 7.0f / 1.5f);
  EXPECT_EQ(ir::to_doubles(out[1])[0], 1.5);
}

TEST_F(HostCodegenLoss, AllIgnoredMeanIsNaNAndTotalWeightZero) {
  for (const std::string name : {"float32_mean_2d", "float32_w_mean_1d"}) {
    const Case& c = find(name);
    std::vector<ir::Buffer> inputs = c.inputs;
    const std::int64_t n = inputs[1].type.rank() == 0 ? 1 : inputs[1].type.sizes[0];
    const std::int64_t ignore = c.graph.node(c.graph.outputs()[0]).attrs.get_int("ignore_index");
    for (std::int64_t i = 0; i < n; ++i) set_target(inputs[1], i, ignore);
    VtpuKernelStatus status{};
    auto got = launch(c, nullptr, &status, 0, inputs);
    EXPECT_EQ(status.code, kVtpuOk);
    float loss, total;
    std::memcpy(&loss, got[0].data(), 4);
    std::memcpy(&total, got[1].data(), 4);
    EXPECT_TRUE(std::isnan(loss)) << name;
    EXPECT_EQ(total, 0.0f) << name;
    EXPECT_EQ(got[0].bytes(), ir::interpret(c.graph, inputs)[0].bytes) << name;
  }
}

TEST_F(HostCodegenLoss, OutOfRangeTargetIsReportedAndSkipped) {
  struct Bad {
    std::string name;
    std::int64_t position;
    std::int64_t value;
  };
  const std::vector<Bad> bad = {{"float32_none_2d", 0, 1000},  {"float32_w_sum_2d", 3, -1},
                                {"float64_mean_2d", 0, 77},    {"bfloat16_w_mean_1d", 0, -5},
                                {"float32_sum_1d", 0, 40},     {"u8_target", 5, 200},
                                {"strided_x", 11, 9},          {"large_none", 49999, 10},
                                {"large_mean", 12345, -2}};
  for (const auto& b : bad) {
    for (const std::string prefix : {"", "b"}) {
      // The forward case and its backward (the one after it).
      const Case* c = &find(b.name);
      if (prefix == "b") c = &cases()[static_cast<std::size_t>(c - cases().data()) + 1];
      std::vector<ir::Buffer> inputs = c->inputs;
      set_target(inputs[static_cast<std::size_t>(c->target_operand)], b.position, b.value);
      EXPECT_THROW(ir::interpret(c->graph, inputs), runtime::Error) << c->symbol;
      for (VtpuParallelFor pf : {static_cast<VtpuParallelFor>(nullptr), &threaded_for}) {
        VtpuKernelStatus status{};
        const auto got = launch(*c, pf, &status, 0x11, inputs);
        for (const auto& o : got) EXPECT_TRUE(o.guards_intact()) << c->symbol;
        EXPECT_EQ(status.code, kVtpuIndexOutOfRange) << c->symbol;
        EXPECT_EQ(status.operand, c->target_operand) << c->symbol;
        EXPECT_EQ(status.value, b.value) << c->symbol;
        EXPECT_EQ(status.bound, c->classes) << c->symbol;
        // Without a status record the bad row is still skipped safely.
        for (const auto& o : launch(*c, pf, nullptr, 0x11, inputs)) EXPECT_TRUE(o.guards_intact()) << c->symbol;
      }
    }
  }
}

TEST(HostCodegenLossErrors, GraphsOutsideTheContractAreRefusedByName) {
  ir::Graph g;
  const auto x = g.add_input(dense(DType::kFloat32, {4, 3}));
  const auto t = g.add_input(dense(DType::kInt64, {4}));
  g.mark_output(g.add_node(OpKind::Neg, {g.add_node(OpKind::NllLoss, {x, t}, nll_attrs("sum", -100, false))}));
  try {
    generate_host_kernel(g, "k");
    FAIL() << "expected an error";
  } catch (const runtime::Error& e) {
    EXPECT_EQ(e.kind(), runtime::ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("nll_loss"), std::string::npos) << e.what();
  }
  // A total weight of other attributes than the loss's.
  ir::Graph h;
  const auto hx = h.add_input(dense(DType::kFloat32, {4, 3}));
  const auto ht = h.add_input(dense(DType::kInt64, {4}));
  h.mark_output(h.add_node(OpKind::NllLoss, {hx, ht}, nll_attrs("sum", -100, false)));
  h.mark_output(h.add_node(OpKind::NllLossTotalWeight, {hx, ht}, nll_attrs("mean", -100, false)));
  EXPECT_THROW(generate_host_kernel(h, "k"), runtime::Error);
}

TEST(HostCodegenLossErrors, TheIrRejectsWhatAtenRejects) {
  auto rejects = [](std::vector<TensorType> types, Attributes attrs) {
    try {
      ir::single_op(OpKind::NllLoss, std::move(types), std::move(attrs));
    } catch (const runtime::Error& e) {
      return std::string(e.what()).find("nll_loss") != std::string::npos;
    }
    return false;
  };
  const Attributes plain = nll_attrs("mean", -100, false), weighted = nll_attrs("mean", -100, true);
  EXPECT_TRUE(rejects({dense(DType::kFloat32, {4, 3}), dense(DType::kInt32, {4})}, plain));      // target dtype
  EXPECT_TRUE(rejects({dense(DType::kFloat32, {4, 3}), dense(DType::kInt64, {5})}, plain));      // batch size
  EXPECT_TRUE(rejects({dense(DType::kFloat32, {2, 4, 3}), dense(DType::kInt64, {2})}, plain));   // rank 3
  EXPECT_TRUE(rejects({dense(DType::kInt64, {4, 3}), dense(DType::kInt64, {4})}, plain));        // integer x
  EXPECT_TRUE(rejects({dense(DType::kFloat32, {4, 3}), dense(DType::kInt64, {4}), dense(DType::kFloat32, {4})},
                      weighted));                                                                 // weight size
  EXPECT_TRUE(rejects({dense(DType::kFloat32, {4, 3}), dense(DType::kInt64, {4})}, nll_attrs("avg", -100, false)));
  EXPECT_FALSE(rejects({dense(DType::kFloat32, {3}), dense(DType::kInt64, {})}, plain));
}

TEST(HostCodegenLossErrors, SupportsTheLossOps) {
  for (OpKind op : {OpKind::NllLoss, OpKind::NllLossTotalWeight, OpKind::NllLossBackward})
    EXPECT_TRUE(host_codegen_supports(op)) << ir::name(op);
}

}  // namespace
}  // namespace vtpu::compiler
