// The hardware layer's targets against each other. The cuda target's
// generated source compiles with nvcc wherever nvcc is installed (the CI
// machine has one, no GPU); where a GPU is present, every case runs on the
// host and the cuda target and the results are compared: bitwise where the
// host computes without the C library (cuda_codegen.h says why they agree),
// within a few ulp for C-library functions.
#include "vtpu/targets/target.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <future>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "vtpu/cache/disk_tier.h"
#include "vtpu/cache/memory_tier.h"
#include "vtpu/compiler/cuda_codegen.h"
#include "vtpu/compiler/cuda_cubin_cache.h"
#include "vtpu/compiler/host_codegen.h"
#include "vtpu/compiler/nvcc_compiler.h"
#include "vtpu/ir/interpreter.h"
#include "vtpu/runtime/error.h"

namespace vtpu::targets {
namespace {

using ir::Attributes;
using ir::DType;
using ir::OpKind;
using ir::TensorType;

struct Case {
  std::string name;
  ir::Graph graph;
  std::vector<ir::Buffer> inputs;
  bool exact = true;  // false: the host calls the C library; compared within ulps
};

// Random values with the awkward ones mixed in: NaN, infinities, signed
// zeros, a float32 subnormal, huge values, halfway cases of rounding.
ir::Buffer special_buffer(const TensorType& type, std::mt19937& rng, bool positive) {
  const std::int64_t extent = type.storage_extent();
  std::vector<double> values(static_cast<std::size_t>(extent));
  std::uniform_real_distribution<double> real(positive ? 0.05 : -4.0, 4.0);
  std::uniform_int_distribution<int> integer(positive ? 1 : -120, 120);
  const double specials[] = {std::numeric_limits<double>::quiet_NaN(), INFINITY, -INFINITY, -0.0, 0.0, 1e-40,
                             3e38, -3e38, 0.5, 2.5, -1.5, 1e10, -7e9, 300.0, -129.0};
  std::uniform_int_distribution<int> pick(0, 7);
  std::uniform_int_distribution<int> which(0, static_cast<int>(std::size(specials)) - 1);
  for (auto& v : values) {
    if (type.dtype == DType::kBool) {
      v = integer(rng) & 1;
    } else if (!ir::is_floating(type.dtype)) {
      v = integer(rng);
    } else if (!positive && pick(rng) == 0) {
      v = specials[which(rng)];
    } else {
      v = real(rng);
    }
  }
  ir::Buffer flat = ir::make_buffer(type.dtype, {extent}, values);
  ir::Buffer buffer = ir::Buffer::zeros(type);
  std::memcpy(buffer.bytes.data(), flat.bytes.data(), flat.bytes.size());
  return buffer;
}

TensorType strided(DType dtype, std::vector<std::int64_t> sizes, std::vector<std::int64_t> strides) {
  return TensorType{dtype, std::move(sizes), std::move(strides)};
}

std::vector<Case> make_cases() {
  std::vector<Case> cases;
  std::mt19937 rng(2026);
  auto add = [&](OpKind op, std::vector<TensorType> types, Attributes attrs = {}, bool exact = true,
                 bool positive = false) {
    Case c;
    c.name = std::string(ir::name(op)) + "_" + std::to_string(cases.size());
    c.graph = ir::single_op(op, types, attrs);
    for (const auto& t : types) c.inputs.push_back(special_buffer(t, rng, positive));
    c.exact = exact;
    cases.push_back(std::move(c));
  };
  const auto f32 = TensorType::contiguous(DType::kFloat32, {7, 129});
  // float32 through the engine's own math and IEEE arithmetic: exact.
  for (OpKind op : {OpKind::Neg, OpKind::Abs, OpKind::Exp, OpKind::Log, OpKind::Tanh, OpKind::Sigmoid, OpKind::Relu,
                    OpKind::Silu, OpKind::Erf, OpKind::Sqrt, OpKind::Rsqrt, OpKind::Reciprocal, OpKind::Floor,
                    OpKind::Ceil, OpKind::Round, OpKind::Trunc, OpKind::Sign, OpKind::IsNan, OpKind::IsInf,
                    OpKind::IsFinite, OpKind::LogicalNot})
    add(op, {f32});
  add(OpKind::Gelu, {f32});
  add(OpKind::Gelu, {f32}, {{"approximate", std::string("tanh")}});
  for (OpKind op : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Maximum, OpKind::Minimum, OpKind::Eq,
                    OpKind::Lt, OpKind::Ge, OpKind::Fmod, OpKind::Remainder, OpKind::LogicalAnd, OpKind::LogicalXor,
                    OpKind::ThresholdBackward, OpKind::GeluBackward, OpKind::SigmoidBackward, OpKind::TanhBackward,
                    OpKind::SiluBackward})
    add(op, {f32, f32});
  add(OpKind::Add, {f32, f32}, {{"alpha", 2.5}});
  add(OpKind::Sub, {f32, f32}, {{"alpha", -0.75}});
  add(OpKind::Div, {f32, f32}, {{"rounding_mode", std::string("trunc")}});
  add(OpKind::Div, {f32, f32}, {{"rounding_mode", std::string("floor")}});
  // C-library functions: within a few ulp.
  for (OpKind op : {OpKind::Sin, OpKind::Cos, OpKind::Tan, OpKind::Exp2, OpKind::Log2, OpKind::Log10, OpKind::Log1p,
                    OpKind::Expm1, OpKind::Atan, OpKind::Sinh, OpKind::Cosh, OpKind::Asin})
    add(op, {f32}, {}, false, op != OpKind::Asin);
  add(OpKind::Atan2, {f32, f32}, {}, false);
  add(OpKind::Pow, {f32, f32}, {}, false, true);
  // Other dtypes: 16-bit floats compute in float32 and round to nearest even.
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    const auto t = TensorType::contiguous(dt, {5, 77});
    for (OpKind op : {OpKind::Add, OpKind::Mul, OpKind::Div}) add(op, {t, t});
    for (OpKind op : {OpKind::Exp, OpKind::Tanh, OpKind::Sigmoid}) add(op, {t});
    add(OpKind::Mul, {t, TensorType::contiguous(DType::kFloat32, {5, 77})});  // promotes to float32
  }
  const auto f64 = TensorType::contiguous(DType::kFloat64, {3, 50});
  for (OpKind op : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div})
    add(op, {f64, f64});
  add(OpKind::Sqrt, {f64});
  add(OpKind::Exp, {f64}, {}, false);
  add(OpKind::Tanh, {f64}, {}, false);
  for (DType dt : {DType::kInt64, DType::kInt32, DType::kInt16, DType::kInt8, DType::kUInt8}) {
    const auto t = TensorType::contiguous(dt, {4, 61});
    for (OpKind op : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::BitwiseXor, OpKind::Maximum}) add(op, {t, t});
    add(OpKind::Div, {t, t}, {{"rounding_mode", std::string("floor")}}, true, true);
    add(OpKind::Remainder, {t, t}, {}, true, true);
    add(OpKind::Pow, {t, t}, {}, true, true);
    // float -> integer through NaN, infinities and out-of-range values.
    add(OpKind::Cast, {f32}, {{"dtype", dt}});
    add(OpKind::Cast, {t}, {{"dtype", DType::kFloat32}});
  }
  const auto b = TensorType::contiguous(DType::kBool, {4, 61});
  add(OpKind::LogicalOr, {b, b});
  add(OpKind::BitwiseAnd, {b, b});
  add(OpKind::Cast, {f32}, {{"dtype", DType::kBFloat16}});
  add(OpKind::Cast, {f32}, {{"dtype", DType::kFloat16}});
  add(OpKind::Cast, {f32}, {{"dtype", DType::kBool}});
  // Promotion: int32 + float32, bf16 * float32.
  add(OpKind::Add, {TensorType::contiguous(DType::kInt32, {6, 9}), TensorType::contiguous(DType::kFloat32, {6, 9})});
  // Layouts: broadcasts, stride-0 expansion, transposed, sliced and permuted views.
  add(OpKind::Add, {TensorType::contiguous(DType::kFloat32, {4, 1, 5}), TensorType::contiguous(DType::kFloat32, {3, 1})});
  add(OpKind::Mul, {strided(DType::kFloat32, {6, 4}, {1, 6}), TensorType::contiguous(DType::kFloat32, {6, 4})});
  add(OpKind::Sub, {strided(DType::kFloat32, {5, 7}, {0, 1}), strided(DType::kFloat32, {5, 7}, {14, 2})});
  add(OpKind::Exp, {strided(DType::kFloat32, {3, 4, 5}, {40, 1, 8})});
  add(OpKind::Mul, {strided(DType::kFloat32, {2, 3, 4, 37}, {444, 37, 111, 1}),
                    TensorType::contiguous(DType::kFloat32, {3, 1, 37})});
  add(OpKind::Add, {TensorType::contiguous(DType::kFloat32, {2, 1, 3, 1, 2, 3}),
                    TensorType::contiguous(DType::kFloat32, {3, 1, 2, 1})});
  add(OpKind::Mul, {TensorType::contiguous(DType::kFloat32, {}), TensorType::contiguous(DType::kFloat32, {})});
  add(OpKind::Add, {TensorType::contiguous(DType::kFloat32, {0, 3}), TensorType::contiguous(DType::kFloat32, {0, 3})});
  // Past one grid's worth of elements (the grid-stride loop goes round).
  add(OpKind::Silu, {TensorType::contiguous(DType::kFloat32, {(1 << 21) + 7})});
  // Ternary ops.
  const auto cond = TensorType::contiguous(DType::kBool, {7, 129});
  add(OpKind::Where, {cond, f32, f32});
  add(OpKind::Lerp, {f32, f32, f32});
  add(OpKind::Addcmul, {f32, f32, f32}, {{"value", 0.5}});
  add(OpKind::Addcdiv, {f32, f32, f32}, {{"value", -2.0}});
  add(OpKind::Clamp, {f32, f32, f32}, {{"has_min", true}, {"has_max", true}});
  add(OpKind::MaskedFill, {f32, cond, TensorType::contiguous(DType::kFloat32, {})});
  // A fused chain with constants (launch scalars) and two outputs:
  // y = tanh(x * 2.0) + w; z = sigmoid(y) as bfloat16.
  {
    Case c;
    c.name = "fused_chain";
    const auto x = c.graph.add_input(f32);
    const auto w = c.graph.add_input(TensorType::contiguous(DType::kFloat32, {129}));
    const auto k = c.graph.add_node(OpKind::Constant, {}, {{"value", 2.0}});
    const auto t = c.graph.add_node(OpKind::Tanh, {c.graph.add_node(OpKind::Mul, {x, k})});
    const auto y = c.graph.add_node(OpKind::Add, {t, w});
    const auto z = c.graph.add_node(OpKind::Cast, {c.graph.add_node(OpKind::Sigmoid, {y})},
                                    {{"dtype", DType::kBFloat16}});
    c.graph.mark_output(y);
    c.graph.mark_output(z);
    c.inputs.push_back(special_buffer(f32, rng, false));
    c.inputs.push_back(special_buffer(TensorType::contiguous(DType::kFloat32, {129}), rng, false));
    cases.push_back(std::move(c));
  }
  // Signed overflow wraps on both targets (nvcc has no -fwrapv: without the
  // wrapping helpers it folded x + y > x into y > 0): a fused add-compare,
  // negation and absolute value of the minimum, products that overflow.
  for (DType dt : {DType::kInt32, DType::kInt64}) {
    const std::int64_t max = dt == DType::kInt32 ? INT32_MAX : INT64_MAX;
    const std::int64_t min = dt == DType::kInt32 ? INT32_MIN : INT64_MIN;
    const auto t = TensorType::contiguous(dt, {6});
    Case c;
    c.name = std::string("wrap_") + std::string(ir::name(dt));
    const auto x = c.graph.add_input(t), y = c.graph.add_input(t);
    const auto sum = c.graph.add_node(OpKind::Add, {x, y});
    c.graph.mark_output(c.graph.add_node(OpKind::Gt, {sum, x}));
    c.graph.mark_output(c.graph.add_node(OpKind::Mul, {c.graph.add_node(OpKind::Neg, {x}), y}));
    c.graph.mark_output(c.graph.add_node(OpKind::Abs, {c.graph.add_node(OpKind::Sub, {x, y})}));
    c.inputs.push_back(ir::make_int_buffer(dt, {6}, {max, min, 5, -7, max, min}));
    c.inputs.push_back(ir::make_int_buffer(dt, {6}, {1, -1, max, min, max, 0}));
    cases.push_back(std::move(c));
  }
  return cases;
}

// The launch description of a graph input on the output's iteration shape:
// right-aligned, stride 0 along broadcast dims.
compiler::VtpuTensorArg broadcast_arg(void* data, const TensorType& t, const std::vector<std::int64_t>& out_sizes) {
  compiler::VtpuTensorArg arg{};
  arg.data = data;
  const std::size_t pad = out_sizes.size() - t.sizes.size();
  for (std::size_t d = 0; d < out_sizes.size(); ++d) {
    arg.sizes[d] = out_sizes[d];
    if (d >= pad) {
      const std::size_t k = d - pad;
      arg.strides[d] = (t.sizes[k] == 1 && out_sizes[d] != 1) ? 0 : t.strides[k];
    }
  }
  return arg;
}

// Device memory of a target, released on scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer(Target& target, std::size_t bytes) : target_(target), data_(target.allocate(bytes)) {}
  ~DeviceBuffer() { target_.release(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return data_; }

 private:
  Target& target_;
  void* data_;
};

// Runs a case on `target`: inputs copied in, one contiguous output per graph
// output (filled with 0x5A first, so an unwritten element shows), copied back.
std::vector<ir::Buffer> run_case(Target& target, const CompiledKernel& kernel, const Case& c) {
  const auto& out_sizes = c.graph.type(c.graph.outputs().front()).sizes;
  std::vector<std::unique_ptr<DeviceBuffer>> memory;
  std::vector<compiler::VtpuTensorArg> args;
  std::vector<ir::Buffer> outputs;
  for (ir::ValueId id : c.graph.outputs()) {
    ir::Buffer out = ir::Buffer::zeros(c.graph.type(id));
    std::fill(out.bytes.begin(), out.bytes.end(), 0x5A);
    memory.push_back(std::make_unique<DeviceBuffer>(target, out.bytes.size()));
    target.copy_from_host(memory.back()->data(), out.bytes.data(), out.bytes.size());
    args.push_back(broadcast_arg(memory.back()->data(), out.type, out_sizes));
    outputs.push_back(std::move(out));
  }
  for (const ir::Buffer& in : c.inputs) {
    memory.push_back(std::make_unique<DeviceBuffer>(target, in.bytes.size()));
    target.copy_from_host(memory.back()->data(), in.bytes.data(), in.bytes.size());
    args.push_back(broadcast_arg(memory.back()->data(), in.type, out_sizes));
  }
  const std::vector<double> scalars = compiler::launch_scalars(c.graph);
  target.launch(kernel, args, static_cast<int>(out_sizes.size()), scalars);
  target.synchronize();
  for (std::size_t k = 0; k < outputs.size(); ++k)
    target.copy_to_host(outputs[k].bytes.data(), memory[k]->data(), outputs[k].bytes.size());
  return outputs;
}

// The same bits, except that a NaN matches any NaN: a GPU's arithmetic
// returns one canonical NaN where x86 keeps the operand's payload and sign
// (CUDA and the CPU differ there in PyTorch as well).
::testing::AssertionResult same_bits(const ir::Buffer& expected, const ir::Buffer& actual) {
  if (expected.bytes == actual.bytes) return ::testing::AssertionSuccess();
  const std::size_t item = ir::itemsize(expected.type.dtype);
  const std::vector<double> e = ir::to_doubles(expected), a = ir::to_doubles(actual);
  for (std::size_t i = 0; i < e.size(); ++i) {
    if (std::isnan(e[i]) && std::isnan(a[i])) continue;
    if (std::memcmp(expected.bytes.data() + i * item, actual.bytes.data() + i * item, item) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": host " << e[i] << ", cuda " << a[i];
  }
  return ::testing::AssertionSuccess();
}

// Values within `ulps` units in the last place of their dtype (NaN matches NaN).
::testing::AssertionResult close_in_ulps(const ir::Buffer& expected, const ir::Buffer& actual, double ulps) {
  const std::vector<double> e = ir::to_doubles(expected), a = ir::to_doubles(actual);
  const double epsilon = expected.type.dtype == DType::kFloat64 ? 0x1p-52 : 0x1p-23;
  for (std::size_t i = 0; i < e.size(); ++i) {
    if (std::isnan(e[i]) && std::isnan(a[i])) continue;
    if (e[i] == a[i]) continue;
    if (!std::isfinite(e[i]) || !std::isfinite(a[i]))  // an infinity matches only itself
      return ::testing::AssertionFailure() << "element " << i << ": host " << e[i] << ", cuda " << a[i];
    const double scale = std::max(std::fabs(e[i]), 1e-30);
    if (std::fabs(e[i] - a[i]) <= ulps * epsilon * scale) continue;
    return ::testing::AssertionFailure() << "element " << i << ": host " << e[i] << ", cuda " << a[i];
  }
  return ::testing::AssertionSuccess();
}

TEST(TargetTest, HostTargetMatchesTheInterpreter) {
  std::unique_ptr<Target> host = make_host_target();
  EXPECT_EQ(host->name(), "host");
  std::mt19937 rng(3);
  const auto t = TensorType::contiguous(DType::kFloat32, {3, 40});
  Case c;
  c.graph = ir::single_op(OpKind::Mul, {t, TensorType::contiguous(DType::kFloat32, {40})});
  c.inputs = {special_buffer(t, rng, true), special_buffer(TensorType::contiguous(DType::kFloat32, {40}), rng, true)};
  const auto kernel = host->compile(c.graph);
  const std::vector<ir::Buffer> got = run_case(*host, *kernel, c);
  const std::vector<ir::Buffer> want = ir::interpret(c.graph, c.inputs);
  EXPECT_EQ(ir::to_doubles(got[0]), ir::to_doubles(want[0]));
  // The same graph again is the same kernel (compiled once).
  EXPECT_EQ(host->compile(c.graph).get(), kernel.get());
  // A launch that does not match the kernel is refused before it runs: too
  // few tensors, another rank, a missing scalar, a negative size.
  std::vector<compiler::VtpuTensorArg> args(3);
  for (auto& a : args) a.sizes[0] = 3, a.sizes[1] = 40;
  auto refused = [&](std::span<const compiler::VtpuTensorArg> tensors, int rank, std::vector<double> scalars) {
    try {
      host->launch(*kernel, tensors, rank, scalars);
    } catch (const runtime::Error& e) {
      return std::string(e.what()).find("launch refused") != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(refused(std::span(args).first(2), 2, {}));
  EXPECT_TRUE(refused(args, 1, {}));
  EXPECT_TRUE(refused(args, 2, {1.0}));
  args[1].sizes[0] = -3;
  EXPECT_TRUE(refused(args, 2, {}));
}

// The wrapping cases on the host target give two's-complement results (the
// cuda target must give the same: CudaMatchesHost).
TEST(TargetTest, HostIntegerArithmeticWraps) {
  std::unique_ptr<Target> host = make_host_target();
  for (const Case& c : make_cases()) {
    if (c.name != "wrap_int32") continue;
    const std::vector<ir::Buffer> out = run_case(*host, *host->compile(c.graph), c);
    // x + y > x for x = (max, min, 5, -7, max, min), y = (1, -1, max, min, max, 0):
    // wrapped sums (min, max, <0, max-6, -2, min); y > 0 would give 1 0 1 0 1 0.
    EXPECT_EQ(ir::to_int64s(out[0]), (std::vector<std::int64_t>{0, 1, 0, 1, 0, 0}));
    // -x * y: -max * 1, -min (= min) * -1 (= min), -5 * max, 7 * min (wraps to min), -max * max, 0.
    EXPECT_EQ(ir::to_int64s(out[1]),
              (std::vector<std::int64_t>{-INT32_MAX, INT32_MIN, static_cast<std::int32_t>(-5LL * INT32_MAX), INT32_MIN,
                                         static_cast<std::int32_t>(-static_cast<std::int64_t>(INT32_MAX) * INT32_MAX), 0}));
    return;
  }
  FAIL() << "no wrap_int32 case";
}

TEST(TargetTest, TargetsRefuseWhatTheirLaunchContractDoesNotCover) {
  const auto t = TensorType::contiguous(DType::kFloat32, {3, 4});
  const ir::Graph sum = ir::single_op(OpKind::Sum, {t}, {{"dims", std::vector<std::int64_t>{1}}, {"keepdim", false}});
  std::string why;
  EXPECT_FALSE(compiler::cuda_codegen_supports(sum, &why));
  EXPECT_NE(why.find("not an elementwise op"), std::string::npos) << why;
  EXPECT_THROW(compiler::generate_cuda_kernel(sum, "k"), runtime::Error);
  std::unique_ptr<Target> host = make_host_target();
  EXPECT_FALSE(host->compiles(sum, &why));
  EXPECT_THROW(host->compile(sum), runtime::Error);
  // More tensors than the cuda launch ABI carries.
  ir::Graph wide;
  ir::ValueId acc = wide.add_input(t);
  for (int i = 0; i < compiler::kCudaMaxTensors; ++i) acc = wide.add_node(OpKind::Add, {acc, wide.add_input(t)});
  wide.mark_output(acc);
  EXPECT_FALSE(compiler::cuda_codegen_supports(wide, &why));
  EXPECT_NE(why.find("tensors"), std::string::npos) << why;
  EXPECT_EQ(make_target("tpu", &why), nullptr);
  EXPECT_NE(why.find("no target named 'tpu'"), std::string::npos) << why;
}

// Every case's cuda source, in one translation unit, through nvcc for
// Hopper (sm_90): the generated code is valid CUDA wherever nvcc exists.
TEST(TargetTest, CudaSourceCompilesWithNvcc) {
  std::string why;
  std::unique_ptr<compiler::NvccCompiler> nvcc = compiler::NvccCompiler::find(&why);
  if (nvcc == nullptr) GTEST_SKIP() << "no nvcc on this machine: " << why;
  std::vector<compiler::GeneratedKernel> kernels;
  const std::vector<Case> cases = make_cases();
  for (std::size_t i = 0; i < cases.size(); ++i)
    kernels.push_back(compiler::generate_cuda_kernel(cases[i].graph, "k" + std::to_string(i)));
  const std::vector<std::uint8_t> cubin = nvcc->compile(compiler::cuda_translation_unit(kernels), "sm_90");
  ASSERT_GT(cubin.size(), 4u);
  EXPECT_EQ(std::memcmp(cubin.data(), "\x7f" "ELF", 4), 0);  // a cubin is an ELF image
  std::cout << "[ nvcc     ] " << kernels.size() << " kernels in one cubin for sm_90 (" << nvcc->identity() << ")\n";
  // A source error comes back as an Error carrying nvcc's diagnostics.
  try {
    nvcc->compile("this is not CUDA", "sm_90");
    ADD_FAILURE() << "nvcc accepted garbage";
  } catch (const runtime::Error& e) {
    EXPECT_NE(std::string(e.what()).find("nvcc failed"), std::string::npos) << e.what();
  }
}

// Cubins live in the compile cache: a second cache over the same directory
// (a warm process) gets the bytes without building; another architecture or
// another source is another key.
TEST(TargetTest, CudaCubinsGoThroughTheCompileCache) {
  std::string why;
  std::unique_ptr<compiler::NvccCompiler> nvcc = compiler::NvccCompiler::find(&why);
  if (nvcc == nullptr) GTEST_SKIP() << "no nvcc on this machine: " << why;
  vtpu::testing::TempDir dir;
  auto disk_cache = [&] {
    return std::make_unique<cache::CompileCache>(std::vector<std::shared_ptr<cache::CacheTier>>{
        std::make_shared<cache::MemoryTier>(std::size_t{1} << 20),
        std::make_shared<cache::DiskTier>(cache::DiskTier::Options{dir.path()})});
  };
  const ir::Graph graph = ir::single_op(OpKind::Silu, {TensorType::contiguous(DType::kFloat32, {8})});
  const std::string source = compiler::cuda_translation_unit({compiler::generate_cuda_kernel(graph, "k")});
  std::vector<std::uint8_t> cold;
  {
    auto cold_cache = disk_cache();
    cold = compiler::cuda_cubin(cold_cache.get(), *nvcc, source, "sm_90");
    EXPECT_EQ(cold_cache->stats().builds, 1u);
    EXPECT_EQ(compiler::cuda_cubin(cold_cache.get(), *nvcc, source, "sm_90"), cold);
    EXPECT_EQ(cold_cache->stats().builds, 1u);
  }
  auto warm_cache = disk_cache();
  EXPECT_EQ(compiler::cuda_cubin(warm_cache.get(), *nvcc, source, "sm_90"), cold);
  EXPECT_EQ(warm_cache->stats().builds, 0u);
  EXPECT_EQ(warm_cache->stats().hits_in("disk"), 1u);
  EXPECT_NE(compiler::cuda_cubin_key(*nvcc, source, "sm_80"), compiler::cuda_cubin_key(*nvcc, source, "sm_90"));
  EXPECT_NE(compiler::cuda_cubin_key(*nvcc, source + " ", "sm_90"), compiler::cuda_cubin_key(*nvcc, source, "sm_90"));
}

TEST(TargetTest, CudaMatchesHost) {
  std::string why;
  std::unique_ptr<Target> cuda = make_cuda_target(&why);
  if (cuda == nullptr) GTEST_SKIP() << "the cuda target is unavailable here: " << why;
  std::unique_ptr<Target> host = make_host_target();
  std::cout << "[ cuda     ] " << cuda->description() << "\n";
  const std::vector<Case> cases = make_cases();
  // Compile the cases for both targets 16 at a time (nvcc and the host
  // compiler are separate processes).
  using KernelPair = std::pair<std::shared_ptr<const CompiledKernel>, std::shared_ptr<const CompiledKernel>>;
  std::vector<KernelPair> compiled;
  for (std::size_t first = 0; first < cases.size(); first += 16) {
    std::vector<std::future<KernelPair>> batch;
    for (std::size_t i = first; i < std::min(cases.size(), first + 16); ++i)
      batch.push_back(std::async(std::launch::async, [&, i] {
        return std::make_pair(host->compile(cases[i].graph), cuda->compile(cases[i].graph));
      }));
    for (auto& f : batch) compiled.push_back(f.get());
  }
  int exact = 0, close = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    const auto& [host_kernel, cuda_kernel] = compiled[i];
    const std::vector<ir::Buffer> want = run_case(*host, *host_kernel, cases[i]);
    const std::vector<ir::Buffer> got = run_case(*cuda, *cuda_kernel, cases[i]);
    ASSERT_EQ(want.size(), got.size());
    for (std::size_t k = 0; k < want.size(); ++k) {
      if (cases[i].exact) {
        EXPECT_TRUE(same_bits(want[k], got[k])) << "output " << k;
        ++exact;
      } else {
        EXPECT_TRUE(close_in_ulps(want[k], got[k], 4)) << "output " << k;
        ++close;
      }
    }
  }
  std::cout << "[ cuda     ] " << exact << " outputs bitwise equal to the host's, " << close
            << " within 4 ulp (C-library functions)\n";
}

TEST(TargetTest, CudaReportsErrorsWithoutAborting) {
  std::string why;
  std::unique_ptr<Target> cuda = make_cuda_target(&why);
  if (cuda == nullptr) GTEST_SKIP() << "the cuda target is unavailable here: " << why;
  // More memory than any GPU has: the engine's out-of-memory error, and the
  // target still works afterwards.
  EXPECT_THROW(cuda->allocate(std::size_t{1} << 50), runtime::OutOfMemoryError);
  void* data = cuda->allocate(64);
  const float values[4] = {1, 2, 3, 4};
  float back[4] = {};
  cuda->copy_from_host(data, values, sizeof(values));
  cuda->copy_to_host(back, data, sizeof(back));
  cuda->release(data);
  EXPECT_EQ(std::memcmp(values, back, sizeof(values)), 0);
  // A host kernel is not a cuda kernel.
  std::unique_ptr<Target> host = make_host_target();
  const auto host_kernel = host->compile(ir::single_op(OpKind::Neg, {TensorType::contiguous(DType::kFloat32, {4})}));
  compiler::VtpuTensorArg arg{};
  std::vector<compiler::VtpuTensorArg> args = {arg, arg};
  EXPECT_THROW(cuda->launch(*host_kernel, args, 1, {}), runtime::Error);
  // A kernel outlives its target: its module is unloaded with the context
  // still retained (the kernel holds it), without an error.
  auto kernel = cuda->compile(ir::single_op(OpKind::Neg, {TensorType::contiguous(DType::kFloat32, {4})}));
  cuda.reset();
  kernel.reset();
}

}  // namespace
}  // namespace vtpu::targets
