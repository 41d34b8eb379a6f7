// Statistical reductions for the host code generator: argmax, argmin, var,
// std, logsumexp and norm. One kernel per (dtypes, rank, reduced-dims set,
// norm's p class); sizes, strides and runtime attributes are launch arguments.
//
// Launch contract (the same as sum/mean's, host_codegen_reduction.cpp):
//   rank       = the input's rank;
//   tensors[0] = the output, described in the input's dims (a reduced dim has
//                the input's size and stride 0; keepdim does not matter);
//   tensors[1] = the input.
//   scalars:
//     var, std:  scalars[0] = correction (the attribute, default 1.0);
//     norm:      scalars[0] = p (the attribute, default 2.0); the kernel is
//                specialised on p's class (0, 1, 2, +inf, -inf or any other)
//                and reads the value only for "any other";
//     argmax, argmin, logsumexp: none (scalars may be null).
// Argmax/argmin return the index of the first extreme in the row-major order
// of the reduced dims (the flat index when every dim is reduced); a NaN is the
// extreme and the first NaN wins, as in ATen.
//
// Every op is one or two passes over each output's elements (var's mean then
// the squared deviations: a two-pass method in double, stable where the
// one-pass sum of squares cancels; logsumexp's max then the shifted sum).
// Each pass reduces like sum does: vtpu_lanes_reduce along a reduced
// innermost dim ("rows"), or groups of neighbouring outputs each in sequential
// order ("columns"), so an output's bits depend only on the sizes.
#include <cmath>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "host_codegen_internal.h"
#include "host_codegen_reduction_loops.h"
#include "vtpu/runtime/error.h"

namespace vtpu::compiler::detail {
namespace {

using ir::DType;
using ir::OpKind;
using runtime::Error;
using runtime::ErrorKind;

// One pass: an accumulator type, its identity, the per-element value (of x,
// the element's index i among the reduced elements, the launch scalars s and
// the previous pass's per-output result p), the combine of two accumulators
// (a, b) and the per-output result of the pass (of the accumulator a and the
// reduced-element count n).
struct Pass {
  std::string acc, init, value, combine, result, result_type;
};

struct StatsKernel {
  std::string t;  // the type elements are loaded in
  std::vector<Pass> passes;
  std::string finish;  // of p0[, p1], n, s: the output value
  std::string helpers;  // extra definitions in the kernel's namespace
};

// The smallest (or largest) value of an integer dtype, as a literal.
std::string integer_bound(DType t, bool largest) {
  switch (t) {
    case DType::kBool: return largest ? "true" : "false";
    case DType::kUInt8: return largest ? "T(255)" : "T(0)";
    case DType::kInt8: return largest ? "T(127)" : "T(-128)";
    case DType::kInt16: return largest ? "T(32767)" : "T(-32768)";
    case DType::kInt32: return largest ? "T(INT32_MAX)" : "T(INT32_MIN)";
    default: return largest ? "T(INT64_MAX)" : "T(INT64_MIN)";
  }
}

StatsKernel describe(const ir::Node& node, DType in_dtype) {
  StatsKernel k;
  const Pass sum_of_value{"double", "0.0", "", "a + b", "a", "double"};
  switch (node.op) {
    case OpKind::Argmax:
    case OpKind::Argmin: {
      // Two passes that vectorise: the extreme value (NaN-propagating), then
      // the first index holding it (the first NaN when it is NaN), as a min
      // over indices. One pass of (value, index) pairs combined with branches
      // stayed scalar: 1.5-1.7x the CPU's time (a performance review). Ties
      // and ±0 go to the first occurrence, as in ATen.
      const bool is_max = node.op == OpKind::Argmax;
      k.t = storage_type(ir::compute_type(in_dtype));
      const bool floating = ir::is_floating(in_dtype);
      const std::string weakest = floating ? (is_max ? "T(-INFINITY)" : "T(INFINITY)") : integer_bound(in_dtype, !is_max);
      k.passes.push_back({"T", weakest, "x", is_max ? "vtpu_max(a, b)" : "vtpu_min(a, b)", "a", "T"});
      k.passes.push_back({"int64_t", "INT64_MAX",
                          floating ? "(x == p || (p != p && x != x)) ? i : INT64_MAX" : "x == p ? i : INT64_MAX",
                          "a < b ? a : b", "a", "int64_t"});
      k.finish = "p1";
      return k;
    }
    case OpKind::Var:
    case OpKind::Std: {
      k.t = "double";
      Pass mean = sum_of_value;
      mean.value = "x";
      mean.result = "a / static_cast<double>(n)";
      Pass squares = sum_of_value;
      squares.value = "(x - p) * (x - p)";
      k.passes = {mean, squares};
      k.finish = "p1 / std::max(0.0, static_cast<double>(n) - s[0])";
      if (node.op == OpKind::Std) k.finish = "std::sqrt(" + k.finish + ")";
      return k;
    }
    case OpKind::LogSumExp: {
      // ATen's formula: the max is NaN-propagating; an infinite max shifts by
      // 0, so an all -inf row gives log(0) = -inf and a +inf gives +inf.
      k.t = ir::compute_type(node.common_dtype) == DType::kFloat64 ? "double" : "float";
      k.passes.push_back({"T", "T(-INFINITY)", "x", "vtpu_max(a, b)", "std::isinf(a) ? T(0) : a", "T"});
      Pass sum = sum_of_value;
      sum.value = "static_cast<double>(vtpu_exp(x - p))";
      k.passes.push_back(sum);
      k.finish = "std::log(p1) + static_cast<double>(p0)";
      return k;
    }
    case OpKind::Norm: {
      k.t = ir::compute_type(node.common_dtype) == DType::kFloat64 ? "double" : "float";
      const double p = node.attrs.get_double("p", 2.0);
      Pass sum = sum_of_value;
      k.finish = "p0";
      // The sum runs in double; ATen's (and CUDA's) float32 and 16-bit norms
      // sum in float, which overflows once the sum rounds past FLT_MAX: the
      // norm of [1e20, 1e20] is inf there. Partial sums of |x|^p only grow,
      // so the double sum rounding to a float inf is where the float one
      // overflows.
      const std::string total = k.t == "float" ? "(std::isinf(static_cast<float>(p0)) ? (double)INFINITY : p0)" : "p0";
      if (std::isinf(p)) {
        // max/min of |x|, NaN-propagating like ATen's inf-norms.
        k.passes.push_back({"T", p > 0 ? "T(0)" : "T(INFINITY)", "std::fabs(x)",
                            p > 0 ? "vtpu_max(a, b)" : "vtpu_min(a, b)", "a", "T"});
        return k;
      }
      if (p == 2.0) {
        sum.value = "static_cast<double>(x) * static_cast<double>(x)";
        k.finish = "std::sqrt(" + total + ")";
      } else if (p == 1.0) {
        sum.value = "std::fabs(static_cast<double>(x))";
        k.finish = total;
      } else if (p == 0.0) {
        sum.value = "x != T(0) ? 1.0 : 0.0";  // NaN counts as non-zero, as in ATen
      } else {
        sum.value = "std::pow(std::fabs(static_cast<double>(x)), s[0])";
        k.finish = "std::pow(" + total + ", 1.0 / s[0])";
      }
      k.passes.push_back(sum);
      return k;
    }
    default:
      throw Error(ErrorKind::kInvalidArgument,
                  "[host codegen] " + std::string(ir::name(node.op)) + " has no statistics reduction kernel");
  }
}

}  // namespace

bool host_reduction_stats_supports(OpKind op) {
  return op == OpKind::Argmax || op == OpKind::Argmin || op == OpKind::Var || op == OpKind::Std ||
         op == OpKind::LogSumExp || op == OpKind::Norm;
}

GeneratedKernel emit_reduction_stats(const ir::Graph& graph, const std::string& symbol) {
  std::size_t at_node = 0;
  while (at_node < graph.nodes().size() && !host_reduction_stats_supports(graph.nodes()[at_node].op)) ++at_node;
  if (at_node == graph.nodes().size())
    throw Error(ErrorKind::kInvalidArgument, "[host codegen] the graph holds no statistics reduction");
  const ir::Node& node = graph.nodes()[at_node];
  if (graph.inputs().size() != 1 || graph.outputs().size() != 1 || graph.nodes().size() != 2 ||
      graph.outputs()[0] != static_cast<ir::ValueId>(at_node))
    throw Error(ErrorKind::kInvalidArgument,
                "[host codegen] " + std::string(ir::name(node.op)) + ": a reduction kernel is one reduction of one input");
  const ir::TensorType& in = graph.type(graph.inputs()[0]);
  const StatsKernel k = describe(node, in.dtype);
  const int rank = static_cast<int>(in.rank());
  std::vector<bool> reduced(static_cast<std::size_t>(rank), false);
  const auto dims = node.attrs.get_ints("dims", {});
  for (std::int64_t d : dims) reduced[static_cast<std::size_t>(d < 0 ? d + rank : d)] = true;
  if (dims.empty()) reduced.assign(static_cast<std::size_t>(rank), true);
  int last_reduced = -1;
  for (int d = 0; d < rank; ++d)
    if (reduced[static_cast<std::size_t>(d)]) last_reduced = d;
  const bool rows = rank > 0 && last_reduced == rank - 1;
  const std::string in_t = storage_type(in.dtype), out_t = storage_type(node.type.dtype);
  const int np = static_cast<int>(k.passes.size());

  std::ostringstream s;
  s << "namespace ns_" << symbol << " {\n"
    << "using T = " << k.t << ";\n" << k.helpers
    << "struct Context { char* out; const char* in; int64_t sizes[VTPU_MAX_RANK]; int64_t out_strides[VTPU_MAX_RANK];"
    << " int64_t in_strides[VTPU_MAX_RANK]; int64_t count; const double* scalars; };\n"
    << "constexpr int kLanes = 32;\n";
  // The passes as functions, so the loop scaffolding below is op-independent.
  for (int p = 0; p < np; ++p) {
    const Pass& pass = k.passes[static_cast<std::size_t>(p)];
    const std::string prev = p == 0 ? "double" : k.passes[static_cast<std::size_t>(p - 1)].result_type;
    s << "static inline " << pass.acc << " init" << p << "() { return " << pass.init << "; }\n"
      << "static inline " << pass.acc << " value" << p << "(T x, int64_t i, const double* s, " << prev
      << " p) { (void)i; (void)s; (void)p; return " << pass.value << "; }\n"
      << "static inline " << pass.acc << " combine" << p << "(" << pass.acc << " a, " << pass.acc
      << " b) { return " << pass.combine << "; }\n"
      << "static inline " << pass.result_type << " result" << p << "(" << pass.acc
      << " a, int64_t n) { (void)n; return " << pass.result << "; }\n";
  }
  s << "static inline auto finish(";
  for (int p = 0; p < np; ++p) s << k.passes[static_cast<std::size_t>(p)].result_type << " p" << p << ", ";
  s << "int64_t n, const double* s) { (void)n; (void)s; return " << k.finish << "; }\n";

  s << "void body(int64_t begin, int64_t end, void* raw) {\n"
    << "  const Context c = *static_cast<const Context*>(raw);  // a copy: see host_codegen.cpp\n"
    << "  const " << in_t << "* in = reinterpret_cast<const " << in_t << "*>(c.in);\n"
    << "  " << out_t << "* out = reinterpret_cast<" << out_t << "*>(c.out);\n";
  auto load = [&](const std::string& index) { return "static_cast<T>(vtpu_load(in[" + index + "]))"; };
  const ReductionLoops loops(s, rank, reduced);

  if (rows) {
    loops.emit_offsets("  ", "begin");
    s << "  const int64_t n = c.sizes[" << last_reduced << "], st = c.in_strides[" << last_reduced << "];\n"
      << "  for (int64_t o = begin; o < end; ++o) {\n";
    for (int p = 0; p < np; ++p) {
      const Pass& pass = k.passes[static_cast<std::size_t>(p)];
      const std::string prev = p == 0 ? "0.0" : "p" + std::to_string(p - 1), ps = std::to_string(p);
      s << "    " << pass.result_type << " p" << p << ";\n    {\n      " << pass.acc << " a = init" << p
        << "();\n      int64_t lin = 0;\n";
      auto [offset, depth] = loops.open_loops("      ", true);
      const std::string ind = "      " + std::string(2 * depth, ' ');
      auto lanes = [&](const std::string& index) {
        return "vtpu_lanes_reduce<" + pass.acc + ">(n, init" + ps + "(), [&](int64_t i) { return value" + ps + "(" +
               load(index) + ", lin * n + i, c.scalars, " + prev + "); }, " +
               lane_combine(pass.acc, pass.combine == "vtpu_max(a, b)" || pass.combine == "vtpu_min(a, b)"
                                          ? pass.combine
                                          : "combine" + ps + "(a, b)") + ")";
      };
      s << ind << "const int64_t base = " << offset << ";\n"
        << ind << "const " << pass.acc << " part = st == 1 ? " << lanes("base + i") << "\n"
        << ind << "    : " << lanes("base + i * st") << ";\n"
        << ind << "a = combine" << p << "(a, part);\n" << ind << "++lin;\n";
      loops.close_loops("      ", depth);
      s << "      p" << p << " = result" << p << "(a, c.count);\n    }\n";
    }
    s << "    out[out_off] = vtpu_store_t<" << out_t << ">::of(finish(";
    for (int p = 0; p < np; ++p) s << "p" << p << ", ";
    s << "c.count, c.scalars));\n";
    loops.emit_advance("    ");
    s << "  }\n";
  } else {
    const int last = rank - 1;
    const std::string inner_size = rank > 0 ? "c.sizes[" + std::to_string(last) + "]" : "1";
    const std::string in_st = rank > 0 ? "c.in_strides[" + std::to_string(last) + "]" : "0";
    const std::string out_st = rank > 0 ? "c.out_strides[" + std::to_string(last) + "]" : "0";
    const std::string k_last = rank > 0 ? "k" + std::to_string(last) : "0";
    s << "  for (int64_t o = begin; o < end;) {\n";
    loops.emit_offsets("    ", "o");
    s << "    const int64_t group = std::min<int64_t>({(int64_t)kLanes, " << inner_size << " - " << k_last
      << ", end - o});\n"
      << "    const int64_t st = " << in_st << ";\n";
    for (int p = 0; p < np; ++p) {
      const Pass& pass = k.passes[static_cast<std::size_t>(p)];
      const std::string prev = p == 0 ? "0.0" : "p" + std::to_string(p - 1) + "[l]", ps = std::to_string(p);
      s << "    " << pass.result_type << " p" << p << "[kLanes];\n    {\n      " << pass.acc
        << " a[kLanes];\n      for (int l = 0; l < kLanes; ++l) a[l] = init" << p << "();\n"
        << "      int64_t lin = 0;\n";
      auto [offset, depth] = loops.open_loops("      ", false);
      const std::string ind = "      " + std::string(2 * depth, ' ');
      auto step = [&](const std::string& index) {
        return "a[l] = combine" + ps + "(a[l], value" + ps + "(" + load(index) + ", lin, c.scalars, " + prev + "));";
      };
      s << ind << "const int64_t base = " << offset << ";\n"
        << ind << "if (group == kLanes && st == 1) { for (int l = 0; l < kLanes; ++l) " << step("base + l") << " }\n"
        << ind << "else { for (int l = 0; l < group; ++l) " << step("base + l * st") << " }\n"
        << ind << "++lin;\n";
      loops.close_loops("      ", depth);
      s << "      for (int l = 0; l < group; ++l) p" << p << "[l] = result" << p << "(a[l], c.count);\n    }\n";
    }
    s << "    for (int l = 0; l < group; ++l) out[out_off + l * " << out_st << "] = vtpu_store_t<" << out_t
      << ">::of(finish(";
    for (int p = 0; p < np; ++p) s << "p" << p << "[l], ";
    s << "c.count, c.scalars));\n    o += group;\n  }\n";
  }
  s << "}\n}  // namespace ns_" << symbol << "\n";

  loops.emit_entry(symbol, true);
  return {symbol, s.str()};
}

}  // namespace vtpu::compiler::detail
