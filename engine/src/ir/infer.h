// Type inference for Graph::add_node, split by op family. Internal.
#pragma once

#include <string>
#include <vector>

#include "vtpu/ir/graph.h"

namespace vtpu::ir::detail {

struct Inferred {
  TensorType type;
  DType common;
};

// Caller has checked input ids and arity.
Inferred infer_node(const Graph& g, OpKind op, const std::vector<ValueId>& in,
                    const Attributes& attrs);

Inferred infer_source(const Graph& g, OpKind op, const std::vector<ValueId>& in,
                      const Attributes& attrs);
Inferred infer_elementwise(const Graph& g, OpKind op, const std::vector<ValueId>& in,
                           const Attributes& attrs);
Inferred infer_reduction(const Graph& g, OpKind op, const std::vector<ValueId>& in,
                         const Attributes& attrs);
Inferred infer_normalization(const Graph& g, OpKind op, const std::vector<ValueId>& in,
                             const Attributes& attrs);
Inferred infer_indexing(const Graph& g, OpKind op, const std::vector<ValueId>& in,
                        const Attributes& attrs);
// nll_loss and its backward (infer_loss.cpp); reached through infer_indexing.
Inferred infer_loss(const Graph& g, OpKind op, const std::vector<ValueId>& in, const Attributes& attrs);
// max_pool2d, its indices and its backward (infer_pooling.cpp); reached through infer_indexing.
Inferred infer_pooling(const Graph& g, OpKind op, const std::vector<ValueId>& in, const Attributes& attrs);
Inferred infer_extern(const Graph& g, OpKind op, const std::vector<ValueId>& in,
                      const Attributes& attrs);

// Throws Error(kInvalidArgument) "[op] message".
[[noreturn]] void fail(OpKind op, const std::string& message);

// Wraps a possibly negative dim into [0, rank); a rank-0 tensor accepts 0 and
// -1 like torch does.
std::int64_t wrap_dim(OpKind op, std::int64_t dim, std::int64_t rank);

// Broadcast several shapes; the error echoes all of them.
std::vector<std::int64_t> broadcast_all(OpKind op,
                                        const std::vector<const TensorType*>& types);

// Checks that the optional operands flagged by `flags` (bool attributes)
// account for the inputs beyond `fixed`.
void check_optional_count(OpKind op, const std::vector<ValueId>& in, std::size_t fixed,
                          const Attributes& attrs, std::initializer_list<const char*> flags);

}  // namespace vtpu::ir::detail
