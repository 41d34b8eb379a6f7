// Dispatch of type inference by category, and the helpers every family uses.
#include "infer.h"

#include "vtpu/runtime/error.h"

namespace vtpu::ir::detail {

void fail(OpKind op, const std::string& message) {
  throw runtime::Error(runtime::ErrorKind::kInvalidArgument,
                       "[" + std::string(name(op)) + "] " + message);
}

std::int64_t wrap_dim(OpKind op, std::int64_t dim, std::int64_t rank) {
  const std::int64_t r = rank == 0 ? 1 : rank;
  if (dim < -r || dim >= r) {
    fail(op, "dim " + std::to_string(dim) + " is out of range for a tensor of rank " +
                 std::to_string(rank));
  }
  return dim < 0 ? dim + r : dim;
}

std::vector<std::int64_t> broadcast_all(OpKind op,
                                        const std::vector<const TensorType*>& types) {
  std::vector<std::int64_t> out;
  bool ok = true;
  for (const TensorType* t : types) {
    auto b = broadcast_shapes(out, t->sizes);
    if (!b) {
      ok = false;
      break;
    }
    out = std::move(*b);
  }
  if (!ok) {
    std::string shapes;
    for (std::size_t i = 0; i < types.size(); ++i) {
      if (i) shapes += i + 1 == types.size() ? " and " : ", ";
      shapes += shape_string(types[i]->sizes);
    }
    fail(op, "shapes " + shapes + " cannot be broadcast");
  }
  return out;
}

void check_optional_count(OpKind op, const std::vector<ValueId>& in, std::size_t fixed,
                          const Attributes& attrs, std::initializer_list<const char*> flags) {
  std::size_t expected = fixed;
  std::string names;
  for (const char* f : flags) {
    if (attrs.get_bool(f, false)) ++expected;
    names += names.empty() ? f : std::string(", ") + f;
  }
  if (in.size() != expected) {
    fail(op, "got " + std::to_string(in.size()) + " inputs but the flags (" + names +
                 ") call for " + std::to_string(expected));
  }
}

Inferred infer_node(const Graph& g, OpKind op, const std::vector<ValueId>& in,
                    const Attributes& attrs) {
  switch (category(op)) {
    case OpCategory::kSource: return infer_source(g, op, in, attrs);
    case OpCategory::kUnary:
    case OpCategory::kBinary:
    case OpCategory::kTernary: return infer_elementwise(g, op, in, attrs);
    case OpCategory::kReduction: return infer_reduction(g, op, in, attrs);
    case OpCategory::kNormalization: return infer_normalization(g, op, in, attrs);
    case OpCategory::kIndexing: return infer_indexing(g, op, in, attrs);
    case OpCategory::kExtern: return infer_extern(g, op, in, attrs);
  }
  fail(op, "unknown category");
}

}  // namespace vtpu::ir::detail
