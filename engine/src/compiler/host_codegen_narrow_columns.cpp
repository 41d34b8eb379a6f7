#include "host_codegen_narrow_columns.h"

#include <sstream>

namespace vtpu::compiler::detail {

bool NarrowColumns::applies(int rank, const std::vector<bool>& reduced) {
  if (rank < 2 || reduced[static_cast<std::size_t>(rank - 1)]) return false;
  for (bool r : reduced)
    if (r) return true;
  return false;
}

void NarrowColumns::emit_task(const std::function<void(const std::string& o)>& offsets,
                              const std::function<void(const std::string& ind)>& read_row,
                              const std::string& flat_when,
                              const std::function<void(const std::string& ind)>& flat) const {
  const std::string last = std::to_string(rank - 1);
  s << "constexpr int kNarrow = 16;\n"
    << "inline int64_t reduced_offset(const Context& c, int t, int64_t e) {\n  (void)t;\n  int64_t off = 0;\n";
  for (int d = rank - 1; d >= 0; --d)
    if (reduced[static_cast<std::size_t>(d)])
      s << "  off += (e % c.sizes[" << d << "]) * " << stride("t", std::to_string(d)) << "; e /= c.sizes[" << d
        << "];\n";
  s << "  return off;\n}\n"
    << "inline void narrow_task(const Context& c, int64_t task, " << acc << "* res) {\n"
    << "  const int64_t b = (task % c.segments) * kVtpuSegment, o = (task / c.segments) * c.sizes[" << last << "];\n"
    << "  const int64_t len = std::min(kVtpuSegment, c.count - b), group = c.sizes[" << last << "];\n";
  offsets("o");
  for (int t = 0; t < num_tensors; ++t)
    if (t != skip_tensor) s << "  const int64_t st" << t << " = " << stride(std::to_string(t), last) << ";\n";
  s << "  " << acc << " lanes[16 * kNarrow];\n"
    << "  for (int j = 0; j < 16 * kNarrow; ++j) lanes[j] = " << identity() << ";\n"
    << "  int64_t i = 0;\n";
  if (!flat_when.empty()) {
    s << "  if (" << flat_when << ") {\n";
    flat("    ");
    s << "  }\n";
  }
  s << "  for (; i < len; i += 16)\n"
    << "    for (int l = 0; l < 16; ++l) {\n"
    << "      " << acc << "* const lane = lanes + l * group;\n"
    << "      if (i + l < len) {\n"
    << "        const int64_t e = b + i + l;\n";
  for (int t = 0; t < num_tensors; ++t)
    if (t != skip_tensor)
      s << "        const int64_t row" << t << " = off" << t << " + (c.r_nested ? e * c.r_st[" << t
      << "] : reduced_offset(c, " << t << ", e));\n";
  read_row("        ");
  s << "      } else {\n"
    << "        for (int64_t g = 0; g < group; ++g) lane[g] = " << combine("lane[g]", identity()) << ";\n"
    << "      }\n"
    << "    }\n"
    << "  for (int w = 8; w > 0; w /= 2)\n"
    << "    for (int l = 0; l < w; ++l)\n"
    << "      for (int64_t g = 0; g < group; ++g)\n"
    << "        lanes[l * group + g] = " << combine("lanes[l * group + g]", "lanes[(l + w) * group + g]") << ";\n"
    << "  for (int64_t g = 0; g < group; ++g) res[g] = lanes[g];\n"
    << "}\n";
}

void NarrowColumns::emit_bodies(const std::function<void(const std::string& o)>& offsets,
                                const std::function<std::string(const std::string& g, const std::string& value)>& store) const {
  const std::string last = std::to_string(rank - 1);
  s << "void narrow_body(int64_t begin, int64_t end, void* raw) {\n"
    << "  const Context c = *static_cast<const Context*>(raw);  // a copy: see host_codegen.cpp\n"
    << "  const int64_t group = c.sizes[" << last << "];\n"
    << "  for (int64_t gi = begin; gi < end; ++gi) {\n"
    << "    " << acc << " chain[kNarrow], res[kNarrow];\n"
    << "    for (int64_t s = 0; s < c.segments; ++s) {\n"
    << "      narrow_task(c, gi * c.segments + s, res);\n"
    << "      for (int64_t g = 0; g < group; ++g)\n"
    << "        chain[g] = c.segments == 1 ? res[g] : " << combine("(s == 0 ? " + identity() + " : chain[g])", "res[g]")
    << ";\n"
    << "    }\n"
    << "    const int64_t o = gi * group;\n";
  offsets("o");
  s << "    for (int64_t g = 0; g < group; ++g) " << store("g", "chain[g]") << "\n"
    << "  }\n}\n"
    << "void narrow_segment_body(int64_t begin, int64_t end, void* raw) {\n"
    << "  const Context c = *static_cast<const Context*>(raw);\n"
    << "  " << acc << "* parts = static_cast<" << acc << "*>(c.parts);\n"
    << "  for (int64_t t = begin; t < end; ++t) narrow_task(c, t, parts + t * kNarrow);\n"
    << "}\n";
}

std::string NarrowColumns::dispatch(const std::function<void(std::ostream& d, const std::string& o)>& offsets,
                                    const std::function<std::string(const std::string& g, const std::string& value)>& store) const {
  const std::string last = std::to_string(rank - 1);
  std::ostringstream d;
  d << "  if (c.sizes[" << last << "] < kNarrow) {\n"
    << "    c.segments = vtpu_segments(c.count);\n"
    // Whether every tensor's reduced dims nest in memory (the reduced
    // elements one run of stride r_st[t]; size-1 dims aside).
    << "    c.r_nested = true;\n"
    << "    int64_t reduced_n = 1;\n"
    << "    for (int t = 0; t < " << num_tensors << "; ++t) c.r_st[t] = 0;\n";
  for (int dim = rank - 1; dim >= 0; --dim) {
    if (!reduced[static_cast<std::size_t>(dim)]) continue;
    const std::string ds = std::to_string(dim);
    d << "    if (c.sizes[" << ds << "] != 1) {\n"
      << "      for (int t = 0; t < " << num_tensors << "; ++t) {\n"
      << "        if (t == " << skip_tensor << ") continue;\n"
      << "        if (reduced_n == 1) c.r_st[t] = " << stride("t", ds) << ";\n"
      << "        else if (" << stride("t", ds) << " != reduced_n * c.r_st[t]) c.r_nested = false;\n"
      << "      }\n"
      << "      reduced_n *= c.sizes[" << ds << "];\n"
      << "    }\n";
  }
  d << "    const int64_t groups = outputs / c.sizes[" << last << "], group = c.sizes[" << last << "];\n"
    // Few groups of outputs and long columns: one task per segment of each
    // group, their results combined in order here (narrow_body's bits).
    << "    if (args->parallel_for != nullptr && groups < 64 && c.segments > 1) {\n"
    << "      vtpu_scratch<" << acc << "> parts(groups * c.segments * kNarrow);\n"
    << "      if (parts.p != nullptr) {\n"
    << "        c.parts = parts.p;\n"
    << "        args->parallel_for(groups * c.segments, 1, &narrow_segment_body, &c, args->runner);\n"
    << "        for (int64_t gi = 0; gi < groups; ++gi) {\n"
    << "          const int64_t o = gi * group;\n";
  offsets(d, "o");
  d << "          for (int64_t g = 0; g < group; ++g) {\n"
    << "            " << acc << " chain = " << identity() << ";\n"
    << "            for (int64_t s = 0; s < c.segments; ++s)\n"
    << "              chain = " << combine("chain", "parts.p[(gi * c.segments + s) * kNarrow + g]") << ";\n"
    << "            " << store("g", "chain") << "\n"
    << "          }\n"
    << "        }\n"
    << "        return;\n"
    << "      }\n"
    << "    }\n"
    << "    const int64_t narrow_grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, c.count * group));\n"
    << "    if (args->parallel_for != nullptr && groups > 1 && outputs * c.count > 32768)\n"
    << "      args->parallel_for(groups, narrow_grain, &narrow_body, &c, args->runner);\n"
    << "    else\n"
    << "      narrow_body(0, groups, &c);\n"
    << "    return;\n"
    << "  }\n";
  return d.str();
}

}  // namespace vtpu::compiler::detail
