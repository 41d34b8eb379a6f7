// Reference convolution (N-d, grouped, strided, dilated, padded, and
// transposed) as plain loops accumulating in double: the stand-in for the
// conv library in the engine's tests.
#include "interp.h"

namespace vtpu::ir::detail {
namespace {

std::vector<std::int64_t> per_dim(const Attributes& a, const char* key, std::size_t n, std::int64_t fallback) {
  std::vector<std::int64_t> v = a.get_ints(key, {});
  if (v.empty()) v.assign(n, fallback);
  if (v.size() == 1) v.assign(n, v[0]);
  return v;
}

std::int64_t product(const std::vector<std::int64_t>& v) {
  std::int64_t p = 1;
  for (std::int64_t x : v) p *= x;
  return p;
}

}  // namespace

Buffer eval_conv(const Node& node, const std::vector<const Buffer*>& in) {
  const Buffer& x = *in[0];
  const Buffer& w = *in[1];
  const Buffer* bias = in.size() > 2 ? in[2] : nullptr;
  const Attributes& a = node.attrs;
  const std::size_t S = x.type.sizes.size() - 2;
  const auto stride = per_dim(a, "stride", S, 1);
  const auto padding = per_dim(a, "padding", S, 0);
  const auto dilation = per_dim(a, "dilation", S, 1);
  const std::int64_t groups = a.get_int("groups", 1);
  const bool transposed = a.get_bool("transposed", false);

  const std::vector<std::int64_t> in_sp(x.type.sizes.begin() + 2, x.type.sizes.end());
  const std::vector<std::int64_t> k_sp(w.type.sizes.begin() + 2, w.type.sizes.end());
  const std::vector<std::int64_t> out_sp(node.type.sizes.begin() + 2, node.type.sizes.end());
  const std::int64_t N = x.type.sizes[0], cin = x.type.sizes[1], cout = node.type.sizes[1];
  const std::int64_t cin_g = cin / groups, cout_g = cout / groups;
  const std::int64_t n_in = product(in_sp), n_k = product(k_sp), n_out = product(out_sp);

  std::vector<double> acc(static_cast<std::size_t>(node.type.numel()), 0.0);
  auto out_at = [&](std::int64_t n, std::int64_t oc, std::int64_t o) {
    return static_cast<std::size_t>((n * cout + oc) * n_out + o);
  };
  // Walk input positions and kernel taps; each pair feeds at most one output
  // position. For a forward conv, o*s - p + k*d = i; transposed swaps roles:
  // i*s - p + k*d = o.
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t ic = 0; ic < cin; ++ic) {
      const std::int64_t g = ic / cin_g;
      for (std::int64_t i = 0; i < n_in; ++i) {
        const auto ii = unravel(i, in_sp);
        std::vector<std::int64_t> xi = {n, ic};
        xi.insert(xi.end(), ii.begin(), ii.end());
        const double xv = load_double(x, broadcast_offset(x.type, xi));
        for (std::int64_t k = 0; k < n_k; ++k) {
          const auto ki = unravel(k, k_sp);
          std::int64_t o = 0;
          bool hit = true;
          for (std::size_t d = 0; d < S && hit; ++d) {
            std::int64_t od;
            if (transposed) {
              od = ii[d] * stride[d] - padding[d] + ki[d] * dilation[d];
            } else {
              const std::int64_t num = ii[d] + padding[d] - ki[d] * dilation[d];
              hit = num % stride[d] == 0;
              od = num / stride[d];
            }
            hit = hit && od >= 0 && od < out_sp[d];
            o = o * out_sp[d] + od;
          }
          if (!hit) continue;
          for (std::int64_t ocl = 0; ocl < cout_g; ++ocl) {
            std::vector<std::int64_t> wi = transposed ? std::vector<std::int64_t>{ic, ocl}
                                                      : std::vector<std::int64_t>{g * cout_g + ocl, ic - g * cin_g};
            wi.insert(wi.end(), ki.begin(), ki.end());
            acc[out_at(n, g * cout_g + ocl, o)] += xv * load_double(w, broadcast_offset(w.type, wi));
          }
        }
      }
    }
  }
  Buffer out = Buffer::zeros(node.type);
  for (std::size_t e = 0; e < acc.size(); ++e) {
    const std::int64_t oc = (static_cast<std::int64_t>(e) / n_out) % cout;
    const double b = bias ? load_double(*bias, oc * bias->type.strides[0]) : 0.0;
    store_double(out, static_cast<std::int64_t>(e), acc[e] + b);
  }
  return out;
}

}  // namespace vtpu::ir::detail
