// The cuda target's code generator: an IR graph of elementwise ops becomes the
// CUDA C++ source of one kernel (a grid-stride loop, one element per thread
// step). The per-element statements are the host generator's
// (host_codegen.cpp), and the helpers and float math the same source
// (kernel_helpers.cpp, kernel_math.h, compiled with --fmad=false): an
// element's operations are the host's, so results are bitwise equal to the
// host target's wherever the host computes without the C library (arithmetic,
// comparisons, casts, exp/log/tanh/erf/sigmoid in float32, 16-bit rounding).
// C-library functions (sin, double exp, ...) come from CUDA's math library
// there and may differ in the last bits. NaNs are NaNs on both, but not the
// same NaN: a GPU's arithmetic returns one canonical NaN where x86 keeps an
// operand's payload and sign.
//
// Launch contract: one VtpuCudaLaunchArgs passed by value (it lives in the
// kernel's parameter space: no device memory to fill before a launch).
// data: outputs then inputs, device pointers at their first element; sizes:
// the iteration shape; strides: per tensor, in elements, 0 for broadcast dims;
// scalars: launch_scalars(graph); dense: every tensor row-major over the
// iteration shape (then element i is at offset i in each).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vtpu/compiler/host_codegen.h"
#include "vtpu/compiler/launch_abi.h"
#include "vtpu/ir/graph.h"

namespace vtpu::compiler {

inline constexpr int kCudaMaxTensors = 24;
inline constexpr int kCudaMaxScalars = 32;

extern "C" {
struct VtpuCudaLaunchArgs {
  std::int64_t total;  // elements of the iteration shape
  std::int32_t rank;
  std::int32_t dense;
  char* data[kCudaMaxTensors];
  std::int64_t sizes[kMaxRank];
  std::int64_t strides[kCudaMaxTensors][kMaxRank];
  double scalars[kCudaMaxScalars];
};
}

// Threads per block of every generated cuda kernel.
inline constexpr int kCudaBlockSize = 256;

// Whether generate_cuda_kernel compiles this graph; `why_not` (may be null)
// says what it refuses.
bool cuda_codegen_supports(const ir::Graph& graph, std::string* why_not);

// Throws Error(kInvalidArgument) naming the reason for a graph that
// cuda_codegen_supports refuses.
GeneratedKernel generate_cuda_kernel(const ir::Graph& graph, const std::string& symbol);

// A complete CUDA translation unit: launch ABI, math and helpers once, then
// the kernels.
std::string cuda_translation_unit(const std::vector<GeneratedKernel>& kernels);

}  // namespace vtpu::compiler
