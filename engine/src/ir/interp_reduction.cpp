// Reference semantics of reductions and normalizations: each lane gathered
// into a vector and reduced in double (int64 for integer sums/products, with
// wrap), then rounded once to the output dtype.
#include <algorithm>
#include <cmath>
#include <limits>

#include "interp.h"

namespace vtpu::ir::detail {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<bool> reduced_mask(const Node& n, std::int64_t rank) {
  const std::vector<std::int64_t> dims = n.attrs.get_ints("dims", {});
  std::vector<bool> mask(static_cast<std::size_t>(rank), dims.empty());
  for (std::int64_t d : dims) {
    if (rank > 0) mask[static_cast<std::size_t>(d < 0 ? d + rank : d)] = true;
  }
  return mask;
}

std::vector<bool> one_dim(std::int64_t dim, std::int64_t rank) {
  std::vector<bool> mask(static_cast<std::size_t>(rank), false);
  if (rank > 0) mask[static_cast<std::size_t>(dim < 0 ? dim + rank : dim)] = true;
  return mask;
}

std::vector<bool> trailing(std::size_t k, std::int64_t rank) {
  std::vector<bool> mask(static_cast<std::size_t>(rank), false);
  for (std::size_t i = 0; i < k; ++i) mask[mask.size() - 1 - i] = true;
  return mask;
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

// `single`: the op computes in float (float32 and 16-bit inputs), where ATen's
// sum of |x|^p overflows past FLT_MAX (the double sum here does not).
double float_reduce(OpKind op, const Attributes& a, const std::vector<double>& v, bool single) {
  const double n = static_cast<double>(v.size());
  switch (op) {
    case OpKind::Sum: { double s = 0; for (double x : v) s += x; return s; }
    case OpKind::Prod: { double p = 1; for (double x : v) p *= x; return p; }
    case OpKind::Mean: return mean_of(v);  // 0/0 = NaN for an empty lane, like torch
    case OpKind::Amax: {
      double m = -kInf;
      for (double x : v) if (std::isnan(x) || x > m) { m = x; if (std::isnan(x)) break; }
      return m;
    }
    case OpKind::Amin: {
      double m = kInf;
      for (double x : v) if (std::isnan(x) || x < m) { m = x; if (std::isnan(x)) break; }
      return m;
    }
    case OpKind::Var:
    case OpKind::Std: {
      const double mu = mean_of(v);
      double ss = 0;
      for (double x : v) ss += (x - mu) * (x - mu);
      const double var = ss / std::max(0.0, n - a.get_double("correction", 1.0));
      return op == OpKind::Std ? std::sqrt(var) : var;
    }
    case OpKind::LogSumExp: {
      // As ATen: the max propagates NaN (so any NaN gives NaN, even beside
      // an inf); all -inf (or empty) -> -inf; any +inf -> +inf.
      double m = -kInf;
      for (double x : v) m = std::isnan(x) || std::isnan(m) ? std::nan("") : std::max(m, x);
      if (std::isinf(m)) return m;
      double s = 0;
      for (double x : v) s += std::exp(x - m);
      return m + std::log(s);
    }
    case OpKind::Norm: {
      const double p = a.get_double("p", 2.0);
      if (std::isinf(p)) {
        double m = p > 0 ? 0.0 : kInf;
        // NaN-propagating, like ATen's max/min of |x|.
        for (double x : v) {
          if (std::isnan(x)) return x;
          m = p > 0 ? std::max(m, std::fabs(x)) : std::min(m, std::fabs(x));
        }
        return m;
      }
      double s = 0;
      for (double x : v) s += p == 0 ? (x != 0) : std::pow(std::fabs(x), p);
      if (single && std::isinf(static_cast<float>(s))) s = kInf;
      return (p == 0 || p == 1) ? s : std::pow(s, 1.0 / p);
    }
    default: return 0;
  }
}

// First index of the max (min); NaN counts as the extreme, like torch.
std::int64_t arg_extreme(bool is_max, const std::vector<double>& v) {
  std::int64_t best = 0;
  for (std::size_t i = 1; i < v.size(); ++i) {
    const double b = v[static_cast<std::size_t>(best)];
    if (std::isnan(b)) break;
    if (std::isnan(v[i]) || (is_max ? v[i] > b : v[i] < b)) best = static_cast<std::int64_t>(i);
  }
  return best;
}

double machine_eps(DType t) {
  switch (t) {
    case DType::kFloat16: return 0.0009765625;
    case DType::kBFloat16: return 0.0078125;
    case DType::kFloat64: return std::numeric_limits<double>::epsilon();
    default: return std::numeric_limits<float>::epsilon();
  }
}

std::vector<double> read_lane(const Buffer& b, const std::vector<std::int64_t>& offs) {
  std::vector<double> v;
  v.reserve(offs.size());
  for (std::int64_t o : offs) v.push_back(load_double(b, o));
  return v;
}

}  // namespace

Buffer eval_reduction(const Node& node, const std::vector<const Buffer*>& in) {
  const Buffer& x = *in[0];
  Buffer out = Buffer::zeros(node.type);
  const auto groups = lanes(x.type, reduced_mask(node, x.type.rank()));
  const bool fl = is_floating(node.common_dtype);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto o = static_cast<std::int64_t>(g);
    if (node.op == OpKind::Argmax || node.op == OpKind::Argmin) {
      store_int(out, o, arg_extreme(node.op == OpKind::Argmax, read_lane(x, groups[g])));
      continue;
    }
    if (!fl && (node.op == OpKind::Sum || node.op == OpKind::Prod || node.op == OpKind::Amax ||
                node.op == OpKind::Amin)) {
      std::int64_t acc = node.op == OpKind::Prod ? 1
                         : node.op == OpKind::Amax ? std::numeric_limits<std::int64_t>::min()
                         : node.op == OpKind::Amin ? std::numeric_limits<std::int64_t>::max()
                                                   : 0;
      for (std::int64_t off : groups[g]) {
        const std::int64_t v = load_int(x, off);
        const auto ua = static_cast<std::uint64_t>(acc), uv = static_cast<std::uint64_t>(v);
        if (node.op == OpKind::Sum) acc = static_cast<std::int64_t>(ua + uv);
        else if (node.op == OpKind::Prod) acc = static_cast<std::int64_t>(ua * uv);
        else if (node.op == OpKind::Amax) acc = std::max(acc, v);
        else acc = std::min(acc, v);
      }
      store_int(out, o, acc);
      continue;
    }
    std::vector<double> v = read_lane(x, groups[g]);
    for (double& e : v) e = round_to_compute(node.common_dtype, e);
    store_double(out, o, float_reduce(node.op, node.attrs, v, compute_type(node.common_dtype) != DType::kFloat64));
  }
  return out;
}

Buffer eval_normalization(const Node& node, const std::vector<const Buffer*>& in) {
  const Buffer& x = *in[0];
  Buffer out = Buffer::zeros(node.type);
  const std::int64_t rank = x.type.rank();
  const Attributes& a = node.attrs;
  switch (node.op) {
    case OpKind::Softmax:
    case OpKind::LogSoftmax: {
      const auto mask = one_dim(a.get_int("dim"), rank);
      const auto xl = lanes(x.type, mask), ol = lanes(out.type, mask);
      for (std::size_t g = 0; g < xl.size(); ++g) {
        std::vector<double> v = read_lane(x, xl[g]);
        for (double& e : v) e = round_to_compute(node.common_dtype, e);
        double m = -kInf, s = 0;
        for (double e : v) m = std::max(m, e);
        for (double e : v) s += std::exp(e - m);
        for (std::size_t k = 0; k < v.size(); ++k) {
          const double r = node.op == OpKind::Softmax ? std::exp(v[k] - m) / s : v[k] - m - std::log(s);
          store_double(out, ol[g][k], r);
        }
      }
      return out;
    }
    case OpKind::SoftmaxBackward:
    case OpKind::LogSoftmaxBackward: {
      const auto mask = one_dim(a.get_int("dim"), rank);
      const auto gl = lanes(x.type, mask), yl = lanes(in[1]->type, mask), ol = lanes(out.type, mask);
      for (std::size_t g = 0; g < gl.size(); ++g) {
        const auto gv = read_lane(x, gl[g]);
        const auto yv = read_lane(*in[1], yl[g]);
        double s = 0;
        for (std::size_t k = 0; k < gv.size(); ++k) {
          s += node.op == OpKind::SoftmaxBackward ? gv[k] * yv[k] : gv[k];
        }
        for (std::size_t k = 0; k < gv.size(); ++k) {
          const double r = node.op == OpKind::SoftmaxBackward ? yv[k] * (gv[k] - s)
                                                              : gv[k] - std::exp(yv[k]) * s;
          store_double(out, ol[g][k], r);
        }
      }
      return out;
    }
    case OpKind::LayerNorm:
    case OpKind::RmsNorm: {
      const bool ln = node.op == OpKind::LayerNorm;
      const std::size_t k = a.get_ints("normalized_shape").size();
      const auto mask = trailing(k, rank);
      std::size_t next = 1;
      std::vector<double> w, b;
      if (a.get_bool("has_weight", false)) w = to_doubles(*in[next++]);
      if (ln && a.get_bool("has_bias", false)) b = to_doubles(*in[next++]);
      const double eps = a.get_double("eps", ln ? 1e-5 : machine_eps(x.type.dtype));
      const auto xl = lanes(x.type, mask), ol = lanes(out.type, mask);
      for (std::size_t g = 0; g < xl.size(); ++g) {
        const auto v = read_lane(x, xl[g]);
        double mu = 0, ms = 0;
        for (double e : v) mu += e;
        mu = ln ? mu / static_cast<double>(v.size()) : 0.0;
        for (double e : v) ms += (e - mu) * (e - mu);
        const double rstd = 1.0 / std::sqrt(ms / static_cast<double>(v.size()) + eps);
        for (std::size_t j = 0; j < v.size(); ++j) {
          double r = (v[j] - mu) * rstd;
          if (!w.empty()) r *= w[j];
          if (!b.empty()) r += b[j];
          store_double(out, ol[g][j], r);
        }
      }
      return out;
    }
    case OpKind::LayerNormBackward:
    case OpKind::RmsNormBackward: {
      // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = grad * weight;
      // RMS norm has no mean term.
      const bool ln = node.op == OpKind::LayerNormBackward;
      const Buffer& xin = *in[1];
      const std::size_t k = a.get_ints("normalized_shape").size();
      const auto mask = trailing(k, rank);
      const std::vector<double> mean = ln ? to_doubles(*in[2]) : std::vector<double>{};
      const std::vector<double> rstd = to_doubles(*in[ln ? 3 : 2]);
      std::vector<double> w;
      if (a.get_bool("has_weight", false)) w = to_doubles(*in[ln ? 4 : 3]);
      const auto gl = lanes(x.type, mask), xl = lanes(xin.type, mask), ol = lanes(out.type, mask);
      for (std::size_t r = 0; r < gl.size(); ++r) {
        const auto gv = read_lane(x, gl[r]);
        const auto xv = read_lane(xin, xl[r]);
        const double n = static_cast<double>(gv.size());
        std::vector<double> g(gv.size()), xhat(gv.size());
        double mg = 0, mgx = 0;
        for (std::size_t j = 0; j < gv.size(); ++j) {
          g[j] = gv[j] * (w.empty() ? 1.0 : w[j]);
          xhat[j] = (xv[j] - (ln ? mean[r] : 0.0)) * rstd[r];
          mg += g[j];
          mgx += g[j] * xhat[j];
        }
        mg = ln ? mg / n : 0.0;
        mgx /= n;
        for (std::size_t j = 0; j < gv.size(); ++j) {
          store_double(out, ol[r][j], rstd[r] * (g[j] - mg - xhat[j] * mgx));
        }
      }
      return out;
    }
    default:
      interp_fail(node.op, "not a normalization op");
  }
}

}  // namespace vtpu::ir::detail
