// Type inference of the data-dependent addressing ops. Index values are only
// known at run time; here only shapes and index dtypes are checked.
#include <algorithm>

#include "infer.h"

namespace vtpu::ir::detail {
namespace {

std::string dname(DType t) { return std::string(name(t)); }

void require_index(OpKind op, const TensorType& t, bool int64_only) {
  const bool ok = t.dtype == DType::kInt64 || (!int64_only && t.dtype == DType::kInt32);
  if (!ok) {
    fail(op, std::string("index must be ") + (int64_only ? "int64" : "int32 or int64") +
                 ", got " + dname(t.dtype));
  }
}

void require_vector(OpKind op, const TensorType& t) {
  if (t.rank() > 1) fail(op, "index must have at most 1 dim, got shape " + shape_string(t.sizes));
}

void require_same_dtype(OpKind op, const TensorType& a, const TensorType& b) {
  if (a.dtype != b.dtype) {
    fail(op, "expected the same dtype, got " + dname(a.dtype) + " and " + dname(b.dtype));
  }
}

// The size of dim d, treating a rank-0 tensor as having one element.
std::int64_t size_at(const TensorType& t, std::int64_t d) {
  return t.rank() == 0 ? 1 : t.sizes[static_cast<std::size_t>(d)];
}

// gather/scatter: index has the rank of `ref`, and no larger size in any dim
// (except `dim` against `ref_other_than_dim` == false).
void check_index_fits(OpKind op, const TensorType& index, const TensorType& ref,
                      std::int64_t dim, bool skip_dim, const char* ref_name) {
  if (index.rank() != ref.rank() && !(index.rank() <= 1 && ref.rank() <= 1)) {
    fail(op, std::string("index shape ") + shape_string(index.sizes) + " and " + ref_name +
                 " shape " + shape_string(ref.sizes) + " differ in rank");
  }
  for (std::int64_t d = 0; d < index.rank(); ++d) {
    if (skip_dim && d == dim) continue;
    if (size_at(index, d) > size_at(ref, d)) {
      fail(op, std::string("index shape ") + shape_string(index.sizes) + " is larger than " +
                   ref_name + " shape " + shape_string(ref.sizes) + " in dim " +
                   std::to_string(d));
    }
  }
}

}  // namespace

Inferred infer_indexing(const Graph& g, OpKind op, const std::vector<ValueId>& in,
                        const Attributes& attrs) {
  if (op == OpKind::NllLoss || op == OpKind::NllLossTotalWeight || op == OpKind::NllLossBackward)
    return infer_loss(g, op, in, attrs);
  if (op == OpKind::MaxPool2d || op == OpKind::MaxPool2dIndices || op == OpKind::MaxPool2dBackward)
    return infer_pooling(g, op, in, attrs);
  const TensorType& a = g.type(in[0]);
  const TensorType& b = g.type(in[1]);
  switch (op) {
    case OpKind::IndexSelect: {
      const std::int64_t dim = wrap_dim(op, attrs.get_int("dim"), a.rank());
      require_index(op, b, false);
      require_vector(op, b);
      std::vector<std::int64_t> sizes = a.sizes;
      if (!sizes.empty()) sizes[static_cast<std::size_t>(dim)] = b.numel();
      else if (b.numel() != 1) fail(op, "index of a 0-dim input must have one element");
      return {TensorType::contiguous(a.dtype, std::move(sizes)), a.dtype};
    }
    case OpKind::Gather: {
      const std::int64_t dim = wrap_dim(op, attrs.get_int("dim"), a.rank());
      require_index(op, b, true);
      check_index_fits(op, b, a, dim, true, "input");
      return {TensorType::contiguous(a.dtype, b.sizes), a.dtype};
    }
    case OpKind::ScatterAdd: {
      const TensorType& src = g.type(in[2]);
      const std::int64_t dim = wrap_dim(op, attrs.get_int("dim"), a.rank());
      require_index(op, b, true);
      require_same_dtype(op, a, src);
      check_index_fits(op, b, src, dim, false, "src");
      check_index_fits(op, b, a, dim, true, "self");
      return {TensorType::contiguous(a.dtype, a.sizes), a.dtype};
    }
    case OpKind::IndexAdd: {
      const TensorType& src = g.type(in[2]);
      const std::int64_t dim = wrap_dim(op, attrs.get_int("dim"), a.rank());
      require_index(op, b, false);
      require_vector(op, b);
      require_same_dtype(op, a, src);
      std::vector<std::int64_t> expected = a.sizes;
      if (!expected.empty()) expected[static_cast<std::size_t>(dim)] = b.numel();
      if (src.sizes != expected && !(a.rank() == 0 && src.numel() == 1 && b.numel() == 1)) {
        fail(op, "source shape " + shape_string(src.sizes) + " must be " +
                     shape_string(expected) + " for self " + shape_string(a.sizes) +
                     " and an index of " + std::to_string(b.numel()) + " elements");
      }
      if (!is_floating(a.dtype) && attrs.find("alpha") &&
          std::holds_alternative<double>(*attrs.find("alpha"))) {
        fail(op, "alpha must not be a floating point number for " + dname(a.dtype) + " inputs");
      }
      return {TensorType::contiguous(a.dtype, a.sizes), a.dtype};
    }
    case OpKind::Embedding: {
      if (a.rank() != 2) fail(op, "weight must have 2 dims, got shape " + shape_string(a.sizes));
      require_index(op, b, false);
      std::vector<std::int64_t> sizes = b.sizes;
      sizes.push_back(a.sizes[1]);
      return {TensorType::contiguous(a.dtype, std::move(sizes)), a.dtype};
    }
    case OpKind::EmbeddingBackward: {
      require_index(op, b, false);
      const std::int64_t n = attrs.get_int("num_weights");
      if (n < 0) fail(op, "num_weights must be >= 0, got " + std::to_string(n));
      if (a.rank() != b.rank() + 1 ||
          !std::equal(b.sizes.begin(), b.sizes.end(), a.sizes.begin())) {
        fail(op, "grad shape " + shape_string(a.sizes) + " must be the indices shape " +
                     shape_string(b.sizes) + " plus the embedding dim");
      }
      if (!is_floating(a.dtype)) fail(op, "expected a floating point grad, got " + dname(a.dtype));
      return {TensorType::contiguous(a.dtype, {n, a.sizes.back()}), a.dtype};
    }
    default:
      fail(op, "not an indexing op");
  }
}

}  // namespace vtpu::ir::detail
