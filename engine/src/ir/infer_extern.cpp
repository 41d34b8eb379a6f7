// Type inference of the extern (library) ops: matmul family, convolution and
// scaled dot-product attention. Operands must share a dtype: the libraries
// behind these do not promote.
#include "infer.h"

namespace vtpu::ir::detail {
namespace {

std::string dname(DType t) { return std::string(name(t)); }

void same_dtypes(OpKind op, const Graph& g, const std::vector<ValueId>& in) {
  for (ValueId v : in) {
    if (g.type(v).dtype != g.type(in[0]).dtype) {
      fail(op, "expected operands of the same dtype, got " + dname(g.type(in[0]).dtype) +
                   " and " + dname(g.type(v).dtype));
    }
  }
}

[[noreturn]] void inner_mismatch(OpKind op, const TensorType& a, const TensorType& b) {
  fail(op, "inner dimensions differ: got " + shape_string(a.sizes) + " and " +
               shape_string(b.sizes));
}

std::vector<std::int64_t> batch_of(const TensorType& t) {
  return t.rank() > 2 ? std::vector<std::int64_t>(t.sizes.begin(), t.sizes.end() - 2)
                      : std::vector<std::int64_t>{};
}

std::vector<std::int64_t> per_dim(OpKind op, const Attributes& attrs, const char* key,
                                  std::size_t spatial, std::int64_t fallback) {
  std::vector<std::int64_t> v = attrs.get_ints(key, {});
  if (v.empty()) v.assign(spatial, fallback);
  if (v.size() == 1) v.assign(spatial, v[0]);
  if (v.size() != spatial) {
    fail(op, std::string(key) + " has " + std::to_string(v.size()) + " values for " +
                 std::to_string(spatial) + " spatial dims");
  }
  return v;
}

Inferred conv(const Graph& g, const std::vector<ValueId>& in, const Attributes& attrs) {
  const OpKind op = OpKind::Conv;
  check_optional_count(op, in, 2, attrs, {"has_bias"});
  const TensorType& x = g.type(in[0]);
  const TensorType& w = g.type(in[1]);
  if (w.rank() < 3) fail(op, "weight must have at least 3 dims, got " + shape_string(w.sizes));
  const std::size_t spatial = static_cast<std::size_t>(w.rank() - 2);
  if (x.rank() != w.rank()) {
    fail(op, "input shape " + shape_string(x.sizes) + " and weight shape " +
                 shape_string(w.sizes) + " differ in rank");
  }
  const auto stride = per_dim(op, attrs, "stride", spatial, 1);
  const auto padding = per_dim(op, attrs, "padding", spatial, 0);
  const auto dilation = per_dim(op, attrs, "dilation", spatial, 1);
  const auto out_pad = per_dim(op, attrs, "output_padding", spatial, 0);
  const std::int64_t groups = attrs.get_int("groups", 1);
  const bool transposed = attrs.get_bool("transposed", false);
  if (groups < 1) fail(op, "groups must be positive, got " + std::to_string(groups));
  const std::int64_t cin = x.sizes[1];
  std::int64_t cout;
  if (!transposed) {
    if (cin != w.sizes[1] * groups || w.sizes[0] % groups != 0) {
      fail(op, "input shape " + shape_string(x.sizes) + " does not match weight shape " +
                   shape_string(w.sizes) + " with groups=" + std::to_string(groups));
    }
    cout = w.sizes[0];
  } else {
    if (cin != w.sizes[0] || w.sizes[0] % groups != 0) {
      fail(op, "input shape " + shape_string(x.sizes) + " does not match transposed weight shape " +
                   shape_string(w.sizes) + " with groups=" + std::to_string(groups));
    }
    cout = w.sizes[1] * groups;
  }
  std::vector<std::int64_t> sizes = {x.sizes[0], cout};
  for (std::size_t i = 0; i < spatial; ++i) {
    const std::int64_t n = x.sizes[i + 2], k = w.sizes[i + 2];
    const std::int64_t o =
        transposed ? (n - 1) * stride[i] - 2 * padding[i] + dilation[i] * (k - 1) + out_pad[i] + 1
                   : (n + 2 * padding[i] - dilation[i] * (k - 1) - 1) / stride[i] + 1;
    if (stride[i] < 1 || o < 1) {
      fail(op, "input shape " + shape_string(x.sizes) + " and weight shape " +
                   shape_string(w.sizes) + " give a non-positive output size");
    }
    sizes.push_back(o);
  }
  if (in.size() == 3 && g.type(in[2]).sizes != std::vector<std::int64_t>{cout}) {
    fail(op, "bias shape " + shape_string(g.type(in[2]).sizes) + " must be (" +
                 std::to_string(cout) + ")");
  }
  same_dtypes(op, g, in);
  return {TensorType::contiguous(x.dtype, std::move(sizes)), x.dtype};
}

Inferred sdpa(const Graph& g, const std::vector<ValueId>& in, const Attributes& attrs) {
  const OpKind op = OpKind::Sdpa;
  check_optional_count(op, in, 3, attrs, {"has_mask"});
  const TensorType& q = g.type(in[0]);
  const TensorType& k = g.type(in[1]);
  const TensorType& v = g.type(in[2]);
  if (q.rank() < 2 || k.rank() < 2 || v.rank() < 2) fail(op, "q, k and v need at least 2 dims");
  if (q.sizes.back() != k.sizes.back() || k.sizes[k.sizes.size() - 2] != v.sizes[v.sizes.size() - 2]) {
    fail(op, "q " + shape_string(q.sizes) + ", k " + shape_string(k.sizes) + " and v " +
                 shape_string(v.sizes) + " do not fit together");
  }
  same_dtypes(op, g, {in[0], in[1], in[2]});
  const TensorType qb = TensorType::contiguous(q.dtype, batch_of(q));
  const TensorType kb = TensorType::contiguous(q.dtype, batch_of(k));
  const TensorType vb = TensorType::contiguous(q.dtype, batch_of(v));
  std::vector<std::int64_t> sizes = broadcast_all(op, {&qb, &kb, &vb});
  const std::int64_t L = q.sizes[q.sizes.size() - 2], S = k.sizes[k.sizes.size() - 2];
  if (in.size() == 4) {
    const TensorType& m = g.type(in[3]);
    if (m.dtype != DType::kBool && m.dtype != q.dtype) {
      fail(op, "mask must be bool or " + dname(q.dtype) + ", got " + dname(m.dtype));
    }
    std::vector<std::int64_t> scores = sizes;
    scores.push_back(L);
    scores.push_back(S);
    const TensorType st = TensorType::contiguous(q.dtype, scores);
    if (broadcast_all(op, {&st, &m}) != scores) {
      fail(op, "mask shape " + shape_string(m.sizes) + " does not broadcast to " +
                   shape_string(scores));
    }
  }
  attrs.get_double("scale", 0.0);
  sizes.push_back(L);
  sizes.push_back(v.sizes.back());
  return {TensorType::contiguous(q.dtype, std::move(sizes)), q.dtype};
}

}  // namespace

Inferred infer_extern(const Graph& g, OpKind op, const std::vector<ValueId>& in,
                      const Attributes& attrs) {
  if (op == OpKind::Conv) return conv(g, in, attrs);
  if (op == OpKind::Sdpa) return sdpa(g, in, attrs);
  same_dtypes(op, g, in);
  if (op == OpKind::Matmul) {
    const TensorType& a = g.type(in[0]);
    const TensorType& b = g.type(in[1]);
    if (a.rank() == 0 || b.rank() == 0) fail(op, "operands must have at least 1 dim");
    const std::int64_t ka = a.sizes.back();
    const std::int64_t kb = b.rank() == 1 ? b.sizes[0] : b.sizes[b.sizes.size() - 2];
    if (ka != kb) inner_mismatch(op, a, b);
    const TensorType ab = TensorType::contiguous(a.dtype, batch_of(a));
    const TensorType bb = TensorType::contiguous(a.dtype, batch_of(b));
    std::vector<std::int64_t> sizes = broadcast_all(op, {&ab, &bb});
    if (a.rank() >= 2) sizes.push_back(a.sizes[a.sizes.size() - 2]);
    if (b.rank() >= 2) sizes.push_back(b.sizes.back());
    return {TensorType::contiguous(a.dtype, std::move(sizes)), a.dtype};
  }
  if (op == OpKind::Bmm) {
    const TensorType& a = g.type(in[0]);
    const TensorType& b = g.type(in[1]);
    if (a.rank() != 3 || b.rank() != 3) {
      fail(op, "operands must have 3 dims, got " + shape_string(a.sizes) + " and " +
                   shape_string(b.sizes));
    }
    if (a.sizes[0] != b.sizes[0]) {
      fail(op, "batch sizes differ: got " + shape_string(a.sizes) + " and " + shape_string(b.sizes));
    }
    if (a.sizes[2] != b.sizes[1]) inner_mismatch(op, a, b);
    return {TensorType::contiguous(a.dtype, {a.sizes[0], a.sizes[1], b.sizes[2]}), a.dtype};
  }
  if (op == OpKind::Addmm) {
    const TensorType& bias = g.type(in[0]);
    const TensorType& a = g.type(in[1]);
    const TensorType& b = g.type(in[2]);
    if (a.rank() != 2 || b.rank() != 2) {
      fail(op, "operands must have 2 dims, got " + shape_string(a.sizes) + " and " +
                   shape_string(b.sizes));
    }
    if (a.sizes[1] != b.sizes[0]) inner_mismatch(op, a, b);
    const std::vector<std::int64_t> mn = {a.sizes[0], b.sizes[1]};
    const TensorType out = TensorType::contiguous(a.dtype, mn);
    if (broadcast_all(op, {&out, &bias}) != mn) {
      fail(op, "bias shape " + shape_string(bias.sizes) + " does not broadcast to " +
                   shape_string(mn));
    }
    return {out, a.dtype};
  }
  fail(op, "not an extern op");
}

}  // namespace vtpu::ir::detail
