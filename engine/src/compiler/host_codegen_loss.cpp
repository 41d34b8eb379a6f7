// The negative log-likelihood loss for the host code generator: nll_loss
// (with its total weight) and nll_loss_backward, the semantics of the
// reference interpreter (interp_loss.cpp) bit for bit. One kernel per
// (dtype, target dtype, rank of x, reduction, ignore_index, weight or not,
// total weight or not); sizes, strides and target values are launch-time.
//
// Launch contract: tensors are the graph's outputs, then its inputs (the
// node's operands, in IR order), each described in its OWN rank (sizes and
// strides in elements, any strides, storage offset applied to data); dims at
// and above a tensor's rank are ignored. args->rank and args->scalars are not
// read. Outputs must not overlap inputs.
//   forward, graph outputs [loss] or [loss, total_weight] (an nll_loss node
//     and an nll_loss_total_weight node of the same operands and attributes):
//     tensors = {loss, total_weight?, x [C] or [N, C], target [] or [N]
//     (int64 or uint8), weight? [C]}. loss is [N] for "none" of a 2-dim x,
//     else 0-dim; total_weight 0-dim.
//   backward, graph output [dx]: tensors = {dx (x's shape), grad, x, target,
//     total_weight (0-dim), weight?}. x's data is not read (dx has its
//     sizes); total_weight is read only for "mean".
// A target outside [0, C) that is not ignore_index is reported through
// vtpu_report_index(args->status, operand = the target's operand index (1
// forward, 2 backward), value, bound = C, dim = x's class dim) and its row is
// skipped: it adds nothing to the sums, its "none" loss element keeps its
// prior contents, its dx row is zeros. Nothing outside the tensors is touched.
//
// Work split: "none" losses and dx are parallel over rows (each row owned by
// one thread: dx's row is zeroed and its one element written). The reduced
// loss is one serial pass in row order summing in double, so its bits do not
// depend on the thread count; it reads one element per row, so the pass is
// cheap next to producing x.
#include <cstdint>
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

// Shared by both kernels. `rnd` rounds a compute-precision value to the
// storage dtype and back (ATen's scalar_t arithmetic for the 16-bit floats).
constexpr const char* kHelpers = R"HELPERS(
static inline C rnd(C v) { return static_cast<C>(vtpu_round_t<T>::of(v)); }
static inline C load(const T* p, int64_t off) { return static_cast<C>(vtpu_load(p[off])); }
// The rows' geometry: a 1-dim x is one row (row strides 0).
struct Rows {
  int64_t rows, classes, xs0, xs1, ts;
  const I* target;
  const T* w; int64_t ws;
  VtpuKernelStatus* st;
  // The target of row b when it counts; -1 when it is ignored or out of range (reported).
  inline int64_t counted(int64_t b) const {
    const int64_t t = static_cast<int64_t>(target[b * ts]);
    if (t == kIgnoreIndex) return -1;
    if (t < 0 || t >= classes) { vtpu_report_index(st, kTargetOperand, t, classes, kTwoDim ? 1 : 0); return -1; }
    return t;
  }
  inline C weight(int64_t t) const {
    if constexpr (kWeight) return load(w, t * ws); else return C(1);
  }
};
static inline Rows rows_of(const VtpuLaunchArgs* args, int x, int target, int weight) {
  const VtpuTensorArg& xa = args->tensors[x];
  Rows r;
  r.rows = kTwoDim ? xa.sizes[0] : 1;
  r.classes = kTwoDim ? xa.sizes[1] : xa.sizes[0];
  r.xs0 = kTwoDim ? xa.strides[0] : 0;
  r.xs1 = kTwoDim ? xa.strides[1] : xa.strides[0];
  r.ts = kTwoDim ? args->tensors[target].strides[0] : 0;
  r.target = static_cast<const I*>(args->tensors[target].data);
  r.w = kWeight ? static_cast<const T*>(args->tensors[weight].data) : nullptr;
  r.ws = kWeight ? args->tensors[weight].strides[0] : 0;
  r.st = args->status;
  return r;
}
)HELPERS";

constexpr const char* kForward = R"BODY(
struct Ctx { Rows r; const T* x; T* out; int64_t os; };
static inline C term(const Ctx& c, int64_t b, int64_t t) {
  const C xv = load(c.x, b * c.r.xs0 + t * c.r.xs1);
  if constexpr (kWeight) return xv * c.r.weight(t); else return xv;
}
// "none" of a 2-dim x: one loss per row.
void none_body(int64_t begin, int64_t end, void* raw) {
  const Ctx& c = *static_cast<const Ctx*>(raw);
  for (int64_t b = begin; b < end; ++b) {
    const int64_t raw_t = static_cast<int64_t>(c.r.target[b * c.r.ts]);
    if (raw_t == kIgnoreIndex) { c.out[b * c.os] = vtpu_store_t<T>::of(C(0)); continue; }
    const int64_t t = c.r.counted(b);
    if (t < 0) continue;
    c.out[b * c.os] = vtpu_store_t<T>::of(-term(c, b, t));
  }
}
static void launch(const VtpuLaunchArgs* args) {
  constexpr int kX = kHasTotal ? 2 : 1;
  Ctx c{rows_of(args, kX, kX + 1, kX + 2), static_cast<const T*>(args->tensors[kX].data),
        static_cast<T*>(args->tensors[0].data), kNone ? args->tensors[0].strides[0] : 0};
  if constexpr (kNone) {
    if constexpr (kHasTotal) *static_cast<T*>(args->tensors[1].data) = vtpu_store_t<T>::of(0.0);
    run(args, c.r.rows, 1, &none_body, &c);
    return;
  } else {
    double sum = 0, total = 0;
    for (int64_t b = 0; b < c.r.rows; ++b) {
      const int64_t t = c.r.counted(b);
      if (t < 0) continue;
      sum += static_cast<double>(term(c, b, t));
      total += static_cast<double>(c.r.weight(t));
    }
    // ATen negates, then divides: 0/0 (every target ignored) is the hardware's NaN as in ATen.
    *c.out = vtpu_store_t<T>::of(kMean ? (-sum) / total : -sum);
    if constexpr (kHasTotal) *static_cast<T*>(args->tensors[1].data) = vtpu_store_t<T>::of(total);
  }
}
)BODY";

constexpr const char* kBackward = R"BODY(
struct Ctx { Rows r; T* dx; int64_t ds0, ds1; const T* g; int64_t gs; C scale; };
void body(int64_t begin, int64_t end, void* raw) {
  const Ctx& c = *static_cast<const Ctx*>(raw);
  const T zero = vtpu_store_t<T>::of(C(0));
  for (int64_t b = begin; b < end; ++b) {
    T* row = c.dx + b * c.ds0;
    if (c.ds1 == 1) { for (int64_t j = 0; j < c.r.classes; ++j) row[j] = zero; }
    else { for (int64_t j = 0; j < c.r.classes; ++j) row[j * c.ds1] = zero; }
    const int64_t t = c.r.counted(b);
    if (t < 0) continue;
    C value;
    if constexpr (kNone) value = -(c.r.weight(t) * load(c.g, b * c.gs));
    else if constexpr (kWeight) value = c.r.weight(t) * c.scale;
    else value = c.scale;
    row[t * c.ds1] = vtpu_store_t<T>::of(value);
  }
}
static void launch(const VtpuLaunchArgs* args) {
  // tensors: dx, grad, x, target, total_weight, weight?
  Ctx c{rows_of(args, 2, 3, 5), static_cast<T*>(args->tensors[0].data), 0, 0,
        static_cast<const T*>(args->tensors[1].data), 0, C(0)};
  c.ds0 = kTwoDim ? args->tensors[0].strides[0] : 0;
  c.ds1 = kTwoDim ? args->tensors[0].strides[1] : args->tensors[0].strides[0];
  c.gs = kNone ? args->tensors[1].strides[0] : 0;
  if constexpr (!kNone) {
    C g = load(c.g, 0);
    if constexpr (kMean) g = rnd(g / load(static_cast<const T*>(args->tensors[4].data), 0));
    c.scale = -g;
  }
  run(args, c.r.rows, c.r.classes, &body, &c);
}
)BODY";

// INT64_MIN has no literal (its magnitude overflows before the minus applies).
std::string integer_literal(std::int64_t v) {
  return v == INT64_MIN ? std::string("INT64_MIN") : std::to_string(v) + "LL";
}

}  // namespace

bool host_loss_supports(OpKind op) {
  return op == OpKind::NllLoss || op == OpKind::NllLossTotalWeight || op == OpKind::NllLossBackward;
}

GeneratedKernel emit_loss(const ir::Graph& graph, const std::string& symbol) {
  const ir::Node& node = single_op_node(graph, &host_loss_supports, OpKind::NllLoss, OpKind::NllLossTotalWeight, "loss");
  const OpKind op = node.op;
  const bool has_total = graph.outputs().size() == 2;
  const bool backward = op == OpKind::NllLossBackward;
  const ir::TensorType& x = graph.type(node.inputs[backward ? 1 : 0]);
  const ir::TensorType& target = graph.type(node.inputs[backward ? 2 : 1]);
  const std::string reduction = node.attrs.get_string("reduction", "mean");
  const bool two_dim = x.rank() == 2;
  std::ostringstream s;
  s << "namespace ns_" << symbol << " {\n"
    << "using T = " << storage_type(x.dtype) << ";\n"
    << "using C = " << storage_type(ir::compute_type(x.dtype)) << ";\n"
    << "using I = " << storage_type(target.dtype) << ";\n"
    << "constexpr bool kWeight = " << (node.attrs.get_bool("has_weight", false) ? "true" : "false") << ";\n"
    << "constexpr bool kTwoDim = " << (two_dim ? "true" : "false") << ";\n"
    << "constexpr bool kNone = " << (reduction == "none" && two_dim ? "true" : "false") << ";\n"
    << "constexpr bool kMean = " << (reduction == "mean" ? "true" : "false") << ";\n"
    << "constexpr bool kHasTotal = " << (has_total ? "true" : "false") << ";\n"
    << "constexpr int64_t kIgnoreIndex = " << integer_literal(node.attrs.get_int("ignore_index", -100)) << ";\n"
    << "constexpr int32_t kTargetOperand = " << (backward ? 2 : 1) << ";\n"
    << kParallelRunSource << kHelpers << (backward ? kBackward : kForward)
    << "}  // namespace ns_" << symbol << "\n"
    << "extern \"C\" __attribute__((visibility(\"default\"))) void " << symbol
    << "(const struct VtpuLaunchArgs* args) { ns_" << symbol << "::launch(args); }\n";
  return {symbol, s.str()};
}

}  // namespace vtpu::compiler::detail
