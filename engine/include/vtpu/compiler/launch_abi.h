// The kernel launch ABI: how the engine calls a generated kernel. Plain C so
// the generated source can declare the same structs without engine headers
// (kLaunchAbiSource below is that declaration, pasted into every kernel).
// Sizes and strides are launch arguments, which keeps kernels shape-generic.
#pragma once

#include <cstdint>

namespace vtpu::compiler {

inline constexpr int kMaxRank = 8;
inline constexpr std::uint32_t kLaunchAbiVersion = 2;

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

// How a kernel reports a bad input it met while running (an index out of
// range): the first report wins (kernels set `code` with an atomic
// compare-and-swap from 0), the element is skipped without touching memory
// out of bounds, and the host raises the error after the kernel returns.
enum VtpuStatusCode : std::int32_t { kVtpuOk = 0, kVtpuIndexOutOfRange = 1 };
struct VtpuKernelStatus {
  std::int32_t code;     // VtpuStatusCode
  std::int32_t operand;  // which input held the bad value
  std::int64_t value;    // the bad index
  std::int64_t bound;    // the size it had to be below (and >= -bound)
  std::int64_t dim;      // the dim it indexes
};

struct VtpuLaunchArgs {
  std::uint32_t abi_version;
  std::int32_t rank;              // of the iteration space (the output)
  std::int32_t num_tensors;       // outputs first, then inputs
  VtpuTensorArg* tensors;
  const double* scalars;          // op attributes that are runtime values (alpha, eps, ...)
  VtpuParallelFor parallel_for;   // may be null: run serially
  void* runner;
  VtpuKernelStatus* status;       // may be null: bad elements are still skipped
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
struct VtpuKernelStatus { int32_t code; int32_t operand; int64_t value; int64_t bound; int64_t dim; };
#define VTPU_INDEX_OUT_OF_RANGE 1
struct VtpuLaunchArgs { uint32_t abi_version; int32_t rank; int32_t num_tensors; struct VtpuTensorArg* tensors;
                        const double* scalars; VtpuParallelFor parallel_for; void* runner;
                        struct VtpuKernelStatus* status; };
// Records the first bad index of a launch (thread-safe; later ones are dropped).
static inline void vtpu_report_index(struct VtpuKernelStatus* st, int32_t operand, int64_t value, int64_t bound,
                                     int64_t dim) {
  if (st == 0) return;
  int32_t expected = 0;
  if (__atomic_compare_exchange_n(&st->code, &expected, -1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    st->operand = operand; st->value = value; st->bound = bound; st->dim = dim;
    __atomic_store_n(&st->code, VTPU_INDEX_OUT_OF_RANGE, __ATOMIC_RELEASE);
  }
}
)ABI";

}  // namespace vtpu::compiler
