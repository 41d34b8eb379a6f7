// Type inference of reductions and row-wise normalizations.
#include <algorithm>

#include "infer.h"

namespace vtpu::ir::detail {
namespace {

std::string dname(DType t) { return std::string(name(t)); }

void require_floating(OpKind op, DType t, const char* what = "input") {
  if (!is_floating(t)) {
    fail(op, std::string("expected a floating point ") + what + ", got " + dname(t));
  }
}

// The trailing `normalized_shape` dims of x, checked; returns how many rows
// (the product of the leading dims) there are.
std::int64_t check_normalized(OpKind op, const TensorType& x,
                              const std::vector<std::int64_t>& ns) {
  if (ns.empty()) fail(op, "normalized_shape must not be empty");
  const bool ok = ns.size() <= x.sizes.size() &&
                  std::equal(ns.begin(), ns.end(), x.sizes.end() - static_cast<std::ptrdiff_t>(ns.size()));
  if (!ok) {
    fail(op, "input shape " + shape_string(x.sizes) + " does not end with normalized_shape " +
                 shape_string(ns));
  }
  std::int64_t rows = 1;
  for (std::size_t i = 0; i + ns.size() < x.sizes.size(); ++i) rows *= x.sizes[i];
  return rows;
}

void check_param(OpKind op, const Graph& g, ValueId id, const std::vector<std::int64_t>& ns,
                 const char* what) {
  if (g.type(id).sizes != ns) {
    fail(op, std::string(what) + " shape " + shape_string(g.type(id).sizes) +
                 " differs from normalized_shape " + shape_string(ns));
  }
}

void check_same_shape(OpKind op, const TensorType& a, const TensorType& b, const char* an,
                      const char* bn) {
  if (a.sizes != b.sizes) {
    fail(op, std::string(an) + " shape " + shape_string(a.sizes) + " and " + bn + " shape " +
                 shape_string(b.sizes) + " differ");
  }
}

}  // namespace

Inferred infer_reduction(const Graph& g, OpKind op, const std::vector<ValueId>& in,
                         const Attributes& attrs) {
  const TensorType& x = g.type(in[0]);
  const std::int64_t rank = x.rank();
  std::vector<std::int64_t> dims = attrs.get_ints("dims", {});
  const bool keepdim = attrs.get_bool("keepdim", false);
  if ((op == OpKind::Argmax || op == OpKind::Argmin) && dims.size() > 1) {
    fail(op, "reduces at most one dim, got " + std::to_string(dims.size()));
  }
  // Which dims reduce; an empty list reduces all of them (torch's dim=None/[]).
  std::vector<bool> reduced(static_cast<std::size_t>(rank), dims.empty());
  for (std::int64_t d : dims) {
    const std::int64_t w = wrap_dim(op, d, rank);
    if (rank == 0) continue;
    if (reduced[static_cast<std::size_t>(w)]) {
      fail(op, "dim " + std::to_string(w) + " appears multiple times in the list of dims");
    }
    reduced[static_cast<std::size_t>(w)] = true;
  }
  std::vector<std::int64_t> sizes;
  for (std::int64_t d = 0; d < rank; ++d) {
    const auto i = static_cast<std::size_t>(d);
    if (!reduced[i]) sizes.push_back(x.sizes[i]);
    else if (keepdim) sizes.push_back(1);
  }
  const bool needs_elements = op == OpKind::Amax || op == OpKind::Amin ||
                              op == OpKind::Argmax || op == OpKind::Argmin;
  if (needs_elements) {
    for (std::int64_t d = 0; d < rank; ++d) {
      const auto i = static_cast<std::size_t>(d);
      if (reduced[i] && x.sizes[i] == 0) {
        fail(op, "cannot reduce over zero-size dim " + std::to_string(d) + " of shape " +
                     shape_string(x.sizes));
      }
    }
  }

  const std::optional<DType> requested = attrs.get_dtype("dtype");
  DType out = x.dtype;
  DType common = x.dtype;
  switch (op) {
    case OpKind::Sum:
    case OpKind::Prod:
      // Integer and bool sums accumulate and return int64, like torch.
      out = requested.value_or(is_floating(x.dtype) ? x.dtype : DType::kInt64);
      common = out;
      break;
    case OpKind::Mean:
    case OpKind::Norm:
      out = requested.value_or(x.dtype);
      require_floating(op, out);
      common = out;
      break;
    case OpKind::Var:
    case OpKind::Std:
      require_floating(op, x.dtype);
      break;
    case OpKind::LogSumExp:
      out = is_floating(x.dtype) ? x.dtype : kDefaultFloat;
      common = out;
      break;
    case OpKind::Argmax:
    case OpKind::Argmin:
      out = DType::kInt64;
      break;
    default:  // Amax, Amin
      break;
  }
  return {TensorType::contiguous(out, std::move(sizes)), common};
}

Inferred infer_normalization(const Graph& g, OpKind op, const std::vector<ValueId>& in,
                             const Attributes& attrs) {
  const TensorType& x = g.type(in[0]);
  switch (op) {
    case OpKind::Softmax:
    case OpKind::LogSoftmax: {
      wrap_dim(op, attrs.get_int("dim"), x.rank());
      const DType out = attrs.get_dtype("dtype").value_or(x.dtype);
      require_floating(op, out);
      return {TensorType::contiguous(out, x.sizes), out};
    }
    case OpKind::SoftmaxBackward:
    case OpKind::LogSoftmaxBackward: {
      const TensorType& y = g.type(in[1]);
      check_same_shape(op, x, y, "grad", "output");
      wrap_dim(op, attrs.get_int("dim"), x.rank());
      require_floating(op, x.dtype, "grad");
      return {TensorType::contiguous(x.dtype, x.sizes), x.dtype};
    }
    case OpKind::LayerNorm:
    case OpKind::RmsNorm: {
      const bool ln = op == OpKind::LayerNorm;
      if (ln) check_optional_count(op, in, 1, attrs, {"has_weight", "has_bias"});
      else check_optional_count(op, in, 1, attrs, {"has_weight"});
      require_floating(op, x.dtype);
      const std::vector<std::int64_t> ns = attrs.get_ints("normalized_shape");
      check_normalized(op, x, ns);
      std::size_t next = 1;
      if (attrs.get_bool("has_weight", false)) check_param(op, g, in[next++], ns, "weight");
      if (ln && attrs.get_bool("has_bias", false)) check_param(op, g, in[next++], ns, "bias");
      attrs.get_double("eps", 0.0);  // type check only
      return {TensorType::contiguous(x.dtype, x.sizes), x.dtype};
    }
    case OpKind::LayerNormBackward:
    case OpKind::RmsNormBackward: {
      // (grad, x, [mean,] rstd, weight?): the statistics hold one value per
      // row, in any shape (ATen keeps the normalized dims as 1s).
      const bool ln = op == OpKind::LayerNormBackward;
      const std::size_t nstats = ln ? 2 : 1;
      check_optional_count(op, in, 2 + nstats, attrs, {"has_weight"});
      const TensorType& xin = g.type(in[1]);
      check_same_shape(op, x, xin, "grad", "input");
      require_floating(op, xin.dtype);
      const std::vector<std::int64_t> ns = attrs.get_ints("normalized_shape");
      const std::int64_t rows = check_normalized(op, xin, ns);
      for (std::size_t s = 0; s < nstats; ++s) {
        const TensorType& st = g.type(in[2 + s]);
        if (st.numel() != rows) {
          fail(op, "statistics shape " + shape_string(st.sizes) + " does not hold one value per row of " +
                       shape_string(xin.sizes));
        }
      }
      if (attrs.get_bool("has_weight", false)) check_param(op, g, in[2 + nstats], ns, "weight");
      return {TensorType::contiguous(xin.dtype, xin.sizes), xin.dtype};
    }
    default:
      fail(op, "not a normalization op");
  }
}

}  // namespace vtpu::ir::detail
