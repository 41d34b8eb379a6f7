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
#include <string>
#include <vector>

#include "host_codegen_internal.h"
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
  if (graph.inputs().size() != 1 || graph.outputs().size() != 1 || graph.nodes().size() != 2)
    throw Error(ErrorKind::kInvalidArgument, "[host codegen] a reduction kernel is one reduction of one input");
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
  // Floats accumulate in double (close to a correctly rounded result; ATen's
  // cascade sum in float is within an ulp or two of it), integers in int64.
  const std::string acc = floating ? "double" : "int64_t";
  std::string init, step;
  switch (node.op) {
    case OpKind::Sum:
    case OpKind::Mean: init = acc + "(0)"; step = "acc = acc + x;"; break;
    case OpKind::Prod: init = acc + "(1)"; step = "acc = acc * x;"; break;
    case OpKind::Amax:
      init = floating ? "-INFINITY" : "INT64_MIN";
      step = "acc = vtpu_max(acc, x);";
      break;
    default:
      init = floating ? "INFINITY" : "INT64_MAX";
      step = "acc = vtpu_min(acc, x);";
      break;
  }

  std::ostringstream s;
  s << "namespace ns_" << symbol << " {\n"
    << "struct Context { char* out; const char* in; int64_t sizes[VTPU_MAX_RANK]; int64_t out_strides[VTPU_MAX_RANK];"
    << " int64_t in_strides[VTPU_MAX_RANK]; int64_t count; };\n"
    << "void body(int64_t begin, int64_t end, void* raw) {\n"
    << "  const Context& c = *static_cast<const Context*>(raw);\n"
    << "  for (int64_t o = begin; o < end; ++o) {\n"
    << "    int64_t rest = o, in_off = 0, out_off = 0;\n";
  for (int d = rank - 1; d >= 0; --d) {
    if (reduced[static_cast<std::size_t>(d)]) continue;
    s << "    { const int64_t i = rest % c.sizes[" << d << "]; rest /= c.sizes[" << d << "]; in_off += i * c.in_strides["
      << d << "]; out_off += i * c.out_strides[" << d << "]; }\n";
  }
  s << "    " << acc << " acc = " << init << ";\n";
  std::string offset = "in_off";
  int depth = 0;
  for (int d = 0; d < rank; ++d) {
    if (!reduced[static_cast<std::size_t>(d)]) continue;
    s << std::string(4 + 2 * depth, ' ') << "for (int64_t r" << d << " = 0; r" << d << " < c.sizes[" << d << "]; ++r"
      << d << ") {\n";
    offset += " + r" + std::to_string(d) + " * c.in_strides[" + std::to_string(d) + "]";
    ++depth;
  }
  s << std::string(4 + 2 * depth, ' ') << "const " << acc << " x = static_cast<" << acc
    << ">(vtpu_load(*reinterpret_cast<const " << storage_type(in.dtype) << "*>(c.in + (" << offset << ") * "
    << ir::itemsize(in.dtype) << ")));\n"
    << std::string(4 + 2 * depth, ' ') << step << "\n";
  for (; depth > 0; --depth) s << std::string(2 + 2 * depth, ' ') << "}\n";
  if (node.op == OpKind::Mean) s << "    acc = acc / static_cast<double>(c.count);\n";
  s << "    *reinterpret_cast<" << storage_type(out_dtype) << "*>(c.out + out_off * " << ir::itemsize(out_dtype)
    << ") = vtpu_store_t<" << storage_type(out_dtype) << ">::of(acc);\n"
    << "  }\n}\n}  // namespace ns_" << symbol << "\n";

  s << "extern \"C\" __attribute__((visibility(\"default\"))) void " << symbol
    << "(const struct VtpuLaunchArgs* args) {\n"
    << "  using namespace ns_" << symbol << ";\n"
    << "  Context c;\n"
    << "  c.out = static_cast<char*>(args->tensors[0].data);\n"
    << "  c.in = static_cast<const char*>(args->tensors[1].data);\n"
    << "  int64_t outputs = 1; c.count = 1;\n";
  for (int d = 0; d < rank; ++d) {
    s << "  c.sizes[" << d << "] = args->tensors[1].sizes[" << d << "]; c.in_strides[" << d
      << "] = args->tensors[1].strides[" << d << "]; c.out_strides[" << d << "] = args->tensors[0].strides[" << d
      << "];\n";
    s << (reduced[static_cast<std::size_t>(d)] ? "  c.count *= c.sizes[" : "  outputs *= c.sizes[") << d << "];\n";
  }
  s << "  if (outputs <= 0) return;\n"
    << "  const int64_t grain = c.count > 0 ? (32768 + c.count - 1) / c.count : 32768;\n"
    << "  if (args->parallel_for != nullptr && outputs > 1 && outputs * c.count > 32768)\n"
    << "    args->parallel_for(outputs, grain, &body, &c, args->runner);\n"
    << "  else body(0, outputs, &c);\n}\n";
  return {symbol, s.str()};
}

}  // namespace vtpu::compiler::detail
