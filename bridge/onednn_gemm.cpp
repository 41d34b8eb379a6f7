#include "onednn_gemm.h"

#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <atomic>
#include <exception>

#include "env_knobs.h"

// ATen's oneDNN matmul (aten/src/ATen/native/mkldnn/Matmul.cpp): result =
// beta * result + alpha * (mat1 @ mat2), 2-d or 3-d. Exported by
// libtorch_cpu, its header not installed. Weak, so a torch build without
// oneDNN still loads the bridge (the address is then null).
namespace at::native {
__attribute__((weak)) void mkldnn_matmul(const at::Tensor& mat1, const at::Tensor& mat2, const at::Tensor& result,
                                         float beta, float alpha);
}  // namespace at::native

namespace vtpu::bridge {
namespace {

std::atomic<std::uint64_t> g_runs{0};

// -1: no OneDnnFlagAtIssue on this thread; else its value.
thread_local int t_flag_at_issue = -1;

bool is_one(const c10::Scalar& s) { return !s.isComplex() && s.toDouble() == 1.0; }

}  // namespace

bool torch_onednn_flag() {
  return t_flag_at_issue >= 0 ? t_flag_at_issue == 1 : at::globalContext().userEnabledMkldnn();
}

OneDnnFlagAtIssue::OneDnnFlagAtIssue(bool enabled) : previous_(t_flag_at_issue) {
  t_flag_at_issue = enabled ? 1 : 0;
}

OneDnnFlagAtIssue::~OneDnnFlagAtIssue() { t_flag_at_issue = previous_; }

namespace {

// Whether ATen's mkldnn_matmul takes float32 on this host, asked once by a
// 2x2 product. Builds without oneDNN export a stub that raises, and ATen
// refuses float32 unless the CPU has AVX-512 BW/VL/DQ or AVX-NE-CONVERT (or
// ONEDNN_MAX_CPU_ISA caps oneDNN below them): AVX2-only processors keep MKL.
bool onednn_takes_float32() {
  static const bool takes = [] {
    if (&at::native::mkldnn_matmul == nullptr || !at::hasMKLDNN()) return false;
    try {
      // Plain CPU kernels, unseen by autograd or a Python dispatch mode
      // active where the first product is issued.
      const c10::impl::ExcludeDispatchKeyGuard plain(
          c10::autograd_dispatch_keyset_with_ADInplaceOrView |
          c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
      const at::Tensor a = at::ones({2, 2}, at::kFloat), out = at::empty({2, 2}, at::kFloat);
      at::native::mkldnn_matmul(a, a, out, 0.0F, 1.0F);
      return out.equal(at::full({2, 2}, 2.0F, at::kFloat));
    } catch (const std::exception&) {
      return false;
    }
  }();
  return takes;
}

}  // namespace

bool onednn_gemm_enabled() {
  static const bool switched_on = env_switch("VTPU_ONEDNN_GEMM", true);
  return switched_on && torch_onednn_flag() && onednn_takes_float32();
}

bool onednn_gemm_accepts(const at::Tensor& out, const at::Tensor& mat1, const at::Tensor& mat2,
                         const at::Tensor& bias, const c10::Scalar& beta, const c10::Scalar& alpha) {
  for (const at::Tensor* t : {&out, &mat1, &mat2})
    if (t->scalar_type() != at::kFloat || t->dim() != 2 || t->numel() == 0) return false;
  if (mat1.size(1) != mat2.size(0) || out.size(0) != mat1.size(0) || out.size(1) != mat2.size(1)) return false;
  if (!bias.defined()) return true;
  // beta other than 1 scales the bias and alpha the product: oneDNN's sum
  // post-op and output scale would round them otherwise than MKL's GEMM;
  // nn.Linear's addmm has both 1.
  return bias.scalar_type() == at::kFloat && bias.dim() <= 2 && at::is_expandable_to(bias.sizes(), out.sizes()) &&
         is_one(beta) && is_one(alpha);
}

bool onednn_reads_in_place(const at::Tensor& t) {
  if (t.is_contiguous()) return t.dim() == 2 || t.dim() == 3;
  const std::int64_t d = t.dim();
  if (d != 2 && d != 3) return false;
  const bool column_major = t.stride(d - 2) == 1 && t.stride(d - 1) == t.size(d - 2);
  return column_major && (d == 2 || t.stride(0) == t.size(1) * t.size(2));
}

void onednn_gemm(const at::Tensor& out, const at::Tensor& mat1, const at::Tensor& mat2, const at::Tensor& bias) {
  if (!bias.defined()) {
    // beta = 0: oneDNN writes out without reading it (a NaN in the fresh
    // out= buffer does not propagate, as with the BLAS's beta = 0).
    at::native::mkldnn_matmul(mat1, mat2, out, 0.0F, 1.0F);
    return;
  }
  // The bias goes into out first and is added by oneDNN's sum post-op, as
  // ATen's addmm does before its GEMM. The in-place addmm_ passes out's own
  // memory as the bias (another tensor object on the host path): nothing
  // to copy.
  const at::Tensor expanded = bias.expand(out.sizes());
  if (expanded.const_data_ptr() != out.const_data_ptr() || expanded.strides() != out.strides()) out.copy_(expanded);
  at::native::mkldnn_matmul(mat1, mat2, out, 1.0F, 1.0F);
}

std::uint64_t onednn_gemm_runs() { return g_runs.load(std::memory_order_relaxed); }

void count_onednn_gemm_run() { g_runs.fetch_add(1, std::memory_order_relaxed); }

}  // namespace vtpu::bridge
