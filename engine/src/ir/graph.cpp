#include "vtpu/ir/graph.h"

#include "infer.h"
#include "vtpu/runtime/error.h"

namespace vtpu::ir {
namespace {

using runtime::Error;
using runtime::ErrorKind;

}  // namespace

ValueId Graph::add_input(TensorType type) {
  if (type.strides.size() != type.sizes.size()) {
    throw Error(ErrorKind::kInvalidArgument,
                "[input] sizes " + shape_string(type.sizes) + " and strides " +
                    shape_string(type.strides) + " differ in rank");
  }
  for (std::size_t i = 0; i < type.sizes.size(); ++i) {
    if (type.sizes[i] < 0 || type.strides[i] < 0) {
      throw Error(ErrorKind::kInvalidArgument,
                  "[input] negative size or stride: sizes " + shape_string(type.sizes) +
                      ", strides " + shape_string(type.strides));
    }
  }
  (void)itemsize(type.dtype);  // validates the dtype code
  Node n;
  n.op = OpKind::Input;
  n.common_dtype = type.dtype;
  n.type = std::move(type);
  nodes_.push_back(std::move(n));
  const ValueId id = size() - 1;
  inputs_.push_back(id);
  return id;
}

ValueId Graph::add_node(OpKind op, std::vector<ValueId> inputs, Attributes attrs) {
  const OpTraits& t = traits(op);
  if (op == OpKind::Input) detail::fail(op, "use Graph::add_input");
  const auto n = static_cast<int>(inputs.size());
  if (n < t.min_inputs || n > t.max_inputs) {
    detail::fail(op, "expected " +
                         (t.min_inputs == t.max_inputs
                              ? std::to_string(t.min_inputs)
                              : std::to_string(t.min_inputs) + " to " +
                                    std::to_string(t.max_inputs)) +
                         " inputs, got " + std::to_string(n));
  }
  for (ValueId v : inputs) {
    if (v < 0 || v >= size()) {
      detail::fail(op, "input %" + std::to_string(v) + " does not exist (graph has " +
                           std::to_string(size()) + " nodes)");
    }
  }
  detail::Inferred inferred;
  try {
    inferred = detail::infer_node(*this, op, inputs, attrs);
  } catch (const Error& e) {
    // Attribute reads throw without knowing the op; name it here.
    const std::string what = e.what();
    if (!what.empty() && what[0] == '[') throw;
    detail::fail(op, what);
  }
  Node node;
  node.op = op;
  node.inputs = std::move(inputs);
  node.attrs = std::move(attrs);
  node.type = std::move(inferred.type);
  node.common_dtype = inferred.common;
  nodes_.push_back(std::move(node));
  return size() - 1;
}

void Graph::mark_output(ValueId id) {
  if (id < 0 || id >= size()) {
    throw Error(ErrorKind::kInvalidArgument,
                "[output] value %" + std::to_string(id) + " does not exist");
  }
  outputs_.push_back(id);
}

const Node& Graph::node(ValueId id) const {
  if (id < 0 || id >= size()) {
    throw Error(ErrorKind::kInvalidArgument,
                "[graph] value %" + std::to_string(id) + " does not exist");
  }
  return nodes_[static_cast<std::size_t>(id)];
}

Graph single_op(OpKind op, std::vector<TensorType> inputs, Attributes attrs) {
  Graph g;
  std::vector<ValueId> ids;
  for (TensorType& t : inputs) ids.push_back(g.add_input(std::move(t)));
  g.mark_output(g.add_node(op, std::move(ids), std::move(attrs)));
  return g;
}

Operand promotion_operand(const Graph& graph, ValueId id) {
  const Node& n = graph.node(id);
  if (n.op == OpKind::Constant) return {n.type.dtype, OperandClass::kWrappedNumber};
  if (n.type.rank() == 0) return {n.type.dtype, OperandClass::kZeroDim};
  return {n.type.dtype, OperandClass::kTensor};
}

namespace {
bool is_16_bit_float(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }
}  // namespace

bool rounds_operand_to_16_bits(const Graph& graph, const Node& node, std::size_t k) {
  const OpCategory cat = category(node.op);
  if (cat != OpCategory::kUnary && cat != OpCategory::kBinary && cat != OpCategory::kTernary) return false;
  if (!is_16_bit_float(node.common_dtype) || k >= node.inputs.size()) return false;
  if ((node.op == OpKind::Where && k == 0) || (node.op == OpKind::MaskedFill && k == 1)) return false;
  const Node& operand = graph.node(node.inputs[k]);
  if (operand.type.dtype == node.common_dtype) return false;
  // ATen's mul and div read a second operand that is a single value (a
  // Python number, a zero-dim tensor) at its original precision; lerp's
  // scalar weight is no tensor operand in ATen at all.
  if ((node.op == OpKind::Mul || node.op == OpKind::Div) && k == 1 && operand.type.rank() == 0) return false;
  if (node.op == OpKind::Lerp && k == 2 && operand.op == OpKind::Constant) return false;
  return true;
}

bool rounds_runtime_scalar_to_16_bits(const Node& node) {
  return is_16_bit_float(node.common_dtype) && (node.op == OpKind::Add || node.op == OpKind::Sub);
}

}  // namespace vtpu::ir
