// Reductions (sum, mean, prod, amax, amin over any dims, keepdim or not) for
// the host code generator. One kernel per (dtype, rank, reduced-dims set):
// sizes and strides are launch arguments.
//
// Launch contract (extends host_codegen.h's): rank = the input's rank;
// tensors[0] is the output described in the input's dims (a reduced dim has
// the input's size and stride 0), tensors[1] the input. Parallel over output
// elements; each output element's reduction runs in one thread, in a fixed
// order, so results do not depend on the thread count.
#include <sstream>
#include <utility>
#include <string>
#include <vector>

#include "host_codegen_internal.h"
#include "host_codegen_narrow_columns.h"
#include "host_codegen_reduction_loops.h"
#include "vtpu/runtime/error.h"

namespace vtpu::compiler::detail {
namespace {

using ir::DType;
using ir::OpKind;

bool is_reduction_kernel(OpKind op) {
  return op == OpKind::Sum || op == OpKind::Mean || op == OpKind::Prod || op == OpKind::Amax ||
         op == OpKind::Amin;
}

}  // namespace

bool host_reduction_supports(OpKind op) { return is_reduction_kernel(op); }

GeneratedKernel emit_reduction(const ir::Graph& graph, const std::string& symbol) {
  using runtime::Error;
  using runtime::ErrorKind;
  // A reduction with elementwise work around it (fused eager's window).
  if (graph.inputs().size() != 1 || graph.outputs().size() != 1 || graph.nodes().size() != 2)
    return emit_fused_reduction(graph, symbol);
  const ir::Node& node = graph.node(graph.outputs()[0]);
  if (!is_reduction_kernel(node.op))
    throw Error(ErrorKind::kInvalidArgument,
                "[host codegen] " + std::string(ir::name(node.op)) + " has no reduction kernel");
  const ir::TensorType& in = graph.type(graph.inputs()[0]);
  const int rank = static_cast<int>(in.rank());
  std::vector<bool> reduced(static_cast<std::size_t>(rank), false);
  const auto dims = node.attrs.get_ints("dims", {});
  for (std::int64_t d : dims) reduced[static_cast<std::size_t>(d < 0 ? d + rank : d)] = true;
  if (dims.empty()) reduced.assign(static_cast<std::size_t>(rank), true);

  const DType out_dtype = node.type.dtype;
  const bool floating = ir::is_floating(node.common_dtype) || ir::is_floating(in.dtype);
  // Sums and products of floats accumulate in double (close to a correctly
  // rounded result; ATen's cascade sum in float is within an ulp or two of
  // it), integers in int64; max and min are exact in the compute type.
  const bool extremum = node.op == OpKind::Amax || node.op == OpKind::Amin;
  const std::string acc = !floating ? "int64_t" : extremum ? storage_type(ir::compute_type(in.dtype)) : "double";
  std::string init, combine;
  switch (node.op) {
    case OpKind::Sum:
    case OpKind::Mean: init = acc + "(0)"; combine = "A = A + X;"; break;
    case OpKind::Prod: init = acc + "(1)"; combine = "A = A * X;"; break;
    case OpKind::Amax:
      init = floating ? "-INFINITY" : "INT64_MIN";
      combine = "A = vtpu_max(A, X);";
      break;
    default:
      init = floating ? "INFINITY" : "INT64_MAX";
      combine = "A = vtpu_min(A, X);";
      break;
  }
  auto step = [&](const std::string& a, const std::string& x) {
    std::string text = combine;
    text.replace(text.find('A'), 1, a);
    text.replace(text.find('A'), 1, a);
    text.replace(text.find('X'), 1, x);
    return text;
  };
  const std::string in_t = storage_type(in.dtype);
  auto load = [&](const std::string& index) {
    return "static_cast<" + acc + ">(vtpu_load(in[" + index + "]))";
  };
  const std::string finish = node.op == OpKind::Mean ? " / static_cast<double>(c.count)" : "";
  const std::string out_t = storage_type(out_dtype);

  int last_reduced = -1;
  for (int d = 0; d < rank; ++d)
    if (reduced[static_cast<std::size_t>(d)]) last_reduced = d;
  // Two loop shapes, chosen by the reduced-dims set (so fixed per kernel):
  // - the innermost dim is reduced ("rows"): each output's innermost run goes
  //   through vtpu_lanes_reduce (interleaved lanes, combined pairwise);
  //   vectorises, and the order depends only on the sizes, not on strides or
  //   threads;
  // - the innermost dim is kept ("columns"): up to kLanes neighbouring
  //   outputs along it are accumulated side by side, each in plain sequential
  //   order; vectorises across outputs.
  const bool rows = rank > 0 && last_reduced == rank - 1;
  constexpr int kLanes = 32;

  std::ostringstream s;
  // A row of several trailing reduced dims (x.sum((2, 3)) of NCHW, a
  // batch norm's statistics) is reduced as one row of their flattened
  // elements: vtpu_lanes_reduce over H*W elements instead of H rows of W,
  // each ending in a horizontal combine. The order depends on the sizes only;
  // a row whose dims do not nest in memory walks them with row_offset().
  const ReductionLoops loops(s, rank, reduced, /*merge_row=*/true);
  s << "namespace ns_" << symbol << " {\n"
    << "struct Context { char* out; const char* in; int64_t sizes[VTPU_MAX_RANK]; int64_t out_strides[VTPU_MAX_RANK];"
    << " int64_t in_strides[VTPU_MAX_RANK]; int64_t count; int64_t row_n; int64_t row_st; bool row_merged;"
    << " void* parts; int64_t segments; bool r_nested; int64_t r_st[1]; };\n"
    << "constexpr int kLanes = " << kLanes << ";\nconstexpr int kGroup = 2048;\n";
  if (loops.merged_row()) loops.emit_row_offset();
  s << "void body(int64_t begin, int64_t end, void* raw) {\n"
    << "  const Context c = *static_cast<const Context*>(raw);  // a copy: see host_codegen.cpp\n"
    << "  const " << in_t << "* in = reinterpret_cast<const " << in_t << "*>(c.in);\n"
    << "  " << out_t << "* out = reinterpret_cast<" << out_t << "*>(c.out);\n";

  // Rows of a transposed input (x.t().sum(-1), transpose(1, 2).amax(-1)):
  // each row walks memory across rows of the input, one element per cache
  // line (and page), while its neighbouring outputs' rows lie next to it.
  // When the innermost kept dim has stride 1 in the input, a block of
  // neighbouring outputs is reduced side by side: for each element position
  // i, one contiguous run of the input is read. Every output keeps
  // vtpu_lanes_reduce's own order (its segments, and in each element i to
  // lane i % 16, the padded last group, the pairwise combine; the segments'
  // results combined in order), so its bits are the plain rows path's
  // (4096x4096 float32 x.t().sum(-1): 16x the CPU's time before).
  int kept_inner = -1;
  for (int d = 0; d < rank; ++d)
    if (!reduced[static_cast<std::size_t>(d)]) kept_inner = d;
  bool only_row_reduced = true;
  for (int d = 0; d < loops.row_start(); ++d) only_row_reduced = only_row_reduced && !reduced[static_cast<std::size_t>(d)];
  const bool blocked_rows = rows && kept_inner >= 0 && only_row_reduced;
  const std::string row_not_unit = loops.merged_row()
                                       ? "!(c.row_merged && c.row_st == 1)"
                                       : "c.in_strides[" + std::to_string(last_reduced) + "] != 1";
  const std::string blocked_when =
      blocked_rows ? "c.in_strides[" + std::to_string(kept_inner) + "] == 1 && " + row_not_unit : "false";
  if (blocked_rows) {
    const std::string k = "k" + std::to_string(kept_inner), kd = std::to_string(kept_inner);
    const std::string n = loops.merged_row() ? "c.row_n" : "c.sizes[" + std::to_string(last_reduced) + "]";
    auto offset_of = [&](const std::string& e) {
      return loops.merged_row() ? "(c.row_merged ? (" + e + ") * c.row_st : row_offset(c, " + e + "))"
                                : "(" + e + ") * c.in_strides[" + std::to_string(last_reduced) + "]";
    };
    s << "  if (" << blocked_when << ") {\n"
      << "    constexpr int kRowLanes = 16, kBlock = 128;\n"
      << "    const int64_t n = " << n << ";\n"
      << "    for (int64_t o = begin; o < end;) {\n";
    loops.emit_offsets("      ", "o");
    s << "      const int64_t block = std::min<int64_t>({(int64_t)kBlock, c.sizes[" << kd << "] - " << k
      << ", end - o});\n"
      << "      " << acc << " lanes[kRowLanes][kBlock], chain[kBlock];\n"
      << "      for (int64_t b = 0;; b += kVtpuSegment) {\n"
      << "        const int64_t len = std::min(kVtpuSegment, n - b);\n"
      << "        for (int l = 0; l < kRowLanes; ++l)\n"
      << "          for (int64_t g = 0; g < block; ++g) lanes[l][g] = " << init << ";\n"
      << "        int64_t i = 0;\n"
      << "        for (; i + kRowLanes <= len; i += kRowLanes)\n"
      << "          for (int l = 0; l < kRowLanes; ++l) {\n"
      << "            const int64_t row = in_off + " << offset_of("b + i + l") << ";\n"
      << "            for (int64_t g = 0; g < block; ++g) " << step("lanes[l][g]", load("row + g")) << "\n"
      << "          }\n"
      << "        if (i < len)\n"
      << "          for (int l = 0; l < kRowLanes; ++l) {\n"
      << "            if (i + l < len) {\n"
      << "              const int64_t row = in_off + " << offset_of("b + i + l") << ";\n"
      << "              for (int64_t g = 0; g < block; ++g) " << step("lanes[l][g]", load("row + g")) << "\n"
      << "            } else {\n"
      << "              for (int64_t g = 0; g < block; ++g) " << step("lanes[l][g]", acc + "(" + init + ")") << "\n"
      << "            }\n"
      << "          }\n"
      << "        for (int w = kRowLanes / 2; w > 0; w /= 2)\n"
      << "          for (int l = 0; l < w; ++l)\n"
      << "            for (int64_t g = 0; g < block; ++g) " << step("lanes[l][g]", "lanes[l + w][g]") << "\n"
      << "        if (n <= kVtpuSegment) {\n"
      << "          for (int64_t g = 0; g < block; ++g) chain[g] = lanes[0][g];\n"
      << "          break;\n"
      << "        }\n"
      << "        if (b == 0)\n"
      << "          for (int64_t g = 0; g < block; ++g) chain[g] = " << init << ";\n"
      << "        for (int64_t g = 0; g < block; ++g) " << step("chain[g]", "lanes[0][g]") << "\n"
      << "        if (b + kVtpuSegment >= n) break;\n"
      << "      }\n"
      << "      for (int64_t g = 0; g < block; ++g) {\n"
      << "        " << acc << " acc = " << init << ";\n"
      << "        " << step("acc", "chain[g]") << "\n"
      << "        out[out_off + g * c.out_strides[" << kd << "]] = vtpu_store_t<" << out_t << ">::of(acc" << finish
      << ");\n"
      << "      }\n"
      << "      o += block;\n"
      << "    }\n"
      << "    return;\n"
      << "  }\n";
  }

  // The row's length and the combine as a lambda, for the segments path too.
  const std::string row_n = loops.merged_row() ? "c.row_n" : "c.sizes[" + std::to_string(last_reduced) + "]";
  std::string step_of_ab = step("a", "b").substr(4);  // "a = a + b;" -> "a + b"
  step_of_ab.pop_back();
  const std::string combine_fn = lane_combine(acc, step_of_ab);
  // The part of one row (or, with `segment`, of its segment at b of len
  // elements) in vtpu_lanes_reduce's order; base is the row's offset.
  auto emit_row_part = [&](const std::string& ind, const std::string& offset, bool segment) {
    auto lanes = [&](const std::string& index) {
      if (in.dtype == DType::kFloat16 && index == "base + i")  // a contiguous float16 row
        return (segment ? "vtpu_half_lanes_segment<" + acc + ">(in + base, b, len, "
                        : "vtpu_half_lanes_reduce<" + acc + ">(in + base, n, ") +
               acc + "(" + init + "), " + combine_fn + ")";
      return (segment ? "vtpu_lanes_segment<" + acc + ">(b, len, " : "vtpu_lanes_reduce<" + acc + ">(n, ") + acc + "(" +
             init + "), [&](int64_t i) { return " + load(index) + "; }, " + combine_fn + ")";
    };
    if (loops.merged_row()) {
      s << ind << "const int64_t base = " << offset << ", n = c.row_n, st = c.row_st;\n"
        << ind << "const " << acc << " part = !c.row_merged ? " << lanes("base + row_offset(c, i)") << "\n"
        << ind << "                        : st == 1 ? " << lanes("base + i") << "\n"
        << ind << "                        : " << lanes("base + i * st") << ";\n";
    } else {
      s << ind << "const int64_t base = " << offset << ", n = " << row_n << ", st = c.in_strides[" << last_reduced
        << "];\n"
        << ind << "const " << acc << " part = st == 1 ? " << lanes("base + i") << "\n"
        << ind << "                        : " << lanes("base + i * st") << ";\n";
    }
  };
  if (rows) {
    loops.emit_offsets("  ", "begin");
    s << "  for (int64_t o = begin; o < end; ++o) {\n";
    s << "    " << acc << " acc = " << init << ";\n";
    auto [offset, depth] = loops.open_loops("    ", true);
    const std::string ind = "    " + std::string(2 * depth, ' ');
    emit_row_part(ind, offset, false);
    s << ind << step("acc", "part") << "\n";
    loops.close_loops("    ", depth);
    s << "    out[out_off] = vtpu_store_t<" << out_t << ">::of(acc" << finish << ");\n";
    loops.emit_advance("    ");
    s << "  }\n";
  } else {
    // Columns (or a 0-dim input): groups of neighbouring outputs along the
    // innermost dim, which is kept.
    const int last = rank - 1;
    const std::string inner_size = rank > 0 ? "c.sizes[" + std::to_string(last) + "]" : "1";
    const std::string in_st = rank > 0 ? "c.in_strides[" + std::to_string(last) + "]" : "0";
    const std::string out_st = rank > 0 ? "c.out_strides[" + std::to_string(last) + "]" : "0";
    s << "  for (int64_t o = begin; o < end;) {\n";
    loops.emit_offsets("    ", "o");
    const std::string k_last = rank > 0 ? "k" + std::to_string(last) : "0";
    // Groups are up to kGroup outputs wide (16 KiB of double accumulators,
    // in L1), so that each input row is read as one run rather than a page
    // touched per 32 columns (2048 rather than 512: a 4096x4096 column sum
    // 1.5 -> 0.9-1.2x the CPU's time); each output's order does not depend
    // on the width.
    s << "    const int64_t group = std::min<int64_t>({(int64_t)kGroup, " << inner_size << " - " << k_last
      << ", end - o});\n"
      << "    const int64_t st = " << in_st << ";\n"
      << "    " << acc << " lanes[kGroup];\n"
      << "    for (int l = 0; l < group; ++l) lanes[l] = " << init << ";\n";
    auto [offset, depth] = loops.open_loops("    ", false);
    const std::string ind = "    " + std::string(2 * depth, ' ');
    s << ind << "const int64_t base = " << offset << ";\n"
      << ind << "if (st == 1) {\n"
      << ind << "  int64_t l = 0;\n"
      << ind << "  for (; l + kLanes <= group; l += kLanes) {\n";
    if (in.dtype == DType::kFloat16)  // converted 16 at a time (vtpu_half_lanes_segment says why)
      s << ind << "    float v[kLanes];\n"
        << ind << "    for (int j = 0; j < kLanes; j += 16) vtpu_half_lanes_load(in + base + l + j, v + j);\n"
        << ind << "    for (int j = 0; j < kLanes; ++j) " << step("lanes[l + j]", "static_cast<" + acc + ">(v[j])") << "\n";
    else
      s << ind << "    for (int j = 0; j < kLanes; ++j) " << step("lanes[l + j]", load("base + l + j")) << "\n";
    s << ind << "  }\n"
      << ind << "  for (; l < group; ++l) " << step("lanes[l]", load("base + l")) << "\n"
      << ind << "} else {\n"
      << ind << "  for (int l = 0; l < group; ++l) " << step("lanes[l]", load("base + l * st")) << "\n"
      << ind << "}\n";
    loops.close_loops("    ", depth);
    s << "    for (int l = 0; l < group; ++l) out[out_off + l * " << out_st << "] = vtpu_store_t<" << out_t
      << ">::of(lanes[l]" << finish << ");\n"
      << "    o += group;\n  }\n";
  }
  s << "}\n";
  // Long rows over few outputs (a whole-tensor sum has one) are reduced by
  // segments (vtpu_lanes_reduce's), spread over the threads: each task is one
  // segment of one output's row; the entry combines each output's segments
  // in order, which gives the bits of the one-thread path.
  // Narrow columns (host_codegen_narrow_columns.h): lanes down the reduced
  // elements of each output, chosen at launch by the innermost kept size.
  const bool narrow = !rows && NarrowColumns::applies(rank, reduced);
  std::string narrow_dispatch;
  if (narrow) {
    const std::string last = std::to_string(rank - 1);
    auto combine_expr = [&](const std::string& a, const std::string& b) {
      // The template's right-hand side with A and X substituted in one pass
      // (a and b may hold those letters: INT64_MAX).
      const std::string rhs = combine.substr(combine.find('=') + 2, combine.size() - combine.find('=') - 3);
      std::string text;
      for (char ch : rhs) text += ch == 'A' ? "(" + a + ")" : ch == 'X' ? "(" + b + ")" : std::string(1, ch);
      return text;
    };
    const NarrowColumns columns{s, rank, reduced, 1, acc, init, combine_expr,
                                [](const std::string&, const std::string& d) { return "c.in_strides[" + d + "]"; }};
    auto offsets_into = [&](std::ostream& o_s, const std::string& ind, const std::string& o) {
      ReductionLoops(o_s, rank, reduced, /*merge_row=*/true).emit_offsets(ind, o);
      o_s << ind << "const int64_t off0 = in_off; (void)out_off;\n"
          << ind << "const " << in_t << "* in = reinterpret_cast<const " << in_t << "*>(c.in); (void)in;\n"
          << ind << out_t << "* out = reinterpret_cast<" << out_t << "*>(c.out); (void)out;\n";
    };
    auto store = [&](const std::string& g, const std::string& value) {
      return "out[out_off + " + g + " * c.out_strides[" + last + "]] = vtpu_store_t<" + out_t + ">::of(" + value +
             finish + ");";
    };
    columns.emit_task([&](const std::string& o) { offsets_into(s, "  ", o); },
                      [&](const std::string& ind) {
                        s << ind << "for (int64_t g = 0; g < group; ++g) lane[g] = "
                          << combine_expr("lane[g]", load("row0 + g * st0")) << ";\n";
                      },
                      "c.r_nested",
                      [&](const std::string& ind) {
                        // Each output's reduced elements one contiguous run
                        // (a transposed input's columns): the run's segment
                        // through the row helpers, the same order.
                        const std::string segment =
                            in.dtype == DType::kFloat16
                                ? "vtpu_half_lanes_segment<" + acc + ">(in + off0 + g * st0, b, len, " + acc + "(" +
                                      init + "), " + combine_fn + ")"
                                : "vtpu_lanes_segment<" + acc + ">(b, len, " + acc + "(" + init +
                                      "), [&](int64_t e) { return " + load("off0 + g * st0 + e") + "; }, " +
                                      combine_fn + ")";
                        s << ind << "if (c.r_st[0] == 1) {\n"
                          << ind << "  for (int64_t g = 0; g < group; ++g) res[g] = " << segment << ";\n"
                          << ind << "  return;\n"
                          << ind << "}\n"
                          // Whole groups of 16 reduced elements of a contiguous
                          // [.., R, group] input are one run of 16 * group
                          // elements, lanes[l * group + g] in memory order.
                          << ind << "if (st0 == 1 && c.r_st[0] == group) {\n"
                          << ind << "  const int64_t width = 16 * group;\n"
                          << ind << "  for (; i + 16 <= len; i += 16) {\n"
                          << ind << "    const " << in_t << "* blk = in + off0 + (b + i) * group;\n";
                        if (in.dtype == DType::kFloat16)  // width is a multiple of 16: lane groups
                          s << ind << "    for (int64_t j = 0; j < width; j += 16) {\n"
                            << ind << "      float v[16];\n"
                            << ind << "      vtpu_half_lanes_load(blk + j, v);\n"
                            << ind << "      for (int q = 0; q < 16; ++q) lanes[j + q] = "
                            << combine_expr("lanes[j + q]", "static_cast<" + acc + ">(v[q])") << ";\n"
                            << ind << "    }\n";
                        else
                          s << ind << "    for (int64_t j = 0; j < width; ++j) lanes[j] = "
                            << combine_expr("lanes[j]", "static_cast<" + acc + ">(vtpu_load(blk[j]))") << ";\n";
                        s << ind << "  }\n"
                          << ind << "}\n";
                      });
    columns.emit_bodies([&](const std::string& o) { offsets_into(s, "    ", o); }, store);
    narrow_dispatch = columns.dispatch(
        [&](std::ostream& d, const std::string& o) { offsets_into(d, "          ", o); }, store);
  }
  const bool segmented = rows && only_row_reduced;
  if (segmented) {
    s << "void segment_body(int64_t begin, int64_t end, void* raw) {\n"
      << "  const Context c = *static_cast<const Context*>(raw);\n"
      << "  const " << in_t << "* in = reinterpret_cast<const " << in_t << "*>(c.in);\n"
      << "  " << acc << "* parts = static_cast<" << acc << "*>(c.parts);\n"
      << "  for (int64_t t = begin; t < end; ++t) {\n"
      << "    const int64_t o = t / c.segments, b = (t % c.segments) * kVtpuSegment;\n";
    loops.emit_offsets("    ", "o");
    s << "    const int64_t len = std::min(kVtpuSegment, " << row_n << " - b);\n";
    emit_row_part("    ", "in_off", true);
    s << "    parts[t] = part;\n  }\n}\n";
  }
  s << "}  // namespace ns_" << symbol << "\n";
  std::string segments_dispatch;
  if (segmented) {
    std::ostringstream d;
    d << "  if (args->parallel_for != nullptr && outputs < 64 && " << row_n << " > kVtpuSegment && !(" << blocked_when
      << ")) {\n"
      << "    c.segments = vtpu_segments(" << row_n << ");\n"
      << "    vtpu_scratch<" << acc << "> parts(outputs * c.segments);\n"
      << "    if (parts.p != nullptr) {\n"
      << "      c.parts = parts.p;\n"
      << "      args->parallel_for(outputs * c.segments, 1, &segment_body, &c, args->runner);\n"
      << "      for (int64_t o = 0; o < outputs; ++o) {\n";
    ReductionLoops(d, rank, reduced, /*merge_row=*/true).emit_offsets("        ", "o");
    d << "        " << acc << " acc = " << init << ";\n"
      << "        const " << acc << " part = vtpu_segments_combine(parts.p + o * c.segments, c.segments, " << acc << "("
      << init << "), " << combine_fn << ");\n"
      << "        " << step("acc", "part") << "\n"
      << "        reinterpret_cast<" << out_t << "*>(c.out)[out_off] = vtpu_store_t<" << out_t << ">::of(acc" << finish
      << ");\n"
      << "      }\n      return;\n    }\n  }\n";
    segments_dispatch = d.str();
  }

  // Columns: a chunk of the parallel loop is a whole group of columns where
  // there are enough (with the cost-based grain alone, 512 columns of 8192
  // rows went out as 8 strips of 64, each reading 256 bytes a row: 3.4x the
  // CPU's time; chunks of at least 256 columns, 12 of them over 4096 columns,
  // still left sum(0) of 4096x4096 at 1.4-1.6x against 0.9-1.1x with two
  // chunks of 2048 on this 2-core host). The cost: a host with many cores
  // runs a column reduction of up to 2 * kGroup columns on two threads; the
  // launch ABI does not tell a kernel how many there are. Which thread sums a
  // column does not change its order.
  // Blocked rows: chunks of whole blocks where there are enough outputs (the
  // cost-based grain gives 8 outputs of 4096-element rows).
  loops.emit_entry(symbol, false,
                   !rows ? "std::min<int64_t>(kGroup, (outputs + 1) / 2)"
                   : blocked_rows ? "(" + blocked_when + ") ? std::min<int64_t>(128, (outputs + 1) / 2) : int64_t(1)"
                                  : "",
                   segments_dispatch + narrow_dispatch);
  return {symbol, s.str()};
}

}  // namespace vtpu::compiler::detail
