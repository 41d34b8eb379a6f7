// Reference semantics of indexing ops and of the extern ops (naive loops that
// stand in for the GEMM/conv/attention libraries in the engine's tests).
#include <cmath>
#include <limits>
#include <map>

#include "interp.h"

namespace vtpu::ir::detail {
namespace {

std::int64_t checked_index(OpKind op, std::int64_t v, std::int64_t size) {
  if (v < 0 || v >= size) {
    interp_fail(op, "index " + std::to_string(v) + " is out of bounds for size " + std::to_string(size));
  }
  return v;
}

std::int64_t wrap(std::int64_t d, std::int64_t rank) { return d < 0 ? d + (rank == 0 ? 1 : rank) : d; }

// Offset of an index tuple in a same-rank tensor.
std::int64_t offset_of(const TensorType& t, const std::vector<std::int64_t>& idx) {
  std::int64_t off = 0;
  for (std::size_t i = 0; i < idx.size(); ++i) off += idx[i] * t.strides[i];
  return off;
}

// Copies element `src` of `from` to element `dst` of `to`, same dtype.
void copy_elem(const Buffer& from, std::int64_t src, Buffer& to, std::int64_t dst) {
  if (is_floating(to.type.dtype)) store_double(to, dst, load_double(from, src));
  else store_int(to, dst, load_int(from, src));
}

// Accumulates in double (int64 for integer dtypes) and rounds once at the
// end: an order-independent reference for scatter-style ops.
struct Accumulator {
  Buffer& out;
  std::vector<double> f;
  std::vector<std::int64_t> i;
  explicit Accumulator(Buffer& o, const Buffer& init) : out(o) {
    const auto n = static_cast<std::size_t>(o.type.numel());
    f.resize(n);
    i.resize(n);
    for (std::size_t k = 0; k < n; ++k) {
      const std::int64_t off = broadcast_offset(init.type, unravel(static_cast<std::int64_t>(k), init.type.sizes));
      f[k] = load_double(init, off);
      i[k] = load_int(init, off);
    }
  }
  void add(std::int64_t linear, const Buffer& src, std::int64_t off, double scale) {
    const auto k = static_cast<std::size_t>(linear);
    f[k] += scale * load_double(src, off);
    i[k] = static_cast<std::int64_t>(static_cast<std::uint64_t>(i[k]) +
                                     static_cast<std::uint64_t>(static_cast<std::int64_t>(scale) * load_int(src, off)));
  }
  void finish() {
    for (std::size_t k = 0; k < f.size(); ++k) {
      if (is_floating(out.type.dtype)) store_double(out, static_cast<std::int64_t>(k), f[k]);
      else store_int(out, static_cast<std::int64_t>(k), i[k]);
    }
  }
};

std::int64_t linear_of(const std::vector<std::int64_t>& idx, const std::vector<std::int64_t>& sizes) {
  std::int64_t l = 0;
  for (std::size_t i = 0; i < idx.size(); ++i) l = l * sizes[i] + idx[i];
  return l;
}

// A matmul operand viewed as a batch of matrices: 1-D operands become a
// row (left) or column (right) vector, as torch.matmul does.
struct MatView {
  const Buffer& b;
  bool vec;
  std::int64_t rows_stride, cols_stride;
  std::vector<std::int64_t> batch_sizes, batch_strides;
  MatView(const Buffer& buf, bool left) : b(buf), vec(buf.type.rank() == 1) {
    const auto& s = buf.type.strides;
    const auto r = buf.type.sizes.size();
    if (vec) {
      rows_stride = left ? 0 : s[0];
      cols_stride = left ? s[0] : 0;
    } else {
      rows_stride = s[r - 2];
      cols_stride = s[r - 1];
      batch_sizes.assign(buf.type.sizes.begin(), buf.type.sizes.end() - 2);
      batch_strides.assign(s.begin(), s.end() - 2);
    }
  }
  std::int64_t at(const std::vector<std::int64_t>& batch, std::int64_t i, std::int64_t j) const {
    std::int64_t off = i * rows_stride + j * cols_stride;
    const std::size_t skip = batch.size() - batch_sizes.size();
    for (std::size_t d = 0; d < batch_sizes.size(); ++d) {
      if (batch_sizes[d] != 1) off += batch[skip + d] * batch_strides[d];
    }
    return off;
  }
};

// out = alpha * (a @ b) [+ beta * bias], torch.matmul shapes.
Buffer matmul(const Node& node, const Buffer& a, const Buffer& b, const Buffer* bias,
              double alpha, double beta) {
  Buffer out = Buffer::zeros(node.type);
  const MatView A(a, true), B(b, false);
  const std::int64_t k_size = a.type.sizes.back();
  const bool fl = is_floating(node.type.dtype);
  std::size_t batch_rank = out.type.sizes.size() - (A.vec ? 0 : 1) - (B.vec ? 0 : 1);
  for (std::int64_t lin = 0; lin < out.type.numel(); ++lin) {
    const auto idx = unravel(lin, out.type.sizes);
    const std::vector<std::int64_t> batch(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(batch_rank));
    const std::int64_t i = A.vec ? 0 : idx[batch_rank];
    const std::int64_t j = B.vec ? 0 : idx.back();
    double f = 0;
    std::int64_t n = 0;
    for (std::int64_t k = 0; k < k_size; ++k) {
      const std::int64_t oa = A.at(batch, i, k), ob = B.at(batch, k, j);
      if (fl) f += load_double(a, oa) * load_double(b, ob);
      else n += load_int(a, oa) * load_int(b, ob);
    }
    if (fl) {
      f *= alpha;
      if (bias && beta != 0) f += beta * load_double(*bias, broadcast_offset(bias->type, idx));
      store_double(out, lin, f);
    } else {
      n *= static_cast<std::int64_t>(alpha);
      if (bias && beta != 0) n += static_cast<std::int64_t>(beta) * load_int(*bias, broadcast_offset(bias->type, idx));
      store_int(out, lin, n);
    }
  }
  return out;
}

Buffer sdpa(const Node& node, const std::vector<const Buffer*>& in) {
  Buffer out = Buffer::zeros(node.type);
  const Buffer &q = *in[0], &k = *in[1], &v = *in[2];
  const Buffer* mask = in.size() > 3 ? in[3] : nullptr;
  const std::int64_t E = q.type.sizes.back(), S = k.type.sizes[k.type.sizes.size() - 2];
  const std::int64_t Ev = v.type.sizes.back();
  const double scale = node.attrs.get_double("scale", 1.0 / std::sqrt(static_cast<double>(E)));
  const bool causal = node.attrs.get_bool("is_causal", false);
  const MatView Q(q, true), K(k, true), V(v, false);
  const std::size_t br = out.type.sizes.size() - 2;
  const std::vector<std::int64_t> rows(out.type.sizes.begin(), out.type.sizes.end() - 1);
  const TensorType row_type = TensorType::contiguous(q.type.dtype, rows);
  for (std::int64_t r = 0; r < row_type.numel(); ++r) {
    const auto ridx = unravel(r, rows);
    const std::vector<std::int64_t> batch(ridx.begin(), ridx.begin() + static_cast<std::ptrdiff_t>(br));
    const std::int64_t i = ridx.back();
    std::vector<double> s(static_cast<std::size_t>(S));
    double m = -std::numeric_limits<double>::infinity();
    for (std::int64_t j = 0; j < S; ++j) {
      double dot = 0;
      for (std::int64_t e = 0; e < E; ++e) dot += load_double(q, Q.at(batch, i, e)) * load_double(k, K.at(batch, j, e));
      double sc = dot * scale;
      if (causal && j > i) sc = -std::numeric_limits<double>::infinity();
      if (mask) {
        std::vector<std::int64_t> midx = batch;
        midx.push_back(i);
        midx.push_back(j);
        const std::int64_t mo = broadcast_offset(mask->type, midx);
        if (mask->type.dtype == DType::kBool) {
          if (!load_bool(*mask, mo)) sc = -std::numeric_limits<double>::infinity();
        } else {
          sc += load_double(*mask, mo);
        }
      }
      s[static_cast<std::size_t>(j)] = sc;
      m = std::max(m, sc);
    }
    double total = 0;
    for (double& e : s) total += (e = std::exp(e - m));
    for (std::int64_t c = 0; c < Ev; ++c) {
      double acc = 0;
      for (std::int64_t j = 0; j < S; ++j) acc += s[static_cast<std::size_t>(j)] * load_double(v, V.at(batch, j, c));
      store_double(out, r * Ev + c, acc / total);
    }
  }
  return out;
}

}  // namespace

Buffer eval_indexing(const Node& node, const std::vector<const Buffer*>& in) {
  if (node.op == OpKind::NllLoss || node.op == OpKind::NllLossTotalWeight || node.op == OpKind::NllLossBackward)
    return eval_loss(node, in);
  if (node.op == OpKind::MaxPool2d || node.op == OpKind::MaxPool2dIndices || node.op == OpKind::MaxPool2dBackward)
    return eval_pooling(node, in);
  const Buffer& x = *in[0];
  const Buffer& index = *in[1];
  Buffer out = Buffer::zeros(node.type);
  const Attributes& a = node.attrs;
  switch (node.op) {
    case OpKind::IndexSelect: {
      const std::int64_t dim = wrap(a.get_int("dim"), x.type.rank());
      const auto ix = to_int64s(index);
      for (std::int64_t lin = 0; lin < out.type.numel(); ++lin) {
        auto idx = unravel(lin, out.type.sizes);
        if (!idx.empty()) {
          auto& d = idx[static_cast<std::size_t>(dim)];
          d = checked_index(node.op, ix[static_cast<std::size_t>(d)], x.type.sizes[static_cast<std::size_t>(dim)]);
        } else {
          checked_index(node.op, ix[0], 1);
        }
        copy_elem(x, offset_of(x.type, idx), out, lin);
      }
      return out;
    }
    case OpKind::Gather: {
      const std::int64_t dim = wrap(a.get_int("dim"), x.type.rank());
      for (std::int64_t lin = 0; lin < out.type.numel(); ++lin) {
        auto idx = unravel(lin, out.type.sizes);
        const std::int64_t v = load_int(index, offset_of(index.type, idx));
        if (!idx.empty()) {
          idx[static_cast<std::size_t>(dim)] = checked_index(node.op, v, x.type.sizes[static_cast<std::size_t>(dim)]);
        } else {
          checked_index(node.op, v, 1);
        }
        copy_elem(x, offset_of(x.type, idx), out, lin);
      }
      return out;
    }
    case OpKind::ScatterAdd: {
      const Buffer& src = *in[2];
      const std::int64_t dim = wrap(a.get_int("dim"), x.type.rank());
      Accumulator acc(out, x);
      for (std::int64_t lin = 0; lin < index.type.numel(); ++lin) {
        const auto idx = unravel(lin, index.type.sizes);
        auto dst = idx;
        const std::int64_t v = load_int(index, offset_of(index.type, idx));
        if (!dst.empty()) {
          dst[static_cast<std::size_t>(dim)] = checked_index(node.op, v, x.type.sizes[static_cast<std::size_t>(dim)]);
        } else {
          checked_index(node.op, v, 1);
        }
        acc.add(linear_of(dst, out.type.sizes), src, offset_of(src.type, idx), 1.0);
      }
      acc.finish();
      return out;
    }
    case OpKind::IndexAdd: {
      const Buffer& src = *in[2];
      const std::int64_t dim = wrap(a.get_int("dim"), x.type.rank());
      const double alpha = a.get_double("alpha", 1.0);
      const auto ix = to_int64s(index);
      Accumulator acc(out, x);
      for (std::int64_t lin = 0; lin < src.type.numel(); ++lin) {
        const auto idx = unravel(lin, src.type.sizes);
        auto dst = idx;
        if (!dst.empty()) {
          auto& d = dst[static_cast<std::size_t>(dim)];
          d = checked_index(node.op, ix[static_cast<std::size_t>(d)], x.type.sizes[static_cast<std::size_t>(dim)]);
        } else {
          checked_index(node.op, ix[0], 1);
        }
        acc.add(linear_of(dst, out.type.sizes), src, offset_of(src.type, idx), alpha);
      }
      acc.finish();
      return out;
    }
    case OpKind::Embedding: {
      const std::int64_t rows = x.type.sizes[0], D = x.type.sizes[1];
      const auto ix = to_int64s(index);
      for (std::size_t r = 0; r < ix.size(); ++r) {
        const std::int64_t row = checked_index(node.op, ix[r], rows);
        for (std::int64_t c = 0; c < D; ++c) {
          copy_elem(x, offset_of(x.type, {row, c}), out, static_cast<std::int64_t>(r) * D + c);
        }
      }
      return out;
    }
    case OpKind::EmbeddingBackward: {
      const std::int64_t rows = out.type.sizes[0], D = out.type.sizes[1];
      const std::int64_t padding = a.get_int("padding_idx", -1);
      const bool by_freq = a.get_bool("scale_grad_by_freq", false);
      const auto ix = to_int64s(index);
      std::map<std::int64_t, std::int64_t> count;
      for (std::int64_t v : ix) ++count[v];
      const Buffer zero = Buffer::zeros(out.type);
      Accumulator acc(out, zero);
      for (std::size_t r = 0; r < ix.size(); ++r) {
        const std::int64_t row = checked_index(node.op, ix[r], rows);
        if (row == padding) continue;
        const double scale = by_freq ? 1.0 / static_cast<double>(count[row]) : 1.0;
        for (std::int64_t c = 0; c < D; ++c) {
          const auto gidx = unravel(static_cast<std::int64_t>(r) * D + c, x.type.sizes);
          acc.add(row * D + c, x, offset_of(x.type, gidx), scale);
        }
      }
      acc.finish();
      return out;
    }
    default:
      interp_fail(node.op, "not an indexing op");
  }
}

Buffer eval_extern(const Node& node, const std::vector<const Buffer*>& in) {
  const Attributes& a = node.attrs;
  switch (node.op) {
    case OpKind::Matmul:
    case OpKind::Bmm:
      return matmul(node, *in[0], *in[1], nullptr, 1.0, 0.0);
    case OpKind::Addmm:
      return matmul(node, *in[1], *in[2], in[0], a.get_double("alpha", 1.0), a.get_double("beta", 1.0));
    case OpKind::Sdpa:
      return sdpa(node, in);
    case OpKind::Conv:
      return eval_conv(node, in);
    default:
      interp_fail(node.op, "not implemented by the reference interpreter");
  }
}

}  // namespace vtpu::ir::detail
