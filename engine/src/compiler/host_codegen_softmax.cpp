// Softmax and log-softmax, forward and backward, for the host code generator:
// row operations along one dim. One kernel per (dtypes, rank, dim); sizes and
// strides are launch arguments.
//
// Launch contract: rank = the input's rank; tensors[0] is the output, then
// the inputs (x, or grad and output), all with the input's shape. Parallel
// over rows; each row is reduced by one thread in a fixed order.
#include <sstream>
#include <string>

#include "host_codegen_internal.h"
#include "vtpu/runtime/error.h"

namespace vtpu::compiler::detail {
namespace {

using ir::OpKind;

// Per element of a row: the expression loading tensor t at row index i, in
// the compute type `ct` (st<t> is the row stride: the constant 1 in the
// unit-stride instantiation of the row function, which then vectorises).
std::string load(int t, const ir::TensorType& type, const std::string& ct) {
  const std::string ts = std::to_string(t);
  return "static_cast<" + ct + ">(vtpu_load(reinterpret_cast<const " + std::string(storage_type(type.dtype)) +
         "*>(c.p[" + ts + "])[off" + ts + " + i * st" + ts + "]))";
}

}  // namespace

bool host_softmax_supports(OpKind op) {
  return op == OpKind::Softmax || op == OpKind::LogSoftmax || op == OpKind::SoftmaxBackward ||
         op == OpKind::LogSoftmaxBackward;
}

GeneratedKernel emit_softmax(const ir::Graph& graph, const std::string& symbol) {
  using runtime::Error;
  using runtime::ErrorKind;
  if (graph.outputs().size() != 1 || graph.nodes().size() != graph.inputs().size() + 1)
    throw Error(ErrorKind::kInvalidArgument, "[host codegen] a softmax kernel is one softmax op");
  const ir::Node& node = graph.node(graph.outputs()[0]);
  const int num_inputs = static_cast<int>(graph.inputs().size());
  const ir::TensorType& x = graph.type(graph.inputs()[0]);
  const int rank = static_cast<int>(x.rank());
  // A 0-dim softmax is a constant (1, or 0 for log_softmax): ATen's kernel
  // handles it; not worth a kernel of its own.
  if (rank == 0) throw Error(ErrorKind::kInvalidArgument, "[host codegen] softmax of a 0-dim tensor");
  // ATen's 16-bit log_softmax rounds an intermediate we have not matched yet
  // (results near 0 differ by an ulp of the input's magnitude): left to ATen.
  if ((node.op == OpKind::LogSoftmax) && ir::compute_type(x.dtype) != x.dtype)
    throw Error(ErrorKind::kInvalidArgument, "[host codegen] log_softmax of a 16-bit float tensor");
  const int dim = static_cast<int>(node.attrs.get_int("dim") < 0 ? node.attrs.get_int("dim") + rank
                                                                   : node.attrs.get_int("dim"));
  const std::string out_type = storage_type(node.type.dtype);
  const int tensors = num_inputs + 1;

  std::ostringstream s;
  s << "namespace ns_" << symbol << " {\n"
    << "struct Context { char* p[" << tensors << "]; int64_t sizes[VTPU_MAX_RANK]; int64_t strides[" << tensors
    << "][VTPU_MAX_RANK]; };\n";
  // Computed in the input's compute type (float for float32/bfloat16/float16),
  // as ATen's CPU kernels do: a double computation would round 16-bit results
  // differently from the CPU's.
  const std::string ct = ir::compute_type(x.dtype) == ir::DType::kFloat64 ? "double" : "float";
  // One row; instantiated for unit row strides (vectorised) and any strides.
  // Row sums and the max use vtpu_lanes_reduce's fixed interleaved order, so
  // both instantiations give the same bits.
  // A 16-bit softmax keeps exp(x - max) of its row in `scratch` (the body's,
  // one row long) between the sum and the scaling: one exp per element
  // instead of two (bfloat16 softmax took 1.8-2.3x the CPU's time), the same
  // bits. Without scratch memory the row recomputes the exps.
  const bool scratch_row = node.op == OpKind::Softmax && out_type != ct;
  // A float16 softmax backward converts its unit-stride rows of grad and
  // output once into scratch (two rows long) through F16C: it converted each
  // element in both passes (2.7x the CPU's time).
  const bool half_backward = node.op == OpKind::SoftmaxBackward && ct == "float" &&
                             x.dtype == ir::DType::kFloat16 &&
                             graph.type(graph.inputs()[1]).dtype == ir::DType::kFloat16 &&
                             node.type.dtype == ir::DType::kFloat16;
  const int scratch_rows = scratch_row ? 1 : half_backward ? 2 : 0;
  s << "template <bool kUnit> inline void row(const Context& c";
  for (int t = 0; t < tensors; ++t) s << ", int64_t off" << t;
  s << ", " << ct << "* scratch) {\n    (void)scratch;\n    const int64_t n = c.sizes[" << dim << "];\n";
  for (int t = 0; t < tensors; ++t)
    s << "    const int64_t st" << t << " = kUnit ? 1 : c.strides[" << t << "][" << dim << "];\n";
  auto L = [&](int t, const ir::TensorType& type) { return load(t, type, ct); };
  const std::string store_prefix = "    for (int64_t i = 0; i < n; ++i) reinterpret_cast<" + out_type +
                                   "*>(c.p[0])[off0 + i * st0] = vtpu_store_t<" + out_type + ">::of(";
  auto lanes = [&](const std::string& init, const std::string& value, const std::string& combine) {
    return "vtpu_lanes_reduce<" + ct + ">(n, " + ct + "(" + init + "), [&](int64_t i) { return " + value +
           "; }, " + lane_combine(ct, combine) + ")";
  };
  switch (node.op) {
    case OpKind::Softmax:
    case OpKind::LogSoftmax: {
      const std::string xi = L(1, x);
      if (scratch_row) {
        // A unit-stride row is read once into scratch in the compute type
        // and written once from it, so that its 16-bit loads and stores are
        // whole loops (float16's 16 at a time through F16C/AVX-512,
        // vtpu_half_lanes_*): the other passes converted each element
        // anew, and a float16 softmax took 2.1x the CPU's time. The same
        // values in the same order as the general row below: the same bits.
        const std::string in_t = storage_type(x.dtype);
        s << "    if (kUnit && scratch != nullptr) {\n"
          << "      const " << in_t << "* x = reinterpret_cast<const " << in_t << "*>(c.p[1]) + off1;\n"
          << "      " << out_type << "* y = reinterpret_cast<" << out_type << "*>(c.p[0]) + off0;\n"
          << "      int64_t i = 0;\n";
        if (x.dtype == ir::DType::kFloat16 && ct == "float")
          s << "      for (; i + 16 <= n; i += 16) vtpu_half_lanes_load(x + i, scratch + i);\n";
        s << "      for (; i < n; ++i) scratch[i] = static_cast<" << ct << ">(vtpu_load(x[i]));\n"
          << "      const " << ct << " mx = " << lanes("-INFINITY", "scratch[i]", "vtpu_max(a, b)") << ";\n"
          << "      const " << ct << " sum = " << lanes("0", "(scratch[i] = vtpu_exp(scratch[i] - mx))", "a + b")
          << ";\n      const " << ct << " scale = " << ct << "(1) / sum;\n      i = 0;\n";
        if (node.type.dtype == ir::DType::kFloat16 && ct == "float")
          s << "      for (; i + 16 <= n; i += 16) {\n        float v[16];\n"
            << "        for (int l = 0; l < 16; ++l) v[l] = scratch[i + l] * scale;\n"
            << "        vtpu_half_lanes_store(v, y + i);\n      }\n";
        s << "      for (; i < n; ++i) y[i] = vtpu_store_t<" << out_type << ">::of(scratch[i] * scale);\n"
          << "      return;\n    }\n";
      }
      s << "    const " << ct << " mx = " << lanes("-INFINITY", xi, "vtpu_max(a, b)") << ";\n";
      if (node.op == OpKind::Softmax && out_type == ct) {
        // The output holds exp(x - max) until it is scaled: one exp per
        // element, and the same bits as recomputing it.
        const std::string out_i = "reinterpret_cast<" + out_type + "*>(c.p[0])[off0 + i * st0]";
        s << "    const " << ct << " sum = "
          << lanes("0", "(" + out_i + " = vtpu_exp(" + xi + " - mx))", "a + b") << ";\n"
          << "    const " << ct << " scale = " << ct << "(1) / sum;\n"
          << "    for (int64_t i = 0; i < n; ++i) " << out_i << " = " << out_i << " * scale;\n";
        break;
      }
      if (scratch_row) {
        s << "    if (scratch != nullptr) {\n"
          << "      const " << ct << " sum = " << lanes("0", "(scratch[i] = vtpu_exp(" + xi + " - mx))", "a + b")
          << ";\n      const " << ct << " scale = " << ct << "(1) / sum;\n  " << store_prefix
          << "scratch[i] * scale);\n      return;\n    }\n";
      }
      s << "    const " << ct << " sum = " << lanes("0", "vtpu_exp(" + xi + " - mx)", "a + b") << ";\n";
      if (node.op == OpKind::Softmax) {
        s << "    const " << ct << " scale = " << ct << "(1) / sum;\n" << store_prefix << "vtpu_exp(" << xi
          << " - mx) * scale);\n";
      } else {
        s << "    const " << ct << " log_sum = vtpu_log(sum);\n" << store_prefix << xi << " - mx - log_sum);\n";
      }
      break;
    }
    case OpKind::SoftmaxBackward: {
      const std::string g = L(1, x), y = L(2, graph.type(graph.inputs()[1]));
      if (half_backward) {  // the same values and order as below
        s << "    if (kUnit && scratch != nullptr) {\n"
          << "      const vtpu_half* gp = reinterpret_cast<const vtpu_half*>(c.p[1]) + off1;\n"
          << "      const vtpu_half* yp = reinterpret_cast<const vtpu_half*>(c.p[2]) + off2;\n"
          << "      vtpu_half* out = reinterpret_cast<vtpu_half*>(c.p[0]) + off0;\n"
          << "      float* const sg = scratch;\n      float* const sy = scratch + n;\n"
          << "      int64_t i = 0;\n"
          << "      for (; i + 16 <= n; i += 16) { vtpu_half_lanes_load(gp + i, sg + i); vtpu_half_lanes_load(yp + i, sy + i); }\n"
          << "      for (; i < n; ++i) { sg[i] = vtpu_load(gp[i]); sy[i] = vtpu_load(yp[i]); }\n"
          // The lane loop reads copies of the scratch pointers: through
          // references to them (a [&] lambda) GCC left it scalar (3x).
          << "      const float* const rg = sg;\n      const float* const ry = sy;\n"
          << "      const float dot = vtpu_lanes_reduce<float>(n, 0.0f, [rg, ry](int64_t i) { return rg[i] * ry[i]; }, "
             "[](float a, float b) { return a + b; });\n"
          << "      for (i = 0; i + 16 <= n; i += 16) {\n        float v[16];\n"
          << "        for (int l = 0; l < 16; ++l) v[l] = sy[i + l] * (sg[i + l] - dot);\n"
          << "        vtpu_half_lanes_store(v, out + i);\n      }\n"
          << "      for (; i < n; ++i) out[i] = vtpu_store_t<vtpu_half>::of(sy[i] * (sg[i] - dot));\n"
          << "      return;\n    }\n";
      }
      s << "    const " << ct << " dot = " << lanes("0", g + " * " + y, "a + b") << ";\n"
        << store_prefix << y << " * (" << g << " - dot));\n";
      break;
    }
    default: {  // LogSoftmaxBackward
      const std::string g = L(1, x), y = L(2, graph.type(graph.inputs()[1]));
      s << "    const " << ct << " sum = " << lanes("0", g, "a + b") << ";\n"
        << store_prefix << g << " - vtpu_exp(" << y << ") * sum);\n";
      break;
    }
  }
  s << "}\n";

  s << "void body(int64_t begin, int64_t end, void* raw) {\n"
    << "  const Context c = *static_cast<const Context*>(raw);  // a copy: see host_codegen.cpp\n"
    << "  const bool unit = true";
  for (int t = 0; t < tensors; ++t) s << " && c.strides[" << t << "][" << dim << "] == 1";
  // Offsets of the first row by division, then an odometer over the other dims.
  s << ";\n  int64_t rest = begin;\n";
  for (int t = 0; t < tensors; ++t) s << "  int64_t off" << t << " = 0;\n";
  for (int d = rank - 1; d >= 0; --d) {
    if (d == dim) continue;
    s << "  int64_t k" << d << " = rest % c.sizes[" << d << "]; rest /= c.sizes[" << d << "];";
    for (int t = 0; t < tensors; ++t) s << " off" << t << " += k" << d << " * c.strides[" << t << "][" << d << "];";
    s << "\n";
  }
  std::string offsets;
  for (int t = 0; t < tensors; ++t) offsets += ", off" + std::to_string(t);
  offsets += ", scratch";
  if (scratch_rows > 0)
    s << "  " << ct << "* scratch = static_cast<" << ct << "*>(std::malloc(static_cast<size_t>(c.sizes[" << dim
      << "]) * " << scratch_rows << " * sizeof(" << ct << ")));\n";
  else
    s << "  " << ct << "* scratch = nullptr;\n";
  s << "  for (int64_t r = begin; r < end; ++r) {\n"
    << "    if (unit) row<true>(c" << offsets << ");\n    else row<false>(c" << offsets << ");\n"
    << "    do {\n";
  for (int d = rank - 1; d >= 0; --d) {
    if (d == dim) continue;
    const std::string k = "k" + std::to_string(d), ds = std::to_string(d);
    s << "      if (++" << k << " < c.sizes[" << ds << "]) {";
    for (int t = 0; t < tensors; ++t) s << " off" << t << " += c.strides[" << t << "][" << ds << "];";
    s << " break; }\n      ";
    for (int t = 0; t < tensors; ++t) s << "off" << t << " -= (" << k << " - 1) * c.strides[" << t << "][" << ds << "]; ";
    s << k << " = 0;\n";
  }
  s << "    } while (false);\n";
  s << "  }\n  std::free(scratch);\n}\n}  // namespace ns_" << symbol << "\n";

  s << "extern \"C\" __attribute__((visibility(\"default\"))) void " << symbol
    << "(const struct VtpuLaunchArgs* args) {\n"
    << "  using namespace ns_" << symbol << ";\n  Context c;\n  int64_t rows = 1;\n";
  for (int t = 0; t < tensors; ++t) s << "  c.p[" << t << "] = static_cast<char*>(args->tensors[" << t << "].data);\n";
  s << "  for (int d = 0; d < " << rank << "; ++d) {\n    c.sizes[d] = args->tensors[1].sizes[d];\n";
  for (int t = 0; t < tensors; ++t) s << "    c.strides[" << t << "][d] = args->tensors[" << t << "].strides[d];\n";
  s << "    if (d != " << dim << ") rows *= c.sizes[d];\n  }\n"
    << "  if (rows <= 0 || c.sizes[" << dim << "] <= 0) return;\n"
    << "  const int64_t grain = (32768 + c.sizes[" << dim << "] - 1) / c.sizes[" << dim << "];\n"
    << "  if (args->parallel_for != nullptr && rows > 1 && rows * c.sizes[" << dim << "] > 32768)\n"
    << "    args->parallel_for(rows, grain, &body, &c, args->runner);\n"
    << "  else body(0, rows, &c);\n}\n";
  return {symbol, s.str()};
}

}  // namespace vtpu::compiler::detail
