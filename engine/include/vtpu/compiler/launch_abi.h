// The kernel launch ABI: how the engine calls a generated kernel. Plain C so
// the generated source can declare the same structs without engine headers
// (kLaunchAbiSource below is that declaration, pasted into every kernel).
// Sizes and strides are launch arguments, which keeps kernels shape-generic.
#pragma once

#include <cstdint>

namespace vtpu::compiler {

inline constexpr int kMaxRank = 8;
inline constexpr std::uint32_t kLaunchAbiVersion = 1;

extern "C" {

struct VtpuTensorArg {
  void* data;                    // first element (storage offset applied)
  std::int64_t sizes[kMaxRank];
  std::int64_t strides[kMaxRank];  // in elements; 0 for broadcast dimensions
};

// Runs body(begin, end, context) over [0, total) in chunks, possibly on many
// threads; supplied by the host so generated kernels share its thread pool.
typedef void (*VtpuParallelBody)(std::int64_t begin, std::int64_t end, void* context);
typedef void (*VtpuParallelFor)(std::int64_t total, std::int64_t grain, VtpuParallelBody body,
                                void* context, void* runner);

struct VtpuLaunchArgs {
  std::uint32_t abi_version;
  std::int32_t rank;              // of the iteration space (the output)
  std::int32_t num_tensors;       // outputs first, then inputs
  VtpuTensorArg* tensors;
  const double* scalars;          // op attributes that are runtime values (alpha, eps, ...)
  VtpuParallelFor parallel_for;   // may be null: run serially
  void* runner;
};

typedef void (*VtpuKernelFn)(const VtpuLaunchArgs* args);

}  // extern "C"

// The same declarations as C source, for the generated kernels.
inline constexpr const char* kLaunchAbiSource = R"ABI(
#include <stdint.h>
#define VTPU_MAX_RANK 8
struct VtpuTensorArg { void* data; int64_t sizes[VTPU_MAX_RANK]; int64_t strides[VTPU_MAX_RANK]; };
typedef void (*VtpuParallelBody)(int64_t, int64_t, void*);
typedef void (*VtpuParallelFor)(int64_t, int64_t, VtpuParallelBody, void*, void*);
struct VtpuLaunchArgs { uint32_t abi_version; int32_t rank; int32_t num_tensors; struct VtpuTensorArg* tensors;
                        const double* scalars; VtpuParallelFor parallel_for; void* runner; };
)ABI";

}  // namespace vtpu::compiler
