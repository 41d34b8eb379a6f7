// Narrow columns: a column reduction (the innermost dim kept) whose kept
// innermost dim has fewer than kNarrow (16) elements, such as sum(0) of a
// [1M, 4] tensor. In sequential order per output (the wide columns' order)
// each output was one chain of dependent adds down a million rows, on one
// thread per column group: 5x the CPU's time. Narrow columns take
// vtpu_lanes_reduce's order instead: each output's reduced elements, in
// row-major order of the reduced dims, go through 16 lanes (the reduced
// element e to lane e % 16, lanes combined pairwise) within segments of
// kVtpuSegment elements, the segments' results combined in order. The choice
// depends on the sizes alone (launch arguments), so the single-op kernel and
// a fused reduction kernel over the same shape choose alike, and a task of
// one segment of one group of outputs can run on any thread.
//
// The generated code (namespace scope, inside the kernel's namespace):
//   reduced_offset(c, t, e)  tensor t's offset of reduced element e
//   narrow_task(c, task, res)  res[g] = one segment's result for output g of
//                              the group: task = group * c.segments + segment
//   narrow_body / narrow_segment_body  parallel bodies over groups / tasks
// and the entry's dispatch (narrow_dispatch), which returns when it took the
// launch. The Context must have: sizes[], count, segments, parts, r_nested,
// r_st[] and what the kernel's own callbacks read.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

namespace vtpu::compiler::detail {

struct NarrowColumns {
  std::ostream& s;
  int rank;
  std::vector<bool> reduced;
  int num_tensors;          // tensors with reduced-dim strides in c.strides_of(t)
  std::string acc, init;    // accumulator type and the combine's identity
  // The combine of a and b, as an expression.
  std::function<std::string(const std::string& a, const std::string& b)> combine;
  // Tensor t's stride of dim d in the Context (c), as an expression; t and
  // d are expressions too.
  std::function<std::string(const std::string& t, const std::string& d)> stride;
  // A tensor the reduced loop does not read (a fused kernel's reduction
  // output), or -1.
  int skip_tensor = -1;

  // Whether a kernel with this reduced-dims set can take the path: a kept
  // innermost dim, and at least one reduced dim.
  static bool applies(int rank, const std::vector<bool>& reduced);
  // The identity as a value of the accumulator type (-INFINITY is a float).
  std::string identity() const { return acc + "(" + init + ")"; }

  // reduced_offset(c, t, e) and narrow_task. `offsets(o)` emits statements
  // declaring off<t>, each tensor's offset of output o (k_last = 0), and
  // whatever read_row and store use; `read_row`
  // emits the statements that combine the reduced element whose offsets are
  // row<t> into lane[g] for g < group (the group's outputs step along the
  // innermost dim by st<t>); `flat`, when not empty, emits a faster loop
  // over whole groups of 16 elements for launches where `flat_when` holds
  // (it must advance i and leave lanes as the general loop would, or set
  // res[g] for every g < group and return).
  void emit_task(const std::function<void(const std::string& o)>& offsets,
                 const std::function<void(const std::string& ind)>& read_row, const std::string& flat_when,
                 const std::function<void(const std::string& ind)>& flat) const;
  // narrow_body and narrow_segment_body; `store(g, value)` is the statement
  // storing output g of the group whose offsets `offsets(o)` declared.
  void emit_bodies(const std::function<void(const std::string& o)>& offsets,
                   const std::function<std::string(const std::string& g, const std::string& value)>& store) const;
  // The entry's statements: r_nested/r_st and the split; returns from the
  // entry when the kept innermost dim is narrow.
  std::string dispatch(const std::function<void(std::ostream& d, const std::string& o)>& offsets,
                       const std::function<std::string(const std::string& g, const std::string& value)>& store) const;
};

}  // namespace vtpu::compiler::detail
