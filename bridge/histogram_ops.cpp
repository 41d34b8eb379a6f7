// torch.histc of integer tensors. ATen's CPU kernel takes floating types only;
// CUDA's takes integers too (transformers' mixture-of-experts layers count
// tokens per expert with histc of an int32 tensor on every device but the CPU
// and MPS, so Mixtral and Qwen2-MoE failed on vtpu). Integers get CUDA's
// semantics here, written with device ops; floating types keep ATen's CPU
// kernel on the host-kernel path (the CPU's bits).
//
// CUDA's rules, followed: bounds are the Scalars as int64; equal bounds and a
// non-empty input take the data's min and max (a host read, as on CUDA);
// still equal, they widen by one on each side; min must then be below max.
// An element in [min, max] goes to bin (v - min) * bins / (max - min) in
// int64 arithmetic, the top edge to the last bin; the counts have the input's
// dtype (wrapping as CUDA's integer atomics do).
#include <ATen/ATen.h>
#include <ATen/native/Resize.h>
#include <torch/library.h>

#include "aten_bridge.h"

namespace vtpu::bridge {
namespace {

bool counts_integers(const at::Tensor& self) {
  return at::isIntegralType(self.scalar_type(), /*includeBool=*/false);
}

at::Tensor integer_histc(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  TORCH_CHECK(bins > 0, "bins must be > 0");
  std::int64_t low = min.to<std::int64_t>();
  std::int64_t high = max.to<std::int64_t>();
  if (low == high && self.numel() > 0) {
    const auto [data_min, data_max] = at::aminmax(self);
    low = data_min.item<std::int64_t>();
    high = data_max.item<std::int64_t>();
  }
  if (low == high) {
    low -= 1;
    high += 1;
  }
  TORCH_CHECK(low < high, "max must be larger than min");
  const at::Tensor values = self.reshape({-1}).to(at::kLong);
  const at::Tensor inside = values.ge(low).logical_and_(values.le(high));
  // Non-negative inside the range, so floor division is CUDA's truncation.
  at::Tensor bin = values.sub(low).mul_(bins).div_(high - low, "floor").clamp_(0, bins - 1);
  bin.masked_fill_(inside.logical_not(), 0);
  at::Tensor counts = at::zeros({bins}, values.options()).scatter_add_(0, bin, inside.to(at::kLong));
  return counts.to(self.scalar_type());
}

// aten::histc and aten::histc.out, boxed: integers here, the rest on the
// host-kernel path with the stack untouched.
void histc_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::size_t arguments = op.schema().arguments().size();
  const std::size_t first = stack->size() - arguments;
  const at::Tensor self = (*stack)[first].toTensor();
  // Refused at the call, as CUDA does (on the host-kernel path ATen's CPU
  // kernel would fail later, inside the queued kernel).
  TORCH_CHECK_NOT_IMPLEMENTED(self.scalar_type() != at::kBool, "\"histc\" not implemented for 'Bool'");
  if (!counts_integers(self)) {
    run_on_host_kernel_path_boxed(op, stack);
    return;
  }
  const int64_t bins = (*stack)[first + 1].toInt();
  const at::Scalar min = (*stack)[first + 2].toScalar();
  const at::Scalar max = (*stack)[first + 3].toScalar();
  at::Tensor result = integer_histc(self, bins, min, max);
  if (arguments == 5) {  // histc.out: CUDA resizes `out` and copies into it
    at::Tensor out = (*stack)[first + 4].toTensor();
    at::native::resize_output(out, result.sizes());
    out.copy_(result);
    result = out;
  }
  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
  stack->push_back(std::move(result));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("histc", torch::CppFunction::makeFromBoxedFunction<&histc_kernel>());
  m.impl("histc.out", torch::CppFunction::makeFromBoxedFunction<&histc_kernel>());
}

}  // namespace vtpu::bridge
