// Reference semantics of sources and elementwise ops. Floating math runs in
// double on operands already rounded to the common compute type; integer math
// runs in int64 with two's-complement wrap (done in uint64 to stay defined).
#include <cmath>
#include <limits>
#include <numbers>

#include "interp.h"

namespace vtpu::ir::detail {
namespace {

using u64 = std::uint64_t;

std::int64_t wrap_add(std::int64_t a, std::int64_t b) { return static_cast<std::int64_t>(u64(a) + u64(b)); }
std::int64_t wrap_sub(std::int64_t a, std::int64_t b) { return static_cast<std::int64_t>(u64(a) - u64(b)); }
std::int64_t wrap_mul(std::int64_t a, std::int64_t b) { return static_cast<std::int64_t>(u64(a) * u64(b)); }

std::int64_t int_div(OpKind op, std::int64_t a, std::int64_t b, bool floor) {
  if (b == 0) interp_fail(op, "integer division by zero");
  if (b == -1) return wrap_sub(0, a);  // INT64_MIN / -1 wraps instead of trapping
  std::int64_t q = a / b;
  if (floor && (a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

std::int64_t int_mod(OpKind op, std::int64_t a, std::int64_t b, bool python) {
  if (b == 0) interp_fail(op, "integer division by zero");
  if (b == -1) return 0;
  std::int64_t m = a % b;
  if (python && m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

std::int64_t int_pow(std::int64_t base, std::int64_t exp) {
  if (exp < 0) {  // c10's powi: only +-1 survive a negative exponent
    if (base == 1) return 1;
    if (base == -1) return (exp % 2 == 0) ? 1 : -1;
    return 0;
  }
  std::int64_t r = 1;
  while (exp) {
    if (exp & 1) r = wrap_mul(r, base);
    base = wrap_mul(base, base);
    exp >>= 1;
  }
  return r;
}

// Python's floor division for floats, exact where a/b then floor is not.
double float_floor_div(double a, double b) {
  if (b == 0) return a / b;
  const double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1.0;
  if (div == 0) return std::copysign(0.0, a / b);
  double fl = std::floor(div);
  if (div - fl > 0.5) fl += 1.0;
  return fl;
}

double nan_max(double a, double b) { return (std::isnan(a) || std::isnan(b)) ? NAN : std::max(a, b); }
double nan_min(double a, double b) { return (std::isnan(a) || std::isnan(b)) ? NAN : std::min(a, b); }
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

constexpr double kSqrt2 = std::numbers::sqrt2;
constexpr double kTanhK = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kTanhC = 0.044715;

double gelu(double x, bool tanh_approx) {
  if (tanh_approx) return 0.5 * x * (1.0 + std::tanh(kTanhK * (x + kTanhC * x * x * x)));
  return 0.5 * x * (1.0 + std::erf(x / kSqrt2));
}

double gelu_grad(double x, bool tanh_approx) {
  if (tanh_approx) {
    const double inner = kTanhK * (x + kTanhC * x * x * x);
    const double t = std::tanh(inner);
    const double dinner = kTanhK * (1.0 + 3.0 * kTanhC * x * x);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner;
  }
  const double cdf = 0.5 * (1.0 + std::erf(x / kSqrt2));
  const double pdf = std::exp(-0.5 * x * x) / std::sqrt(2.0 * std::numbers::pi);
  return cdf + x * pdf;
}

struct Num {
  bool is_float;
  double f;
  std::int64_t i;
};
Num F(double v) { return {true, v, 0}; }
Num I(std::int64_t v) { return {false, 0.0, v}; }
Num B(bool v) { return {false, 0.0, v ? 1 : 0}; }

Num float_op(const Node& n, const std::vector<double>& v) {
  const double x = v[0];
  const double y = v.size() > 1 ? v[1] : 0.0;
  const Attributes& a = n.attrs;
  // p * q + r rounded once, as ATen's fused multiply-adds (host_codegen.cpp):
  // in float for float32 and the 16-bit types (their compute type), in double
  // for float64.
  const auto fused = [&n](double p, double q, double r) {
    if (n.common_dtype == DType::kFloat64) return std::fma(p, q, r);
    return static_cast<double>(std::fma(static_cast<float>(p), static_cast<float>(q), static_cast<float>(r)));
  };
  switch (n.op) {
    case OpKind::Neg: return F(-x);
    case OpKind::Abs: return F(std::fabs(x));
    case OpKind::Exp: return F(std::exp(x));
    case OpKind::Exp2: return F(std::exp2(x));
    case OpKind::Log: return F(std::log(x));
    case OpKind::Log2: return F(std::log2(x));
    case OpKind::Log10: return F(std::log10(x));
    case OpKind::Log1p: return F(std::log1p(x));
    case OpKind::Expm1: return F(std::expm1(x));
    case OpKind::Sqrt: return F(std::sqrt(x));
    case OpKind::Rsqrt: return F(1.0 / std::sqrt(x));
    case OpKind::Reciprocal: return F(1.0 / x);
    case OpKind::Sin: return F(std::sin(x));
    case OpKind::Cos: return F(std::cos(x));
    case OpKind::Tan: return F(std::tan(x));
    case OpKind::Asin: return F(std::asin(x));
    case OpKind::Acos: return F(std::acos(x));
    case OpKind::Atan: return F(std::atan(x));
    case OpKind::Sinh: return F(std::sinh(x));
    case OpKind::Cosh: return F(std::cosh(x));
    case OpKind::Tanh: return F(std::tanh(x));
    case OpKind::Sigmoid: return F(sigmoid(x));
    case OpKind::Relu: return F(x < 0 ? 0.0 : x);  // NaN passes through
    case OpKind::Gelu: return F(gelu(x, a.get_string("approximate", "none") == "tanh"));
    case OpKind::Silu: return F(x * sigmoid(x));
    case OpKind::Erf: return F(std::erf(x));
    case OpKind::Floor: return F(std::floor(x));
    case OpKind::Ceil: return F(std::ceil(x));
    case OpKind::Round: return F(std::nearbyint(x));  // default mode: half to even
    case OpKind::Trunc: return F(std::trunc(x));
    case OpKind::Sign: return F((x > 0) - (x < 0));  // torch: sign(NaN) = sign(-0.0) = +0
    case OpKind::LogicalNot: return B(x == 0);
    case OpKind::IsNan: return B(std::isnan(x));
    case OpKind::IsInf: return B(std::isinf(x));
    case OpKind::IsFinite: return B(std::isfinite(x));
    case OpKind::Cast: return F(x);
    case OpKind::Add:
    case OpKind::Sub: {
      double alpha = a.get_double("alpha", 1.0);
      if (rounds_runtime_scalar_to_16_bits(n)) alpha = round_to_16_bits(n.common_dtype, alpha);
      const double signed_alpha = n.op == OpKind::Add ? alpha : -alpha;
      // One rounding in float32/float64, as ATen's fmadd (host_codegen.cpp).
      if (n.common_dtype == DType::kFloat32)
        return F(std::fma(static_cast<float>(signed_alpha), static_cast<float>(y), static_cast<float>(x)));
      if (n.common_dtype == DType::kFloat64) return F(std::fma(signed_alpha, y, x));
      return F(x + signed_alpha * y);
    }
    case OpKind::Mul: return F(x * y);
    case OpKind::Div: {
      const std::string mode = a.get_string("rounding_mode", "");
      if (mode == "trunc") return F(std::trunc(x / y));
      if (mode == "floor") return F(float_floor_div(x, y));
      return F(x / y);
    }
    case OpKind::Pow:
      // bfloat16 rounds x * x first for the exponents 3 and -2 (ATen's kernel).
      if (n.common_dtype == DType::kBFloat16 && (y == 3.0 || y == -2.0)) {
        const double square = round_to_16_bits(DType::kBFloat16, static_cast<float>(x * x));
        return F(y == 3.0 ? square * x : 1.0 / square);
      }
      return F(std::pow(x, y));
    case OpKind::Maximum: return F(nan_max(x, y));
    case OpKind::Minimum: return F(nan_min(x, y));
    case OpKind::Eq: return B(x == y);
    case OpKind::Ne: return B(x != y);
    case OpKind::Lt: return B(x < y);
    case OpKind::Le: return B(x <= y);
    case OpKind::Gt: return B(x > y);
    case OpKind::Ge: return B(x >= y);
    case OpKind::LogicalAnd: return B(x != 0 && y != 0);
    case OpKind::LogicalOr: return B(x != 0 || y != 0);
    case OpKind::LogicalXor: return B((x != 0) != (y != 0));
    case OpKind::Fmod: return F(std::fmod(x, y));
    case OpKind::Remainder: {
      double m = std::fmod(x, y);
      if (m != 0 && ((y < 0) != (m < 0))) m += y;
      return F(m);
    }
    case OpKind::Atan2: return F(std::atan2(x, y));
    case OpKind::ThresholdBackward: return F(y <= a.get_double("threshold", 0.0) ? 0.0 : x);
    case OpKind::GeluBackward:
      return F(x * gelu_grad(y, a.get_string("approximate", "none") == "tanh"));
    case OpKind::SiluBackward: {
      const double s = sigmoid(y);
      return F(x * s * (1.0 + y * (1.0 - s)));
    }
    case OpKind::SigmoidBackward:
      if (n.common_dtype == DType::kFloat16) {  // float16 arithmetic, as in host_codegen.cpp
        const double one_minus = round_to_16_bits(DType::kFloat16, static_cast<float>(1.0 - y));
        return F(round_to_16_bits(DType::kFloat16, static_cast<float>(x * one_minus)) * y);
      }
      return F(x * (1.0 - y) * y);
    case OpKind::TanhBackward: return F(x * fused(-y, y, 1.0));
    case OpKind::Where: return F(v[0] != 0 ? v[1] : v[2]);
    case OpKind::Clamp: {
      double r = x;
      std::size_t k = 1;
      if (a.get_bool("has_min", false)) r = nan_max(r, v[k++]);
      if (a.get_bool("has_max", false)) r = nan_min(r, v[k++]);
      return F(r);
    }
    case OpKind::Lerp: {
      const double w = v[2];
      return F(std::fabs(w) < 0.5 ? fused(w, y - x, x) : fused(w - 1.0, y - x, y));
    }
    case OpKind::Addcmul: return F(fused(a.get_double("value", 1.0) * v[1], v[2], x));
    case OpKind::Addcdiv: return F(x + a.get_double("value", 1.0) * v[1] / v[2]);
    case OpKind::MaskedFill: return F(v[1] != 0 ? v[2] : x);
    default: interp_fail(n.op, "not implemented by the reference interpreter for floating types");
  }
}

Num int_op(const Node& n, const std::vector<std::int64_t>& v) {
  const std::int64_t x = v[0];
  const std::int64_t y = v.size() > 1 ? v[1] : 0;
  const Attributes& a = n.attrs;
  const bool is_bool = n.common_dtype == DType::kBool;
  switch (n.op) {
    case OpKind::Neg: return I(wrap_sub(0, x));
    case OpKind::Abs: return I(x < 0 ? wrap_sub(0, x) : x);
    case OpKind::Relu: return I(x < 0 ? 0 : x);
    case OpKind::Floor: case OpKind::Ceil: case OpKind::Round: case OpKind::Trunc:
    case OpKind::Cast:
      return I(x);
    case OpKind::Sign: return I((x > 0) - (x < 0));
    case OpKind::LogicalNot: return B(x == 0);
    case OpKind::BitwiseNot: return I(is_bool ? !x : ~x);
    case OpKind::IsNan: case OpKind::IsInf: return B(false);
    case OpKind::IsFinite: return B(true);
    case OpKind::Add: return I(wrap_add(x, wrap_mul(a.get_int("alpha", 1), y)));
    case OpKind::Sub: return I(wrap_sub(x, wrap_mul(a.get_int("alpha", 1), y)));
    case OpKind::Mul: return I(wrap_mul(x, y));
    case OpKind::Div: return I(int_div(n.op, x, y, a.get_string("rounding_mode", "") == "floor"));
    case OpKind::Pow: return I(int_pow(x, y));
    case OpKind::Maximum: return I(std::max(x, y));
    case OpKind::Minimum: return I(std::min(x, y));
    case OpKind::Eq: return B(x == y);
    case OpKind::Ne: return B(x != y);
    case OpKind::Lt: return B(x < y);
    case OpKind::Le: return B(x <= y);
    case OpKind::Gt: return B(x > y);
    case OpKind::Ge: return B(x >= y);
    case OpKind::LogicalAnd: return B(x != 0 && y != 0);
    case OpKind::LogicalOr: return B(x != 0 || y != 0);
    case OpKind::LogicalXor: return B((x != 0) != (y != 0));
    case OpKind::BitwiseAnd: return I(x & y);
    case OpKind::BitwiseOr: return I(x | y);
    case OpKind::BitwiseXor: return I(x ^ y);
    case OpKind::Fmod: return I(int_mod(n.op, x, y, false));
    case OpKind::Remainder: return I(int_mod(n.op, x, y, true));
    case OpKind::ThresholdBackward: return I(static_cast<double>(y) <= a.get_double("threshold", 0.0) ? 0 : x);
    case OpKind::Where: return I(v[0] != 0 ? v[1] : v[2]);
    case OpKind::Clamp: {
      std::int64_t r = x;
      std::size_t k = 1;
      if (a.get_bool("has_min", false)) r = std::max(r, v[k++]);
      if (a.get_bool("has_max", false)) r = std::min(r, v[k++]);
      return I(r);
    }
    case OpKind::Addcmul:
      return I(wrap_add(x, wrap_mul(a.get_int("value", 1), wrap_mul(v[1], v[2]))));
    case OpKind::MaskedFill: return I(v[1] != 0 ? v[2] : x);
    default: interp_fail(n.op, "not implemented by the reference interpreter for integer types");
  }
}

// Which operands enter in the common dtype; the others (conditions, masks)
// are read as truth values.
bool is_condition(OpKind op, std::size_t k) {
  return (op == OpKind::Where && k == 0) || (op == OpKind::MaskedFill && k == 1);
}

}  // namespace

Buffer eval_source(const Node& node, const std::vector<const Buffer*>& in) {
  Buffer out = Buffer::zeros(node.type);
  const bool fl = is_floating(node.type.dtype);
  switch (node.op) {
    case OpKind::Constant: {
      const AttrValue& v = *node.attrs.find("value");
      if (const auto* d = std::get_if<double>(&v)) store_double(out, 0, *d);
      else if (const auto* i = std::get_if<std::int64_t>(&v)) store_int(out, 0, *i);
      else store_int(out, 0, std::get<bool>(v) ? 1 : 0);
      return out;
    }
    case OpKind::Fill: {
      for (std::int64_t i = 0; i < out.type.numel(); ++i) {
        if (fl) store_double(out, i, load_double(*in[0], 0));
        else store_int(out, i, load_int(*in[0], 0));
      }
      return out;
    }
    case OpKind::Arange: {
      // start + i * step in double (int64 for integer dtypes), like ATen's
      // accumulate type, so element i does not depend on i-1's rounding.
      for (std::int64_t i = 0; i < out.type.numel(); ++i) {
        if (fl) {
          store_double(out, i, load_double(*in[0], 0) + static_cast<double>(i) * load_double(*in[1], 0));
        } else {
          store_int(out, i, wrap_add(load_int(*in[0], 0), wrap_mul(i, load_int(*in[1], 0))));
        }
      }
      return out;
    }
    default:
      interp_fail(node.op, "not a source op");
  }
}

Buffer eval_elementwise(const Node& node, const std::vector<const Buffer*>& in, const std::vector<bool>& to_16_bits) {
  Buffer out = Buffer::zeros(node.type);
  const DType common = node.common_dtype;
  const bool fl = is_floating(common);
  std::vector<double> fv(in.size());
  std::vector<std::int64_t> iv(in.size());
  for (std::int64_t lin = 0; lin < out.type.numel(); ++lin) {
    const auto idx = unravel(lin, out.type.sizes);
    for (std::size_t k = 0; k < in.size(); ++k) {
      const Buffer& b = *in[k];
      const std::int64_t off = broadcast_offset(b.type, idx);
      if (is_condition(node.op, k)) {
        fv[k] = load_bool(b, off) ? 1.0 : 0.0;
        iv[k] = load_bool(b, off) ? 1 : 0;
      } else if (fl) {
        const double loaded = load_double(b, off);
        fv[k] = round_to_compute(common, k < to_16_bits.size() && to_16_bits[k] ? round_to_16_bits(common, loaded) : loaded);
      } else {
        iv[k] = load_int(b, off);
      }
    }
    const Num r = fl ? float_op(node, fv) : int_op(node, iv);
    if (r.is_float) store_double(out, lin, round_to_compute(common, r.f));
    else store_int(out, lin, r.i);
  }
  return out;
}

}  // namespace vtpu::ir::detail
