// torch.autocast("vtpu"): the same cast policy as CUDA's — matmul-like ops
// run in the lower-precision dtype, precision-sensitive ops in float32 —
// registered for the AutocastPrivateUse1 key with ATen's own wrappers.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace vtpu::bridge {

#define VTPU_AUTOCAST_LOWER_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define VTPU_AUTOCAST_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(VTPU_AUTOCAST_LOWER_PRECISION)
  AT_FORALL_FP32(VTPU_AUTOCAST_FP32)
}

// Every other op passes through autocast untouched.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

}  // namespace vtpu::bridge
