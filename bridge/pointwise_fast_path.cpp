// Native vtpu kernels for the hottest pointwise ops. The generic host-kernel
// path pays for a meta kernel that, in a Python process, is usually Python
// (tens of microseconds). Here the output metadata comes from ATen's C++
// structured meta (TensorIterator: broadcasting, type promotion, strides,
// device checks) with the output allocated on vtpu, and the CPU kernel is
// queued on aliases of device memory: a few microseconds per op.
#include <ATen/ATen.h>
#include <ATen/ops/add_cpu_dispatch.h>
#include <ATen/ops/add_meta.h>
#include <ATen/ops/div_cpu_dispatch.h>
#include <ATen/ops/div_meta.h>
#include <ATen/ops/exp_cpu_dispatch.h>
#include <ATen/ops/exp_meta.h>
#include <ATen/ops/log_cpu_dispatch.h>
#include <ATen/ops/log_meta.h>
#include <ATen/ops/mul_cpu_dispatch.h>
#include <ATen/ops/mul_meta.h>
#include <ATen/ops/neg_cpu_dispatch.h>
#include <ATen/ops/neg_meta.h>
#include <ATen/ops/rsqrt_cpu_dispatch.h>
#include <ATen/ops/rsqrt_meta.h>
#include <ATen/ops/sigmoid_cpu_dispatch.h>
#include <ATen/ops/sigmoid_meta.h>
#include <ATen/ops/silu_cpu_dispatch.h>
#include <ATen/ops/silu_meta.h>
#include <ATen/ops/sqrt_cpu_dispatch.h>
#include <ATen/ops/sqrt_meta.h>
#include <ATen/ops/sub_cpu_dispatch.h>
#include <ATen/ops/sub_meta.h>
#include <ATen/ops/tanh_cpu_dispatch.h>
#include <ATen/ops/tanh_meta.h>
#include <torch/library.h>

#include "aten_bridge.h"
#include "device_context.h"
#include "generated_kernels.h"

namespace vtpu::bridge {
namespace {

// A structured meta class whose outputs live on vtpu. For in-place ops the
// output is preset to `self`, as ATen's generated in-place kernels do, so
// TensorIterator checks that the result fits it.
template <class Meta>
struct DeviceStructured final : Meta {
  void set_output_raw_strided(int64_t index, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                              c10::TensorOptions options) override {
    if (in_place) {
      TORCH_CHECK(out.sizes() == sizes, "output with shape ", out.sizes(),
                  " doesn't match the broadcast shape ", sizes);
    } else {
      const auto dtype = c10::typeMetaToScalarType(options.dtype());
      // Empty strides mean "dense in options' memory format" in the
      // structured-kernel protocol: TensorIterator's fast setup for
      // channels-last inputs asks for a channels-last output that way.
      out = strides.empty() ? empty_device(sizes, dtype, options.memory_format_opt())
                            : empty_device_strided(sizes, strides, dtype);
    }
    Meta::set_output_raw_strided(index, sizes, strides, options);
  }
  const at::Tensor& maybe_get_output(int64_t) override { return out; }

  at::Tensor out;
  bool in_place = false;
};

template <typename Kernel>
void queue(Kernel kernel, const char* op) {
  DeviceContext& context = DeviceContext::get();
  context.metrics().count_op();
  context.launch(std::move(kernel), op);
}

bool is_float(c10::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf;
}

// The common case needs no TensorIterator: same-shape contiguous floating
// operands on the device give a contiguous output of their dtype (no
// broadcasting, no promotion). Anything else takes ATen's full meta.
bool simple_binary(const at::Tensor& a, const at::Tensor& b) {
  return a.device().type() == kVtpu && b.device().type() == kVtpu && a.scalar_type() == b.scalar_type() &&
         is_float(a.scalar_type()) && a.sizes().equals(b.sizes()) && a.is_contiguous() &&
         b.is_contiguous();
}

bool simple_unary(const at::Tensor& a) {
  return a.device().type() == kVtpu && is_float(a.scalar_type()) && a.is_contiguous();
}

// In place, the written tensor must also not partially overlap the input.
bool simple_in_place(const at::Tensor& self, const at::Tensor& other) {
  return simple_binary(self, other) &&
         (!self.storage().is_alias_of(other.storage()) ||
          (self.storage_offset() == other.storage_offset()));
}

#define VTPU_BINARY_ALPHA(op, IR_OP)                                                                \
  at::Tensor op##_tensor(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) { \
    at::Tensor out;                                                                            \
    /* a bool alpha: the meta raises ATen's error for a float result */                       \
    if (simple_binary(self, other) && !alpha.isBoolean()) {                                    \
      out = empty_device(self.sizes(), self.scalar_type());                                    \
    } else {                                                                                   \
      DeviceStructured<at::meta::structured_##op##_Tensor> s;                                  \
      s.meta(self, other, alpha);                                                              \
      out = std::move(s.out);                                                                  \
    }                                                                                          \
    if (generated_kernels_enabled() && exact_in_double(alpha) &&                               \
        converts_without_overflow(alpha, out.scalar_type()) &&                                 \
        launch_generated(ir::OpKind::IR_OP, out, {self, other}, {{"alpha", alpha.toDouble()}})) \
      return out;                                                                              \
    queue([o = KernelOperand::capture(out), a = KernelOperand::capture(self),                  \
           b = KernelOperand::capture(other), alpha] {                                         \
      at::Tensor result = o.host();                                                            \
      at::cpu::op##_out(result, a.host(), b.host(), alpha);                                    \
    }, #op);                                                                                    \
    return out;                                                                                \
  }                                                                                            \
  at::Tensor& op##_tensor_(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) { \
    if (!simple_in_place(self, other) || alpha.isBoolean()) {                                  \
      DeviceStructured<at::meta::structured_##op##_Tensor> s;                                  \
      s.out = self;                                                                            \
      s.in_place = true;                                                                       \
      s.meta(self, other, alpha);                                                              \
    }                                                                                          \
    if (generated_kernels_enabled() && exact_in_double(alpha) &&                               \
        converts_without_overflow(alpha, self.scalar_type()) &&                                \
        launch_generated(ir::OpKind::IR_OP, self, {self, other}, {{"alpha", alpha.toDouble()}})) \
      return self;                                                                             \
    queue([a = KernelOperand::capture(self), b = KernelOperand::capture(other), alpha] {       \
      at::Tensor result = a.host();                                                            \
      at::cpu::op##_out(result, result, b.host(), alpha);                                      \
    }, #op);                                                                                    \
    return self;                                                                               \
  }

#define VTPU_BINARY(op, IR_OP)                                                                      \
  at::Tensor op##_tensor(const at::Tensor& self, const at::Tensor& other) {                   \
    at::Tensor out;                                                                            \
    if (simple_binary(self, other)) {                                                          \
      out = empty_device(self.sizes(), self.scalar_type());                                    \
    } else {                                                                                   \
      DeviceStructured<at::meta::structured_##op##_Tensor> s;                                  \
      s.meta(self, other);                                                                     \
      out = std::move(s.out);                                                                  \
    }                                                                                          \
    if (generated_kernels_enabled() && launch_generated(ir::OpKind::IR_OP, out, {self, other}))  \
      return out;                                                                              \
    queue([o = KernelOperand::capture(out), a = KernelOperand::capture(self),                  \
           b = KernelOperand::capture(other)] {                                                \
      at::Tensor result = o.host();                                                            \
      at::cpu::op##_out(result, a.host(), b.host());                                           \
    }, #op);                                                                                    \
    return out;                                                                                \
  }                                                                                            \
  at::Tensor& op##_tensor_(at::Tensor& self, const at::Tensor& other) {                       \
    if (!simple_in_place(self, other)) {                                                       \
      DeviceStructured<at::meta::structured_##op##_Tensor> s;                                  \
      s.out = self;                                                                            \
      s.in_place = true;                                                                       \
      s.meta(self, other);                                                                     \
    }                                                                                          \
    if (generated_kernels_enabled() && launch_generated(ir::OpKind::IR_OP, self, {self, other})) \
      return self;                                                                             \
    queue([a = KernelOperand::capture(self), b = KernelOperand::capture(other)] {              \
      at::Tensor result = a.host();                                                            \
      at::cpu::op##_out(result, result, b.host());                                             \
    }, #op);                                                                                    \
    return self;                                                                               \
  }

#define VTPU_UNARY(op, IR_OP)                                                                       \
  at::Tensor op##_unary(const at::Tensor& self) {                                              \
    at::Tensor out;                                                                            \
    if (simple_unary(self)) {                                                                  \
      out = empty_device(self.sizes(), self.scalar_type());                                    \
    } else {                                                                                   \
      DeviceStructured<at::meta::structured_##op> s;                                           \
      s.meta(self);                                                                            \
      out = std::move(s.out);                                                                  \
    }                                                                                          \
    if (generated_kernels_enabled() && launch_generated(ir::OpKind::IR_OP, out, {self}))        \
      return out;                                                                              \
    queue([o = KernelOperand::capture(out), a = KernelOperand::capture(self)] {                \
      at::Tensor result = o.host();                                                            \
      at::cpu::op##_out(result, a.host());                                                     \
    }, #op);                                                                                    \
    return out;                                                                                \
  }

VTPU_BINARY_ALPHA(add, Add)
VTPU_BINARY_ALPHA(sub, Sub)
VTPU_BINARY(mul, Mul)
VTPU_BINARY(div, Div)
VTPU_UNARY(exp, Exp)
VTPU_UNARY(log, Log)
VTPU_UNARY(neg, Neg)
VTPU_UNARY(rsqrt, Rsqrt)
VTPU_UNARY(sigmoid, Sigmoid)
VTPU_UNARY(silu, Silu)
VTPU_UNARY(sqrt, Sqrt)
VTPU_UNARY(tanh, Tanh)

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("add.Tensor", TORCH_FN(add_tensor));
  m.impl("add_.Tensor", TORCH_FN(add_tensor_));
  m.impl("sub.Tensor", TORCH_FN(sub_tensor));
  m.impl("sub_.Tensor", TORCH_FN(sub_tensor_));
  m.impl("mul.Tensor", TORCH_FN(mul_tensor));
  m.impl("mul_.Tensor", TORCH_FN(mul_tensor_));
  m.impl("div.Tensor", TORCH_FN(div_tensor));
  m.impl("div_.Tensor", TORCH_FN(div_tensor_));
  m.impl("exp", TORCH_FN(exp_unary));
  m.impl("log", TORCH_FN(log_unary));
  m.impl("neg", TORCH_FN(neg_unary));
  m.impl("rsqrt", TORCH_FN(rsqrt_unary));
  m.impl("sigmoid", TORCH_FN(sigmoid_unary));
  m.impl("silu", TORCH_FN(silu_unary));
  m.impl("sqrt", TORCH_FN(sqrt_unary));
  m.impl("tanh", TORCH_FN(tanh_unary));
}

}  // namespace vtpu::bridge
