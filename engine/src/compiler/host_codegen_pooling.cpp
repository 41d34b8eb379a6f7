// 2-d max pooling and its backward for the host code generator, the
// semantics of the reference interpreter (interp_pooling.cpp) bit for bit.
// One kernel per (dtype, rank, kernel size, stride, padding, dilation,
// indices or not); sizes and strides are launch-time (the output sizes, which
// ceil_mode decides, come from the output tensor).
//
// Launch contract: tensors are the graph's outputs, then its inputs (the
// node's operands, in IR order), each described in its OWN rank (3: C, H, W
// or 4: N, C, H, W; sizes and strides in elements, any strides, storage
// offset applied to data). args->rank and args->scalars are not read.
// Outputs must not overlap inputs.
//   forward, graph outputs [values] or [values, indices] (a max_pool2d node
//     and a max_pool2d_indices node of the same operand and attributes):
//     tensors = {values, indices?, x}.
//   backward, graph output [dx]: tensors = {dx (x's shape), grad, x,
//     indices}; x's data is not read.
// An index outside [0, H * W) other than -1 is reported through
// vtpu_report_index(args->status, operand = 2, value, bound = H * W, dim =
// -1) and skipped; nothing outside the tensors is touched.
//
// Work split: the forward is parallel over output rows (plane, oh), the
// backward over planes, each plane's dx owned by one thread that zeroes it
// and adds in output order, so bits do not depend on the thread count.
// Kernel, stride, padding and dilation are compile-time: windows wholly
// inside the input unroll and vectorise across outputs (whole() below);
// windows clipped by the padding or the edge take a scalar loop.
#include <sstream>
#include <string>

#include "host_codegen_internal.h"
#include "vtpu/compiler/launch_abi.h"
#include "vtpu/runtime/error.h"

namespace vtpu::compiler::detail {
namespace {

using ir::OpKind;
using runtime::Error;
using runtime::ErrorKind;

constexpr const char* kHelpers = R"HELPERS(
// A rank-3 or rank-4 tensor as planes of H x W: plane p is (n, c) = (p / C, p % C).
struct Planes {
  char* p; int64_t C, H, W, sn, sc, sh, sw;
  inline int64_t base(int64_t plane) const { return (kRank == 4 ? (plane / C) * sn : 0) + (plane % C) * sc; }
};
static inline Planes planes_of(const VtpuLaunchArgs* args, int t) {
  const VtpuTensorArg& a = args->tensors[t];
  constexpr int o = kRank - 3;
  Planes v{static_cast<char*>(a.data), a.sizes[o], a.sizes[o + 1], a.sizes[o + 2], kRank == 4 ? a.strides[0] : 0,
           a.strides[o], a.strides[o + 1], a.strides[o + 2]};
  return v;
}
static inline int64_t count(const VtpuLaunchArgs* args, int t) {
  return kRank == 4 ? args->tensors[t].sizes[0] * args->tensors[t].sizes[1] : args->tensors[t].sizes[0];
}
)HELPERS";

constexpr const char* kForward = R"BODY(
struct Ctx { Planes x, out, ind; };
constexpr int64_t kChunk = 64;  // outputs of a row per vectorised pass
// One output of a window clipped by the padding or the input's edge.
static inline void clipped(const T* xp, int64_t H, int64_t W, int64_t xh, int64_t xw, int64_t oh, int64_t ow, C* value,
                           int64_t* index) {
  int64_t h0 = oh * kSH - kPH, w0 = ow * kSW - kPW;
  const int64_t h1 = h0 + (kKH - 1) * kDH + 1 < H ? h0 + (kKH - 1) * kDH + 1 : H;
  const int64_t w1 = w0 + (kKW - 1) * kDW + 1 < W ? w0 + (kKW - 1) * kDW + 1 : W;
  while (h0 < 0) h0 += kDH;
  while (w0 < 0) w0 += kDW;
  C best = -__builtin_inf();
  int64_t at = h0 * W + w0;
  for (int64_t h = h0; h < h1; h += kDH)
    for (int64_t w = w0; w < w1; w += kDW) {
      const C v = static_cast<C>(vtpu_load(xp[h * xh + w * xw]));
      if (v > best || v != v) { best = v; at = h * W + w; }
    }
  *value = best;
  *index = at;
}
// Outputs [lo, lo + n) of a row whose windows are whole: the window loops
// unroll (compile-time trip counts), so the output loop vectorises with the
// compare-and-selects as blends; data-dependent branches would mispredict on
// about half of the elements (ATen's kernel branches: ~4x slower). The
// winner's window position is 32-bit, the values' width. XW is x's element
// stride along W when it is 1, 0 when only the launch knows it.
template <int XW>
static inline void whole(const T* xp, int64_t W, int64_t xh, int64_t xw_rt, int64_t oh, int64_t lo, int64_t n,
                         C* best, int64_t* where) {
  const int64_t xw = XW == 1 ? 1 : xw_rt;
  const int64_t h0 = oh * kSH - kPH;
  int32_t pos[kChunk];
  for (int64_t q = 0; q < n; ++q) {
    C b = -__builtin_inf();
    int32_t p = 0;
#pragma GCC unroll 16
    for (int i = 0; i < kKH; ++i) {
#pragma GCC unroll 16
      for (int j = 0; j < kKW; ++j) {
        const C v = static_cast<C>(vtpu_load(xp[(h0 + i * kDH) * xh + ((lo + q) * kSW - kPW + j * kDW) * xw]));
        const bool take = (v > b) | (v != v);
        b = take ? v : b;
        p = take ? i * kKW + j : p;
      }
    }
    best[q] = b;
    pos[q] = p;
  }
  for (int64_t q = 0; q < n; ++q) {
    const int64_t i = pos[q] / kKW, j = pos[q] % kKW;
    where[q] = (h0 + i * kDH) * W + (lo + q) * kSW - kPW + j * kDW;
  }
}
void body(int64_t begin, int64_t end, void* raw) {
  const Ctx& c = *static_cast<const Ctx*>(raw);
  const T* x = reinterpret_cast<const T*>(c.x.p);
  T* out = reinterpret_cast<T*>(c.out.p);
  int64_t* ind = kIndices ? reinterpret_cast<int64_t*>(c.ind.p) : nullptr;
  const int64_t OH = c.out.H, OW = c.out.W, H = c.x.H, W = c.x.W, xh = c.x.sh, xw = c.x.sw;
  const int64_t os = c.out.sw, is = kIndices ? c.ind.sw : 0;
  // The outputs whose windows lie wholly inside a row: [lo, hi).
  constexpr int64_t kSpanH = (kKH - 1) * kDH + 1, kSpanW = (kKW - 1) * kDW + 1;
  const int64_t lo = (kPW + kSW - 1) / kSW < OW ? (kPW + kSW - 1) / kSW : OW;
  const int64_t last = W + kPW - kSpanW >= 0 ? (W + kPW - kSpanW) / kSW + 1 : 0;
  const int64_t hi = last < lo ? lo : (last > OW ? OW : last);
  C best[kChunk];
  int64_t where[kChunk];
  for (int64_t r = begin; r < end; ++r) {
    const int64_t plane = r / OH, oh = r % OH;
    const T* xp = x + c.x.base(plane);
    T* op = out + c.out.base(plane) + oh * c.out.sh;
    int64_t* ip = kIndices ? ind + c.ind.base(plane) + oh * c.ind.sh : nullptr;
    const int64_t h0 = oh * kSH - kPH;
    const bool whole_rows = h0 >= 0 && h0 + kSpanH <= H;
    const int64_t a = whole_rows ? lo : OW, b = whole_rows ? hi : OW;
    for (int64_t ow = 0; ow < OW; ++ow) {
      if (ow == a && a < b) {  // the interior, in chunks
        for (int64_t q0 = a; q0 < b; q0 += kChunk) {
          const int64_t n = b - q0 < kChunk ? b - q0 : kChunk;
          if (xw == 1) whole<1>(xp, W, xh, xw, oh, q0, n, best, where);
          else whole<0>(xp, W, xh, xw, oh, q0, n, best, where);
          for (int64_t q = 0; q < n; ++q) {
            op[(q0 + q) * os] = vtpu_store_t<T>::of(best[q]);
            if constexpr (kIndices) ip[(q0 + q) * is] = where[q];
          }
        }
        ow = b - 1;
        continue;
      }
      C value;
      int64_t index;
      clipped(xp, H, W, xh, xw, oh, ow, &value, &index);
      op[ow * os] = vtpu_store_t<T>::of(value);
      if constexpr (kIndices) ip[ow * is] = index;
    }
  }
}
static void launch(const VtpuLaunchArgs* args) {
  constexpr int kX = kIndices ? 2 : 1;
  Ctx c{planes_of(args, kX), planes_of(args, 0), kIndices ? planes_of(args, 1) : planes_of(args, 0)};
  run(args, count(args, 0) * c.out.H, c.out.W * kKH * kKW, &body, &c);
}
)BODY";

constexpr const char* kBackward = R"BODY(
struct Ctx { Planes dx, g, ind; VtpuKernelStatus* st; };
void body(int64_t begin, int64_t end, void* raw) {
  const Ctx& c = *static_cast<const Ctx*>(raw);
  const int64_t H = c.dx.H, W = c.dx.W, OH = c.g.H, OW = c.g.W, n = H * W;
  const bool dense = c.dx.sw == 1 && c.dx.sh == W;
  const T zero = vtpu_store_t<T>::of(C(0));
  for (int64_t plane = begin; plane < end; ++plane) {
    T* dp = reinterpret_cast<T*>(c.dx.p) + c.dx.base(plane);
    const T* gp = reinterpret_cast<const T*>(c.g.p) + c.g.base(plane);
    const int64_t* ip = reinterpret_cast<const int64_t*>(c.ind.p) + c.ind.base(plane);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t w = 0; w < W; ++w) dp[h * c.dx.sh + w * c.dx.sw] = zero;
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const int64_t index = ip[oh * c.ind.sh + ow * c.ind.sw];
        if (index == -1) continue;
        if (index < 0 || index >= n) { vtpu_report_index(c.st, 2, index, n, -1); continue; }
        T* d = dense ? dp + index : dp + (index / W) * c.dx.sh + (index % W) * c.dx.sw;
        const C sum = static_cast<C>(vtpu_load(*d)) + static_cast<C>(vtpu_load(gp[oh * c.g.sh + ow * c.g.sw]));
        *d = vtpu_store_t<T>::of(sum);
      }
  }
}
static void launch(const VtpuLaunchArgs* args) {
  // tensors: dx, grad, x, indices
  Ctx c{planes_of(args, 0), planes_of(args, 1), planes_of(args, 3), args->status};
  run(args, count(args, 0), c.dx.H * c.dx.W + c.g.H * c.g.W, &body, &c);
}
)BODY";

}  // namespace

bool host_pooling_supports(OpKind op) {
  return op == OpKind::MaxPool2d || op == OpKind::MaxPool2dIndices || op == OpKind::MaxPool2dBackward;
}

GeneratedKernel emit_pooling(const ir::Graph& graph, const std::string& symbol) {
  const ir::Node& node =
      single_op_node(graph, &host_pooling_supports, OpKind::MaxPool2d, OpKind::MaxPool2dIndices, "pooling");
  const OpKind op = node.op;
  const bool indices = graph.outputs().size() == 2;
  const bool backward = op == OpKind::MaxPool2dBackward;
  const ir::TensorType& x = graph.type(node.inputs[backward ? 1 : 0]);
  const auto k = node.attrs.get_ints("kernel_size"), s = node.attrs.get_ints("stride");
  const auto p = node.attrs.get_ints("padding"), d = node.attrs.get_ints("dilation");
  std::ostringstream src;
  src << "namespace ns_" << symbol << " {\n"
      << "using T = " << storage_type(x.dtype) << ";\n"
      << "using C = " << storage_type(ir::compute_type(x.dtype)) << ";\n"
      << "constexpr int kRank = " << x.rank() << ";\n"
      << "constexpr bool kIndices = " << (indices ? "true" : "false") << ";\n"
      << "constexpr int64_t kKH = " << k[0] << ", kKW = " << k[1] << ", kSH = " << s[0] << ", kSW = " << s[1]
      << ", kPH = " << p[0] << ", kPW = " << p[1] << ", kDH = " << d[0] << ", kDW = " << d[1] << ";\n"
      << kParallelRunSource << kHelpers << (backward ? kBackward : kForward) << "}  // namespace ns_" << symbol << "\n"
      << "extern \"C\" __attribute__((visibility(\"default\"))) void " << symbol
      << "(const struct VtpuLaunchArgs* args) { ns_" << symbol << "::launch(args); }\n";
  return {symbol, src.str()};
}

}  // namespace vtpu::compiler::detail
