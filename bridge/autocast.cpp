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

namespace {

// CUDA's policy refuses binary_cross_entropy under autocast: its input is
// usually a sigmoid computed in the lower precision, where log(1 - p)
// saturates; the fused form with logits is safe.
at::Tensor binary_cross_entropy_refused(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                        int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast (as on "
              "CUDA): a sigmoid followed by binary cross entropy loses precision in float16/bfloat16. Use "
              "torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss on the logits, "
              "which are safe to autocast, or compute this loss outside the autocast region in float32.");
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  m.impl("binary_cross_entropy", TORCH_FN(binary_cross_entropy_refused));
  AT_FORALL_LOWER_PRECISION_FP(VTPU_AUTOCAST_LOWER_PRECISION)
  AT_FORALL_FP32(VTPU_AUTOCAST_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(VTPU_AUTOCAST_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(VTPU_AUTOCAST_DIFFERENT_SIGNATURE)
  AT_FORALL_PROMOTE(VTPU_AUTOCAST_PROMOTE)
  // CUDA runs avg_pool3d in float16/bfloat16; ATen's CPU kernel, which vtpu
  // runs, has no 16-bit version for the default layout (a 3-d network raised
  // NotImplementedError under autocast), and CPU autocast computes it in
  // float32: so does vtpu's.
  KERNEL_PRIVATEUSEONE(avg_pool3d, fp32)
}

// Every other op passes through autocast untouched.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

}  // namespace vtpu::bridge
