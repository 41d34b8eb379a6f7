// Generated argmax/argmin/var/std/logsumexp/norm reductions and layer/rms
// norm (forward and backward) against the reference interpreter: float32,
// bfloat16, float16, float64 and integer inputs, rows shorter and longer than
// the 16 reduction lanes, non-contiguous inputs, zero-size tensors, NaN/inf
// rows; and a threaded launch against a serial one, bit for bit. All kernels
// are compiled in one translation unit, as the AOT library is.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "test_kernel_cache.h"
#include "vtpu/compiler/host_codegen.h"
#include "vtpu/compiler/kernel_library.h"
#include "vtpu/compiler/launch_abi.h"
#include "vtpu/compiler/system_compiler.h"
#include "vtpu/ir/interpreter.h"
#include "vtpu/runtime/error.h"

namespace vtpu::compiler {
namespace {

using ir::Attributes;
using ir::DType;
using ir::OpKind;
using ir::TensorType;
using Ints = std::vector<std::int64_t>;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Case {
  std::string symbol;
  ir::Graph graph;
  std::vector<ir::Buffer> inputs;
  std::vector<double> scalars;
  // A norm backward graph launched through generate_norm_param_grad_kernel.
  bool param_grads = false;
};

TensorType strided(DType dtype, Ints sizes, Ints strides) { return TensorType{dtype, std::move(sizes), std::move(strides)}; }
TensorType dense(DType dtype, Ints sizes) { return TensorType::contiguous(dtype, std::move(sizes)); }

// Random values over a tensor's whole strided extent (so gaps hold data too).
ir::Buffer random_buffer(const TensorType& type, std::mt19937& rng, bool positive) {
  ir::Buffer buffer = ir::Buffer::zeros(type);
  const std::int64_t extent = type.storage_extent();
  std::vector<double> values(static_cast<std::size_t>(extent));
  std::uniform_real_distribution<double> real(positive ? 0.1 : -3.0, 3.0);
  // Few distinct integers: argmax/argmin rows have ties.
  std::uniform_int_distribution<int> integer(positive ? 1 : -4, 4);
  for (auto& v : values) v = ir::is_floating(type.dtype) ? real(rng) : integer(rng);
  ir::Buffer flat = ir::make_buffer(type.dtype, {extent}, values);
  std::memcpy(buffer.bytes.data(), flat.bytes.data(), flat.bytes.size());
  return buffer;
}

bool is_norm(OpKind op) {
  return op == OpKind::LayerNorm || op == OpKind::RmsNorm || op == OpKind::LayerNormBackward ||
         op == OpKind::RmsNormBackward;
}

// One graph input's role in a norm launch: 0 row tensor, 1 parameter, 2 statistic.
int norm_role(OpKind op, std::size_t input) {
  const bool backward = op == OpKind::LayerNormBackward || op == OpKind::RmsNormBackward;
  if (!backward) return input == 0 ? 0 : 1;
  if (input < 2) return 0;
  return input < (op == OpKind::LayerNormBackward ? 4u : 3u) ? 2 : 1;
}

class HostCodegenNormTest : public ::testing::Test {
 public:
  static void SetUpTestSuite();
  static void TearDownTestSuite() { library().reset(); }
  static std::vector<Case>& cases() {
    static std::vector<Case> all;
    return all;
  }
  static std::unique_ptr<KernelLibrary>& library() {
    static std::unique_ptr<KernelLibrary> lib;
    return lib;
  }
  // The case named `name` (symbols are "n<index>_<name>").
  static const Case& find(const std::string& name) {
    for (const auto& c : cases())
      if (c.symbol.size() > name.size() && c.symbol.compare(c.symbol.size() - name.size() - 1, std::string::npos,
                                                            "_" + name) == 0)
        return c;
    throw std::runtime_error("no case " + name);
  }
};

void HostCodegenNormTest::SetUpTestSuite() {
  std::mt19937 rng(11);
  auto add = [&](const std::string& name, OpKind op, std::vector<TensorType> types, Attributes attrs,
                 std::vector<double> scalars = {}) -> Case& {
    Case c;
    c.symbol = "n" + std::to_string(cases().size()) + "_" + name;
    c.graph = ir::single_op(op, types, attrs);
    for (std::size_t i = 0; i < types.size(); ++i)
      c.inputs.push_back(random_buffer(types[i], rng, is_norm(op) && norm_role(op, i) == 2));
    c.scalars = std::move(scalars);
    cases().push_back(std::move(c));
    return cases().back();
  };
  auto red = [&](const std::string& name, OpKind op, TensorType t, Ints dims, bool keepdim = false,
                 Attributes extra = {}, std::vector<double> scalars = {}) -> Case& {
    Attributes a = extra;
    a.set("dims", dims);
    a.set("keepdim", keepdim);
    return add(name, op, {std::move(t)}, a, std::move(scalars));
  };
  // Replaces a contiguous case's input with given values.
  auto with_values = [](Case& c, const std::vector<double>& v) {
    c.inputs[0] = ir::make_buffer(c.inputs[0].type.dtype, c.inputs[0].type.sizes, v);
  };
  const DType f32 = DType::kFloat32, bf16 = DType::kBFloat16, f64 = DType::kFloat64, f16 = DType::kFloat16;

  // argmax / argmin: rows (innermost reduced), columns, flat, ties, dtypes.
  red("argmax_rows", OpKind::Argmax, dense(f32, {6, 37}), {1});
  red("argmin_cols", OpKind::Argmin, dense(f32, {6, 37}), {0});
  red("argmax_flat", OpKind::Argmax, dense(f32, {3, 4, 5}), {});
  red("argmax_bf16", OpKind::Argmax, dense(bf16, {5, 20}), {-1}, true);
  red("argmin_i32_ties", OpKind::Argmin, dense(DType::kInt32, {7, 40}), {1});
  red("argmax_i64_cols_ties", OpKind::Argmax, dense(DType::kInt64, {40, 3}), {0});
  red("argmax_u8", OpKind::Argmax, dense(DType::kUInt8, {4, 19}), {1});
  red("argmax_f64_strided", OpKind::Argmax, strided(f64, {5, 70}, {1, 5}), {1});
  red("argmin_mid", OpKind::Argmin, dense(f16, {3, 18, 4}), {1});
  red("argmax_scalar", OpKind::Argmax, dense(f32, {}), {});
  red("argmax_empty_out", OpKind::Argmax, dense(f32, {0, 5}), {1});
  {
    // Rows of 20: NaN first wins; -inf rows; all equal; NaN after a max.
    std::vector<double> v(8 * 20, 1.0);
    for (int i = 0; i < 20; ++i) { v[20 + i] = -kInf; v[40 + i] = static_cast<double>(i % 3); }
    v[60 + 17] = kNan; v[60 + 18] = kNan; v[60 + 2] = 50;
    v[80 + 3] = kInf; v[80 + 9] = kInf;
    v[100 + 19] = kNan;
    v[120 + 0] = kNan;
    v[140 + 5] = -kInf; v[140 + 6] = -kInf;
    for (OpKind op : {OpKind::Argmax, OpKind::Argmin}) {
      with_values(red(op == OpKind::Argmax ? "argmax_special" : "argmin_special", op, dense(f32, {8, 20}), {1}), v);
      with_values(red(op == OpKind::Argmax ? "argmax_special_cols" : "argmin_special_cols", op, dense(f32, {20, 8}), {0}), v);
    }
  }

  // var / std: two-pass in double.
  red("var_rows", OpKind::Var, dense(f32, {6, 37}), {1}, false, {}, {1.0});
  red("std_two_dims", OpKind::Std, dense(f32, {4, 5, 6}), {0, 2}, true, {{"correction", 0.0}}, {0.0});
  red("var_bf16", OpKind::Var, dense(bf16, {5, 40}), {-1}, false, {}, {1.0});
  red("var_f64_cols", OpKind::Var, dense(f64, {9, 70}), {0}, false, {}, {1.0});
  red("std_strided", OpKind::Std, strided(f32, {7, 30}, {1, 7}), {1}, false, {{"correction", 2.5}}, {2.5});
  red("var_all", OpKind::Var, dense(f16, {3, 11}), {}, false, {}, {1.0});
  red("var_empty_dim", OpKind::Var, dense(f32, {0, 5}), {0}, false, {}, {1.0});
  red("std_one_element", OpKind::Std, dense(f32, {4, 1}), {1}, false, {}, {1.0});
  {
    // A large mean: a one-pass sum of squares in float would lose it all.
    Case& c = red("var_offset", OpKind::Var, dense(f32, {3, 50}), {1}, false, {}, {1.0});
    std::vector<double> v(150);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 1e4 + static_cast<double>(i % 7) * 0.125;
    with_values(c, v);
  }

  // logsumexp
  red("lse_rows", OpKind::LogSumExp, dense(f32, {6, 37}), {1});
  red("lse_cols", OpKind::LogSumExp, dense(f32, {40, 7}), {0}, true);
  red("lse_bf16", OpKind::LogSumExp, dense(bf16, {3, 50}), {1});
  red("lse_f64", OpKind::LogSumExp, dense(f64, {4, 5, 6}), {0, 2});
  red("lse_int", OpKind::LogSumExp, dense(DType::kInt32, {5, 9}), {1});
  red("lse_empty_row", OpKind::LogSumExp, dense(f32, {3, 0}), {1});
  {
    std::vector<double> v(7 * 18, 0.5);
    for (int i = 0; i < 18; ++i) v[i] = -kInf;           // all -inf -> -inf
    v[18 + 4] = kInf;                                     // +inf -> +inf
    v[36 + 7] = kNan;                                     // NaN -> NaN
    v[54 + 1] = kNan; v[54 + 2] = kInf;                   // NaN beats +inf
    for (int i = 0; i < 18; ++i) v[72 + i] = -kInf;
    v[72 + 9] = kNan;                                     // NaN among -inf
    v[90 + 3] = -kInf; v[90 + 11] = 80.0;                 // large finite, some -inf
    v[108 + 0] = kInf; v[108 + 1] = -kInf;
    with_values(red("lse_special", OpKind::LogSumExp, dense(f32, {7, 18}), {1}), v);
    with_values(red("lse_special_cols", OpKind::LogSumExp, dense(f32, {18, 7}), {0}), v);
  }

  // norm: every p class; p is scalars[0].
  auto norm = [&](const std::string& name, TensorType t, Ints dims, double p) -> Case& {
    return red(name, OpKind::Norm, std::move(t), std::move(dims), false, {{"p", p}}, {p});
  };
  norm("norm2_rows", dense(f32, {6, 37}), {1}, 2.0);
  norm("norm1_cols", dense(f32, {6, 37}), {0}, 1.0);
  norm("norminf", dense(f32, {5, 23}), {1}, kInf);
  norm("normneginf_cols", dense(f32, {23, 5}), {0}, -kInf);
  norm("norm0", dense(f32, {5, 23}), {1}, 0.0);
  norm("norm3", dense(f32, {5, 23}), {1}, 3.0);
  norm("norm_neg1_5", dense(f64, {5, 23}), {1}, -1.5);
  norm("norm2_bf16", dense(bf16, {4, 33}), {-1}, 2.0);
  norm("norm2_all_strided", strided(f32, {6, 8}, {1, 6}), {}, 2.0);
  norm("norm2_empty", dense(f32, {2, 0}), {1}, 2.0);
  {
    std::vector<double> v(6 * 17, 1.5);
    for (int i = 0; i < 17; i += 2) v[i] = 0.0;
    v[17 + 5] = kNan;
    v[34 + 3] = kInf; v[34 + 4] = kNan;
    v[51 + 8] = -kInf;
    for (int i = 0; i < 17; ++i) v[68 + i] = 0.0;
    v[85 + 16] = kNan;
    for (double p : {2.0, 1.0, 0.0, kInf, -kInf, 3.0})
      with_values(norm(std::string("norm_special_p") + (std::isinf(p) ? (p > 0 ? "inf" : "neginf")
                                                                      : std::to_string(static_cast<int>(p))),
                       dense(f32, {6, 17}), {1}, p),
                  v);
  }

  // layer_norm / rms_norm forward: eps is scalars[0].
  auto ln = [&](const std::string& name, TensorType x, Ints ns, bool w, bool b, double eps) {
    std::vector<TensorType> types = {x};
    if (w) types.push_back(dense(x.dtype, ns));
    if (b) types.push_back(dense(x.dtype, ns));
    add(name, OpKind::LayerNorm, types, {{"normalized_shape", ns}, {"eps", eps}, {"has_weight", w}, {"has_bias", b}},
        {eps});
  };
  ln("ln_f32", dense(f32, {6, 37}), {37}, true, true, 1e-5);
  ln("ln_two_dims_w", dense(f32, {4, 3, 10}), {3, 10}, true, false, 1e-5);
  ln("ln_bf16", dense(bf16, {5, 40}), {40}, true, true, 1e-5);
  ln("ln_f16_short", dense(f16, {7, 5}), {5}, false, true, 1e-5);
  ln("ln_f64_plain", dense(f64, {3, 100}), {100}, false, false, 1e-5);
  ln("ln_transposed", strided(f32, {37, 6}, {1, 37}), {6}, true, true, 1e-5);
  ln("ln_row_gap", strided(f32, {5, 20}, {40, 1}), {20}, true, true, 1e-5);
  ln("ln_split_dims", strided(f32, {4, 3, 10}, {60, 20, 1}), {3, 10}, true, true, 1e-5);
  ln("ln_eps_half", dense(f32, {3, 16}), {16}, true, true, 0.5);
  ln("ln_empty_rows", dense(f32, {0, 8}), {8}, true, true, 1e-5);
  ln("ln_all_dims", dense(f32, {17}), {17}, true, true, 1e-5);
  auto rms = [&](const std::string& name, TensorType x, Ints ns, bool w, double eps, bool eps_attr = true) {
    std::vector<TensorType> types = {x};
    if (w) types.push_back(dense(x.dtype, ns));
    Attributes a{{"normalized_shape", ns}, {"has_weight", w}};
    if (eps_attr) a.set("eps", eps);
    add(name, OpKind::RmsNorm, types, a, {eps});
  };
  rms("rms_f32", dense(f32, {6, 37}), {37}, true, 1e-6);
  rms("rms_default_eps", dense(f32, {6, 15}), {15}, false, std::numeric_limits<float>::epsilon(), false);
  rms("rms_bf16", dense(bf16, {4, 3, 11}), {3, 11}, true, 1e-6);
  rms("rms_f64_transposed", strided(f64, {20, 4}, {1, 20}), {4}, true, 1e-6);

  // Backward (dx): grad, x, [mean,] rstd, weight?; statistics as [rows] or
  // [rows..., 1], computed from x as the forward would (random statistics
  // make xhat large and dx a float cancellation no kernel could match).
  auto consistent_stats = [](Case& c, const Ints& ns, bool layer) {
    std::int64_t n = 1;
    for (auto v : ns) n *= v;
    const auto xv = ir::to_doubles(c.inputs[1]);
    const std::size_t rows = xv.size() / static_cast<std::size_t>(n);
    std::vector<double> mean(rows, 0.0), rstd(rows, 0.0);
    for (std::size_t r = 0; r < rows; ++r) {
      double sum = 0, ss = 0;
      for (std::int64_t j = 0; j < n; ++j) sum += xv[r * static_cast<std::size_t>(n) + static_cast<std::size_t>(j)];
      mean[r] = layer ? sum / static_cast<double>(n) : 0.0;
      for (std::int64_t j = 0; j < n; ++j) {
        const double d = xv[r * static_cast<std::size_t>(n) + static_cast<std::size_t>(j)] - mean[r];
        ss += d * d;
      }
      rstd[r] = 1.0 / std::sqrt(ss / static_cast<double>(n) + 1e-5);
    }
    const std::size_t rstd_at = layer ? 3 : 2;
    if (layer) c.inputs[2] = ir::make_buffer(c.inputs[2].type.dtype, c.inputs[2].type.sizes, mean);
    c.inputs[rstd_at] = ir::make_buffer(c.inputs[rstd_at].type.dtype, c.inputs[rstd_at].type.sizes, rstd);
  };
  auto lnb = [&](const std::string& name, TensorType x, Ints ns, bool w, Ints stat_sizes, TensorType grad) {
    std::vector<TensorType> types = {grad, x, dense(x.dtype, stat_sizes), dense(x.dtype, stat_sizes)};
    if (w) types.push_back(dense(x.dtype, ns));
    consistent_stats(add(name, OpKind::LayerNormBackward, types, {{"normalized_shape", ns}, {"has_weight", w}}), ns,
                     true);
  };
  lnb("lnb_f32", dense(f32, {6, 37}), {37}, true, {6, 1}, dense(f32, {6, 37}));
  lnb("lnb_no_weight", dense(f32, {5, 12}), {12}, false, {5}, dense(f32, {5, 12}));
  lnb("lnb_two_dims", dense(f32, {2, 3, 4, 9}), {4, 9}, true, {2, 3, 1, 1}, strided(f32, {2, 3, 4, 9}, {108, 1, 27, 3}));
  lnb("lnb_bf16", dense(bf16, {4, 40}), {40}, true, {4, 1}, dense(bf16, {4, 40}));
  lnb("lnb_f64", dense(f64, {3, 70}), {70}, true, {3}, dense(f64, {3, 70}));
  auto rmsb = [&](const std::string& name, TensorType x, Ints ns, bool w, Ints stat_sizes, TensorType grad) {
    std::vector<TensorType> types = {grad, x, dense(x.dtype, stat_sizes)};
    if (w) types.push_back(dense(x.dtype, ns));
    consistent_stats(add(name, OpKind::RmsNormBackward, types, {{"normalized_shape", ns}, {"has_weight", w}}), ns,
                     false);
  };
  rmsb("rmsb_f32", dense(f32, {6, 37}), {37}, true, {6, 1}, dense(f32, {6, 37}));
  rmsb("rmsb_no_weight_strided", strided(f32, {9, 5}, {1, 9}), {5}, false, {9}, dense(f32, {9, 5}));
  rmsb("rmsb_bf16", dense(bf16, {3, 2, 20}), {2, 20}, true, {3, 1, 1}, dense(bf16, {3, 2, 20}));

  // Parameter gradients of some backward graphs (checked against sums in the
  // test, the IR having no op for them).
  auto param_grads = [&](const std::string& of) {
    Case c = find(of);
    c.symbol = "n" + std::to_string(cases().size()) + "_pgrad_" + of;
    c.param_grads = true;
    cases().push_back(std::move(c));
  };
  for (const char* of : {"lnb_f32", "lnb_no_weight", "lnb_two_dims", "lnb_bf16", "lnb_f64", "rmsb_f32",
                         "rmsb_no_weight_strided", "rmsb_bf16"})
    param_grads(of);

  // Big enough for the kernels to use parallel_for (> 32768 elements).
  red("big_argmax", OpKind::Argmax, dense(f32, {1000, 40}), {1});
  red("big_var_cols", OpKind::Var, dense(f32, {40, 1000}), {0}, false, {}, {1.0});
  red("big_lse", OpKind::LogSumExp, dense(f32, {1000, 40}), {1});
  norm("big_norm3", dense(f32, {1000, 40}), {1}, 3.0);
  ln("big_ln", dense(f32, {1000, 40}), {40}, true, true, 1e-5);
  ln("big_ln_bf16_strided", strided(bf16, {1000, 40}, {1, 1000}), {40}, true, true, 1e-5);
  rms("big_rms", dense(f32, {1000, 40}), {40}, true, 1e-6);
  lnb("big_lnb", dense(f32, {1000, 40}), {40}, true, {1000, 1}, dense(f32, {1000, 40}));
  rmsb("big_rmsb", dense(f32, {1000, 40}), {40}, true, {1000}, dense(f32, {1000, 40}));
  param_grads("big_lnb");
  param_grads("big_rmsb");

  std::vector<GeneratedKernel> kernels;
  for (const auto& c : cases())
    kernels.push_back(c.param_grads ? generate_norm_param_grad_kernel(c.graph, c.symbol)
                                    : generate_host_kernel(c.graph, c.symbol));
  library() = std::make_unique<KernelLibrary>(KernelLibrary::load(testing::compile_once(host_translation_unit(kernels))));
}

// Row-major strides of sizes.
Ints row_major(const Ints& sizes) {
  Ints strides(sizes.size(), 1);
  for (std::size_t d = sizes.size(); d-- > 1;) strides[d - 1] = strides[d] * sizes[d];
  return strides;
}

// Launch arguments per the contracts at the top of host_codegen_norm.cpp and
// host_codegen_reduction_stats.cpp: everything in the input's dims.
std::vector<VtpuTensorArg> tensor_args(const Case& c, std::vector<ir::Buffer>& outs, std::vector<ir::Buffer>& inputs) {
  const ir::Node& node = c.graph.node(c.graph.outputs()[0]);
  std::vector<VtpuTensorArg> args(outs.size() + inputs.size());
  ir::Buffer& out = outs[0];
  args[0].data = out.bytes.data();
  if (!is_norm(node.op)) {
    const TensorType& in = inputs[0].type;
    const auto rank = static_cast<std::size_t>(in.rank());
    const Ints dims = node.attrs.get_ints("dims", {});
    std::vector<bool> reduced(rank, dims.empty());
    for (auto d : dims) reduced[static_cast<std::size_t>(d < 0 ? d + static_cast<std::int64_t>(rank) : d)] = true;
    const bool keepdim = node.attrs.get_bool("keepdim", false);
    args[1].data = inputs[0].bytes.data();
    std::size_t out_dim = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      args[0].sizes[d] = args[1].sizes[d] = in.sizes[d];
      args[1].strides[d] = in.strides[d];
      if (reduced[d]) {
        args[0].strides[d] = 0;
        if (keepdim) ++out_dim;
      } else {
        args[0].strides[d] = out.type.strides[out_dim++];
      }
    }
    return args;
  }
  const bool backward = node.op == OpKind::LayerNormBackward || node.op == OpKind::RmsNormBackward;
  const TensorType& x = inputs[backward ? 1 : 0].type;
  const std::size_t rank = x.sizes.size();
  const std::size_t k = node.attrs.get_ints("normalized_shape").size();
  const std::size_t lead = rank - k;
  const Ints lead_strides = row_major(Ints(x.sizes.begin(), x.sizes.begin() + static_cast<std::ptrdiff_t>(lead)));
  const std::size_t nout = outs.size();
  for (std::size_t t = 0; t < args.size(); ++t) {
    ir::Buffer& b = t < nout ? outs[t] : inputs[t - nout];
    const TensorType& type = b.type;
    args[t].data = b.bytes.data();
    const int role = t < nout ? (c.param_grads ? 1 : 0) : norm_role(node.op, t - nout);
    for (std::size_t d = 0; d < rank; ++d) {
      args[t].sizes[d] = x.sizes[d];
      if (role == 0) args[t].strides[d] = type.strides[d];
      else if (role == 1) args[t].strides[d] = d < lead ? 0 : type.strides[d - lead];
      else args[t].strides[d] = d < lead ? lead_strides[d] : 0;  // contiguous statistics
    }
  }
  return args;
}

void threaded_for(std::int64_t total, std::int64_t grain, VtpuParallelBody body, void* context, void*) {
  std::vector<std::thread> threads;
  const std::int64_t chunk = std::max<std::int64_t>(grain, (total + 3) / 4);
  for (std::int64_t begin = 0; begin < total; begin += chunk)
    threads.emplace_back([=] { body(begin, std::min(total, begin + chunk), context); });
  for (auto& t : threads) t.join();
}

// The parameter gradients' dtype and shape: the weight's, else x's dtype.
TensorType param_type(const Case& c) {
  const ir::Node& node = c.graph.node(c.graph.outputs()[0]);
  const DType dt = node.attrs.get_bool("has_weight", false) ? c.inputs.back().type.dtype : c.inputs[1].type.dtype;
  return dense(dt, node.attrs.get_ints("normalized_shape"));
}

std::vector<ir::Buffer> launch_all(const Case& c, VtpuParallelFor parallel_for,
                                   const std::vector<double>* scalars = nullptr) {
  const ir::Node& node = c.graph.node(c.graph.outputs()[0]);
  std::vector<ir::Buffer> outs;
  if (c.param_grads) {
    outs.push_back(ir::Buffer::zeros(param_type(c)));
    if (node.op == OpKind::LayerNormBackward) outs.push_back(ir::Buffer::zeros(param_type(c)));
  } else {
    outs.push_back(ir::Buffer::zeros(c.graph.type(c.graph.outputs()[0])));
  }
  // Poison the outputs: every element must be written.
  for (auto& o : outs) std::memset(o.bytes.data(), 0x7f, o.bytes.size());
  std::vector<ir::Buffer> inputs = c.inputs;
  std::vector<VtpuTensorArg> args = tensor_args(c, outs, inputs);
  const ir::Buffer& shaped = c.param_grads ? inputs[1] : outs[0];  // has x's shape for norms
  // A norm's output has x's shape; a reduction's rank is its input's.
  const auto rank = static_cast<std::int32_t>(is_norm(node.op) ? shaped.type.rank() : inputs[0].type.rank());
  const std::vector<double>& s = scalars ? *scalars : c.scalars;
  VtpuLaunchArgs launch_args{kLaunchAbiVersion, rank, static_cast<std::int32_t>(args.size()), args.data(),
                             s.empty() ? nullptr : s.data(), parallel_for, nullptr, nullptr};
  HostCodegenNormTest::library()->get(c.symbol)(&launch_args);
  return outs;
}

ir::Buffer launch(const Case& c, VtpuParallelFor parallel_for, const std::vector<double>* scalars = nullptr) {
  return launch_all(c, parallel_for, scalars)[0];
}

// dweight[j] = sum_r grad * xhat, dbias[j] = sum_r grad, in double.
std::vector<ir::Buffer> expected_param_grads(const Case& c) {
  const ir::Node& node = c.graph.node(c.graph.outputs()[0]);
  const bool layer = node.op == OpKind::LayerNormBackward;
  const auto g = ir::to_doubles(c.inputs[0]), x = ir::to_doubles(c.inputs[1]);
  const auto mean = layer ? ir::to_doubles(c.inputs[2]) : std::vector<double>{};
  const auto rstd = ir::to_doubles(c.inputs[layer ? 3 : 2]);
  const TensorType pt = param_type(c);
  const std::size_t n = static_cast<std::size_t>(pt.numel()), rows = n == 0 ? 0 : g.size() / n;
  std::vector<double> dw(n, 0.0), db(n, 0.0);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t j = 0; j < n; ++j) {
      const double gv = g[r * n + j];
      dw[j] += gv * (x[r * n + j] - (layer ? mean[r] : 0.0)) * rstd[r];
      db[j] += gv;
    }
  std::vector<ir::Buffer> out = {ir::make_buffer(pt.dtype, pt.sizes, dw)};
  if (layer) out.push_back(ir::make_buffer(pt.dtype, pt.sizes, db));
  return out;
}

// Mismatches of got against the interpreter (all listed in `report`):
// integers exactly, floats within a relative tolerance of the dtype, NaN and
// infinities exactly.
int mismatches(const Case& c, const ir::Buffer& expected, const ir::Buffer& got, std::string* report) {
  const auto e = ir::to_doubles(expected);
  const auto g = ir::to_doubles(got);
  if (e.size() != g.size()) return 1;
  const DType dt = expected.type.dtype;
  // float32 rows of the norms accumulate in float (as ATen's), reductions in
  // double; bfloat16/float16 results may round to a neighbour.
  const double rel = dt == DType::kBFloat16 ? 1e-2 : dt == DType::kFloat16 ? 2e-3 : dt == DType::kFloat32 ? 2e-5
                     : dt == DType::kFloat64 ? 1e-12 : 0.0;
  int bad = 0;
  for (std::size_t i = 0; i < e.size(); ++i) {
    const bool ok = std::isnan(e[i]) ? std::isnan(g[i])
                    : std::isinf(e[i]) ? g[i] == e[i]
                                       : std::fabs(g[i] - e[i]) <= rel * std::max(1.0, std::fabs(e[i]));
    if (!ok) {
      ++bad;
      if (report && bad <= 5) *report += c.symbol + " at " + std::to_string(i) + ": got " + std::to_string(g[i]) +
                                         ", expected " + std::to_string(e[i]) + "\n";
    }
  }
  return bad;
}

TEST_F(HostCodegenNormTest, EveryKernelMatchesTheInterpreter) {
  for (const auto& c : cases()) {
    if (c.param_grads) continue;
    const auto expected = ir::interpret(c.graph, c.inputs);
    std::string report;
    EXPECT_EQ(mismatches(c, expected[0], launch(c, nullptr), &report), 0) << report;
  }
}

TEST_F(HostCodegenNormTest, ParameterGradientsMatchRowSums) {
  int checked = 0;
  for (const auto& c : cases()) {
    if (!c.param_grads) continue;
    const auto expected = expected_param_grads(c);
    const auto got = launch_all(c, nullptr);
    ASSERT_EQ(got.size(), expected.size()) << c.symbol;
    for (std::size_t k = 0; k < got.size(); ++k) {
      std::string report;
      EXPECT_EQ(mismatches(c, expected[k], got[k], &report), 0) << "output " << k << "\n" << report;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 10);
}

TEST_F(HostCodegenNormTest, ThreadedLaunchIsBitwiseTheSerialOne) {
  int threaded_cases = 0;
  for (const auto& c : cases()) {
    const auto serial = launch_all(c, nullptr);
    const auto parallel = launch_all(c, &threaded_for);
    for (std::size_t k = 0; k < serial.size(); ++k) EXPECT_EQ(serial[k].bytes, parallel[k].bytes) << c.symbol;
    threaded_cases += c.symbol.find("big_") != std::string::npos;
  }
  EXPECT_EQ(threaded_cases, 11);
}

TEST_F(HostCodegenNormTest, SpecialRowsGiveAtenResults) {
  // Spot values from ATen's semantics, independent of the interpreter.
  const auto argmax = ir::to_int64s(launch(find("argmax_special"), nullptr));
  ASSERT_EQ(argmax.size(), 8u);
  EXPECT_EQ(argmax[0], 0);   // all equal: the first
  EXPECT_EQ(argmax[1], 0);   // all -inf: the first
  EXPECT_EQ(argmax[2], 2);   // 0,1,2,0,1,2...: first 2
  EXPECT_EQ(argmax[3], 17);  // first NaN wins over a larger finite
  EXPECT_EQ(argmax[4], 3);   // first +inf
  EXPECT_EQ(argmax[6], 0);
  const auto lse = ir::to_doubles(launch(find("lse_special"), nullptr));
  ASSERT_EQ(lse.size(), 7u);
  EXPECT_EQ(lse[0], -kInf);
  EXPECT_EQ(lse[1], kInf);
  EXPECT_TRUE(std::isnan(lse[2]));
  EXPECT_TRUE(std::isnan(lse[3]));
  EXPECT_TRUE(std::isnan(lse[4]));
  EXPECT_NEAR(lse[5], 80.0, 1e-5);
  EXPECT_EQ(lse[6], kInf);
}

TEST_F(HostCodegenNormTest, EpsIsALaunchScalar) {
  // The ln_f32 kernel launched with eps = 0.5 matches the interpreter's
  // layer_norm with eps = 0.5 (and differs from eps = 1e-5).
  const Case& c = find("ln_f32");
  Case other = c;
  Attributes a = c.graph.node(c.graph.outputs()[0]).attrs;
  a.set("eps", 0.5);
  std::vector<TensorType> types;
  for (const auto& b : c.inputs) types.push_back(b.type);
  other.graph = ir::single_op(OpKind::LayerNorm, types, a);
  const std::vector<double> eps = {0.5};
  const auto got = launch(c, nullptr, &eps);
  EXPECT_EQ(mismatches(other, ir::interpret(other.graph, other.inputs)[0], got, nullptr), 0);
  EXPECT_GT(mismatches(c, ir::interpret(c.graph, c.inputs)[0], got, nullptr), 0);
}

TEST_F(HostCodegenNormTest, TheComparisonCatchesAWrongElement) {
  // The tests above can fail: one changed element is reported.
  for (const char* name : {"var_rows", "ln_f32", "argmax_rows"}) {
    const Case* c = &find(name);
    ir::Buffer got = launch(*c, nullptr);
    const auto expected = ir::interpret(c->graph, c->inputs)[0];
    ASSERT_EQ(mismatches(*c, expected, got, nullptr), 0) << name;
    auto values = ir::to_doubles(got);
    values[3] += values[3] == 0 ? 1.0 : 1e-3 * std::fabs(values[3]) + 1;
    got = ir::make_buffer(got.type.dtype, got.type.sizes, values);
    EXPECT_EQ(mismatches(*c, expected, got, nullptr), 1) << name;
  }
}

TEST(HostCodegenNormErrors, AFusedNormGraphIsRefusedByName) {
  ir::Graph g;
  const auto x = g.add_input(TensorType::contiguous(DType::kFloat32, {2, 3}));
  const auto y = g.add_node(OpKind::LayerNorm, {x}, {{"normalized_shape", Ints{3}}});
  g.mark_output(g.add_node(OpKind::Relu, {y}));
  try {
    generate_host_kernel(g, "k");
    FAIL() << "expected an error";
  } catch (const runtime::Error& e) {
    EXPECT_EQ(e.kind(), runtime::ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("layer_norm"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(host_codegen_supports(OpKind::RmsNormBackward));
  EXPECT_TRUE(host_codegen_supports(OpKind::Argmin));
}

}  // namespace
}  // namespace vtpu::compiler
