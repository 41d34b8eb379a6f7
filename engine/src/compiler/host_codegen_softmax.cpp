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
// the compute type `ct`.
std::string load(int t, const ir::TensorType& type, int dim, const std::string& ct) {
  return "static_cast<" + ct + ">(vtpu_load(*reinterpret_cast<const " + std::string(storage_type(type.dtype)) +
         "*>(c.p[" + std::to_string(t) + "] + (off" + std::to_string(t) + " + i * c.strides[" + std::to_string(t) +
         "][" + std::to_string(dim) + "]) * " + std::to_string(ir::itemsize(type.dtype)) + ")))";
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
    << "][VTPU_MAX_RANK]; };\n"
    << "void body(int64_t begin, int64_t end, void* raw) {\n"
    << "  const Context& c = *static_cast<const Context*>(raw);\n";
  s << "  for (int64_t row = begin; row < end; ++row) {\n    int64_t rest = row;\n";
  for (int t = 0; t < tensors; ++t) s << "    int64_t off" << t << " = 0;\n";
  for (int d = rank - 1; d >= 0; --d) {
    if (d == dim) continue;
    s << "    { const int64_t k = rest % c.sizes[" << d << "]; rest /= c.sizes[" << d << "];";
    for (int t = 0; t < tensors; ++t) s << " off" << t << " += k * c.strides[" << t << "][" << d << "];";
    s << " }\n";
  }
  s << "    const int64_t n = c.sizes[" << dim << "];\n";
  // Computed in the input's compute type (float for float32/bfloat16/float16),
  // as ATen's CPU kernels do: a double computation would round 16-bit results
  // differently from the CPU's.
  const std::string ct = ir::compute_type(x.dtype) == ir::DType::kFloat64 ? "double" : "float";
  auto L = [&](int t, const ir::TensorType& type) { return load(t, type, dim, ct); };
  const std::string store_prefix = "    for (int64_t i = 0; i < n; ++i) *reinterpret_cast<" + out_type +
                                   "*>(c.p[0] + (off0 + i * c.strides[0][" + std::to_string(dim) + "]) * " +
                                   std::to_string(ir::itemsize(node.type.dtype)) + ") = vtpu_store_t<" + out_type +
                                   ">::of(";
  switch (node.op) {
    case OpKind::Softmax:
    case OpKind::LogSoftmax: {
      const std::string xi = L(1, x);
      s << "    " << ct << " mx = -INFINITY;\n    for (int64_t i = 0; i < n; ++i) mx = vtpu_max(mx, " << xi << ");\n"
        << "    " << ct << " sum = 0;\n    for (int64_t i = 0; i < n; ++i) sum += std::exp(" << xi << " - mx);\n";
      if (node.op == OpKind::Softmax) {
        s << "    const " << ct << " scale = " << ct << "(1) / sum;\n" << store_prefix << "std::exp(" << xi
          << " - mx) * scale);\n";
      } else {
        s << "    const " << ct << " log_sum = std::log(sum);\n" << store_prefix << xi << " - mx - log_sum);\n";
      }
      break;
    }
    case OpKind::SoftmaxBackward: {
      const std::string g = L(1, x), y = L(2, graph.type(graph.inputs()[1]));
      s << "    " << ct << " dot = 0;\n    for (int64_t i = 0; i < n; ++i) dot += " << g << " * " << y << ";\n"
        << store_prefix << y << " * (" << g << " - dot));\n";
      break;
    }
    default: {  // LogSoftmaxBackward
      const std::string g = L(1, x), y = L(2, graph.type(graph.inputs()[1]));
      s << "    " << ct << " sum = 0;\n    for (int64_t i = 0; i < n; ++i) sum += " << g << ";\n"
        << store_prefix << g << " - std::exp(" << y << ") * sum);\n";
      break;
    }
  }
  s << "  }\n}\n}  // namespace ns_" << symbol << "\n";

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
