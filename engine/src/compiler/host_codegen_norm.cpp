// Layer norm and RMS norm, forward and backward (dx), for the host code
// generator: row operations over the trailing `normalized_shape` dims. One
// kernel per (dtypes, rank, number of normalized dims, optional operands
// present); sizes, strides and eps are launch arguments.
//
// Launch contract: rank = x's rank; every tensor is described in x's dims
// (sizes = x's sizes); tensors = the output, then the node's inputs in IR
// order (only the present optional ones):
//   layer_norm:          [y, x, weight?, bias?]          scalars[0] = eps
//   rms_norm:            [y, x, weight?]                 scalars[0] = eps
//   layer_norm_backward: [dx, grad, x, mean, rstd, weight?]   no scalars
//   rms_norm_backward:   [dx, grad, x, rstd, weight?]         no scalars
// eps is the attribute's value, or its default when absent: 1e-5 for
// layer_norm, torch.finfo(x.dtype).eps for rms_norm (the launcher passes it,
// so one kernel serves every eps).
// Row tensors (y, x, grad, dx) use all their strides. Parameters (weight,
// bias) use only the strides of the normalized dims (their leading strides
// are ignored; pass 0). Statistics (mean, rstd: one value per row) use only
// the strides of the leading dims (a contiguous [rows] or [rows..., 1...]
// tensor: the row-major strides of x's leading sizes; normalized dims
// ignored).
//
// Parallel over rows, one row per thread. Rows are computed in float for
// float32/bfloat16/float16 x (double for float64), as ATen's CPU kernels
// accumulate: the mean (or mean square) and the variance are two passes of
// vtpu_lanes_reduce, so bits depend only on the sizes. A row whose normalized
// dims all have unit element stride (collapsed) runs the unit-stride
// instantiation, which vectorises; any other layout computes element offsets
// by division.
#include <sstream>
#include <string>
#include <vector>

#include "host_codegen_internal.h"
#include "vtpu/runtime/error.h"

namespace vtpu::compiler::detail {
namespace {

using ir::OpKind;
using runtime::Error;
using runtime::ErrorKind;

enum class Role { kRow, kParam, kStat };

}  // namespace

bool host_norm_supports(OpKind op) {
  return op == OpKind::LayerNorm || op == OpKind::RmsNorm || op == OpKind::LayerNormBackward ||
         op == OpKind::RmsNormBackward;
}

GeneratedKernel emit_norm(const ir::Graph& graph, const std::string& symbol) {
  std::size_t at_node = 0;
  while (at_node < graph.nodes().size() && !host_norm_supports(graph.nodes()[at_node].op)) ++at_node;
  if (at_node == graph.nodes().size())
    throw Error(ErrorKind::kInvalidArgument, "[host codegen] the graph holds no norm op");
  const ir::Node& node = graph.nodes()[at_node];
  const std::string op_name(ir::name(node.op));
  // The launch contract numbers tensors by the op's operands: the graph must
  // be that one op, its inputs the graph's in the same order.
  if (graph.outputs().size() != 1 || graph.outputs()[0] != static_cast<ir::ValueId>(at_node) ||
      graph.nodes().size() != graph.inputs().size() + 1 || node.inputs != graph.inputs())
    throw Error(ErrorKind::kInvalidArgument,
                "[host codegen] " + op_name + ": a norm kernel is one norm op of the graph's inputs");
  const bool backward = node.op == OpKind::LayerNormBackward || node.op == OpKind::RmsNormBackward;
  const bool layer = node.op == OpKind::LayerNorm || node.op == OpKind::LayerNormBackward;
  const bool has_weight = node.attrs.get_bool("has_weight", false);
  const bool has_bias = node.op == OpKind::LayerNorm && node.attrs.get_bool("has_bias", false);
  const ir::TensorType& x = graph.type(node.inputs[backward ? 1 : 0]);
  const int rank = static_cast<int>(x.rank());
  const int k = static_cast<int>(node.attrs.get_ints("normalized_shape").size());
  if (k < 1 || k > rank)
    throw Error(ErrorKind::kInvalidArgument,
                "[host codegen] " + op_name + ": normalized_shape does not fit the input");
  const int lead = rank - k;

  // Tensor slots (0 = output) and their roles; graph inputs are node inputs.
  std::vector<Role> roles = {Role::kRow};
  std::vector<ir::DType> dtypes = {node.type.dtype};
  for (std::size_t i = 0; i < node.inputs.size(); ++i) {
    Role r = Role::kRow;
    if (backward && i >= 2) r = (i < (layer ? 4u : 3u)) ? Role::kStat : Role::kParam;
    if (!backward && i >= 1) r = Role::kParam;
    roles.push_back(r);
    dtypes.push_back(graph.type(node.inputs[i]).dtype);
  }
  const int tensors = static_cast<int>(roles.size());
  // Slots by meaning.
  const int sx = backward ? 2 : 1, sg = 1;
  const int sw = has_weight ? (backward ? (layer ? 5 : 4) : 2) : -1;
  const int sb = has_bias ? (has_weight ? 3 : 2) : -1;
  const int smean = backward && layer ? 3 : -1, srstd = backward ? (layer ? 4 : 3) : -1;

  const std::string T = ir::compute_type(x.dtype) == ir::DType::kFloat64 ? "double" : "float";
  auto at = [&](int t) { return "reinterpret_cast<const " + std::string(storage_type(dtypes[t])) + "*>(c.p[" +
                                std::to_string(t) + "])"; };
  // Element i of the row of tensor t, in T.
  auto L = [&](int t) { return "T(vtpu_load(" + at(t) + "[at(" + std::to_string(t) + ", i)]))"; };
  auto stat = [&](int t) { return "T(vtpu_load(" + at(t) + "[off[" + std::to_string(t) + "]]))"; };
  auto lanes = [&](const std::string& value) {
    return "vtpu_lanes_reduce<T>(n, T(0), [&](int64_t i) { return " + value + "; }, [](T a, T b) { return a + b; })";
  };
  const std::string out_t = storage_type(node.type.dtype);

  std::ostringstream s;
  s << "namespace ns_" << symbol << " {\nusing T = " << T << ";\n"
    << "struct Context { char* p[" << tensors << "]; int64_t sizes[VTPU_MAX_RANK]; int64_t strides[" << tensors
    << "][VTPU_MAX_RANK]; int64_t n; const double* scalars; };\n"
    // Offset of element i of a row (row-major over the normalized dims).
    << "inline int64_t elem(const Context& c, int t, int64_t i) {\n"
    << "  int64_t o = 0;\n"
    << "  for (int d = " << rank - 1 << "; d >= " << lead << "; --d) { o += (i % c.sizes[d]) * c.strides[t][d]; "
    << "i /= c.sizes[d]; }\n  return o;\n}\n"
    << "template <bool kUnit> inline void row(const Context& c, const int64_t* off) {\n"
    << "  const int64_t n = c.n;\n"
    << "  auto at = [&](int t, int64_t i) { return kUnit ? off[t] + i : off[t] + elem(c, t, i); };\n"
    << "  " << out_t << "* out = reinterpret_cast<" << out_t << "*>(c.p[0]);\n";
  const std::string store = "  for (int64_t i = 0; i < n; ++i) out[at(0, i)] = vtpu_store_t<" + out_t + ">::of(";
  const std::string w = has_weight ? " * " + L(sw) : "";
  if (!backward) {
    if (layer) {
      s << "  const T mean = " << lanes(L(sx)) << " / T(n);\n"
        << "  const T var = " << lanes("(" + L(sx) + " - mean) * (" + L(sx) + " - mean)") << " / T(n);\n"
        << "  const T rstd = T(1) / std::sqrt(var + T(c.scalars[0]));\n"
        << store << "(" << L(sx) << " - mean) * rstd" << w << (has_bias ? " + " + L(sb) : "") << ");\n";
    } else {
      s << "  const T ms = " << lanes(L(sx) + " * " + L(sx)) << " / T(n);\n"
        << "  const T rstd = T(1) / std::sqrt(ms + T(c.scalars[0]));\n"
        << store << L(sx) << " * rstd" << w << ");\n";
    }
  } else {
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = grad * weight,
    // xhat = (x - mean) * rstd; RMS norm has no mean terms.
    const std::string g = "(" + L(sg) + w + ")";
    const std::string xhat = layer ? "((" + L(sx) + " - mean) * rstd)" : "(" + L(sx) + " * rstd)";
    s << "  const T rstd = " << stat(srstd) << ";\n";
    if (layer) s << "  const T mean = " << stat(smean) << ";\n";
    s << "  const T mgx = " << lanes(g + " * " + xhat) << " / T(n);\n";
    if (layer) s << "  const T mg = " << lanes(g) << " / T(n);\n";
    s << store << "rstd * (" << g << (layer ? " - mg" : "") << " - " << xhat << " * mgx));\n";
  }
  s << "}\n";

  // Rows: offsets of the first row by division, then an odometer over the
  // leading dims (parameters stay at offset 0).
  s << "void body(int64_t begin, int64_t end, void* raw) {\n"
    << "  const Context c = *static_cast<const Context*>(raw);  // a copy: see host_codegen.cpp\n"
    << "  bool all_unit = true;\n";
  // The unit instantiation needs every row and parameter tensor's normalized
  // dims to collapse to one run of stride 1 (size-1 dims' strides don't matter).
  for (int t = 0; t < tensors; ++t) {
    if (roles[t] == Role::kStat) continue;
    s << "  { int64_t expect = 1; for (int d = " << rank - 1 << "; d >= " << lead << "; --d) { if (c.sizes[d] != 1 && "
      << "c.strides[" << t << "][d] != expect) all_unit = false; expect *= c.sizes[d]; } }\n";
  }
  s << "  int64_t off[" << tensors << "] = {};\n  int64_t rest = begin;\n";
  std::vector<int> walkers;
  for (int t = 0; t < tensors; ++t)
    if (roles[t] != Role::kParam) walkers.push_back(t);
  for (int d = lead - 1; d >= 0; --d) {
    s << "  int64_t k" << d << " = rest % c.sizes[" << d << "]; rest /= c.sizes[" << d << "];";
    for (int t : walkers) s << " off[" << t << "] += k" << d << " * c.strides[" << t << "][" << d << "];";
    s << "\n";
  }
  s << "  for (int64_t r = begin; r < end; ++r) {\n"
    << "    if (all_unit) row<true>(c, off);\n    else row<false>(c, off);\n"
    << "    do {\n";
  for (int d = lead - 1; d >= 0; --d) {
    const std::string kd = "k" + std::to_string(d), ds = std::to_string(d);
    s << "      if (++" << kd << " < c.sizes[" << ds << "]) {";
    for (int t : walkers) s << " off[" << t << "] += c.strides[" << t << "][" << ds << "];";
    s << " break; }\n      ";
    for (int t : walkers) s << "off[" << t << "] -= (" << kd << " - 1) * c.strides[" << t << "][" << ds << "]; ";
    s << kd << " = 0;\n";
  }
  s << "    } while (false);\n  }\n}\n}  // namespace ns_" << symbol << "\n";

  s << "extern \"C\" __attribute__((visibility(\"default\"))) void " << symbol
    << "(const struct VtpuLaunchArgs* args) {\n"
    << "  using namespace ns_" << symbol << ";\n  Context c;\n  c.scalars = args->scalars;\n"
    << "  int64_t rows = 1; c.n = 1;\n";
  for (int t = 0; t < tensors; ++t) s << "  c.p[" << t << "] = static_cast<char*>(args->tensors[" << t << "].data);\n";
  s << "  for (int d = 0; d < " << rank << "; ++d) {\n    c.sizes[d] = args->tensors[0].sizes[d];\n";
  for (int t = 0; t < tensors; ++t) s << "    c.strides[" << t << "][d] = args->tensors[" << t << "].strides[d];\n";
  s << "    if (d < " << lead << ") rows *= c.sizes[d]; else c.n *= c.sizes[d];\n  }\n"
    << "  if (rows <= 0 || c.n <= 0) return;\n"
    << "  const int64_t grain = (32768 + c.n - 1) / c.n;\n"
    << "  if (args->parallel_for != nullptr && rows > 1 && rows * c.n > 32768)\n"
    << "    args->parallel_for(rows, grain, &body, &c, args->runner);\n"
    << "  else body(0, rows, &c);\n}\n";
  return {symbol, s.str()};
}

}  // namespace vtpu::compiler::detail
