// A reduction (sum, mean, prod, amax, amin) fused with elementwise work over
// its input's iteration space: fused eager mode's window puts a reduction
// into the cluster that computes its input (RMSNorm's pow before its mean, a
// backward's product before its sum), so the input never goes through memory.
//
// Launch contract (extends host_codegen.h's): rank = the iteration space's
// (the reduction input's) rank; tensors = the graph's outputs in order, then
// its inputs, each described in the iteration space with its own strides
// (the reduction's output has stride 0 along the reduced dims, as in
// host_codegen_reduction.cpp). Elementwise outputs are written once per
// element. Parallel over reduction outputs.
//
// Bits: each reduction output accumulates its elements in exactly the order
// of the single-op reduction kernel (host_codegen_reduction.cpp: rows through
// vtpu_lanes_reduce, columns in sequential order per output), and each
// element's value is what the single-op elementwise kernels would have stored
// (half/bf16 rounded to storage, float kept in float), so the fused kernel
// gives the bits strict mode gets from the unfused ops.
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "host_codegen_internal.h"
#include "host_codegen_narrow_columns.h"
#include "vtpu/compiler/launch_abi.h"
#include "vtpu/runtime/error.h"

namespace vtpu::compiler::detail {
namespace {

using ir::DType;
using ir::OpKind;

bool is_fusable_reduction(OpKind op) {
  return op == OpKind::Sum || op == OpKind::Mean || op == OpKind::Prod || op == OpKind::Amax || op == OpKind::Amin;
}

}  // namespace

GeneratedKernel emit_fused_reduction(const ir::Graph& graph, const std::string& symbol) {
  // The one reduction, and checks that everything else is elementwise work
  // over its input's shape.
  ir::ValueId reduction = -1;
  for (std::size_t i = 0; i < graph.nodes().size(); ++i) {
    const ir::Node& node = graph.nodes()[i];
    if (host_reduction_supports(node.op)) {
      if (reduction >= 0) refuse(node.op, "a fused reduction kernel holds one reduction");
      reduction = static_cast<ir::ValueId>(i);
    }
  }
  if (reduction < 0 || !is_fusable_reduction(graph.node(reduction).op))
    throw runtime::Error(runtime::ErrorKind::kInvalidArgument, "[host codegen] no reduction to fuse");
  const ir::Node& red = graph.node(reduction);
  const ir::ValueId red_input = red.inputs.at(0);
  const ir::TensorType& space = graph.type(red_input);
  const int rank = static_cast<int>(space.rank());
  if (rank == 0 || rank > kMaxRank) refuse(red.op, "a fused reduction needs an input of rank 1.." + std::to_string(kMaxRank));
  for (std::size_t i = 0; i < graph.nodes().size(); ++i) {
    const ir::Node& node = graph.nodes()[i];
    if (static_cast<ir::ValueId>(i) == reduction || node.op == OpKind::Constant) continue;
    for (ir::ValueId in : node.inputs)
      if (in == reduction) refuse(node.op, "reads the reduction it is fused with");
    if (node.op != OpKind::Input && !ir::is_elementwise(node.op))
      refuse(node.op, "is not elementwise; a fused reduction's other work must be");
    if (node.type.sizes != space.sizes) refuse(node.op, "is not in the reduction input's iteration space");
  }
  std::vector<bool> reduced(static_cast<std::size_t>(rank), false);
  const auto dims = red.attrs.get_ints("dims", {});
  for (std::int64_t d : dims) reduced[static_cast<std::size_t>(d < 0 ? d + rank : d)] = true;
  if (dims.empty()) reduced.assign(static_cast<std::size_t>(rank), true);
  int last_reduced = -1;
  for (int d = 0; d < rank; ++d)
    if (reduced[static_cast<std::size_t>(d)]) last_reduced = d;
  // The row: the trailing run of reduced dims, reduced as one row of their
  // flattened elements, as host_codegen_reduction.cpp does.
  int row_start = -1;  // columns: no row
  if (last_reduced == rank - 1)
    for (row_start = last_reduced; row_start > 0 && reduced[static_cast<std::size_t>(row_start - 1)];) --row_start;

  const auto& outputs = graph.outputs();
  const int num_outputs = static_cast<int>(outputs.size());
  const int num_tensors = num_outputs + static_cast<int>(graph.inputs().size());
  int red_slot = -1;
  for (int k = 0; k < num_outputs; ++k)
    if (outputs[static_cast<std::size_t>(k)] == reduction) red_slot = k;
  if (red_slot < 0) refuse(red.op, "the fused reduction's result must be an output");

  // The accumulator and combine, as host_codegen_reduction.cpp has them.
  const DType in_dtype = space.dtype;
  const bool floating = ir::is_floating(red.common_dtype) || ir::is_floating(in_dtype);
  const bool extremum = red.op == OpKind::Amax || red.op == OpKind::Amin;
  const std::string acc = !floating ? "int64_t" : extremum ? storage_type(ir::compute_type(in_dtype)) : "double";
  std::string init, combine;  // combine of a and b, as an expression
  switch (red.op) {
    case OpKind::Sum:
    case OpKind::Mean: init = acc + "(0)"; combine = "a + b"; break;
    case OpKind::Prod: init = acc + "(1)"; combine = "a * b"; break;
    case OpKind::Amax: init = floating ? "-INFINITY" : "INT64_MIN"; combine = "vtpu_max(a, b)"; break;
    default: init = floating ? "INFINITY" : "INT64_MAX"; combine = "vtpu_min(a, b)"; break;
  }
  const std::string finish = red.op == OpKind::Mean ? " / static_cast<double>(c.count)" : "";
  const std::string out_t = storage_type(red.type.dtype);
  auto slot = [](int t) { return std::to_string(t); };

  std::ostringstream s;
  s << "namespace ns_" << symbol << " {\nstruct Context {\n";
  for (int t = 0; t < num_tensors; ++t) s << "  char* p" << t << ";\n";
  s << "  const double* scalars;\n  int64_t count;\n  int64_t sizes[VTPU_MAX_RANK];\n  int64_t strides["
    << num_tensors << "][VTPU_MAX_RANK];\n"
    << "  int64_t row_n;\n  int64_t row_st[" << num_tensors << "];\n  bool row_merged;\n  bool row_fast;\n"
    << "  bool col_fast;\n  void* parts;\n  int64_t segments;\n  bool r_nested;\n  int64_t r_st[" << num_tensors
    << "];\n};\n"
    << "constexpr int kLanes = 32;\nconstexpr int kGroup = 2048;\n";
  // The row's offset of element i of tensor t when its dims do not nest.
  s << "inline int64_t row_offset(const Context& c, int t, int64_t i) {\n  int64_t off = 0;\n";
  for (int d = rank - 1; d >= row_start && row_start >= 0; --d)
    s << "  off += (i % c.sizes[" << d << "]) * c.strides[t][" << d << "]; i /= c.sizes[" << d << "];\n";
  s << "  return off;\n}\n";
  // The fast row: every tensor walks the row with a stride known here (1, or
  // 0 for a broadcast input), so the loop vectorises without gathers.
  // Inputs: the stride their layout class implies (the class is in the
  // kernel's key); stored outputs: 1. Checked at launch (row_fast).
  std::vector<int> fast_stride(static_cast<std::size_t>(num_tensors), 1);
  bool has_fast = row_start >= 0;
  for (std::size_t k = 0; k < graph.inputs().size() && has_fast; ++k) {
    const ir::TensorType& type = graph.type(graph.inputs()[k]);
    std::int64_t n = 1, st = 0;
    bool nested = true;
    for (int d = rank - 1; d >= row_start; --d) {
      const auto du = static_cast<std::size_t>(d);
      if (type.sizes[du] == 1) continue;
      if (n == 1) st = type.strides[du];
      else if (type.strides[du] != n * st) nested = false;
      n *= type.sizes[du];
    }
    if (!nested || (st != 0 && st != 1)) has_fast = false;
    fast_stride[static_cast<std::size_t>(num_outputs) + k] = static_cast<int>(st);
  }
  fast_stride[static_cast<std::size_t>(red_slot)] = 0;
  // Columns: the same along the kept innermost dim, which the l-loop walks:
  // with every tensor's stride known (1, or 0 for an input broadcast along
  // it), the loop over a block of kLanes neighbouring outputs vectorises.
  std::vector<int> col_stride(static_cast<std::size_t>(num_tensors), 1);
  bool has_col_fast = row_start < 0;
  for (std::size_t k = 0; k < graph.inputs().size() && has_col_fast; ++k) {
    const std::int64_t st = graph.type(graph.inputs()[k]).strides[static_cast<std::size_t>(rank - 1)];
    if (st != 0 && st != 1) has_col_fast = false;
    col_stride[static_cast<std::size_t>(num_outputs) + k] = static_cast<int>(st);
  }
  // element(): one element's elementwise work and stores; returns the value
  // the reduction accumulates.
  // It takes the tensors' pointers and the scalars by value, not the
  // Context: read through a reference inside the row's lane loop, GCC did
  // not hoist them past the element's stores and left the loop scalar (a
  // ReLU + mean over H, W of random data ran 30x slower, its ReLU a
  // mispredicted branch per element).
  s << "struct Scalars { const double* scalars; };\n";
  s << "inline " << acc << " element(Scalars c";
  for (int t = 0; t < num_tensors; ++t)
    if (t != red_slot) s << ", char* p" << t;
  for (int t = 0; t < num_tensors; ++t)
    if (t != red_slot) s << ", int64_t o" << t;
  s << ") {\n";
  emit_elementwise_values(
      s, graph,
      [&](int position, DType dtype) {
        const int t = num_outputs + position;
        return "*reinterpret_cast<const " + std::string(storage_type(dtype)) + "*>(p" + slot(t) + " + o" + slot(t) +
               " * " + std::to_string(ir::itemsize(dtype)) + ")";
      },
      [&](const ir::Node& node) { return &node == &red; });
  for (int k = 0; k < num_outputs; ++k) {
    if (k == red_slot) continue;
    const ir::ValueId id = outputs[static_cast<std::size_t>(k)];
    const DType dt = graph.type(id).dtype;
    s << "  *reinterpret_cast<" << storage_type(dt) << "*>(p" << k << " + o" << k << " * " << ir::itemsize(dt)
      << ") = vtpu_store_t<" << storage_type(dt) << ">::of(v" << id << ");\n";
  }
  s << "  return static_cast<" << acc << ">(v" << red_input << ");\n}\n";

  // Offsets of every tensor for output number `o` (kept-dim coordinates).
  auto emit_offsets = [&](const std::string& ind, const std::string& index, std::ostream* to = nullptr) {
    std::ostream& out = to != nullptr ? *to : s;
    out << ind << "int64_t rest = " << index << ";\n";
    for (int t = 0; t < num_tensors; ++t) out << ind << "int64_t off" << t << " = 0;\n";
    for (int d = rank - 1; d >= 0; --d) {
      if (reduced[static_cast<std::size_t>(d)]) continue;
      out << ind << "const int64_t k" << d << " = rest % c.sizes[" << d << "]; rest /= c.sizes[" << d << "];\n";
      for (int t = 0; t < num_tensors; ++t) out << ind << "off" << t << " += k" << d << " * c.strides[" << t << "][" << d << "];\n";
    }
  };
  // Loops over the reduced dims in row-major order (all, or all but the
  // innermost); inside them base<t> is tensor t's offset.
  auto open_loops = [&](const std::string& ind, bool skip_last) {
    int depth = 0;
    std::vector<std::string> base(static_cast<std::size_t>(num_tensors));
    for (int t = 0; t < num_tensors; ++t) base[static_cast<std::size_t>(t)] = "off" + slot(t);
    for (int d = 0; d < rank; ++d) {
      if (!reduced[static_cast<std::size_t>(d)] || (skip_last && d >= row_start)) continue;
      s << ind << std::string(2 * depth, ' ') << "for (int64_t r" << d << " = 0; r" << d << " < c.sizes[" << d
        << "]; ++r" << d << ") {\n";
      for (int t = 0; t < num_tensors; ++t)
        base[static_cast<std::size_t>(t)] += " + r" + std::to_string(d) + " * c.strides[" + slot(t) + "][" + std::to_string(d) + "]";
      ++depth;
    }
    const std::string in = ind + std::string(2 * depth, ' ');
    for (int t = 0; t < num_tensors; ++t) s << in << "const int64_t base" << t << " = " << base[static_cast<std::size_t>(t)] << ";\n";
    return depth;
  };
  auto close_loops = [&](const std::string& ind, int depth) {
    for (; depth > 0; --depth) s << ind << std::string(2 * (depth - 1), ' ') << "}\n";
  };
  // element()'s leading arguments: the scalars and the tensors' pointers,
  // read from the Context (`from_context`) or from the fast row's copies.
  auto element_head = [&](bool from_context) {
    std::string text = from_context ? "element(Scalars{c.scalars}" : "element(q_";
    for (int t = 0; t < num_tensors; ++t)
      if (t != red_slot) text += (from_context ? ", c.p" : ", q") + slot(t);
    return text;
  };
  auto call = [&](const std::string& step) {  // element() at base<t> + step * st<t>
    std::string text = element_head(true);
    for (int t = 0; t < num_tensors; ++t)
      if (t != red_slot) text += ", base" + slot(t) + " + " + step + " * st" + slot(t);
    return text + ")";
  };
  auto call_with = [&](const std::function<std::string(int)>& offset, bool from_context = true) {
    std::string text = element_head(from_context);
    for (int t = 0; t < num_tensors; ++t)
      if (t != red_slot) text += ", base" + slot(t) + offset(t);
    return text + ")";
  };
  auto store = [&](const std::string& offset, const std::string& value) {
    return "*reinterpret_cast<" + out_t + "*>(c.p" + slot(red_slot) + " + (" + offset + ") * " +
           std::to_string(ir::itemsize(red.type.dtype)) + ") = vtpu_store_t<" + out_t + ">::of(" + value + finish + ");";
  };

  s << "void body(int64_t begin, int64_t end, void* raw) {\n"
    << "  const Context c = *static_cast<const Context*>(raw);  // a copy: see host_codegen.cpp\n";
  const bool rows = last_reduced == rank - 1;
  // One row's part (or, with `segment`, the part of its segment at b of len
  // elements), in vtpu_lanes_reduce's order; needs base<t> in scope.
  auto emit_row_part = [&](const std::string& ind, bool segment) {
    for (int t = 0; t < num_tensors; ++t) s << ind << "const int64_t st" << t << " = c.row_st[" << t << "];\n";
    // The fast row touches element i of every tensor at step i (the
    // window's rules: a buffer read and written is the same memory at the
    // same offsets), so its lane loop carries no dependence.
    auto lanes = [&](const std::string& value, bool ivdep = false) {
      const std::string fn = std::string(segment ? "vtpu_lanes_segment" : "vtpu_lanes_reduce") + (ivdep ? "_ivdep<" : "<");
      return fn + acc + ">(" + (segment ? "b, len, " : "c.row_n, ") + acc + "(" + init + "), [" + (ivdep ? "=" : "&") +
             "](int64_t i) { return " + value + "; }, " + (num_outputs == 1 ? lane_combine(acc, combine) : "[](" + acc + " a, " + acc + " b) { return " + combine + "; }") + ")";
    };
    s << ind << "const " << acc << " part =\n";
    if (has_fast) {
      // The fast row's lane loop reads copies of the pointers, captured by
      // value (see element()).
      std::string copies = "const Scalars q_{c.scalars};";
      for (int t = 0; t < num_tensors; ++t)
        if (t != red_slot) copies += " char* const q" + slot(t) + " = c.p" + slot(t) + ";";
      s << ind << "    c.row_fast ? [&] { " << copies << " return " << lanes(call_with([&](int t) {
        return fast_stride[static_cast<std::size_t>(t)] == 1 ? std::string(" + i") : std::string();
      }, /*from_context=*/false), /*ivdep=*/true) << "; }() :\n";
    }
    s << ind << "    c.row_merged ? " << lanes(call("i")) << " :\n"
      << ind << "    " << lanes(call_with([&](int t) { return " + row_offset(c, " + slot(t) + ", i)"; })) << ";\n";
  };
  if (rows) {
    s << "  for (int64_t o = begin; o < end; ++o) {\n";
    emit_offsets("    ", "o");
    s << "    " << acc << " acc = " << init << ";\n";
    const int depth = open_loops("    ", true);
    const std::string ind = "    " + std::string(2 * depth, ' ');
    emit_row_part(ind, false);
    s << ind << "{ const " << acc << " a = acc, b = part; acc = " << combine << "; }\n";
    close_loops("    ", depth);
    s << "    " << store("off" + slot(red_slot), "acc") << "\n  }\n";
  } else {
    // Columns: groups of up to kGroup neighbouring outputs along the kept
    // innermost dim, each accumulated in sequential order. A group is wide
    // (2048 accumulators, 16 KiB of doubles) so that each row of each tensor
    // is read as one run of up to 8 KiB: with groups of 32 outputs every row
    // of every tensor was a separate page (TLB misses dominated a column sum
    // fused with a backward's elementwise work). Each output's order is the
    // same for any group width.
    const std::string last = std::to_string(rank - 1);
    s << "  for (int64_t o = begin; o < end;) {\n";
    emit_offsets("    ", "o");
    s << "    const int64_t group = std::min<int64_t>({(int64_t)kGroup, c.sizes[" << last << "] - k" << last
      << ", end - o});\n";
    for (int t = 0; t < num_tensors; ++t) s << "    const int64_t st" << t << " = c.strides[" << t << "][" << last << "];\n";
    // Only the group's accumulators: a narrow kept dim (sum(1) of
    // [200000, 3, 2]) makes many groups of one or two columns.
    s << "    " << acc << " lanes[kGroup];\n"
      << "    for (int l = 0; l < group; ++l) lanes[l] = " << init << ";\n";
    const int depth = open_loops("    ", false);
    const std::string ind = "    " + std::string(2 * depth, ' ');
    if (has_col_fast)
      s << ind << "if (c.col_fast) {\n"
        << ind << "  int64_t l = 0;\n"
        << ind << "  for (; l + kLanes <= group; l += kLanes) {\n"
        << ind << "    #pragma GCC ivdep\n"
        << ind << "    for (int j = 0; j < kLanes; ++j) { const " << acc << " a = lanes[l + j], b = "
        << call_with([&](int t) {
             return col_stride[static_cast<std::size_t>(t)] == 1 ? std::string(" + (l + j)") : std::string();
           })
        << "; lanes[l + j] = " << combine << "; }\n"
        << ind << "  }\n"
        << ind << "  for (; l < group; ++l) { const " << acc << " a = lanes[l], b = " << call("l")
        << "; lanes[l] = " << combine << "; }\n"
        << ind << "} else\n";
    s << ind << "for (int l = 0; l < group; ++l) { const " << acc << " a = lanes[l], b = " << call("l")
      << "; lanes[l] = " << combine << "; }\n";
    close_loops("    ", depth);
    s << "    for (int l = 0; l < group; ++l) " << store("off" + slot(red_slot) + " + l * st" + slot(red_slot), "lanes[l]")
      << "\n    o += group;\n  }\n";
  }
  s << "}\n";
  // Long rows over few outputs: tasks of one segment of one output's row on
  // the threads, combined in order by the entry (host_codegen_reduction.cpp
  // says why; the same bits as the one-thread path). Each element's
  // elementwise work and stores run once, in the task of its segment.
  bool segmented = rows;
  for (int d = 0; d < row_start && segmented; ++d) segmented = !reduced[static_cast<std::size_t>(d)];
  if (segmented) {
    s << "void segment_body(int64_t begin, int64_t end, void* raw) {\n"
      << "  const Context c = *static_cast<const Context*>(raw);\n"
      << "  " << acc << "* parts = static_cast<" << acc << "*>(c.parts);\n"
      << "  for (int64_t t = begin; t < end; ++t) {\n"
      << "    const int64_t o = t / c.segments, b = (t % c.segments) * kVtpuSegment;\n"
      << "    const int64_t len = std::min(kVtpuSegment, c.row_n - b);\n";
    emit_offsets("    ", "o");
    const int depth = open_loops("    ", true);  // no loops: only the row is reduced
    emit_row_part("    ", true);
    close_loops("    ", depth);
    s << "    parts[t] = part;\n  }\n}\n";
  }
  // Narrow columns (host_codegen_narrow_columns.h): the single-op kernel's
  // order, element() computing each value once.
  std::string narrow_dispatch;
  if (!rows && NarrowColumns::applies(rank, reduced)) {
    const std::string last = std::to_string(rank - 1);
    auto combine_expr = [&](const std::string& a, const std::string& b) {
      return "[](" + acc + " a, " + acc + " b) { return " + combine + "; }(" + a + ", " + b + ")";
    };
    NarrowColumns columns{s, rank, reduced, num_tensors, acc, init, combine_expr,
                          [](const std::string& t, const std::string& d) { return "c.strides[" + t + "][" + d + "]"; }};
    columns.skip_tensor = red_slot;
    auto store_g = [&](const std::string& g, const std::string& value) {
      return store("off" + slot(red_slot) + " + " + g + " * c.strides[" + slot(red_slot) + "][" + last + "]", value);
    };
    columns.emit_task([&](const std::string& o) { emit_offsets("  ", o); },
                      [&](const std::string& ind) {
                        std::string call = element_head(true);
                        for (int t = 0; t < num_tensors; ++t)
                          if (t != red_slot) call += ", row" + slot(t) + " + g * st" + slot(t);
                        s << ind << "for (int64_t g = 0; g < group; ++g) lane[g] = " << combine_expr("lane[g]", call + ")")
                          << ";\n";
                      },
                      "", nullptr);
    columns.emit_bodies([&](const std::string& o) { emit_offsets("    ", o); }, store_g);
    narrow_dispatch = columns.dispatch([&](std::ostream& d, const std::string& o) { emit_offsets("          ", o, &d); },
                                       store_g);
  }
  s << "}  // namespace ns_" << symbol << "\n";

  s << "extern \"C\" __attribute__((visibility(\"default\"))) void " << symbol
    << "(const struct VtpuLaunchArgs* args) {\n"
    << "  using namespace ns_" << symbol << ";\n"
    << "  Context c;\n  c.scalars = args->scalars;\n  int64_t outputs = 1; c.count = 1;\n";
  for (int t = 0; t < num_tensors; ++t)
    s << "  c.p" << t << " = static_cast<char*>(args->tensors[" << t << "].data);\n";
  for (int d = 0; d < rank; ++d) {
    const std::string ds = std::to_string(d);
    // The sizes of the iteration space: every tensor is described in it;
    // the reduction's output has the input's size along reduced dims.
    s << "  c.sizes[" << ds << "] = args->tensors[" << red_slot << "].sizes[" << ds << "];\n";
    for (int t = 0; t < num_tensors; ++t)
      s << "  c.strides[" << t << "][" << ds << "] = args->tensors[" << t << "].strides[" << ds << "];\n";
    s << (reduced[static_cast<std::size_t>(d)] ? "  c.count *= c.sizes[" : "  outputs *= c.sizes[") << ds << "];\n";
  }
  if (row_start >= 0) {
    // Whether every tensor's row dims nest in memory (one run of stride
    // row_st[t]), and whether the strides are the fast row's. The
    // reduction's output does not walk the row (its strides along the
    // reduced dims are whatever its keepdim view has, 1 as often as 0:
    // counting them sent a ReLU + mean over H, W down the per-element
    // offset path, 8x slower).
    s << "  c.row_n = 1; c.row_merged = true;\n"
      << "  for (int t = 0; t < " << num_tensors << "; ++t) c.row_st[t] = 0;\n"
      << "  for (int d = " << rank - 1 << "; d >= " << row_start << "; --d) {\n"
      << "    if (c.sizes[d] == 1) continue;\n"
      << "    for (int t = 0; t < " << num_tensors << "; ++t) {\n"
      << "      if (t == " << red_slot << ") continue;\n"
      << "      if (c.row_n == 1) c.row_st[t] = c.strides[t][d];\n"
      << "      else if (c.strides[t][d] != c.row_n * c.row_st[t]) c.row_merged = false;\n"
      << "    }\n"
      << "    c.row_n *= c.sizes[d];\n  }\n"
      << "  c.row_fast = c.row_merged";
    for (int t = 0; t < num_tensors; ++t)
      if (t != red_slot) s << " && c.row_st[" << t << "] == " << fast_stride[static_cast<std::size_t>(t)];
    s << ";\n";
  }
  if (has_col_fast) {
    s << "  c.col_fast = true";
    for (int t = 0; t < num_tensors; ++t)
      if (t != red_slot)
        s << " && c.strides[" << t << "][" << rank - 1 << "] == " << col_stride[static_cast<std::size_t>(t)];
    s << ";\n";
  }
  s << "  if (outputs <= 0) return;\n";
  if (segmented) {
    s << "  if (args->parallel_for != nullptr && outputs < 64 && c.row_n > kVtpuSegment) {\n"
      << "    c.segments = vtpu_segments(c.row_n);\n"
      << "    vtpu_scratch<" << acc << "> parts(outputs * c.segments);\n"
      << "    if (parts.p != nullptr) {\n"
      << "      c.parts = parts.p;\n"
      << "      args->parallel_for(outputs * c.segments, 1, &segment_body, &c, args->runner);\n"
      << "      for (int64_t o = 0; o < outputs; ++o) {\n";
    emit_offsets("        ", "o");
    s << "        " << acc << " acc = " << init << ";\n"
      << "        const " << acc << " part = vtpu_segments_combine(parts.p + o * c.segments, c.segments, " << acc << "("
      << init << "), [](" << acc << " a, " << acc << " b) { return " << combine << "; });\n"
      << "        { const " << acc << " a = acc, b = part; acc = " << combine << "; }\n"
      << "        " << store("off" + slot(red_slot), "acc") << "\n"
      << "      }\n      return;\n    }\n  }\n";
  }
  s << narrow_dispatch;
  s << "  int64_t grain = c.count > 0 ? (32768 + c.count - 1) / c.count : 32768;\n";
  // Columns: a parallel chunk is a whole group where there are enough
  // columns (host_codegen_reduction.cpp says why).
  if (!rows) s << "  grain = std::max<int64_t>(grain, std::min<int64_t>(kGroup, (outputs + 1) / 2));\n";
  s << "  if (args->parallel_for != nullptr && outputs > 1 && outputs * c.count > 32768)\n"
    << "    args->parallel_for(outputs, grain, &body, &c, args->runner);\n"
    << "  else body(0, outputs, &c);\n}\n";
  return {symbol, s.str()};
}

}  // namespace vtpu::compiler::detail
