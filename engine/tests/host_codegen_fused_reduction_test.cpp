// A reduction fused with elementwise work (host_codegen_fused_reduction.cpp)
// against the unfused pair of kernels strict mode runs: the elementwise
// kernel storing the reduction's input (and any other results), then the
// single-op reduction kernel reading it. Fused mode promises strict's bits,
// so every output must be byte-identical: rows and columns, sum/mean/amax/
// prod, float32 and bfloat16, a broadcast operand, a strided operand, an
// extra stored result, launched serially and on four threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
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

using ir::DType;
using ir::OpKind;
using ir::TensorType;
using ir::ValueId;
using Ints = std::vector<std::int64_t>;

// The elementwise part: builds nodes over `inputs` and returns the value the
// reduction reads, appending any other result that must be stored to `extra`.
using Prologue = std::function<ValueId(ir::Graph&, const std::vector<ValueId>& inputs, std::vector<ValueId>& extra)>;

struct Spec {
  std::string name;
  std::vector<TensorType> inputs;  // in the iteration space (broadcast: stride 0)
  Prologue prologue;
  OpKind reduction;
  Ints dims;
  bool keepdim;
};

struct Built {
  ir::Graph fused, elementwise, reduce;
  ValueId fused_reduction = -1;
};

Built build(const Spec& spec) {
  Built b;
  auto make = [&](ir::Graph& g, bool with_reduction) {
    std::vector<ValueId> in;
    for (const TensorType& t : spec.inputs) in.push_back(g.add_input(t));
    std::vector<ValueId> extra;
    const ValueId value = spec.prologue(g, in, extra);
    if (with_reduction) {
      b.fused_reduction = g.add_node(spec.reduction, {value}, {{"dims", spec.dims}, {"keepdim", spec.keepdim}});
      g.mark_output(b.fused_reduction);
    } else {
      g.mark_output(value);
    }
    for (ValueId e : extra) g.mark_output(e);
  };
  make(b.fused, true);
  make(b.elementwise, false);
  const TensorType stored = TensorType::contiguous(b.elementwise.type(b.elementwise.outputs()[0]).dtype,
                                                   spec.inputs[0].sizes);
  b.reduce = ir::single_op(spec.reduction, {stored}, {{"dims", spec.dims}, {"keepdim", spec.keepdim}});
  return b;
}

ir::Buffer random_buffer(const TensorType& type, std::mt19937& rng) {
  ir::Buffer buffer = ir::Buffer::zeros(type);
  const std::int64_t extent = std::max<std::int64_t>(1, type.storage_extent());
  std::vector<double> values(static_cast<std::size_t>(extent));
  std::uniform_real_distribution<double> real(-2.0, 2.0);
  for (auto& v : values) v = real(rng);
  ir::Buffer flat = ir::make_buffer(type.dtype, {extent}, values);
  std::memcpy(buffer.bytes.data(), flat.bytes.data(), std::min(flat.bytes.size(), buffer.bytes.size()));
  return buffer;
}

void four_threads(std::int64_t total, std::int64_t grain, VtpuParallelBody body, void* context, void*) {
  std::vector<std::thread> threads;
  const std::int64_t chunk = std::max<std::int64_t>(1, std::min(grain, (total + 3) / 4));
  for (std::int64_t begin = 0; begin < total; begin += chunk)
    threads.emplace_back([=] { body(begin, std::min(total, begin + chunk), context); });
  for (auto& t : threads) t.join();
}

// The reduction's output described in the input's dims (stride 0 where reduced).
VtpuTensorArg reduction_out_arg(void* data, const Spec& spec, const TensorType& out_type) {
  const auto rank = static_cast<std::int64_t>(spec.inputs[0].rank());
  std::vector<bool> reduced(static_cast<std::size_t>(rank), spec.dims.empty());
  for (auto d : spec.dims) reduced[static_cast<std::size_t>(d < 0 ? d + rank : d)] = true;
  VtpuTensorArg arg{};
  arg.data = data;
  std::size_t out_dim = 0;
  for (std::int64_t d = 0; d < rank; ++d) {
    arg.sizes[d] = spec.inputs[0].sizes[static_cast<std::size_t>(d)];
    if (reduced[static_cast<std::size_t>(d)]) {
      arg.strides[d] = 0;
      if (spec.keepdim) ++out_dim;
    } else {
      arg.strides[d] = out_type.strides[out_dim++];
    }
  }
  return arg;
}

void run(const KernelLibrary& library, const std::string& symbol, std::vector<VtpuTensorArg>& args, int rank,
         const std::vector<double>& scalars, VtpuParallelFor parallel_for) {
  VtpuLaunchArgs launch{kLaunchAbiVersion, rank, static_cast<std::int32_t>(args.size()), args.data(),
                        scalars.data(), parallel_for, nullptr, nullptr};
  library.get(symbol)(&launch);
}

TEST(HostCodegenFusedReduction, GivesTheBitsOfTheUnfusedKernels) {
  auto f32 = [](Ints sizes) { return TensorType::contiguous(DType::kFloat32, std::move(sizes)); };
  auto f64 = [](Ints sizes) { return TensorType::contiguous(DType::kFloat64, std::move(sizes)); };
  const std::vector<Spec> specs = {
      // RMSNorm's statistic: mean(x^2) over the last dim, keepdim.
      {"rms", {f32({6, 37})},
       [](ir::Graph& g, const std::vector<ValueId>& in, std::vector<ValueId>&) {
         const ValueId two = g.add_node(OpKind::Constant, {}, {{"value", 2.0}});
         return g.add_node(OpKind::Pow, {in[0], two});
       },
       OpKind::Mean, {-1}, true},
      // A backward's sum(grad * w * x) with w broadcast along the rows, over
      // long rows (beyond the 16 lanes).
      {"broadcast", {f32({5, 70}), TensorType{DType::kFloat32, {5, 70}, {0, 1}}, f32({5, 70})},
       [](ir::Graph& g, const std::vector<ValueId>& in, std::vector<ValueId>&) {
         return g.add_node(OpKind::Mul, {g.add_node(OpKind::Mul, {in[0], in[1]}), in[2]});
       },
       OpKind::Sum, {1}, true},
      // A weight gradient: columns (reduce the leading dims), 3-d.
      {"columns", {f32({4, 3, 40}), f32({4, 3, 40})},
       [](ir::Graph& g, const std::vector<ValueId>& in, std::vector<ValueId>&) {
         return g.add_node(OpKind::Mul, {in[0], in[1]});
       },
       OpKind::Sum, {0, 1}, false},
      // A stored intermediate beside the reduction, and a transposed operand.
      {"stored", {f32({9, 33}), TensorType{DType::kFloat32, {9, 33}, {1, 9}}},
       [](ir::Graph& g, const std::vector<ValueId>& in, std::vector<ValueId>& extra) {
         const ValueId d = g.add_node(OpKind::Sub, {in[0], in[1]});
         extra.push_back(g.add_node(OpKind::Exp, {d}));
         return g.add_node(OpKind::Mul, {d, d});
       },
       OpKind::Sum, {}, false},
      {"amax", {f32({7, 20})},
       [](ir::Graph& g, const std::vector<ValueId>& in, std::vector<ValueId>&) { return g.add_node(OpKind::Abs, {in[0]}); },
       OpKind::Amax, {0}, false},
      {"bf16", {TensorType::contiguous(DType::kBFloat16, {4, 50}), TensorType::contiguous(DType::kBFloat16, {4, 50})},
       [](ir::Graph& g, const std::vector<ValueId>& in, std::vector<ValueId>&) {
         return g.add_node(OpKind::Mul, {g.add_node(OpKind::Add, {in[0], in[1]}), in[1]});
       },
       OpKind::Sum, {-1}, false},
      // A batch norm's variance: sum((x - mean)^2) over N, H, W with the mean
      // broadcast: the row is H*W (the fast row: x stride 1, mean stride 0).
      {"batch_norm_var", {f32({4, 3, 5, 7}), TensorType{DType::kFloat32, {4, 3, 5, 7}, {0, 1, 0, 0}}},
       [](ir::Graph& g, const std::vector<ValueId>& in, std::vector<ValueId>&) {
         const ValueId d = g.add_node(OpKind::Sub, {in[0], in[1]});
         return g.add_node(OpKind::Mul, {d, d});
       },
       OpKind::Sum, {0, 2, 3}, true},
      // The same over channels-last x (the row runs with stride C) with a
      // stored result, and over x with H and W swapped in memory (the row's
      // dims do not nest: element offsets computed per element).
      {"channels_last", {TensorType{DType::kFloat32, {4, 3, 5, 7}, {105, 1, 21, 3}}, f32({4, 3, 5, 7})},
       [](ir::Graph& g, const std::vector<ValueId>& in, std::vector<ValueId>& extra) {
         const ValueId d = g.add_node(OpKind::Mul, {in[0], in[1]});
         extra.push_back(g.add_node(OpKind::Neg, {d}));
         return d;
       },
       OpKind::Sum, {0, 2, 3}, false},
      {"not_nested", {TensorType{DType::kFloat32, {4, 3, 5, 7}, {105, 35, 1, 5}}},
       [](ir::Graph& g, const std::vector<ValueId>& in, std::vector<ValueId>&) { return g.add_node(OpKind::Exp, {in[0]}); },
       OpKind::Mean, {0, 2, 3}, true},
      // A layer norm's weight gradient: sum over rows of dy * (x - mean) with
      // the mean broadcast along the kept columns (stride 0 there), 70
      // columns: two whole groups of 32 and a remainder.
      {"layer_norm_weight_grad", {f32({6, 70}), TensorType{DType::kFloat32, {6, 70}, {1, 0}}, f32({6, 70})},
       [](ir::Graph& g, const std::vector<ValueId>& in, std::vector<ValueId>& extra) {
         const ValueId centred = g.add_node(OpKind::Sub, {in[0], in[1]});
         extra.push_back(centred);
         return g.add_node(OpKind::Mul, {in[2], centred});
       },
       OpKind::Sum, {0}, false},
      // Rows longer than a segment (32768 elements): on threads, one
      // output's segments are tasks of their own; a stored result beside.
      {"long_rows", {f32({2, 3 * 32768 + 21}), TensorType{DType::kFloat32, {2, 3 * 32768 + 21}, {1, 0}}},
       [](ir::Graph& g, const std::vector<ValueId>& in, std::vector<ValueId>& extra) {
         const ValueId d = g.add_node(OpKind::Sub, {in[0], in[1]});
         extra.push_back(g.add_node(OpKind::Exp, {d}));
         return g.add_node(OpKind::Mul, {d, d});
       },
       OpKind::Sum, {1}, false},
      // A whole tensor's mean (one output; the row merged over both dims),
      // and one not nested in memory.
      {"whole_mean", {f32({300, 400})},
       [](ir::Graph& g, const std::vector<ValueId>& in, std::vector<ValueId>&) { return g.add_node(OpKind::Abs, {in[0]}); },
       OpKind::Mean, {}, false},
      {"whole_not_nested", {TensorType{DType::kFloat32, {300, 400}, {1, 300}}},
       [](ir::Graph& g, const std::vector<ValueId>& in, std::vector<ValueId>&) { return g.add_node(OpKind::Exp, {in[0]}); },
       OpKind::Sum, {}, false},
      {"long_amax_bf16", {TensorType::contiguous(DType::kBFloat16, {1, 40000})},
       [](ir::Graph& g, const std::vector<ValueId>& in, std::vector<ValueId>&) { return g.add_node(OpKind::Neg, {in[0]}); },
       OpKind::Amax, {1}, true},
      // Narrow columns (fewer than 16 kept along the innermost dim): lanes
      // down each output's column, in segments of 32768 rows on threads; a
      // broadcast row operand, a stored result, and a column-major operand.
      // float64: another summation order shows in the bits.
      {"narrow_columns", {f64({3 * 32768 + 7, 4}), TensorType{DType::kFloat64, {3 * 32768 + 7, 4}, {0, 1}}},
       [](ir::Graph& g, const std::vector<ValueId>& in, std::vector<ValueId>& extra) {
         const ValueId d = g.add_node(OpKind::Sub, {in[0], in[1]});
         extra.push_back(g.add_node(OpKind::Neg, {d}));
         return g.add_node(OpKind::Mul, {d, d});
       },
       OpKind::Sum, {0}, false},
      {"narrow_columns_strided", {TensorType{DType::kFloat64, {5000, 3}, {1, 5000}}, f64({5000, 3})},
       [](ir::Graph& g, const std::vector<ValueId>& in, std::vector<ValueId>&) {
         return g.add_node(OpKind::Add, {in[0], in[1]});
       },
       OpKind::Mean, {0}, true},
      {"narrow_columns_3d", {f64({40, 900, 5})},
       [](ir::Graph& g, const std::vector<ValueId>& in, std::vector<ValueId>&) { return g.add_node(OpKind::Abs, {in[0]}); },
       OpKind::Amax, {0, 1}, false},
      {"prod", {f32({3, 8})},
       [](ir::Graph& g, const std::vector<ValueId>& in, std::vector<ValueId>&) { return g.add_node(OpKind::Sigmoid, {in[0]}); },
       OpKind::Prod, {1}, false},
  };
  std::vector<Built> built;
  std::vector<GeneratedKernel> kernels;
  for (const Spec& spec : specs) {
    built.push_back(build(spec));
    kernels.push_back(generate_host_kernel(built.back().fused, "fused_" + spec.name));
    kernels.push_back(generate_host_kernel(built.back().elementwise, "elem_" + spec.name));
    kernels.push_back(generate_host_kernel(built.back().reduce, "red_" + spec.name));
  }
  const auto library = KernelLibrary::load(testing::compile_once(host_translation_unit(kernels)));
  std::mt19937 rng(11);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const Spec& spec = specs[i];
    Built& b = built[i];
    const int rank = static_cast<int>(spec.inputs[0].rank());
    std::vector<ir::Buffer> inputs;
    for (const TensorType& t : spec.inputs) inputs.push_back(random_buffer(t, rng));
    const std::vector<double> scalars = launch_scalars(b.fused);
    const TensorType red_type = b.fused.type(b.fused_reduction);
    const std::size_t extras = b.fused.outputs().size() - 1;

    // Unfused: the elementwise kernel stores everything, the reduction reads it.
    std::vector<ir::Buffer> elem_out;
    for (ValueId id : b.elementwise.outputs())
      elem_out.push_back(ir::Buffer::zeros(TensorType::contiguous(b.elementwise.type(id).dtype, spec.inputs[0].sizes)));
    std::vector<VtpuTensorArg> args;
    for (auto& o : elem_out) args.push_back(testing::tensor_arg(o.bytes.data(), o.type));
    for (std::size_t k = 0; k < inputs.size(); ++k) args.push_back(testing::tensor_arg(inputs[k].bytes.data(), spec.inputs[k]));
    run(library, "elem_" + spec.name, args, rank, launch_scalars(b.elementwise), nullptr);
    ir::Buffer expected = ir::Buffer::zeros(red_type);
    args = {reduction_out_arg(expected.bytes.data(), spec, red_type), testing::tensor_arg(elem_out[0].bytes.data(), elem_out[0].type)};
    run(library, "red_" + spec.name, args, rank, {}, nullptr);

    for (VtpuParallelFor parallel_for : {static_cast<VtpuParallelFor>(nullptr), &four_threads}) {
      ir::Buffer got = ir::Buffer::zeros(red_type);
      std::vector<ir::Buffer> got_extra;
      for (std::size_t k = 0; k < extras; ++k) got_extra.push_back(ir::Buffer::zeros(elem_out[k + 1].type));
      args = {reduction_out_arg(got.bytes.data(), spec, red_type)};
      for (auto& o : got_extra) args.push_back(testing::tensor_arg(o.bytes.data(), o.type));
      for (std::size_t k = 0; k < inputs.size(); ++k) args.push_back(testing::tensor_arg(inputs[k].bytes.data(), spec.inputs[k]));
      run(library, "fused_" + spec.name, args, rank, scalars, parallel_for);
      EXPECT_EQ(got.bytes, expected.bytes) << spec.name << (parallel_for ? " threaded" : " serial");
      for (std::size_t k = 0; k < extras; ++k) EXPECT_EQ(got_extra[k].bytes, elem_out[k + 1].bytes) << spec.name;
    }
  }
}

TEST(HostCodegenFusedReduction, RefusesWorkOutsideTheIterationSpace) {
  // An elementwise op reading the reduction's result cannot share its loop.
  ir::Graph g;
  const ValueId x = g.add_input(TensorType::contiguous(DType::kFloat32, {4, 8}));
  const ValueId s = g.add_node(OpKind::Sum, {g.add_node(OpKind::Exp, {x})}, {{"dims", Ints{1}}, {"keepdim", true}});
  g.mark_output(s);
  g.mark_output(g.add_node(OpKind::Mul, {s, s}));
  EXPECT_THROW(generate_host_kernel(g, "bad"), runtime::Error);
}

}  // namespace
}  // namespace vtpu::compiler
