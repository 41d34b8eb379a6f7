// The loop scaffolding shared by the reduction kernels (sum/mean/prod/
// amax/amin in host_codegen_reduction.cpp, the statistics in
// host_codegen_reduction_stats.cpp): walking the kept dims of the outputs,
// looping over the reduced dims, and the extern "C" entry that fills the
// Context and splits the outputs over the thread pool. The generated code
// names its variables c (the Context), in_off/out_off, k<d> (kept-dim
// coordinates) and r<d> (reduced-dim counters).
#pragma once

#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace vtpu::compiler::detail {

class ReductionLoops {
 public:
  // merge_row: the trailing run of reduced dims (row_start() .. rank-1) is
  // reduced as one row of their flattened elements (the Context then has
  // row_n, row_st and row_merged, set by emit_entry); otherwise the row is
  // the innermost dim alone.
  ReductionLoops(std::ostream& s, int rank, std::vector<bool> reduced, bool merge_row = false);

  int last_reduced() const { return last_reduced_; }
  int row_start() const { return row_start_; }
  // True when the row spans more than one dim.
  bool merged_row() const { return row_start_ < last_reduced_; }

  // Output index `index` -> kept-dim coordinates k<d> and the offsets.
  void emit_offsets(const std::string& indent, const std::string& index) const;
  // Steps k<d> and the offsets to the next output: an odometer, so that no
  // output pays for integer divisions.
  void emit_advance(const std::string& indent) const;
  // Opens the loops over the reduced dims in row-major order (all of them, or
  // all but the row's); returns the input offset expression and the depth.
  std::pair<std::string, int> open_loops(const std::string& indent, bool skip_last) const;
  void close_loops(const std::string& indent, int depth) const;
  // Defines row_offset(c, i): the input offset of the row's i-th element
  // (row-major over the row's dims), for rows whose dims do not nest in memory.
  void emit_row_offset() const;
  // The kernel's extern "C" entry: tensors[0] the output described in the
  // input's dims, tensors[1] the input; `with_scalars` stores args->scalars
  // in c.scalars.
  // `min_grain`: a C++ expression (of `outputs`) the parallel grain is
  // raised to, when a kernel's loops want wider chunks than its cost asks.
  // `before_dispatch`: statements run once the Context is filled and there
  // are outputs, before the split over outputs (a kernel's other way to
  // split the work, which returns when it took it).
  void emit_entry(const std::string& symbol, bool with_scalars, const std::string& min_grain = "",
                  const std::string& before_dispatch = "") const;

 private:
  std::ostream& s_;
  int rank_;
  std::vector<bool> reduced_;
  int last_reduced_ = -1;
  int row_start_ = 0;
};

}  // namespace vtpu::compiler::detail
