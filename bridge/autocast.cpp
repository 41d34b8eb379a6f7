// torch.autocast("vtpu"): the same cast policy as CUDA's — matmul-like ops
// run in the lower-precision dtype, precision-sensitive ops in float32 —
// registered for the AutocastPrivateUse1 key with ATen's own wrappers.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace vtpu::bridge {

// The redispatch-signature list names ATen types unqualified.
using namespace at;  // NOLINT(google-build-using-namespace)

#define VTPU_AUTOCAST_LOWER_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define VTPU_AUTOCAST_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define VTPU_AUTOCAST_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define VTPU_AUTOCAST_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
#define VTPU_AUTOCAST_DIFFERENT_SIGNATURE(REDISPATCH_FUNC, REGISTER_NAME, REGISTER_SIGNATURE, \
                                          REDISPATCH_SIGNATURE, POLICY)                     \
  KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE(REDISPATCH_FUNC, REGISTER_NAME,       \
                                                      REGISTER_SIGNATURE, REDISPATCH_SIGNATURE, POLICY)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(VTPU_AUTOCAST_LOWER_PRECISION)
  AT_FORALL_FP32(VTPU_AUTOCAST_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(VTPU_AUTOCAST_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(VTPU_AUTOCAST_DIFFERENT_SIGNATURE)
  AT_FORALL_PROMOTE(VTPU_AUTOCAST_PROMOTE)
}

// Every other op passes through autocast untouched.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

}  // namespace vtpu::bridge
