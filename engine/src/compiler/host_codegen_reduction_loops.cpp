#include "host_codegen_reduction_loops.h"

namespace vtpu::compiler::detail {

ReductionLoops::ReductionLoops(std::ostream& s, int rank, std::vector<bool> reduced, bool merge_row)
    : s_(s), rank_(rank), reduced_(std::move(reduced)) {
  for (int d = 0; d < rank_; ++d)
    if (reduced_[static_cast<std::size_t>(d)]) last_reduced_ = d;
  row_start_ = last_reduced_;
  if (merge_row && last_reduced_ == rank_ - 1)
    while (row_start_ > 0 && reduced_[static_cast<std::size_t>(row_start_ - 1)]) --row_start_;
}

void ReductionLoops::emit_offsets(const std::string& indent, const std::string& index) const {
  s_ << indent << "int64_t rest = " << index << ", in_off = 0, out_off = 0;\n";
  for (int d = rank_ - 1; d >= 0; --d) {
    if (reduced_[static_cast<std::size_t>(d)]) continue;
    s_ << indent << "int64_t k" << d << " = rest % c.sizes[" << d << "]; rest /= c.sizes[" << d << "]; in_off += k"
       << d << " * c.in_strides[" << d << "]; out_off += k" << d << " * c.out_strides[" << d << "];\n";
  }
}

void ReductionLoops::emit_advance(const std::string& indent) const {
  s_ << indent << "do {\n";
  for (int d = rank_ - 1; d >= 0; --d) {
    if (reduced_[static_cast<std::size_t>(d)]) continue;
    const std::string k = "k" + std::to_string(d), ds = std::to_string(d);
    s_ << indent << "  if (++" << k << " < c.sizes[" << ds << "]) { in_off += c.in_strides[" << ds
       << "]; out_off += c.out_strides[" << ds << "]; break; }\n"
       << indent << "  in_off -= (" << k << " - 1) * c.in_strides[" << ds << "]; out_off -= (" << k
       << " - 1) * c.out_strides[" << ds << "]; " << k << " = 0;\n";
  }
  s_ << indent << "} while (false);\n";
}

std::pair<std::string, int> ReductionLoops::open_loops(const std::string& indent, bool skip_last) const {
  std::string offset = "in_off";
  int depth = 0;
  for (int d = 0; d < rank_; ++d) {
    if (!reduced_[static_cast<std::size_t>(d)] || (skip_last && d >= row_start_)) continue;
    s_ << indent << std::string(2 * depth, ' ') << "for (int64_t r" << d << " = 0; r" << d << " < c.sizes[" << d
       << "]; ++r" << d << ") {\n";
    offset += " + r" + std::to_string(d) + " * c.in_strides[" + std::to_string(d) + "]";
    ++depth;
  }
  return {offset, depth};
}

void ReductionLoops::close_loops(const std::string& indent, int depth) const {
  for (; depth > 0; --depth) s_ << indent << std::string(2 * (depth - 1), ' ') << "}\n";
}

void ReductionLoops::emit_row_offset() const {
  s_ << "inline int64_t row_offset(const Context& c, int64_t i) {\n  int64_t off = 0;\n";
  for (int d = rank_ - 1; d >= row_start_; --d)
    s_ << "  off += (i % c.sizes[" << d << "]) * c.in_strides[" << d << "]; i /= c.sizes[" << d << "];\n";
  s_ << "  return off;\n}\n";
}

void ReductionLoops::emit_entry(const std::string& symbol, bool with_scalars, const std::string& min_grain,
                                const std::string& before_dispatch) const {
  s_ << "extern \"C\" __attribute__((visibility(\"default\"))) void " << symbol
     << "(const struct VtpuLaunchArgs* args) {\n"
     << "  using namespace ns_" << symbol << ";\n"
     << "  Context c;\n"
     << "  c.out = static_cast<char*>(args->tensors[0].data);\n"
     << "  c.in = static_cast<const char*>(args->tensors[1].data);\n";
  if (with_scalars) s_ << "  c.scalars = args->scalars;\n";
  s_ << "  int64_t outputs = 1; c.count = 1;\n";
  for (int d = 0; d < rank_; ++d) {
    s_ << "  c.sizes[" << d << "] = args->tensors[1].sizes[" << d << "]; c.in_strides[" << d
       << "] = args->tensors[1].strides[" << d << "]; c.out_strides[" << d << "] = args->tensors[0].strides[" << d
       << "];\n";
    s_ << (reduced_[static_cast<std::size_t>(d)] ? "  c.count *= c.sizes[" : "  outputs *= c.sizes[") << d << "];\n";
  }
  if (merged_row()) {
    // The row's dims nest in memory (each stride = the next dim's size x its
    // stride; size-1 dims aside) when the row is one run of stride row_st.
    s_ << "  c.row_n = 1; c.row_st = 0; c.row_merged = true;\n"
       << "  for (int d = " << rank_ - 1 << "; d >= " << row_start_ << "; --d) {\n"
       << "    if (c.sizes[d] == 1) continue;\n"
       << "    if (c.row_n == 1) c.row_st = c.in_strides[d];\n"
       << "    else if (c.in_strides[d] != c.row_n * c.row_st) c.row_merged = false;\n"
       << "    c.row_n *= c.sizes[d];\n  }\n";
  }
  // Parallel over outputs; each output's reduction runs in one thread.
  s_ << "  if (outputs <= 0) return;\n" << before_dispatch
     << "  int64_t grain = c.count > 0 ? (32768 + c.count - 1) / c.count : 32768;\n";
  if (!min_grain.empty()) s_ << "  grain = std::max<int64_t>(grain, " << min_grain << ");\n";
  s_ << "  if (args->parallel_for != nullptr && outputs > 1 && outputs * c.count > 32768)\n"
     << "    args->parallel_for(outputs, grain, &body, &c, args->runner);\n"
     << "  else body(0, outputs, &c);\n}\n";
}

}  // namespace vtpu::compiler::detail
