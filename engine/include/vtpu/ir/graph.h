// The tensor-op graph. Nodes are appended in topological order (an input must
// exist before its users) and each node's output type is inferred when it is
// added: broadcasting, type promotion, reduction shapes. A malformed node is
// refused there, with a message naming the op and echoing the shapes, so
// nothing downstream (codegen, interpreter) has to re-validate.
#pragma once

#include <cstdint>
#include <vector>

#include "vtpu/ir/attributes.h"
#include "vtpu/ir/dtype.h"
#include "vtpu/ir/op.h"
#include "vtpu/ir/tensor_type.h"

namespace vtpu::ir {

// A value id: the index of the node that produces it.
using ValueId = std::int32_t;

struct Node {
  OpKind op = OpKind::Input;
  std::vector<ValueId> inputs;
  Attributes attrs;
  TensorType type;  // the output; contiguous for every node but Input
  // TensorIterator's common dtype: what the operands are converted to before
  // the op computes (in compute_type(common_dtype)). Differs from type.dtype
  // for comparisons/logical ops/isnan (output bool), argmax (int64) and casts.
  DType common_dtype = DType::kFloat32;
};

class Graph {
 public:
  // A graph input with an arbitrary strided type. Throws for a malformed type
  // (rank mismatch between sizes and strides, negative sizes or strides).
  ValueId add_input(TensorType type);
  // Appends a node and infers its type. Throws Error(kInvalidArgument)
  // "[op] ..." for an unknown input id, a wrong number of inputs, a missing or
  // ill-typed attribute, or shapes/dtypes the op does not accept.
  ValueId add_node(OpKind op, std::vector<ValueId> inputs, Attributes attrs = {});
  // Outputs are returned in marking order; a value may be marked twice.
  void mark_output(ValueId id);

  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(ValueId id) const;
  const TensorType& type(ValueId id) const { return node(id).type; }
  const std::vector<ValueId>& inputs() const { return inputs_; }  // Input nodes, in order
  const std::vector<ValueId>& outputs() const { return outputs_; }
  std::int32_t size() const { return static_cast<std::int32_t>(nodes_.size()); }

 private:
  std::vector<Node> nodes_;
  std::vector<ValueId> inputs_;
  std::vector<ValueId> outputs_;
};

// One op applied to fresh inputs of the given types, its result the only
// output: the graph strict mode compiles per op. Rank-0 types are zero-dim
// tensors, not wrapped numbers; build Constant operands with Graph directly.
Graph single_op(OpKind op, std::vector<TensorType> inputs, Attributes attrs = {});

// How an operand takes part in type promotion: Constant nodes are wrapped
// numbers, other rank-0 values zero-dim tensors.
Operand promotion_operand(const Graph& graph, ValueId id);

// Whether elementwise node `node` converts its operand `k` to its 16-bit
// common dtype before computing in float, as ATen's CPU kernels do: a
// float16/bfloat16 op rounds every operand of another dtype (an int32
// tensor, a float32 zero-dim tensor) to the 16-bit type first, and Python
// numbers too (half(0.5) + 2049 is 2048 on the CPU), except where ATen's
// kernel reads the original scalar in float: the single-value second
// operand of mul and div, and lerp's scalar weight. Conditions (where,
// masked_fill's mask) are never converted.
bool rounds_operand_to_16_bits(const Graph& graph, const Node& node, std::size_t k);

// Whether node's run-time scalar (alpha, value, ...) is rounded to the
// 16-bit common dtype first: add/sub's alpha is, addcmul/addcdiv's value is
// not (ATen reads it in float).
bool rounds_runtime_scalar_to_16_bits(const Node& node);

}  // namespace vtpu::ir
