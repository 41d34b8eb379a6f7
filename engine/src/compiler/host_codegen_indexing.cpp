// Indexing and source ops for the host code generator: index_select,
// embedding, gather (copies), embedding_backward, index_add, scatter_add
// (accumulations), fill and arange (sources). One kernel per (dtypes, ranks,
// attributes); sizes, strides and index values are launch-time.
//
// Launch contract (all ops):
//   tensors[0] is the output; then the op's tensor operands in IR operand
//   order (the graph's inputs must be the node's operands, in that order).
//   Every tensor is described in its OWN rank (sizes/strides in elements,
//   any strides, storage offset applied to data); dims at and above a
//   tensor's rank are ignored, so a 0-dim tensor needs no sizes. args->rank
//   is not read. The output must not overlap an input, except that the
//   output of index_add / scatter_add may be exactly `self` (in place).
//   Index tensors are int64 or int32 (gather/scatter_add: int64, as the IR
//   requires). An index outside [0, bound) is reported through
//   vtpu_report_index(args->status, operand = 1 (the index is always the
//   node's operand 1), value, bound, dim) and skipped: the output element it
//   would have produced keeps its prior contents (copies) or gets no
//   contribution from it (accumulations); nothing outside the tensors is read
//   or written. Negative indices are out of range, as in the interpreter.
//
//   index_select(x, index) dim: tensors = {out, x, index}; index 0- or 1-dim;
//     out = x's shape with size(dim) = index.numel(). bound = x.size(dim).
//   embedding(weight, indices): tensors = {out, weight [R, D], indices (any
//     rank)}; out = indices.shape + [D]. bound = R, dim = 0. padding_idx has
//     no effect on the forward (the IR has no such attribute).
//   gather(x, index) dim: tensors = {out, x, index}; out has index's shape.
//     bound = x.size(dim).
//   embedding_backward(grad, indices) num_weights, padding_idx (default -1:
//     none), scale_grad_by_freq: tensors = {out [num_weights, D], grad
//     (indices.shape + [D]), indices}. bound = num_weights, dim = 0. Row
//     padding_idx is all zeros; with scale_grad_by_freq each contribution to
//     row r is scaled by 1 / (occurrences of r in indices).
//   index_add(self, index, source) dim, alpha (compiled in): tensors = {out,
//     self, index (0-/1-dim), source}. out = self + alpha * contributions.
//     bound = self.size(dim).
//   scatter_add(self, index, src) dim: tensors = {out, self, index, src}.
//     bound = self.size(dim).
//   fill(value) sizes, dtype: tensors = {out (any strides)}, plus {value}
//     when the operand is a graph input (a 0-dim tensor of any dtype); when
//     it is a Constant node, its value is args->scalars[0] instead.
//   arange(start, step) size, dtype: tensors = {out (1-dim, any stride)},
//     then those of start and step that are graph inputs (0-dim tensors);
//     Constant operands are args->scalars: one per Constant node of the
//     graph, in node order (as in host_codegen.h), not operand order.
//     Element i = start + i * step, computed in double (floating outputs)
//     or wrapping int64 (integer outputs), so no element depends on the
//     rounding of the one before.
//   Source operands convert as the interpreter's loads do: to double for a
//   floating output; to int64 for an integer or bool output (a floating
//   operand truncates toward zero, saturating; NaN gives 0).
//   A 0-dim x/self of index_select, gather, index_add or scatter_add is
//   addressed as shape [1] (dim 0 or -1).
//
// Accumulations round once: floating data sum in double, integers in
// wrapping int64, each output element owned by one thread that adds its
// contributions in index order, so results equal the interpreter's bit for
// bit and do not depend on the thread count (no atomics). embedding_backward
// and index_add first sort the index positions by target (a serial counting
// sort, O(n + bound), with n-and-bound-sized heap scratch; without it they
// scan the index per target); scatter_add walks each index line once per tile
// of its outputs, 32 neighbouring lines at a time when dim is not the last.
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "host_codegen_internal.h"
#include "vtpu/compiler/launch_abi.h"
#include "vtpu/runtime/error.h"

namespace vtpu::compiler::detail {
namespace {

using ir::DType;
using ir::OpKind;
using runtime::Error;
using runtime::ErrorKind;

// Shared by every indexing kernel (emitted into its namespace). `offset`
// unravels a row-major position over dims [first, last) of `sizes` into an
// element offset through `strides`; `skip` names a dim the position does not
// run over (scatter_add's lines). Callers only use it when every size
// involved is non-zero.
constexpr const char* kHelpers = R"HELPERS(
struct View { char* p; int64_t size[VTPU_MAX_RANK]; int64_t stride[VTPU_MAX_RANK]; };
static inline View view_of(const VtpuLaunchArgs* args, int t, int rank) {
  View v; v.p = static_cast<char*>(args->tensors[t].data);
  for (int d = 0; d < VTPU_MAX_RANK; ++d) {
    v.size[d] = d < rank ? args->tensors[t].sizes[d] : 1;
    v.stride[d] = d < rank ? args->tensors[t].strides[d] : 0;
  }
  return v;
}
static inline int64_t offset(const int64_t* sizes, const int64_t* strides, int64_t linear, int first, int last,
                             int skip = -1) {
  int64_t off = 0;
  for (int d = last - 1; d >= first; --d) {
    if (d == skip) continue;
    off += (linear % sizes[d]) * strides[d];
    linear /= sizes[d];
  }
  return off;
}
static inline int64_t numel(const int64_t* sizes, int first, int last) {
  int64_t n = 1;
  for (int d = first; d < last; ++d) n *= sizes[d];
  return n;
}
// Whether dims [first, last) are laid out row-major with unit innermost stride.
static inline bool dense(const View& v, int first, int last) {
  int64_t expected = 1;
  for (int d = last - 1; d >= first; --d) {
    if (v.size[d] != 1 && v.stride[d] != expected) return false;
    expected *= v.size[d];
  }
  return true;
}
static inline int64_t index_at(const View& ix, int64_t off) { return static_cast<int64_t>(reinterpret_cast<const I*>(ix.p)[off]); }
)HELPERS";

// Accumulation in A (double or wrapping uint64), from and to storage type T.
constexpr const char* kAccumulate = R"ACC(
using A = std::conditional_t<kFloat, double, uint64_t>;
static inline A acc_load(T v) {
  if constexpr (kFloat) return static_cast<double>(vtpu_load(v));
  else return static_cast<uint64_t>(static_cast<int64_t>(vtpu_load(v)));
}
static inline T acc_store(A a) {
  if constexpr (kFloat) return vtpu_store_t<T>::of(a);
  else return vtpu_store_t<T>::of(static_cast<int64_t>(a));
}
static inline A scaled(A x, double scale) {
  if constexpr (kFloat) return scale * x;
  else return static_cast<uint64_t>(static_cast<int64_t>(scale)) * x;
}
constexpr int64_t kTile = 256;
// Positions of the index sorted by target (counting sort): the contributions
// to target r are order[start[r] .. start[r+1]), in index order. When the
// scratch cannot be allocated, `order` is null and callers scan the index.
struct Sorted { int64_t* start = nullptr; int64_t* order = nullptr; };
template <typename IndexAt>
static inline Sorted sort_by_target(int64_t n, int64_t bound, IndexAt at, VtpuKernelStatus* st, int64_t dim) {
  Sorted s;
  s.start = static_cast<int64_t*>(std::calloc(static_cast<size_t>(bound + 1), sizeof(int64_t)));
  s.order = static_cast<int64_t*>(std::malloc(static_cast<size_t>(n > 0 ? n : 1) * sizeof(int64_t)));
  for (int64_t k = 0; k < n; ++k) {
    const int64_t v = at(k);
    if (v < 0 || v >= bound) { vtpu_report_index(st, 1, v, bound, dim); continue; }
    if (s.start != nullptr) ++s.start[v + 1];
  }
  if (s.start == nullptr || s.order == nullptr) {
    std::free(s.start); std::free(s.order);
    return Sorted{};
  }
  for (int64_t r = 0; r < bound; ++r) s.start[r + 1] += s.start[r];
  for (int64_t k = 0; k < n; ++k) {
    const int64_t v = at(k);
    if (v >= 0 && v < bound) s.order[s.start[v]++] = k;
  }
  for (int64_t r = bound; r > 0; --r) s.start[r] = s.start[r - 1];
  s.start[0] = 0;
  return s;
}
template <typename IndexAt, typename F>
static inline void for_each_source(const Sorted& s, int64_t n, int64_t r, IndexAt at, F f) {
  if (s.order != nullptr) {
    for (int64_t q = s.start[r]; q < s.start[r + 1]; ++q) f(s.order[q]);
  } else {
    for (int64_t k = 0; k < n; ++k) if (at(k) == r) f(k);
  }
}
)ACC";

constexpr const char* kIndexSelect = R"BODY(
struct Ctx { View out, x, ix; int64_t n, inner; bool unit; VtpuKernelStatus* st; };
// Work item w = (outer position o, index position j), taken in runs of one
// o at a time so that the outer bases are computed once per run and a
// one-element slice is a plain load and store.
void body(int64_t begin, int64_t end, void* raw) {
  const Ctx& c = *static_cast<const Ctx*>(raw);
  const int64_t bound = c.x.size[kDim], n = c.n, inner = c.inner;
  const int64_t is = c.ix.stride[0], od = c.out.stride[kDim], xd = c.x.stride[kDim];
  const I* ix = reinterpret_cast<const I*>(c.ix.p);
  for (int64_t w = begin; w < end;) {
    const int64_t o = w / n, j0 = w % n;
    const int64_t j1 = end - w < n - j0 ? j0 + (end - w) : n;
    w += j1 - j0;
    T* out = reinterpret_cast<T*>(c.out.p) + offset(c.out.size, c.out.stride, o, 0, kDim);
    const T* x = reinterpret_cast<const T*>(c.x.p) + offset(c.out.size, c.x.stride, o, 0, kDim);
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t v = static_cast<int64_t>(ix[j * is]);
      if (v < 0 || v >= bound) { vtpu_report_index(c.st, 1, v, bound, kDim); continue; }
      T* dst = out + j * od;
      const T* src = x + v * xd;
      if (inner == 1) { *dst = *src; continue; }
      if (c.unit) { std::memcpy(dst, src, static_cast<size_t>(inner) * sizeof(T)); continue; }
      for (int64_t e = 0; e < inner; ++e)
        dst[offset(c.out.size, c.out.stride, e, kDim + 1, kRank)] = src[offset(c.out.size, c.x.stride, e, kDim + 1, kRank)];
    }
  }
}
static void launch(const VtpuLaunchArgs* args) {
  Ctx c{view_of(args, 0, kOutRank), view_of(args, 1, kXRank), view_of(args, 2, kIndexRank), 0, 0, false, args->status};
  c.n = c.out.size[kDim];
  c.inner = numel(c.out.size, kDim + 1, kRank);
  c.unit = dense(c.out, kDim + 1, kRank) && dense(c.x, kDim + 1, kRank);
  if (c.inner <= 0) return;
  run(args, numel(c.out.size, 0, kDim) * c.n, c.inner, &body, &c);
}
)BODY";

constexpr const char* kEmbedding = R"BODY(
struct Ctx { View out, w, ix; bool unit; VtpuKernelStatus* st; };
void body(int64_t begin, int64_t end, void* raw) {
  const Ctx& c = *static_cast<const Ctx*>(raw);
  const int64_t rows = c.w.size[0], D = c.w.size[1];
  for (int64_t k = begin; k < end; ++k) {
    const int64_t v = index_at(c.ix, offset(c.ix.size, c.ix.stride, k, 0, kIndexRank));
    if (v < 0 || v >= rows) { vtpu_report_index(c.st, 1, v, rows, 0); continue; }
    T* dst = reinterpret_cast<T*>(c.out.p) + offset(c.ix.size, c.out.stride, k, 0, kIndexRank);
    const T* src = reinterpret_cast<const T*>(c.w.p) + v * c.w.stride[0];
    if (c.unit) { std::memcpy(dst, src, static_cast<size_t>(D) * sizeof(T)); continue; }
    const int64_t ds = c.out.stride[kIndexRank], ss = c.w.stride[1];
    for (int64_t e = 0; e < D; ++e) dst[e * ds] = src[e * ss];
  }
}
static void launch(const VtpuLaunchArgs* args) {
  Ctx c{view_of(args, 0, kIndexRank + 1), view_of(args, 1, 2), view_of(args, 2, kIndexRank), false, args->status};
  const int64_t D = c.w.size[1];
  c.unit = (c.out.stride[kIndexRank] == 1 || D <= 1) && (c.w.stride[1] == 1 || D <= 1);
  if (D <= 0) return;
  run(args, numel(c.ix.size, 0, kIndexRank), D, &body, &c);
}
)BODY";

// Rows of the index along its last dim; x is addressed with the row's
// coordinates except at kDim, where the index value goes.
constexpr const char* kGather = R"BODY(
struct Ctx { View out, x, ix; VtpuKernelStatus* st; int64_t xrow[VTPU_MAX_RANK]; };
constexpr int kLast = kRank - 1;
void body(int64_t begin, int64_t end, void* raw) {
  const Ctx& c = *static_cast<const Ctx*>(raw);
  const int64_t bound = c.x.size[kDim], len = c.ix.size[kLast];
  const int64_t os = c.out.stride[kLast], is = c.ix.stride[kLast], xs = kDim == kLast ? 0 : c.x.stride[kLast];
  const int64_t xd = c.x.stride[kDim];
  T* out = reinterpret_cast<T*>(c.out.p);
  const T* x = reinterpret_cast<const T*>(c.x.p);
  const I* ix = reinterpret_cast<const I*>(c.ix.p);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t oo = offset(c.ix.size, c.out.stride, r, 0, kLast);
    const int64_t io = offset(c.ix.size, c.ix.stride, r, 0, kLast);
    const int64_t xo = offset(c.ix.size, c.xrow, r, 0, kLast);
    for (int64_t j = 0; j < len; ++j) {
      const int64_t v = static_cast<int64_t>(ix[io + j * is]);
      if (v < 0 || v >= bound) { vtpu_report_index(c.st, 1, v, bound, kDim); continue; }
      out[oo + j * os] = x[xo + j * xs + v * xd];
    }
  }
}
static void launch(const VtpuLaunchArgs* args) {
  Ctx c{view_of(args, 0, kOutRank), view_of(args, 1, kXRank), view_of(args, 2, kIndexRank), args->status, {}};
  // x's strides for a row's base offset: the coordinate along kDim comes from the index.
  for (int d = 0; d < VTPU_MAX_RANK; ++d) c.xrow[d] = d == kDim ? 0 : c.x.stride[d];
  if (numel(c.ix.size, 0, kRank) <= 0) return;
  run(args, numel(c.ix.size, 0, kLast), c.ix.size[kLast], &body, &c);
}
)BODY";

// Each output row is one work item: its sources come from the sorted index.
constexpr const char* kEmbeddingBackward = R"BODY(
struct Ctx { View out, g, ix; int64_t n; Sorted sorted; };
static inline int64_t source_index(const Ctx& c, int64_t k) {
  return index_at(c.ix, offset(c.ix.size, c.ix.stride, k, 0, kIndexRank));
}
void body(int64_t begin, int64_t end, void* raw) {
  const Ctx& c = *static_cast<const Ctx*>(raw);
  const int64_t D = c.out.size[1];
  const int64_t os = c.out.stride[1], gs = c.g.stride[kIndexRank];
  auto at = [&](int64_t k) { return source_index(c, k); };
  for (int64_t r = begin; r < end; ++r) {
    T* dst = reinterpret_cast<T*>(c.out.p) + r * c.out.stride[0];
    int64_t count = 0;
    if (r != kPaddingIdx) for_each_source(c.sorted, c.n, r, at, [&](int64_t) { ++count; });
    if (count == 0) {  // most rows of a large vocabulary: zeros (all-zero bits for the float types)
      if (os == 1) std::memset(static_cast<void*>(dst), 0, static_cast<size_t>(D) * sizeof(T));
      else for (int64_t e = 0; e < D; ++e) dst[e * os] = acc_store(A(0));
      continue;
    }
    const double scale = kScaleByFreq ? 1.0 / static_cast<double>(count) : 1.0;
    for (int64_t e0 = 0; e0 < D; e0 += kTile) {
      const int64_t m = D - e0 < kTile ? D - e0 : kTile;
      A acc[kTile];
      for (int64_t t = 0; t < m; ++t) acc[t] = A(0);
      for_each_source(c.sorted, c.n, r, at, [&](int64_t k) {
        const T* src = reinterpret_cast<const T*>(c.g.p) + offset(c.ix.size, c.g.stride, k, 0, kIndexRank) + e0 * gs;
        if (gs == 1) { for (int64_t t = 0; t < m; ++t) acc[t] += scaled(acc_load(src[t]), scale); }
        else { for (int64_t t = 0; t < m; ++t) acc[t] += scaled(acc_load(src[t * gs]), scale); }
      });
      if (os == 1) { for (int64_t t = 0; t < m; ++t) dst[e0 + t] = acc_store(acc[t]); }
      else { for (int64_t t = 0; t < m; ++t) dst[(e0 + t) * os] = acc_store(acc[t]); }
    }
  }
}
static void launch(const VtpuLaunchArgs* args) {
  Ctx c{view_of(args, 0, 2), view_of(args, 1, kIndexRank + 1), view_of(args, 2, kIndexRank), 0, Sorted{}};
  c.n = numel(c.ix.size, 0, kIndexRank);
  const int64_t rows = c.out.size[0], D = c.out.size[1];
  c.sorted = sort_by_target(c.n, rows, [&](int64_t k) { return source_index(c, k); }, args->status, 0);
  if (D > 0) run(args, rows, D * (1 + (rows > 0 ? c.n / rows : 0)), &body, &c);
  std::free(c.sorted.start);
  std::free(c.sorted.order);
}
)BODY";

// Work item = (outer position, target i along kDim): the inner slice of
// out[.., i, ..] = self[.., i, ..] + alpha * sum of source[.., j, ..] over
// index[j] == i, in tiles of kTile inner elements.
constexpr const char* kIndexAdd = R"BODY(
struct Ctx { View out, self, ix, src; int64_t n, inner; bool unit; Sorted sorted; };
template <bool kUnit>
static inline int64_t inner_offset(const Ctx& c, const int64_t* strides, int64_t e) {
  if constexpr (kUnit) return e;
  else return offset(c.self.size, strides, e, kDim + 1, kRank);
}
template <bool kUnit>
static inline void target(const Ctx& c, int64_t o, int64_t i) {
  T* out = reinterpret_cast<T*>(c.out.p) + offset(c.self.size, c.out.stride, o, 0, kDim) + i * c.out.stride[kDim];
  const T* self = reinterpret_cast<const T*>(c.self.p) + offset(c.self.size, c.self.stride, o, 0, kDim) + i * c.self.stride[kDim];
  const T* src0 = reinterpret_cast<const T*>(c.src.p) + offset(c.self.size, c.src.stride, o, 0, kDim);
  auto at = [&](int64_t k) { return index_at(c.ix, k * c.ix.stride[0]); };
  for (int64_t e0 = 0; e0 < c.inner; e0 += kTile) {
    const int64_t m = c.inner - e0 < kTile ? c.inner - e0 : kTile;
    A acc[kTile];
    for (int64_t t = 0; t < m; ++t) acc[t] = acc_load(self[inner_offset<kUnit>(c, c.self.stride, e0 + t)]);
    for_each_source(c.sorted, c.n, i, at, [&](int64_t j) {
      const T* src = src0 + j * c.src.stride[kDim];
      for (int64_t t = 0; t < m; ++t) acc[t] += scaled(acc_load(src[inner_offset<kUnit>(c, c.src.stride, e0 + t)]), kAlpha);
    });
    for (int64_t t = 0; t < m; ++t) out[inner_offset<kUnit>(c, c.out.stride, e0 + t)] = acc_store(acc[t]);
  }
}
void body(int64_t begin, int64_t end, void* raw) {
  const Ctx& c = *static_cast<const Ctx*>(raw);
  const int64_t S = c.self.size[kDim];
  for (int64_t w = begin; w < end; ++w) {
    if (c.unit) target<true>(c, w / S, w % S);
    else target<false>(c, w / S, w % S);
  }
}
static void launch(const VtpuLaunchArgs* args) {
  Ctx c{view_of(args, 0, kOutRank), view_of(args, 1, kOutRank), view_of(args, 2, kIndexRank),
        view_of(args, 3, kSrcRank), 0, 0, false, Sorted{}};
  c.n = c.ix.size[0];
  c.inner = numel(c.self.size, kDim + 1, kRank);
  c.unit = dense(c.out, kDim + 1, kRank) && dense(c.self, kDim + 1, kRank) && dense(c.src, kDim + 1, kRank);
  const int64_t S = c.self.size[kDim];
  c.sorted = sort_by_target(c.n, S, [&](int64_t k) { return index_at(c.ix, k * c.ix.stride[0]); }, args->status, kDim);
  if (c.inner > 0) run(args, numel(c.self.size, 0, kDim) * S, c.inner * (1 + (S > 0 ? c.n / S : 0)), &body, &c);
  std::free(c.sorted.start);
  std::free(c.sorted.order);
}
)BODY";

// Work item = a block of kLanes neighbouring lines of self along kDim (lines
// that differ only in the last coordinate, so that loads and stores of one
// step touch adjacent elements; one line when kDim is the last dim). The
// block's outputs are accumulated in a buffer (whole lines, or tiles of them
// when the lines are long and the heap refuses), walking the index lines in
// order for each tile.
constexpr const char* kScatterAdd = R"BODY(
struct Ctx { View out, self, ix, src; VtpuKernelStatus* st; int64_t lanes_size, blocks; };
constexpr int kLast = kRank - 1;
constexpr int64_t kLanes = kDim == kLast ? 1 : 32;
constexpr int64_t kStackCells = 4096;
void body(int64_t begin, int64_t end, void* raw) {
  const Ctx& c = *static_cast<const Ctx*>(raw);
  const int64_t S = c.self.size[kDim];
  A stack[kStackCells];
  A* acc = stack;
  int64_t tile = S < kStackCells / kLanes ? S : kStackCells / kLanes;
  A* heap = nullptr;
  if (S > tile) {
    heap = static_cast<A*>(std::malloc(static_cast<size_t>(S * kLanes) * sizeof(A)));
    if (heap != nullptr) { acc = heap; tile = S; }
  }
  const int64_t os = c.out.stride[kDim], ss = c.self.stride[kDim], is = c.ix.stride[kDim], rs = c.src.stride[kDim];
  const int64_t ol = c.out.stride[kLast], sl = c.self.stride[kLast], il = c.ix.stride[kLast], rl = c.src.stride[kLast];
  for (int64_t w = begin; w < end; ++w) {
    const int64_t first_lane = (w % c.blocks) * kLanes;
    const int64_t line = (w / c.blocks) * c.lanes_size + first_lane;
    const int64_t lanes = c.lanes_size - first_lane < kLanes ? c.lanes_size - first_lane : kLanes;
    // Lanes [0, inside) have coordinates inside the index's shape (in every dim but kDim).
    int64_t rest = line, io = 0, ro = 0, inside = lanes;
    for (int d = kRank - 1; d >= 0; --d) {
      if (d == kDim) continue;
      const int64_t k = rest % c.self.size[d];
      rest /= c.self.size[d];
      if (kLanes > 1 && d == kLast) inside = c.ix.size[d] - k < inside ? c.ix.size[d] - k : inside;
      else if (k >= c.ix.size[d]) inside = 0;
      io += k * c.ix.stride[d];
      ro += k * c.src.stride[d];
    }
    if (inside < 0) inside = 0;
    const int64_t M = inside > 0 ? c.ix.size[kDim] : 0;
    T* out = reinterpret_cast<T*>(c.out.p) + offset(c.self.size, c.out.stride, line, 0, kRank, kDim);
    const T* self = reinterpret_cast<const T*>(c.self.p) + offset(c.self.size, c.self.stride, line, 0, kRank, kDim);
    const T* src = reinterpret_cast<const T*>(c.src.p) + ro;
    for (int64_t t0 = 0; t0 < S; t0 += tile) {
      const int64_t m = S - t0 < tile ? S - t0 : tile;
      for (int64_t t = 0; t < m; ++t)
        for (int64_t b = 0; b < lanes; ++b) acc[t * kLanes + b] = acc_load(self[(t0 + t) * ss + b * sl]);
      for (int64_t q = 0; q < M; ++q) {
        for (int64_t b = 0; b < inside; ++b) {
          const int64_t v = index_at(c.ix, io + q * is + b * il);
          if (v < 0 || v >= S) { if (t0 == 0) vtpu_report_index(c.st, 1, v, S, kDim); continue; }
          if (v >= t0 && v < t0 + m) acc[(v - t0) * kLanes + b] += acc_load(src[q * rs + b * rl]);
        }
      }
      for (int64_t t = 0; t < m; ++t)
        for (int64_t b = 0; b < lanes; ++b) out[(t0 + t) * os + b * ol] = acc_store(acc[t * kLanes + b]);
    }
  }
  std::free(heap);
}
static void launch(const VtpuLaunchArgs* args) {
  Ctx c{view_of(args, 0, kOutRank), view_of(args, 1, kOutRank), view_of(args, 2, kIndexRank),
        view_of(args, 3, kSrcRank), args->status, 1, 1};
  const int64_t S = c.self.size[kDim];
  if (numel(c.self.size, 0, kRank) <= 0) return;
  if (kLanes > 1) {
    c.lanes_size = c.self.size[kLast];
    c.blocks = (c.lanes_size + kLanes - 1) / kLanes;
  }
  const int64_t lines = numel(c.self.size, 0, kRank) / S;
  run(args, lines / c.lanes_size * c.blocks, (S + c.ix.size[kDim]) * kLanes, &body, &c);
}
)BODY";

// Fill and arange: the operand values are read once (V0, V1 below are the
// generated loads), converted as the interpreter does.
constexpr const char* kFill = R"BODY(
struct Ctx { View out; V value; bool dense; };
void body(int64_t begin, int64_t end, void* raw) {
  const Ctx& c = *static_cast<const Ctx*>(raw);
  T* out = reinterpret_cast<T*>(c.out.p);
  const T v = vtpu_store_t<T>::of(c.value);
  if (c.dense) { for (int64_t i = begin; i < end; ++i) out[i] = v; return; }
  for (int64_t i = begin; i < end; ++i) out[offset(c.out.size, c.out.stride, i, 0, kOutRank)] = v;
}
static void launch(const VtpuLaunchArgs* args) {
  Ctx c{view_of(args, 0, kOutRank), V(0), false};
  c.value = operand0(args);
  c.dense = dense(c.out, 0, kOutRank);
  run(args, numel(c.out.size, 0, kOutRank), 1, &body, &c);
}
)BODY";

constexpr const char* kArange = R"BODY(
struct Ctx { View out; V start, step; };
void body(int64_t begin, int64_t end, void* raw) {
  const Ctx& c = *static_cast<const Ctx*>(raw);
  T* out = reinterpret_cast<T*>(c.out.p);
  const int64_t s = c.out.stride[0];
  for (int64_t i = begin; i < end; ++i) {
    if constexpr (kFloat) out[i * s] = vtpu_store_t<T>::of(c.start + static_cast<double>(i) * c.step);
    else out[i * s] = vtpu_store_t<T>::of(static_cast<int64_t>(static_cast<uint64_t>(c.start) +
                                                               static_cast<uint64_t>(i) * static_cast<uint64_t>(c.step)));
  }
}
static void launch(const VtpuLaunchArgs* args) {
  Ctx c{view_of(args, 0, 1), operand0(args), operand1(args)};
  run(args, c.out.size[0], 1, &body, &c);
}
)BODY";

bool is_source(OpKind op) { return op == OpKind::Fill || op == OpKind::Arange; }

int wrap_dim(const ir::Node& node, int rank) {
  const auto d = node.attrs.get_int("dim");
  const int r = rank == 0 ? 1 : rank;
  return static_cast<int>(d < 0 ? d + r : d);
}

// The generated load of a source op's operand `k` as V (double for floating
// outputs, int64 otherwise), converted as the interpreter's load_double /
// load_int do. Inputs are tensors in operand order; Constants are scalars.
std::string operand_function(const ir::Graph& graph, const ir::Node& node, int k, bool floating, int* tensor) {
  const ir::ValueId id = node.inputs[static_cast<std::size_t>(k)];
  const ir::Node& operand = graph.node(id);
  const std::string st = storage_type(operand.type.dtype);
  std::ostringstream s;
  s << "static inline V operand" << k << "(const VtpuLaunchArgs* args) {\n";
  if (operand.op == OpKind::Input) {
    s << "  const auto raw = vtpu_load(*static_cast<const " << st << "*>(args->tensors[" << (*tensor)++ << "].data));\n";
  } else {
    // The Constant's value arrives as a double and is first rounded to its dtype.
    int scalar = 0;  // Constants are scalars in node order (host_codegen.h)
    for (ir::ValueId other = 0; other < id; ++other) scalar += graph.node(other).op == OpKind::Constant;
    s << "  const auto raw = vtpu_load(vtpu_store_t<" << st << ">::of(args->scalars[" << scalar << "]));\n";
  }
  if (floating || !ir::is_floating(operand.type.dtype)) {
    s << "  return static_cast<V>(raw);\n}\n";
  } else {
    // A floating operand of an integer output: saturating truncation.
    s << "  const double d = static_cast<double>(raw);\n"
      << "  if (d != d) return 0;\n  if (d >= 9.2233720368547758e18) return INT64_MAX;\n"
      << "  if (d <= -9.2233720368547758e18) return INT64_MIN;\n  return static_cast<int64_t>(d);\n}\n";
  }
  return s.str();
}

}  // namespace

bool host_indexing_supports(OpKind op) {
  switch (op) {
    case OpKind::IndexSelect:
    case OpKind::Embedding:
    case OpKind::Gather:
    case OpKind::EmbeddingBackward:
    case OpKind::IndexAdd:
    case OpKind::ScatterAdd:
    case OpKind::Fill:
    case OpKind::Arange:
      return true;
    default:
      return false;
  }
}

GeneratedKernel emit_indexing(const ir::Graph& graph, const std::string& symbol) {
  if (graph.outputs().size() != 1)
    throw Error(ErrorKind::kInvalidArgument, "[host codegen] an indexing kernel has one output");
  const ir::Node& node = graph.node(graph.outputs()[0]);
  if (!host_indexing_supports(node.op)) {
    for (const auto& n : graph.nodes())
      if (host_indexing_supports(n.op)) refuse(n.op, "an indexing kernel is one op, the graph's output");
    throw Error(ErrorKind::kInvalidArgument, "[host codegen] no indexing op in the graph");
  }
  // One op: its tensor operands are the graph's inputs, in operand order.
  std::vector<ir::ValueId> tensor_operands;
  for (ir::ValueId id : node.inputs) {
    const OpKind k = graph.node(id).op;
    if (k == OpKind::Input) tensor_operands.push_back(id);
    else if (!(is_source(node.op) && k == OpKind::Constant)) refuse(node.op, "operands must be graph inputs");
  }
  if (tensor_operands != graph.inputs()) refuse(node.op, "the graph's inputs must be the op's operands, in order");
  for (const auto& n : graph.nodes())
    if (n.op != OpKind::Input && n.op != OpKind::Constant && &n != &node)
      refuse(node.op, "an indexing kernel is one op (" + std::string(ir::name(n.op)) + " beside it)");
  const int out_rank = static_cast<int>(node.type.rank());
  if (out_rank > kMaxRank) refuse(node.op, "rank above " + std::to_string(kMaxRank));

  const DType data = node.type.dtype;
  std::ostringstream s;
  s << "#include <cstdlib>\nnamespace ns_" << symbol << " {\n"
    << "using T = " << storage_type(data) << ";\n"
    << "constexpr bool kFloat = " << (ir::is_floating(data) ? "true" : "false") << ";\n"
    << "constexpr int kOutRank = " << out_rank << ";\n";
  if (is_source(node.op)) {
    s << "using I = int64_t;\nusing V = " << (ir::is_floating(data) ? "double" : "int64_t") << ";\n" << kParallelRunSource << kHelpers;
    int tensor = 1;
    for (int k = 0; k < static_cast<int>(node.inputs.size()); ++k)
      s << operand_function(graph, node, k, ir::is_floating(data), &tensor);
    if (node.op == OpKind::Arange && out_rank != 1) refuse(node.op, "expected a 1-dim output");
    s << (node.op == OpKind::Fill ? kFill : kArange);
  } else {
    const ir::TensorType& x = graph.type(node.inputs[0]);
    const ir::TensorType& index = graph.type(node.inputs[1]);
    if (index.dtype != DType::kInt64 && index.dtype != DType::kInt32)
      refuse(node.op, "indices must be int64 or int32");
    if (static_cast<int>(x.rank()) > kMaxRank || static_cast<int>(index.rank()) >= kMaxRank)
      refuse(node.op, "rank above " + std::to_string(kMaxRank));
    // A 0-dim self/x is addressed as shape [1] (view_of pads sizes with 1).
    const int rank = x.rank() == 0 ? 1 : static_cast<int>(x.rank());
    s << "using I = " << storage_type(index.dtype) << ";\n"
      << "constexpr int kRank = " << rank << ";\n"
      << "constexpr int kXRank = " << x.rank() << ";\n"
      << "constexpr int kIndexRank = " << index.rank() << ";\n"
      << kParallelRunSource << kHelpers;
    switch (node.op) {
      case OpKind::IndexSelect:
        s << "constexpr int kDim = " << wrap_dim(node, static_cast<int>(x.rank())) << ";\n" << kIndexSelect;
        break;
      case OpKind::Embedding:
        s << kEmbedding;
        break;
      case OpKind::Gather:
        if (index.rank() != x.rank() && !(index.rank() <= 1 && x.rank() <= 1))
          refuse(node.op, "index and input ranks differ");
        s << "constexpr int kDim = " << wrap_dim(node, static_cast<int>(x.rank())) << ";\n" << kGather;
        break;
      case OpKind::EmbeddingBackward:
        if (!ir::is_floating(data)) refuse(node.op, "expected a floating point grad");
        s << "constexpr int64_t kPaddingIdx = " << node.attrs.get_int("padding_idx", -1) << ";\n"
          << "constexpr bool kScaleByFreq = " << (node.attrs.get_bool("scale_grad_by_freq", false) ? "true" : "false")
          << ";\n"
          << kAccumulate << kEmbeddingBackward;
        break;
      case OpKind::IndexAdd:
      case OpKind::ScatterAdd: {
        const ir::TensorType& src = graph.type(node.inputs[2]);
        if (!std::isfinite(node.attrs.get_double("alpha", 1.0))) refuse(node.op, "alpha must be finite");
        std::ostringstream alpha;
        alpha.precision(17);
        alpha << node.attrs.get_double("alpha", 1.0);
        s << "constexpr int kDim = " << wrap_dim(node, static_cast<int>(x.rank())) << ";\n"
          << "constexpr int kSrcRank = " << src.rank() << ";\n"
          << "constexpr double kAlpha = " << alpha.str() << ";\n"
          << kAccumulate << (node.op == OpKind::IndexAdd ? kIndexAdd : kScatterAdd);
        break;
      }
      default:
        refuse(node.op, "not an indexing op");
    }
  }
  s << "}  // namespace ns_" << symbol << "\n"
    << "extern \"C\" __attribute__((visibility(\"default\"))) void " << symbol
    << "(const struct VtpuLaunchArgs* args) { ns_" << symbol << "::launch(args); }\n";
  return {symbol, s.str()};
}

}  // namespace vtpu::compiler::detail
