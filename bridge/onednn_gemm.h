// float32 matrix products on oneDNN (inside the torch wheel) instead of MKL.
//
// Why: ATen's CPU GEMM is MKL's, and MKL takes a slower code path on AMD
// processors (it selects its kernels by vendor). oneDNN selects by the
// instruction set, and on this host (AMD EPYC, AVX-512) its float32 matmul
// ran the training suite's shapes at 170-210 GFLOPS on two threads against
// MKL's 105-165, and 0-23% faster on one thread (`/tmp` probe, 2026-12-07).
// Both are extern libraries inside the wheel; DESIGN.md chose them for
// matrix work.
//
// The results are the CPU's to rounding, not its bits (another summation
// order); every mode runs the same call for the same shapes, so the modes
// stay bitwise equal among themselves.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace vtpu::bridge {

// Whether float32 products may go to oneDNN: ATen's oneDNN matmul takes
// float32 on this host (a build with oneDNN, a CPU with AVX-512 BW/VL/DQ or
// AVX-NE-CONVERT; probed once), `torch.backends.mkldnn.enabled` is on (as
// the op was issued, see OneDnnFlagAtIssue), and VTPU_ONEDNN_GEMM is not off.
bool onednn_gemm_enabled();

// `torch.backends.mkldnn.enabled` as the calling thread should see it: the
// value an enclosing OneDnnFlagAtIssue holds, else the global flag.
bool torch_onednn_flag();

// Holds the torch flag's value at an op's issue on the thread that runs the
// op later (the stream's), for the op's duration: the flag is read when a
// product runs, which may be after the Python code that set it moved on.
class OneDnnFlagAtIssue {
 public:
  explicit OneDnnFlagAtIssue(bool enabled);
  ~OneDnnFlagAtIssue();
  OneDnnFlagAtIssue(const OneDnnFlagAtIssue&) = delete;
  OneDnnFlagAtIssue& operator=(const OneDnnFlagAtIssue&) = delete;

 private:
  int previous_;
};

// Whether `out = bias + mat1 @ mat2` (beta, alpha as addmm's; no bias for mm)
// is one oneDNN takes: float32 2-d operands of matching sizes, nothing empty,
// alpha 1 and beta 1 (or no bias), a bias expandable to out's shape.
bool onednn_gemm_accepts(const at::Tensor& out, const at::Tensor& mat1, const at::Tensor& mat2,
                         const at::Tensor& bias, const c10::Scalar& beta, const c10::Scalar& alpha);

// Whether oneDNN reads `t` (2-d, or 3-d: a batch of matrices) as it lies:
// contiguous, or its matrices column-major with no gaps between them.
// ATen's mkldnn_matmul copies any other layout (a row block of a transposed
// matrix, a column block of a row-major one) into a contiguous tensor first.
bool onednn_reads_in_place(const at::Tensor& t);

// Runs it on oneDNN with the calling thread's OpenMP team (one thread under
// SingleThreadedAten). `bias` undefined for mm, and for bmm (3-d operands,
// out = mat1 @ mat2 per batch element). out must not overlap the matrices
// (the caller checks); it may be the bias itself (addmm_).
void onednn_gemm(const at::Tensor& out, const at::Tensor& mat1, const at::Tensor& mat2, const at::Tensor& bias);

// Products (whole or blocks' calls counted once per product) run on oneDNN.
std::uint64_t onednn_gemm_runs();
void count_onednn_gemm_run();

}  // namespace vtpu::bridge
