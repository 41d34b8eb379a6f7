// Strict and debug mode on vTPU's own generated kernels: an ATen op in the
// compiled set becomes a single-op IR graph, its shape-generic kernel comes
// from the ahead-of-time library or the compile cache (compiled on a miss) and
// is launched on the device stream. On by default; VTPU_GENERATED_KERNELS=0
// runs ATen's CPU kernels instead.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "vtpu/compiler/kernel_provider.h"
#include "vtpu/compiler/launch_abi.h"
#include "vtpu/ir/attributes.h"
#include "vtpu/ir/op.h"

namespace vtpu::bridge {

bool generated_kernels_enabled();

// The IR dtype of a torch dtype; nullopt for the ones the IR lacks (complex, ...).
std::optional<ir::DType> to_ir_dtype(c10::ScalarType t);

// Launch scalars and attributes travel as doubles: an integer scalar beyond
// 2^53 would lose its low bits (an int64 hash constant, `t * (2**63 - 1)`),
// so ops with one stay on ATen's kernel.
bool exact_in_double(const c10::Scalar& value);

// ATen converts a scalar argument (add's alpha, addcmul's value) to the type
// it computes in with an overflow check, and raises ("value cannot be
// converted to type int without overflow"); a kernel taking the scalar as a
// double computed with it instead. False when `value` does not convert to
// `dtype` without overflow (or `dtype` is one this check does not know):
// ATen's kernel then raises or computes, as it decides.
bool converts_without_overflow(const c10::Scalar& value, c10::ScalarType dtype);

// Runs `op` over `inputs` into `out` (already allocated with the op's result
// geometry) on a generated kernel. Returns false, having done nothing, when
// the op/dtypes/operands are outside what the generator handles or the
// kernel could not be built; the caller then uses ATen's kernel.
bool launch_generated(ir::OpKind op, const at::Tensor& out, c10::ArrayRef<at::Tensor> inputs,
                      const ir::Attributes& attrs = {});

// A reduction of `input` over `dims` (empty: all) into `out`, which has the
// reduced shape (keepdim or not). Same contract as launch_generated.
// `extra` attributes go on the reduction node (correction, p); `scalars` are
// the kernel's launch scalars (host_codegen_reduction_stats.cpp's contract).
bool launch_generated_reduction(ir::OpKind op, const at::Tensor& out, const at::Tensor& input,
                                std::vector<std::int64_t> dims, bool keepdim, const ir::Attributes& extra = {},
                                std::vector<double> scalars = {});

// Indexing and source ops (host_codegen_indexing.cpp): every tensor in its own
// rank; Python scalars become Constants. An undefined `out` is allocated from
// the IR's inferred type. Returns the output, or an undefined tensor when the
// op stays on ATen's kernel (nothing queued).
at::Tensor launch_generated_indexed(ir::OpKind op, at::Tensor out, c10::ArrayRef<at::Tensor> inputs,
                                    const ir::Attributes& attrs);

// Runs body over [0, total) on the work-sharing pool (the generated kernels'
// parallel_for; VTPU_WORK_SHARING=0: ATen's). `body` must not throw.
void parallel_over(std::int64_t total, std::int64_t grain, compiler::VtpuParallelBody body, void* context);

// The process's kernel provider (nullptr when the cache could not be set up).
compiler::KernelProvider* generated_kernel_provider();

// Runs a generated kernel now (on the stream worker); a bad index reported
// by the kernel raises ATen's error for it.
void run_generated_kernel(compiler::VtpuKernelFn fn, ir::OpKind op, std::int64_t rank,
                          const std::vector<compiler::VtpuTensorArg>& tensors, const std::vector<double>& scalars);
// One launch of a generated elementwise kernel (no index checks).
struct KernelLaunch {
  compiler::VtpuKernelFn fn = nullptr;
  std::int64_t rank = 0;
  std::vector<compiler::VtpuTensorArg> tensors;
  std::vector<double> scalars;
};
// Runs several independent elementwise launches in one parallel region,
// whole launches per thread (each serial inside): one fork/join instead of
// one per launch. Per-element results do not depend on the split.
void run_generated_kernels_batch(const std::vector<KernelLaunch>& launches);

// Adds launches made outside this file (fused mode's) to the generated count.
void count_generated_launches(std::uint64_t n);

// One IR node as one kernel, with the node of ATen's second output beside it
// when `outputs` has two: nll_loss (host_codegen_loss.cpp): {loss} or {loss,
// total_weight} for OpKind::NllLoss, {dx} for OpKind::NllLossBackward;
// max-pooling (host_codegen_pooling.cpp): {values, indices} for
// OpKind::MaxPool2d, {dx} for OpKind::MaxPool2dBackward. `inputs` are the
// node's operands in IR order (optional ones last, when defined). Out tensors
// of the wrong size are resized as ATen's resize_output does. False, having
// queued nothing, when the case stays on ATen's kernel (which then raises its
// own error for arguments the IR rejects).
bool launch_generated_node(ir::OpKind op, const std::vector<at::Tensor>& outputs, c10::ArrayRef<at::Tensor> inputs,
                           const ir::Attributes& attrs);

struct GeneratedKernelStats {
  std::uint64_t launches = 0;
  std::uint64_t compiles = 0;
  double compile_seconds = 0;
  std::uint64_t cache_misses = 0;
  std::map<std::string, std::uint64_t> cache_hits;  // memory, disk, shared, aot
  std::uint64_t shared_refused = 0;  // shared-tier entries whose signature did not verify
  std::uint64_t shared_errors = 0;   // shared-tier requests that failed (store unreachable, ...)
};
GeneratedKernelStats generated_kernel_stats();
void reset_generated_kernel_launches();

}  // namespace vtpu::bridge
