// Native vtpu kernels for the foreach ops torch.optim issues (foreach AdamW,
// Adam and SGD: one call per op over every parameter).
//
// ATen's generic foreach kernels (CompositeExplicitAutograd, the "slow"
// ones) call the per-tensor op through the dispatcher once per tensor; a
// scalar operand is wrapped into a fresh 0-dim CPU tensor per call and the
// in-place op then takes TensorIterator's meta (or, for lerp/addcmul/addcdiv,
// the host-kernel path's). That was 2-4 us of the issuing thread per tensor
// and op, and in fused mode the thread's time is not hidden: a window's
// kernels start only once its last op is recorded (a foreach AdamW step over
// 100 tensors recorded 3.2 ms, then ran 4.7 ms).
//
// Here each tensor's op goes straight to the generated launch the per-tensor
// path ends in (same IR op, operands and attributes, so the same kernel and
// the same bits in every mode), with one wrapped scalar per distinct value.
// Calls outside the common case (lists of unequal length, tensors that are
// not on the device, not floating, not contiguous or not of one shape and
// dtype per index, complex scalars, generated kernels off) take ATen's slow
// kernel, which raises ATen's errors; a tensor whose launch the generator
// refuses (an operand overlapping the output) takes the per-tensor op.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add_native.h>
#include <ATen/ops/_foreach_addcdiv_native.h>
#include <ATen/ops/_foreach_addcmul_native.h>
#include <ATen/ops/_foreach_div_native.h>
#include <ATen/ops/_foreach_lerp_native.h>
#include <ATen/ops/_foreach_mul_native.h>
#include <ATen/ops/_foreach_sqrt_native.h>
#include <ATen/ops/_foreach_sub_native.h>
#include <ATen/ops/add.h>
#include <ATen/ops/addcdiv.h>
#include <ATen/ops/addcmul.h>
#include <ATen/ops/div.h>
#include <ATen/ops/lerp.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/sub.h>
#include <torch/library.h>

#include <cstring>
#include <initializer_list>
#include <vector>

#include "aten_bridge.h"
#include "generated_kernels.h"
#include "generated_lowering.h"

namespace vtpu::bridge {
namespace {

using ir::OpKind;
using at::TensorList;
using ScalarList = at::ArrayRef<at::Scalar>;

bool floating(c10::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf;
}

// The common case: `self` non-empty, every list as long as it, tensor i of
// each list on the device, contiguous, of self[i]'s shape and (floating)
// dtype, so the op's result has self[i]'s geometry and dtype.
bool common_case(TensorList self, std::initializer_list<TensorList> others, std::size_t scalars = 0,
                 bool scalar_list = false) {
  if (!generated_kernels_enabled() || self.empty()) return false;
  if (scalar_list && scalars != self.size()) return false;
  for (TensorList other : others)
    if (other.size() != self.size()) return false;
  for (std::size_t i = 0; i < self.size(); ++i) {
    const at::Tensor& s = self[i];
    if (!s.defined() || s.device().type() != kVtpu || !floating(s.scalar_type()) || !s.is_contiguous()) return false;
    for (TensorList other : others) {
      const at::Tensor& o = other[i];
      if (!o.defined() || o.device().type() != kVtpu || o.scalar_type() != s.scalar_type() ||
          !o.sizes().equals(s.sizes()) || !o.is_contiguous())
        return false;
    }
  }
  return true;
}

bool real(const at::Scalar& s) { return !s.isComplex(); }
bool all_real(ScalarList scalars) {
  for (const at::Scalar& s : scalars)
    if (!real(s)) return false;
  return true;
}

// The wrapped-number tensor of each scalar of a list, made once per
// distinct value (an optimizer passes one bias correction per parameter,
// mostly equal).
class WrappedScalars {
 public:
  const at::Tensor& of(const at::Scalar& s) {
    if (!last_.defined() || !same(last_value_, s)) {
      last_ = wrapped_number(s);
      last_value_ = s;
    }
    return last_;
  }

 private:
  // Same kind and same bits (0.0 and -0.0 differ; a NaN is made anew).
  static bool same(const at::Scalar& a, const at::Scalar& b) {
    if (a.type() != b.type()) return false;
    if (a.isFloatingPoint()) {
      const double x = a.toDouble(), y = b.toDouble();
      return std::memcmp(&x, &y, sizeof x) == 0;
    }
    if (a.isIntegral(/*includeBool=*/false)) return a.toLong() == b.toLong();
    if (a.isBoolean()) return a.toBool() == b.toBool();
    return false;
  }

  at::Tensor last_;
  at::Scalar last_value_;
};

ir::Attributes alpha_attr(const at::Scalar& alpha) { return {{"alpha", alpha.toDouble()}}; }
ir::Attributes value_attr(const at::Scalar& value) { return {{"value", value.toDouble()}}; }

// In place: tensor i through its generated launch, else its per-tensor op.
// A launched tensor's version is bumped here, after the launch, as ATen's
// in-place view-tracking kernel does for the per-tensor op (a foreach op has
// no such kernel of its own: ATen's generic foreach gets the bumps from its
// per-tensor calls, CUDA's fused kernels bump explicitly). Without it autograd
// missed in-place updates of tensors saved for backward.
template <class Launch, class PerTensor>
void each_in_place(TensorList self, Launch launch, PerTensor per_tensor) {
  for (std::size_t i = 0; i < self.size(); ++i) {
    if (launch(i, self[i])) self[i].unsafeGetTensorImpl()->bump_version();
    else per_tensor(i);
  }
}

// Out of place: a fresh result of self[i]'s geometry and dtype per tensor.
template <class Launch, class PerTensor>
std::vector<at::Tensor> each_fresh(TensorList self, Launch launch, PerTensor per_tensor) {
  std::vector<at::Tensor> results;
  results.reserve(self.size());
  for (std::size_t i = 0; i < self.size(); ++i) {
    at::Tensor out = empty_device(self[i].sizes(), self[i].scalar_type());
    results.push_back(launch(i, out) ? std::move(out) : per_tensor(i));
  }
  return results;
}

// ---- add / sub (alpha), mul / div: Scalar, List and ScalarList forms ----
// ATen's add.Scalar is add.Tensor(self, wrapped(scalar), alpha=1); mul.Scalar
// and div.Scalar are mul/div.Tensor with the wrapped scalar.

#define VTPU_FOREACH_BINARY(name, IR_OP, HAS_ALPHA)                                                              \
  void name##_scalar_(TensorList self, const at::Scalar& scalar) {                                                 \
    if (!common_case(self, {}) || !real(scalar))                                                                   \
      return at::native::foreach_tensor_##name##_scalar_kernel_slow_(self, scalar);                                \
    const at::Tensor other = wrapped_number(scalar);                                                               \
    const ir::Attributes attrs = HAS_ALPHA ? alpha_attr(1) : ir::Attributes{};                                    \
    each_in_place(                                                                                                 \
        self, [&](std::size_t, const at::Tensor& out) { return launch_generated(IR_OP, out, {out, other}, attrs); }, \
        [&](std::size_t i) { self[i].name##_(scalar); });                                                          \
  }                                                                                                                \
  std::vector<at::Tensor> name##_scalar(TensorList self, const at::Scalar& scalar) {                              \
    if (!common_case(self, {}) || !real(scalar))                                                                   \
      return at::native::foreach_tensor_##name##_scalar_kernel_slow(self, scalar);                                 \
    const at::Tensor other = wrapped_number(scalar);                                                               \
    const ir::Attributes attrs = HAS_ALPHA ? alpha_attr(1) : ir::Attributes{};                                    \
    return each_fresh(                                                                                             \
        self, [&](std::size_t i, const at::Tensor& out) { return launch_generated(IR_OP, out, {self[i], other}, attrs); }, \
        [&](std::size_t i) { return at::name(self[i], scalar); });                                                 \
  }                                                                                                                \
  void name##_scalarlist_(TensorList self, ScalarList scalars) {                                                   \
    if (!common_case(self, {}, scalars.size(), true) || !all_real(scalars))                                        \
      return at::native::foreach_tensor_##name##_scalarlist_kernel_slow_(self, scalars);                           \
    WrappedScalars wrapped;                                                                                        \
    const ir::Attributes attrs = HAS_ALPHA ? alpha_attr(1) : ir::Attributes{};                                    \
    each_in_place(                                                                                                 \
        self,                                                                                                      \
        [&](std::size_t i, const at::Tensor& out) {                                                                \
          return launch_generated(IR_OP, out, {out, wrapped.of(scalars[i])}, attrs);                               \
        },                                                                                                         \
        [&](std::size_t i) { self[i].name##_(scalars[i]); });                                                      \
  }                                                                                                                \
  std::vector<at::Tensor> name##_scalarlist(TensorList self, ScalarList scalars) {                                \
    if (!common_case(self, {}, scalars.size(), true) || !all_real(scalars))                                        \
      return at::native::foreach_tensor_##name##_scalarlist_kernel_slow(self, scalars);                            \
    WrappedScalars wrapped;                                                                                        \
    const ir::Attributes attrs = HAS_ALPHA ? alpha_attr(1) : ir::Attributes{};                                    \
    return each_fresh(                                                                                             \
        self,                                                                                                      \
        [&](std::size_t i, const at::Tensor& out) {                                                                \
          return launch_generated(IR_OP, out, {self[i], wrapped.of(scalars[i])}, attrs);                           \
        },                                                                                                         \
        [&](std::size_t i) { return at::name(self[i], scalars[i]); });                                             \
  }

VTPU_FOREACH_BINARY(add, OpKind::Add, true)
VTPU_FOREACH_BINARY(sub, OpKind::Sub, true)
VTPU_FOREACH_BINARY(mul, OpKind::Mul, false)
VTPU_FOREACH_BINARY(div, OpKind::Div, false)
#undef VTPU_FOREACH_BINARY

// The List forms: add/sub take alpha, mul/div do not.
#define VTPU_FOREACH_LIST_ALPHA(name, IR_OP)                                                                     \
  void name##_list_(TensorList self, TensorList other, const at::Scalar& alpha) {                                  \
    if (!common_case(self, {other}) || !real(alpha))                                                               \
      return at::native::foreach_tensor_##name##_list_kernel_slow_(self, other, alpha);                            \
    const ir::Attributes attrs = alpha_attr(alpha);                                                                \
    each_in_place(                                                                                                 \
        self,                                                                                                      \
        [&](std::size_t i, const at::Tensor& out) { return launch_generated(IR_OP, out, {out, other[i]}, attrs); }, \
        [&](std::size_t i) { self[i].name##_(other[i], alpha); });                                                 \
  }                                                                                                                \
  std::vector<at::Tensor> name##_list(TensorList self, TensorList other, const at::Scalar& alpha) {               \
    if (!common_case(self, {other}) || !real(alpha))                                                               \
      return at::native::foreach_tensor_##name##_list_kernel_slow(self, other, alpha);                             \
    const ir::Attributes attrs = alpha_attr(alpha);                                                                \
    return each_fresh(                                                                                             \
        self,                                                                                                      \
        [&](std::size_t i, const at::Tensor& out) {                                                                \
          return launch_generated(IR_OP, out, {self[i], other[i]}, attrs);                                         \
        },                                                                                                         \
        [&](std::size_t i) { return at::name(self[i], other[i], alpha); });                                        \
  }

VTPU_FOREACH_LIST_ALPHA(add, OpKind::Add)
VTPU_FOREACH_LIST_ALPHA(sub, OpKind::Sub)
#undef VTPU_FOREACH_LIST_ALPHA

#define VTPU_FOREACH_LIST(name, IR_OP)                                                                           \
  void name##_list_(TensorList self, TensorList other) {                                                           \
    if (!common_case(self, {other})) return at::native::foreach_tensor_##name##_list_kernel_slow_(self, other);    \
    each_in_place(                                                                                                 \
        self, [&](std::size_t i, const at::Tensor& out) { return launch_generated(IR_OP, out, {out, other[i]}); },  \
        [&](std::size_t i) { self[i].name##_(other[i]); });                                                        \
  }                                                                                                                \
  std::vector<at::Tensor> name##_list(TensorList self, TensorList other) {                                        \
    if (!common_case(self, {other})) return at::native::foreach_tensor_##name##_list_kernel_slow(self, other);     \
    return each_fresh(                                                                                             \
        self, [&](std::size_t i, const at::Tensor& out) { return launch_generated(IR_OP, out, {self[i], other[i]}); }, \
        [&](std::size_t i) { return at::name(self[i], other[i]); });                                               \
  }

VTPU_FOREACH_LIST(mul, OpKind::Mul)
VTPU_FOREACH_LIST(div, OpKind::Div)
#undef VTPU_FOREACH_LIST

// ---- addcmul / addcdiv: self + value * t1 (*|/) t2, value a Scalar or one per tensor ----

#define VTPU_FOREACH_POINTWISE(name, IR_OP)                                                                      \
  void name##_scalar_(TensorList self, TensorList t1, TensorList t2, const at::Scalar& value) {                   \
    if (!common_case(self, {t1, t2}) || !real(value))                                                              \
      return at::native::foreach_tensor_##name##_scalar_slow_(self, t1, t2, value);                                \
    const ir::Attributes attrs = value_attr(value);                                                                \
    each_in_place(                                                                                                 \
        self,                                                                                                      \
        [&](std::size_t i, const at::Tensor& out) {                                                                \
          return launch_generated(IR_OP, out, {out, t1[i], t2[i]}, attrs);                                         \
        },                                                                                                         \
        [&](std::size_t i) { self[i].name##_(t1[i], t2[i], value); });                                             \
  }                                                                                                                \
  std::vector<at::Tensor> name##_scalar(TensorList self, TensorList t1, TensorList t2, const at::Scalar& value) { \
    if (!common_case(self, {t1, t2}) || !real(value))                                                              \
      return at::native::foreach_tensor_##name##_scalar_slow(self, t1, t2, value);                                 \
    const ir::Attributes attrs = value_attr(value);                                                                \
    return each_fresh(                                                                                             \
        self,                                                                                                      \
        [&](std::size_t i, const at::Tensor& out) {                                                                \
          return launch_generated(IR_OP, out, {self[i], t1[i], t2[i]}, attrs);                                     \
        },                                                                                                         \
        [&](std::size_t i) { return at::name(self[i], t1[i], t2[i], value); });                                    \
  }                                                                                                                \
  void name##_scalarlist_(TensorList self, TensorList t1, TensorList t2, ScalarList scalars) {                     \
    if (!common_case(self, {t1, t2}, scalars.size(), true) || !all_real(scalars))                                  \
      return at::native::foreach_tensor_##name##_scalarlist_slow_(self, t1, t2, scalars);                          \
    each_in_place(                                                                                                 \
        self,                                                                                                      \
        [&](std::size_t i, const at::Tensor& out) {                                                                \
          return launch_generated(IR_OP, out, {out, t1[i], t2[i]}, value_attr(scalars[i]));                        \
        },                                                                                                         \
        [&](std::size_t i) { self[i].name##_(t1[i], t2[i], scalars[i]); });                                        \
  }                                                                                                                \
  std::vector<at::Tensor> name##_scalarlist(TensorList self, TensorList t1, TensorList t2, ScalarList scalars) {  \
    if (!common_case(self, {t1, t2}, scalars.size(), true) || !all_real(scalars))                                  \
      return at::native::foreach_tensor_##name##_scalarlist_slow(self, t1, t2, scalars);                           \
    return each_fresh(                                                                                             \
        self,                                                                                                      \
        [&](std::size_t i, const at::Tensor& out) {                                                                \
          return launch_generated(IR_OP, out, {self[i], t1[i], t2[i]}, value_attr(scalars[i]));                    \
        },                                                                                                         \
        [&](std::size_t i) { return at::name(self[i], t1[i], t2[i], scalars[i]); });                               \
  }

VTPU_FOREACH_POINTWISE(addcmul, OpKind::Addcmul)
VTPU_FOREACH_POINTWISE(addcdiv, OpKind::Addcdiv)
#undef VTPU_FOREACH_POINTWISE

// ---- lerp with one Scalar weight (AdamW's and Adam's first moment) ----

void lerp_scalar_(TensorList self, TensorList end, const at::Scalar& weight) {
  if (!common_case(self, {end}) || !real(weight))
    return at::native::foreach_tensor_lerp_list_kernel_slow_(self, end, weight);
  const at::Tensor w = wrapped_number(weight);
  each_in_place(
      self, [&](std::size_t i, const at::Tensor& out) { return launch_generated(OpKind::Lerp, out, {out, end[i], w}); },
      [&](std::size_t i) { self[i].lerp_(end[i], weight); });
}

std::vector<at::Tensor> lerp_scalar(TensorList self, TensorList end, const at::Scalar& weight) {
  if (!common_case(self, {end}) || !real(weight))
    return at::native::foreach_tensor_lerp_list_kernel_slow(self, end, weight);
  const at::Tensor w = wrapped_number(weight);
  return each_fresh(
      self,
      [&](std::size_t i, const at::Tensor& out) { return launch_generated(OpKind::Lerp, out, {self[i], end[i], w}); },
      [&](std::size_t i) { return at::lerp(self[i], end[i], weight); });
}

// ---- sqrt (Adam's and AdamW's denominator) ----

void sqrt_list_(TensorList self) {
  if (!common_case(self, {})) return at::native::foreach_tensor_sqrt_slow_(self);
  each_in_place(
      self, [&](std::size_t, const at::Tensor& out) { return launch_generated(OpKind::Sqrt, out, {out}); },
      [&](std::size_t i) { self[i].sqrt_(); });
}

std::vector<at::Tensor> sqrt_list(TensorList self) {
  if (!common_case(self, {})) return at::native::foreach_tensor_sqrt_slow(self);
  return each_fresh(
      self, [&](std::size_t i, const at::Tensor& out) { return launch_generated(OpKind::Sqrt, out, {self[i]}); },
      [&](std::size_t i) { return at::sqrt(self[i]); });
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
#define VTPU_REGISTER_BINARY(name)                                  \
  m.impl("_foreach_" #name "_.Scalar", TORCH_FN(name##_scalar_));         \
  m.impl("_foreach_" #name ".Scalar", TORCH_FN(name##_scalar));           \
  m.impl("_foreach_" #name "_.ScalarList", TORCH_FN(name##_scalarlist_)); \
  m.impl("_foreach_" #name ".ScalarList", TORCH_FN(name##_scalarlist));   \
  m.impl("_foreach_" #name "_.List", TORCH_FN(name##_list_));             \
  m.impl("_foreach_" #name ".List", TORCH_FN(name##_list));
  VTPU_REGISTER_BINARY(add)
  VTPU_REGISTER_BINARY(sub)
  VTPU_REGISTER_BINARY(mul)
  VTPU_REGISTER_BINARY(div)
#undef VTPU_REGISTER_BINARY
#define VTPU_REGISTER_POINTWISE(name)                               \
  m.impl("_foreach_" #name "_.Scalar", TORCH_FN(name##_scalar_));         \
  m.impl("_foreach_" #name ".Scalar", TORCH_FN(name##_scalar));           \
  m.impl("_foreach_" #name "_.ScalarList", TORCH_FN(name##_scalarlist_)); \
  m.impl("_foreach_" #name ".ScalarList", TORCH_FN(name##_scalarlist));
  VTPU_REGISTER_POINTWISE(addcmul)
  VTPU_REGISTER_POINTWISE(addcdiv)
#undef VTPU_REGISTER_POINTWISE
  m.impl("_foreach_lerp_.Scalar", TORCH_FN(lerp_scalar_));
  m.impl("_foreach_lerp.Scalar", TORCH_FN(lerp_scalar));
  m.impl("_foreach_sqrt_", TORCH_FN(sqrt_list_));
  m.impl("_foreach_sqrt", TORCH_FN(sqrt_list));
}

}  // namespace vtpu::bridge
