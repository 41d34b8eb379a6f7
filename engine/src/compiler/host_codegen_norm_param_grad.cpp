// The weight and bias gradients of layer norm and RMS norm for the host code
// generator. The IR's LayerNormBackward/RmsNormBackward nodes yield dx only;
// this second kernel of the same node yields the parameter gradients, which
// are sums over rows:
//   dweight[j] = sum_r grad[r, j] * xhat[r, j]   (xhat = (x - mean) * rstd,
//                                                 or x * rstd for RMS norm)
//   dbias[j]   = sum_r grad[r, j]                 (layer norm only)
//
// Launch contract: rank = x's rank; every tensor is described in x's dims
// (sizes = x's sizes); tensors = the outputs, then the backward node's inputs
// in IR order (the same list as the dx kernel's inputs; weight, when the node
// has one, is passed and not read):
//   layer_norm_backward: [dweight, dbias, grad, x, mean, rstd, weight?]
//   rms_norm_backward:   [dweight, grad, x, rstd, weight?]
// No scalars. dweight and dbias are parameters (only the strides of the
// normalized dims are used; leading strides ignored), grad and x row tensors,
// mean and rstd statistics (only leading-dim strides used), as in
// host_codegen_norm.cpp. Their dtype is the weight's when the node has one,
// else x's. Zero rows give zero gradients.
//
// Parallel over columns (elements of the normalized shape): each column is
// owned by one thread and sums its rows in order, in double, so results do
// not depend on the thread count. Columns go in blocks whose accumulators
// stay in registers/L1 while the rows stream past; a block's loads from one
// row are contiguous when the normalized dims are (then it vectorises).
#include <sstream>
#include <string>
#include <vector>

#include "host_codegen_internal.h"
#include "vtpu/runtime/error.h"

namespace vtpu::compiler::detail {

GeneratedKernel emit_norm_param_grads(const ir::Graph& graph, const std::string& symbol) {
  using ir::OpKind;
  using runtime::Error;
  using runtime::ErrorKind;
  std::size_t at_node = 0;
  auto is_backward = [](OpKind op) { return op == OpKind::LayerNormBackward || op == OpKind::RmsNormBackward; };
  while (at_node < graph.nodes().size() && !is_backward(graph.nodes()[at_node].op)) ++at_node;
  if (at_node == graph.nodes().size())
    throw Error(ErrorKind::kInvalidArgument,
                "[host codegen] norm parameter gradients need a layer_norm_backward or rms_norm_backward graph");
  const ir::Node& node = graph.nodes()[at_node];
  const std::string op_name(ir::name(node.op));
  if (graph.outputs().size() != 1 || graph.outputs()[0] != static_cast<ir::ValueId>(at_node) ||
      graph.nodes().size() != graph.inputs().size() + 1 || node.inputs != graph.inputs())
    throw Error(ErrorKind::kInvalidArgument,
                "[host codegen] " + op_name + ": a norm kernel is one norm op of the graph's inputs");
  const bool layer = node.op == OpKind::LayerNormBackward;
  const bool has_weight = node.attrs.get_bool("has_weight", false);
  const ir::TensorType& x = graph.type(node.inputs[1]);
  const int rank = static_cast<int>(x.rank());
  const int k = static_cast<int>(node.attrs.get_ints("normalized_shape").size());
  if (k < 1 || k > rank)
    throw Error(ErrorKind::kInvalidArgument, "[host codegen] " + op_name + ": normalized_shape does not fit the input");
  const int lead = rank - k;
  const int outs = layer ? 2 : 1;
  const int sg = outs, sx = outs + 1, smean = layer ? outs + 2 : -1, srstd = outs + (layer ? 3 : 2);
  const int tensors = outs + static_cast<int>(node.inputs.size());
  const ir::DType param_dtype = has_weight ? graph.type(node.inputs.back()).dtype : x.dtype;
  auto dtype_of = [&](int t) {
    return t < outs ? param_dtype : graph.type(node.inputs[static_cast<std::size_t>(t - outs)]).dtype;
  };
  auto ptr = [&](int t) {
    return "reinterpret_cast<const " + std::string(storage_type(dtype_of(t))) + "*>(c.p[" + std::to_string(t) + "])";
  };
  auto load = [&](int t, const std::string& index) {
    return "static_cast<double>(vtpu_load(" + ptr(t) + "[" + index + "]))";
  };
  const std::string out_t = storage_type(param_dtype);
  // Row tensors move with the rows; statistics too (one value per row).
  std::vector<int> walkers = {sg, sx, srstd};
  if (layer) walkers.push_back(smean);

  std::ostringstream s;
  s << "namespace ns_" << symbol << " {\n"
    << "struct Context { char* p[" << tensors << "]; int64_t sizes[VTPU_MAX_RANK]; int64_t strides[" << tensors
    << "][VTPU_MAX_RANK]; };\n"
    << "constexpr int64_t kBlock = 256;\n"
    << "inline int64_t elem(const Context& c, int t, int64_t i) {\n"
    << "  int64_t o = 0;\n"
    << "  for (int d = " << rank - 1 << "; d >= " << lead << "; --d) { o += (i % c.sizes[d]) * c.strides[t][d]; "
    << "i /= c.sizes[d]; }\n  return o;\n}\n"
    << "template <bool kUnit> void columns(const Context& c, int64_t begin, int64_t end) {\n"
    << "  auto at = [&](int t, int64_t j) { return kUnit ? j : elem(c, t, j); };\n"
    << "  for (int64_t b = begin; b < end; b += kBlock) {\n"
    << "    const int64_t m = std::min<int64_t>(kBlock, end - b);\n"
    << "    double dw[kBlock], db[kBlock];\n"
    << "    for (int64_t j = 0; j < kBlock; ++j) { dw[j] = 0.0; db[j] = 0.0; }\n"
    << "    int64_t off[" << tensors << "] = {};\n    int64_t k[VTPU_MAX_RANK] = {};\n"
    << "    int64_t rows = 1;\n    for (int d = 0; d < " << lead << "; ++d) rows *= c.sizes[d];\n"
    << "    for (int64_t r = 0; r < rows; ++r) {\n"
    << "      const double rstd = " << load(srstd, "off[" + std::to_string(srstd) + "]") << ";\n"
    << "      const double mean = " << (layer ? load(smean, "off[" + std::to_string(smean) + "]") : "0.0") << ";\n"
    << "      for (int64_t j = 0; j < m; ++j) {\n"
    << "        const double g = " << load(sg, "off[" + std::to_string(sg) + "] + at(" + std::to_string(sg) + ", b + j)")
    << ";\n"
    << "        const double xhat = (" << load(sx, "off[" + std::to_string(sx) + "] + at(" + std::to_string(sx) + ", b + j)")
    << " - mean) * rstd;\n"
    << "        dw[j] += g * xhat;\n        db[j] += g;\n      }\n"
    // The next row: an odometer over the leading dims.
    << "      for (int d = " << lead - 1 << "; d >= 0; --d) {\n"
    << "        if (++k[d] < c.sizes[d]) {";
  for (int t : walkers) s << " off[" << t << "] += c.strides[" << t << "][d];";
  s << " break; }\n        ";
  for (int t : walkers) s << "off[" << t << "] -= (k[d] - 1) * c.strides[" << t << "][d]; ";
  s << "k[d] = 0;\n      }\n    }\n"
    << "    for (int64_t j = 0; j < m; ++j) {\n"
    << "      reinterpret_cast<" << out_t << "*>(c.p[0])[at(0, b + j)] = vtpu_store_t<" << out_t << ">::of(dw[j]);\n";
  if (layer)
    s << "      reinterpret_cast<" << out_t << "*>(c.p[1])[at(1, b + j)] = vtpu_store_t<" << out_t << ">::of(db[j]);\n";
  s << "    }\n  }\n}\n"
    << "void body(int64_t begin, int64_t end, void* raw) {\n"
    << "  const Context c = *static_cast<const Context*>(raw);  // a copy: see host_codegen.cpp\n"
    << "  bool all_unit = true;\n";
  // Unit: every row and parameter tensor's normalized dims collapse to one
  // run of stride 1.
  for (int t = 0; t < tensors; ++t) {
    if (t == srstd || t == smean || t > srstd) continue;  // statistics, and weight (not read)
    s << "  { int64_t expect = 1; for (int d = " << rank - 1 << "; d >= " << lead << "; --d) { if (c.sizes[d] != 1 && "
      << "c.strides[" << t << "][d] != expect) all_unit = false; expect *= c.sizes[d]; } }\n";
  }
  s << "  if (all_unit) columns<true>(c, begin, end);\n  else columns<false>(c, begin, end);\n}\n"
    << "}  // namespace ns_" << symbol << "\n";

  s << "extern \"C\" __attribute__((visibility(\"default\"))) void " << symbol
    << "(const struct VtpuLaunchArgs* args) {\n"
    << "  using namespace ns_" << symbol << ";\n  Context c;\n  int64_t rows = 1, n = 1;\n";
  for (int t = 0; t < tensors; ++t) s << "  c.p[" << t << "] = static_cast<char*>(args->tensors[" << t << "].data);\n";
  s << "  for (int d = 0; d < " << rank << "; ++d) {\n    c.sizes[d] = args->tensors[" << sx << "].sizes[d];\n";
  for (int t = 0; t < tensors; ++t) s << "    c.strides[" << t << "][d] = args->tensors[" << t << "].strides[d];\n";
  s << "    if (d < " << lead << ") rows *= c.sizes[d]; else n *= c.sizes[d];\n  }\n"
    << "  if (n <= 0) return;\n"
    << "  const int64_t grain = rows > 0 ? (32768 + rows - 1) / rows : 32768;\n"
    << "  if (args->parallel_for != nullptr && n > 1 && rows * n > 32768)\n"
    << "    args->parallel_for(n, grain, &body, &c, args->runner);\n"
    << "  else body(0, n, &c);\n}\n";
  return {symbol, s.str()};
}

}  // namespace vtpu::compiler::detail
