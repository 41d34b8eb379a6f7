// The host code generator against the reference interpreter: many single-op
// kernels over dtypes, broadcasting, non-contiguous and zero-size inputs, all
// compiled in one translation unit (as the AOT library is) and launched
// through the ABI, serially and through a parallel_for.
#include "vtpu/compiler/host_codegen.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "test_kernel_cache.h"
#include "temp_dir.h"
#include "vtpu/compiler/kernel_library.h"
#include "vtpu/ir/canonical.h"
#include "vtpu/ir/half.h"
#include "vtpu/compiler/system_compiler.h"
#include "vtpu/ir/interpreter.h"
#include "vtpu/runtime/error.h"

namespace vtpu::compiler {
namespace {

using ir::Attributes;
using ir::DType;
using ir::OpKind;
using ir::TensorType;

struct Case {
  std::string symbol;
  ir::Graph graph;
  std::vector<ir::Buffer> inputs;
  std::vector<double> scalars;
  // Relative float32 tolerance against the double interpreter: a few ulp for
  // one function; row operations accumulate in float (as ATen does), so more.
  double float_tolerance = 2e-6;
};

ir::Buffer random_buffer(const TensorType& type, std::mt19937& rng, bool positive) {
  ir::Buffer buffer = ir::Buffer::zeros(type);
  // Fill the whole strided extent through a contiguous view of the bytes.
  const std::int64_t extent = type.storage_extent();
  std::vector<double> values(static_cast<std::size_t>(extent));
  std::uniform_real_distribution<double> real(positive ? 0.1 : -3.0, 3.0);
  std::uniform_int_distribution<int> integer(positive ? 1 : -9, 9);
  for (auto& v : values) v = ir::is_floating(type.dtype) ? real(rng) : integer(rng);
  if (type.dtype == DType::kBool)
    for (auto& v : values) v = (integer(rng) & 1);
  ir::Buffer flat = ir::make_buffer(type.dtype, {extent}, values);
  std::memcpy(buffer.bytes.data(), flat.bytes.data(), flat.bytes.size());
  return buffer;
}

TensorType strided(DType dtype, std::vector<std::int64_t> sizes, std::vector<std::int64_t> strides) {
  return TensorType{dtype, std::move(sizes), std::move(strides)};
}

class HostCodegenTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    std::mt19937 rng(7);
    auto add_case = [&](OpKind op, std::vector<TensorType> types, Attributes attrs = {}, bool positive = false) {
      Case c;
      c.symbol = "k" + std::to_string(cases().size()) + "_" + std::string(ir::name(op));
      c.graph = ir::single_op(op, types, attrs);
      c.scalars = launch_scalars(c.graph);
      for (const auto& t : types) c.inputs.push_back(random_buffer(t, rng, positive));
      if (ir::category(op) == ir::OpCategory::kNormalization) c.float_tolerance = 2e-5;
      cases().push_back(std::move(c));
    };
    const auto f32 = TensorType::contiguous(DType::kFloat32, {4, 33});
    for (OpKind op : {OpKind::Neg, OpKind::Abs, OpKind::Exp, OpKind::Tanh, OpKind::Sigmoid, OpKind::Relu,
                      OpKind::Silu, OpKind::Erf, OpKind::Sin, OpKind::Floor, OpKind::Round, OpKind::Sign,
                      OpKind::IsNan, OpKind::LogicalNot})
      add_case(op, {f32});
    for (OpKind op : {OpKind::Log, OpKind::Sqrt, OpKind::Rsqrt, OpKind::Reciprocal}) add_case(op, {f32}, {}, true);
    add_case(OpKind::Gelu, {f32}, {{"approximate", std::string("tanh")}});
    add_case(OpKind::Gelu, {f32});
    for (OpKind op : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Maximum, OpKind::Minimum, OpKind::Lt,
                      OpKind::Eq, OpKind::Atan2, OpKind::Remainder, OpKind::Fmod})
      add_case(op, {f32, f32});
    add_case(OpKind::Div, {f32, f32}, {}, true);
    add_case(OpKind::Pow, {f32, f32}, {}, true);
    add_case(OpKind::Add, {f32, f32}, {{"alpha", 2.5}});
    add_case(OpKind::GeluBackward, {f32, f32});
    // Row operations: all tensors share the input's shape.
    add_case(OpKind::Softmax, {f32}, {{"dim", std::int64_t{1}}});
    add_case(OpKind::LogSoftmax, {f32}, {{"dim", std::int64_t{0}}});
    add_case(OpKind::Softmax, {TensorType::contiguous(DType::kBFloat16, {3, 5, 7})}, {{"dim", std::int64_t{-1}}});
    add_case(OpKind::LogSoftmax, {strided(DType::kFloat32, {6, 4}, {1, 6})}, {{"dim", std::int64_t{1}}});
    add_case(OpKind::SoftmaxBackward, {f32, f32}, {{"dim", std::int64_t{1}}});
    add_case(OpKind::LogSoftmaxBackward, {f32, f32}, {{"dim", std::int64_t{1}}});
    // Rows longer than the 32 reduction lanes, unit stride and strided.
    add_case(OpKind::Softmax, {TensorType::contiguous(DType::kFloat32, {3, 100})}, {{"dim", std::int64_t{1}}});
    add_case(OpKind::LogSoftmax, {strided(DType::kFloat32, {70, 3}, {1, 70})}, {{"dim", std::int64_t{0}}});
    add_case(OpKind::SoftmaxBackward, {TensorType::contiguous(DType::kFloat32, {2, 77}),
                                       TensorType::contiguous(DType::kFloat32, {2, 77})},
             {{"dim", std::int64_t{1}}});
    // Dtypes: bf16/f16 compute in float32 and round on store; ints wrap like torch.
    for (DType dt : {DType::kBFloat16, DType::kFloat16, DType::kFloat64, DType::kInt32, DType::kInt64,
                     DType::kUInt8, DType::kBool}) {
      const auto t = TensorType::contiguous(dt, {3, 17});
      add_case(OpKind::Mul, {t, t});
      add_case(OpKind::Add, {t, t});
    }
    const auto i64 = TensorType::contiguous(DType::kInt64, {3, 17});
    add_case(OpKind::Div, {i64, i64}, {{"rounding_mode", std::string("floor")}}, true);
    add_case(OpKind::Remainder, {i64, i64}, {}, true);
    add_case(OpKind::BitwiseXor, {i64, i64});
    add_case(OpKind::Pow, {i64, TensorType::contiguous(DType::kInt64, {3, 17})});
    // Promotion: int32 + float32 -> float32; bf16 * f32 -> f32.
    add_case(OpKind::Add, {TensorType::contiguous(DType::kInt32, {5, 6}), TensorType::contiguous(DType::kFloat32, {5, 6})});
    add_case(OpKind::Mul, {TensorType::contiguous(DType::kBFloat16, {5, 6}), TensorType::contiguous(DType::kFloat32, {5, 6})});
    // Broadcasting, stride-0 expansion, transposed and sliced inputs.
    add_case(OpKind::Add, {TensorType::contiguous(DType::kFloat32, {4, 1, 5}), TensorType::contiguous(DType::kFloat32, {3, 1})});
    add_case(OpKind::Mul, {strided(DType::kFloat32, {6, 4}, {1, 6}), TensorType::contiguous(DType::kFloat32, {6, 4})});
    add_case(OpKind::Sub, {strided(DType::kFloat32, {5, 7}, {0, 1}), strided(DType::kFloat32, {5, 7}, {14, 2})});
    add_case(OpKind::Exp, {strided(DType::kFloat32, {3, 4, 5}, {40, 1, 8})});
    // Permuted views with unit stride along the last dim (attention's
    // transpose(1, 2)): the rows loop, chosen at launch; beside a broadcast
    // operand; and beside an input strided along the last dim (odometer).
    add_case(OpKind::Cast, {strided(DType::kFloat32, {2, 3, 4, 37}, {444, 37, 111, 1})},
             {{"dtype", DType::kFloat32}});
    add_case(OpKind::Mul, {strided(DType::kFloat32, {2, 3, 4, 37}, {444, 37, 111, 1}),
                           TensorType::contiguous(DType::kFloat32, {3, 1, 37})});
    add_case(OpKind::Add, {strided(DType::kFloat32, {3, 4, 37}, {37, 111, 1}),
                           strided(DType::kFloat32, {3, 4, 37}, {1, 3, 12})});
    // Zero-size and rank-0.
    add_case(OpKind::Add, {TensorType::contiguous(DType::kFloat32, {0, 3}), TensorType::contiguous(DType::kFloat32, {0, 3})});
    add_case(OpKind::Mul, {TensorType::contiguous(DType::kFloat32, {}), TensorType::contiguous(DType::kFloat32, {})});
    // Ternary and cast.
    const auto cond = TensorType::contiguous(DType::kBool, {4, 33});
    add_case(OpKind::Where, {cond, f32, f32});
    add_case(OpKind::Lerp, {f32, f32, f32});
    add_case(OpKind::Addcmul, {f32, f32, f32}, {{"value", 0.5}});
    add_case(OpKind::Clamp, {f32, f32, f32}, {{"has_min", true}, {"has_max", true}});
    add_case(OpKind::Cast, {f32}, {{"dtype", DType::kBFloat16}});
    add_case(OpKind::Cast, {f32}, {{"dtype", DType::kInt32}});

    // A graph with a Constant operand: the scalar is a launch argument.
    {
      Case c;
      c.symbol = "k_const_mul";
      const auto x = c.graph.add_input(f32);
      const auto k = c.graph.add_node(OpKind::Constant, {}, {{"value", 2.0}});
      const auto y = c.graph.add_node(OpKind::Mul, {x, k});
      const auto z = c.graph.add_node(OpKind::Tanh, {y});
      c.graph.mark_output(z);
      c.inputs.push_back(random_buffer(f32, rng, false));
      c.scalars = {2.0};
      cases().push_back(std::move(c));
    }

    std::vector<GeneratedKernel> kernels;
    for (const auto& c : cases()) kernels.push_back(generate_host_kernel(c.graph, c.symbol));
    const SystemCompiler compiler;
    library() = std::make_unique<KernelLibrary>(KernelLibrary::load(testing::compile_once(host_translation_unit(kernels), compiler)));
  }
  static void TearDownTestSuite() { library().reset(); }

  static std::vector<Case>& cases() {
    static std::vector<Case> all;
    return all;
  }
  static std::unique_ptr<KernelLibrary>& library() {
    static std::unique_ptr<KernelLibrary> lib;
    return lib;
  }
};

VtpuTensorArg tensor_arg(ir::Buffer& buffer, const std::vector<std::int64_t>& out_sizes) {
  VtpuTensorArg arg{};
  arg.data = buffer.bytes.data();
  const auto& t = buffer.type;
  // Right-align to the output rank; missing leading dims broadcast (stride 0).
  const std::size_t pad = out_sizes.size() - t.sizes.size();
  for (std::size_t d = 0; d < out_sizes.size(); ++d) {
    arg.sizes[d] = out_sizes[d];
    if (d < pad) {
      arg.strides[d] = 0;
    } else {
      const std::size_t k = d - pad;
      arg.strides[d] = (t.sizes[k] == 1 && out_sizes[d] != 1) ? 0 : t.strides[k];
    }
  }
  return arg;
}

// A parallel_for that really splits the range over threads.
void threaded_for(std::int64_t total, std::int64_t grain, VtpuParallelBody body, void* context, void*) {
  std::vector<std::thread> threads;
  const std::int64_t chunk = std::max<std::int64_t>(grain, (total + 3) / 4);
  for (std::int64_t begin = 0; begin < total; begin += chunk)
    threads.emplace_back([=] { body(begin, std::min(total, begin + chunk), context); });
  for (auto& t : threads) t.join();
}

std::vector<ir::Buffer> launch(const Case& c, VtpuParallelFor parallel_for) {
  std::vector<ir::Buffer> outputs;
  for (ir::ValueId id : c.graph.outputs()) outputs.push_back(ir::Buffer::zeros(c.graph.type(id)));
  std::vector<ir::Buffer> inputs = c.inputs;
  const auto& out_sizes = c.graph.type(c.graph.outputs().front()).sizes;
  std::vector<VtpuTensorArg> args;
  for (auto& b : outputs) args.push_back(tensor_arg(b, out_sizes));
  for (auto& b : inputs) args.push_back(tensor_arg(b, out_sizes));
  VtpuLaunchArgs launch_args{kLaunchAbiVersion, static_cast<std::int32_t>(out_sizes.size()),
                             static_cast<std::int32_t>(args.size()), args.data(), c.scalars.data(),
                             parallel_for, nullptr, nullptr};
  HostCodegenTest::library()->get(c.symbol)(&launch_args);
  return outputs;
}

void expect_matches_interpreter(const Case& c, const std::vector<ir::Buffer>& got) {
  const auto expected = ir::interpret(c.graph, c.inputs);
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    const auto e = ir::to_doubles(expected[k]);
    const auto g = ir::to_doubles(got[k]);
    ASSERT_EQ(e.size(), g.size()) << c.symbol;
    const DType dt = expected[k].type.dtype;
    // libm and the interpreter's double math may differ in the last float bit;
    // 16-bit floats may then round to neighbouring values.
    const double rel = dt == DType::kBFloat16 ? 1e-2 : dt == DType::kFloat16 ? 2e-3 : dt == DType::kFloat32 ? c.float_tolerance : 1e-12;
    for (std::size_t i = 0; i < e.size(); ++i) {
      if (std::isnan(e[i])) {
        EXPECT_TRUE(std::isnan(g[i])) << c.symbol << " at " << i;
        continue;
      }
      EXPECT_NEAR(g[i], e[i], rel * std::max(1.0, std::fabs(e[i]))) << c.symbol << " at " << i;
    }
  }
}

TEST_F(HostCodegenTest, EveryKernelMatchesTheInterpreter) {
  for (const auto& c : cases()) expect_matches_interpreter(c, launch(c, nullptr));
}

TEST_F(HostCodegenTest, ParallelLaunchGivesBitwiseTheSameResult) {
  for (const auto& c : cases()) {
    const auto serial = launch(c, nullptr);
    const auto parallel = launch(c, &threaded_for);
    for (std::size_t k = 0; k < serial.size(); ++k) EXPECT_EQ(serial[k].bytes, parallel[k].bytes) << c.symbol;
  }
}

TEST_F(HostCodegenTest, ConstantIsALaunchArgument) {
  Case c = cases().back();
  ASSERT_EQ(c.symbol, "k_const_mul");
  c.scalars = {-0.5};
  // The interpreter bakes the Constant's value in: rebuild the graph with -0.5.
  ir::Graph g;
  const auto x = g.add_input(c.graph.type(0));
  const auto k = g.add_node(OpKind::Constant, {}, {{"value", -0.5}});
  g.mark_output(g.add_node(OpKind::Tanh, {g.add_node(OpKind::Mul, {x, k})}));
  Case expected_case{c.symbol, g, c.inputs, c.scalars};
  expect_matches_interpreter(expected_case, launch(c, nullptr));
}

// alpha, value and threshold are launch scalars: graphs that differ only in
// them share the shape-generic hash (so the kernel), and each launch computes
// with its own value.
TEST(HostCodegenRuntimeScalars, AttributeValuesAreLaunchArguments) {
  const auto t = TensorType::contiguous(DType::kFloat32, {5, 7});
  std::mt19937 rng(5);
  std::vector<Case> cases;
  std::vector<GeneratedKernel> kernels;
  const std::vector<std::pair<OpKind, std::string>> ops = {
      {OpKind::Sub, "alpha"}, {OpKind::Addcdiv, "value"}, {OpKind::ThresholdBackward, "threshold"}};
  for (const auto& [op, attr] : ops) {
    const std::size_t arity = op == OpKind::Addcdiv ? 3 : 2;
    const ir::Graph one = ir::single_op(op, std::vector<TensorType>(arity, t), {{attr, 0.25}});
    const ir::Graph other = ir::single_op(op, std::vector<TensorType>(arity, t), {{attr, -3.5}});
    EXPECT_EQ(ir::hash(one, ir::ShapeMode::kGeneric, ir::ScalarMode::kParameters),
              ir::hash(other, ir::ShapeMode::kGeneric, ir::ScalarMode::kParameters));
    EXPECT_NE(ir::hash(one, ir::ShapeMode::kGeneric, ir::ScalarMode::kValues),
              ir::hash(other, ir::ShapeMode::kGeneric, ir::ScalarMode::kValues));
    const std::string symbol = "rs_" + std::string(ir::name(op));
    kernels.push_back(generate_host_kernel(one, symbol));
    EXPECT_EQ(kernels.back().source, generate_host_kernel(other, symbol).source);
    std::vector<ir::Buffer> inputs;
    for (std::size_t k = 0; k < arity; ++k) inputs.push_back(random_buffer(t, rng, op == OpKind::Addcdiv));
    cases.push_back(Case{symbol, other, inputs, launch_scalars(other)});
  }
  auto& library = HostCodegenTest::library();
  library = std::make_unique<KernelLibrary>(KernelLibrary::load(testing::compile_once(host_translation_unit(kernels))));
  for (const Case& c : cases) {
    ASSERT_EQ(c.scalars, std::vector<double>{-3.5});
    expect_matches_interpreter(c, launch(c, &threaded_for));
  }
  library.reset();
}

// A float16/bfloat16 op rounds an operand of another dtype to 16 bits first,
// as ATen's CPU kernels do (half(0.5) + int32(2049) is 2048), except the
// single-value second operand of mul/div; add's alpha is rounded too. The
// kernels and the interpreter must agree bit for bit, and with float math
// on the operands as ATen converts them.
TEST(HostCodegenMixed16Bit, OperandsOfAnotherDtypeAreRoundedFirst) {
  const std::int64_t n = 64;
  std::vector<double> xs, ints;
  for (std::int64_t i = 0; i < n; ++i) {
    xs.push_back(0.5 + 0.37 * static_cast<double>(i) - 7.0);
    ints.push_back(static_cast<double>(2049 + 3 * i));
  }
  struct Expectation {
    std::string symbol;
    ir::Graph graph;
    std::vector<ir::Buffer> inputs;
    std::function<float(float, float)> reference;  // on x and the operand as ATen reads it
  };
  std::vector<Expectation> expectations;
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    const auto to16 = [dt](float v) {
      return dt == DType::kFloat16 ? ir::half_bits_to_float(ir::float_to_half_bits(v))
                                   : ir::bfloat16_bits_to_float(ir::float_to_bfloat16_bits(v));
    };
    const auto x_type = TensorType::contiguous(dt, {n});
    const ir::Buffer x = ir::make_buffer(dt, {n}, xs);
    const std::string tag = dt == DType::kFloat16 ? "h" : "b";
    {  // x + int32 tensor: the integers rounded to 16 bits
      ir::Graph g;
      const auto a = g.add_input(x_type);
      const auto b = g.add_input(TensorType::contiguous(DType::kInt32, {n}));
      g.mark_output(g.add_node(OpKind::Add, {a, b}));
      expectations.push_back({"mx_add_int_" + tag, g, {x, ir::make_buffer(DType::kInt32, {n}, ints)},
                              [to16](float v, float i) { return v + to16(i); }});
    }
    {  // x + 2049.3 (a Python number): rounded
      ir::Graph g;
      const auto a = g.add_input(x_type);
      g.mark_output(g.add_node(OpKind::Add, {a, g.add_node(OpKind::Constant, {}, {{"value", 2049.3}})}));
      expectations.push_back({"mx_add_const_" + tag, g, {x},
                              [to16](float v, float) { return v + to16(2049.3f); }});
    }
    {  // x - 0.3 * x (alpha): alpha rounded
      ir::Graph g;
      const auto a = g.add_input(x_type);
      g.mark_output(g.add_node(OpKind::Sub, {a, a}, {{"alpha", 0.3}}));
      expectations.push_back({"mx_sub_alpha_" + tag, g, {x},
                              [to16](float v, float) { return v - to16(0.3f) * v; }});
    }
    for (double exponent : {3.0, -2.0}) {  // bfloat16 rounds x * x first (ATen's kernel); float16 does not
      ir::Graph g;
      const auto a = g.add_input(x_type);
      g.mark_output(g.add_node(OpKind::Pow, {a, g.add_node(OpKind::Constant, {}, {{"value", exponent}})}));
      const bool bf16 = dt == DType::kBFloat16;
      expectations.push_back({"mx_pow" + std::string(exponent > 0 ? "3_" : "m2_") + tag, g, {x},
                              [to16, exponent, bf16](float v, float) {
                                const float square = bf16 ? to16(v * v) : v * v;
                                return exponent > 0 ? square * v : 1.0f / square;
                              }});
    }
    {  // x * 0.3 (a Python number): read at its original precision
      ir::Graph g;
      const auto a = g.add_input(x_type);
      g.mark_output(g.add_node(OpKind::Mul, {a, g.add_node(OpKind::Constant, {}, {{"value", 0.3}})}));
      expectations.push_back({"mx_mul_const_" + tag, g, {x}, [](float v, float) { return v * 0.3f; }});
    }
  }
  std::vector<GeneratedKernel> kernels;
  for (const auto& e : expectations) kernels.push_back(generate_host_kernel(e.graph, e.symbol));
  auto& library = HostCodegenTest::library();
  library = std::make_unique<KernelLibrary>(KernelLibrary::load(testing::compile_once(host_translation_unit(kernels))));
  for (const auto& e : expectations) {
    const Case c{e.symbol, e.graph, e.inputs, launch_scalars(e.graph)};
    const auto got = launch(c, nullptr);
    const auto interpreted = ir::interpret(e.graph, e.inputs);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].bytes, interpreted[0].bytes) << e.symbol << ": kernel and interpreter differ";
    const DType dt = e.graph.type(e.graph.outputs()[0]).dtype;
    const auto g = ir::to_doubles(got[0]);
    for (std::int64_t i = 0; i < n; ++i) {
      const float x16 = static_cast<float>(ir::to_doubles(e.inputs[0])[static_cast<std::size_t>(i)]);
      const float r = e.reference(x16, static_cast<float>(ints[static_cast<std::size_t>(i)]));
      const float want = dt == DType::kFloat16 ? ir::half_bits_to_float(ir::float_to_half_bits(r))
                                               : ir::bfloat16_bits_to_float(ir::float_to_bfloat16_bits(r));
      EXPECT_EQ(static_cast<float>(g[static_cast<std::size_t>(i)]), want) << e.symbol << " at " << i;
    }
  }
  library.reset();
}

TEST(HostCodegenErrors, UnsupportedOpIsRefusedByName) {
  // Matrix work is extern: the host generator refuses it.
  const auto t = TensorType::contiguous(DType::kFloat32, {2, 3, 3});
  const ir::Graph g = ir::single_op(OpKind::Bmm, {t, t});
  try {
    generate_host_kernel(g, "k");
    FAIL() << "expected an error";
  } catch (const runtime::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bmm"), std::string::npos) << e.what();
  }
}

// Reductions: the output is passed in the input's dims, stride 0 where reduced.
TEST(HostCodegenReductions, MatchTheInterpreter) {
  struct ReductionCase {
    OpKind op;
    TensorType input;
    std::vector<std::int64_t> dims;
    bool keepdim;
  };
  const std::vector<ReductionCase> specs = {
      {OpKind::Sum, TensorType::contiguous(DType::kFloat32, {6, 7}), {1}, false},
      {OpKind::Sum, TensorType::contiguous(DType::kFloat32, {6, 7}), {0}, true},
      {OpKind::Sum, TensorType::contiguous(DType::kFloat32, {3, 4, 5}), {}, false},
      {OpKind::Mean, TensorType::contiguous(DType::kFloat32, {3, 4, 5}), {0, 2}, false},
      {OpKind::Mean, TensorType::contiguous(DType::kBFloat16, {4, 9}), {-1}, true},
      {OpKind::Prod, TensorType::contiguous(DType::kFloat64, {5, 3}), {1}, false},
      {OpKind::Amax, TensorType::contiguous(DType::kFloat32, {4, 6}), {1}, false},
      {OpKind::Amin, TensorType::contiguous(DType::kInt32, {4, 6}), {0}, false},
      {OpKind::Sum, TensorType::contiguous(DType::kInt64, {4, 6}), {1}, false},
      {OpKind::Sum, TensorType{DType::kFloat32, {5, 4}, {1, 5}}, {1}, false},  // transposed input
      {OpKind::Sum, TensorType::contiguous(DType::kFloat32, {0, 3}), {0}, false},  // empty reduction
      // Beyond the 32 lanes: long rows (unit stride and strided) and columns
      // wide enough for whole groups of neighbouring outputs.
      {OpKind::Sum, TensorType::contiguous(DType::kFloat32, {3, 100}), {1}, false},
      {OpKind::Amax, TensorType::contiguous(DType::kFloat32, {3, 100}), {-1}, true},
      {OpKind::Mean, TensorType{DType::kFloat32, {5, 70}, {1, 5}}, {1}, false},
      {OpKind::Sum, TensorType::contiguous(DType::kFloat32, {9, 70}), {0}, false},
      {OpKind::Amin, TensorType::contiguous(DType::kBFloat16, {4, 3, 40}), {0, 1}, false},
      {OpKind::Sum, TensorType::contiguous(DType::kInt64, {2, 50, 3}), {1}, false},
      // Several trailing reduced dims make one row (a batch norm's statistics
      // over N, H, W): nested in memory (contiguous; channels-last, whose row
      // runs with stride C), and not nested (H and W swapped in memory).
      {OpKind::Sum, TensorType::contiguous(DType::kFloat32, {4, 3, 5, 7}), {0, 2, 3}, true},
      {OpKind::Mean, TensorType{DType::kFloat32, {4, 3, 5, 7}, {105, 1, 21, 3}}, {0, 2, 3}, false},
      {OpKind::Amax, TensorType{DType::kFloat32, {4, 3, 5, 7}, {105, 35, 1, 5}}, {0, 2, 3}, true},
      {OpKind::Sum, TensorType{DType::kFloat32, {3, 6, 9}, {54, 1, 6}}, {}, false},
  };
  std::mt19937 rng(3);
  std::vector<Case> cases;
  std::vector<GeneratedKernel> kernels;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto& spec = specs[i];
    Case c;
    c.symbol = "r" + std::to_string(i);
    c.graph = ir::single_op(spec.op, {spec.input}, {{"dims", spec.dims}, {"keepdim", spec.keepdim}});
    c.inputs.push_back(random_buffer(spec.input, rng, spec.op == OpKind::Prod));
    kernels.push_back(generate_host_kernel(c.graph, c.symbol));
    cases.push_back(std::move(c));
  }
  const auto library = KernelLibrary::load(testing::compile_once(host_translation_unit(kernels)));
  for (std::size_t i = 0; i < cases.size(); ++i) {
    Case& c = cases[i];
    const auto& spec = specs[i];
    const TensorType& in_type = spec.input;
    const TensorType out_type = c.graph.type(c.graph.outputs()[0]);
    ir::Buffer out = ir::Buffer::zeros(out_type);
    ir::Buffer in = c.inputs[0];
    const auto rank = static_cast<std::size_t>(in_type.rank());
    std::vector<bool> reduced(rank, spec.dims.empty());
    for (auto d : spec.dims) reduced[static_cast<std::size_t>(d < 0 ? d + static_cast<std::int64_t>(rank) : d)] = true;
    VtpuTensorArg args[2] = {};
    args[0].data = out.bytes.data();
    args[1].data = in.bytes.data();
    std::size_t out_dim = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      args[1].sizes[d] = args[0].sizes[d] = in_type.sizes[d];
      args[1].strides[d] = in_type.strides[d];
      if (reduced[d]) {
        args[0].strides[d] = 0;
        if (spec.keepdim) ++out_dim;
      } else {
        args[0].strides[d] = out_type.strides[out_dim++];
      }
    }
    VtpuLaunchArgs launch{kLaunchAbiVersion, static_cast<std::int32_t>(rank), 2, args, nullptr, &threaded_for, nullptr, nullptr};
    library.get(c.symbol)(&launch);
    expect_matches_interpreter(c, {out});
  }
}

TEST(HostCodegenErrors, CompilerDiagnosticsAreReported) {
  const SystemCompiler compiler;
  try {
    compiler.compile("this is not C++");
    FAIL() << "expected an error";
  } catch (const runtime::Error& e) {
    EXPECT_EQ(e.kind(), runtime::ErrorKind::kRuntime);
    EXPECT_NE(std::string(e.what()).find("failed"), std::string::npos);
  }
}

// A compiler run that ends by a signal (a busy machine's OOM killer) is tried
// once more, and the error says how it ended: a fresh clone's test run once
// printed "c++ failed:" and nothing else.
TEST(HostCodegenErrors, AKilledCompilerIsRetriedOnceAndNamed) {
  ::vtpu::testing::TempDir dir;
  const std::string script = dir.sub("killed-cxx");
  const std::string runs = dir.sub("runs");
  {
    std::ofstream out(script);
    out << "#!/bin/sh\nif [ \"$1\" = --version ]; then echo killed-cxx 1.0; exit 0; fi\n"
        << "echo run >> '" << runs << "'\nkill -9 $$\n";
  }
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  const SystemCompiler compiler(script);
  try {
    compiler.compile("int x;");
    FAIL() << "expected an error";
  } catch (const runtime::Error& e) {
    EXPECT_NE(std::string(e.what()).find("killed by signal 9"), std::string::npos) << e.what();
  }
  std::ifstream in(runs);
  std::string line;
  int count = 0;
  while (std::getline(in, line)) ++count;
  EXPECT_EQ(count, 2);
}

TEST(HostCodegenErrors, GarbageBytesDoNotLoad) {
  EXPECT_THROW(KernelLibrary::load(std::vector<std::uint8_t>(100, 7)), runtime::Error);
}

}  // namespace
}  // namespace vtpu::compiler
