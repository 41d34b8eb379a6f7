// The hardware layer: what the engine needs from a device to run its
// generated kernels there. A target = memory + code generation + launch + a
// profile that names it. The host target (the CPU) is always there; the cuda
// target (an NVIDIA GPU, kernels built with nvcc) plugs in beside it where a
// driver and a GPU are present. The layers above see only this interface.
//
// Today the torch device vtpu runs on the host target through the runtime
// and kernel provider directly; the cuda target runs the engine's
// elementwise IR graphs (docs/architecture.md, "Targets").
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "vtpu/cache/compile_cache.h"
#include "vtpu/compiler/launch_abi.h"
#include "vtpu/ir/graph.h"

namespace vtpu::targets {

// A kernel compiled for one target, ready to launch there. Kept alive by
// whoever launches it (the target caches its own copies too). It knows the
// launch it was generated for: its graph's tensor count (outputs + inputs),
// iteration rank and launch-scalar count; a launch with others is refused
// (the kernel would read past its arguments).
class CompiledKernel {
 public:
  CompiledKernel(int num_tensors, int rank, int num_scalars)
      : num_tensors_(num_tensors), rank_(rank), num_scalars_(num_scalars) {}
  virtual ~CompiledKernel() = default;
  int num_tensors() const { return num_tensors_; }
  int rank() const { return rank_; }
  int num_scalars() const { return num_scalars_; }

  // Throws Error(kInvalidArgument) naming `target` unless the launch matches
  // the kernel and every size is non-negative.
  void check_launch(std::span<const compiler::VtpuTensorArg> tensors, int rank, std::size_t scalars,
                    const std::string& target) const;

 private:
  int num_tensors_;
  int rank_;
  int num_scalars_;
};

class Target {
 public:
  virtual ~Target() = default;

  // "host", "cuda".
  virtual const std::string& name() const = 0;
  // What kernels are built for, as a compile-cache key needs it: the cuda
  // target's "sm_90"; the host's compiler identity.
  virtual const std::string& isa() const = 0;
  // The device in words ("NVIDIA H100 80GB HBM3, sm_90, 132 multiprocessors").
  virtual const std::string& description() const = 0;

  // Device memory. allocate throws OutOfMemoryError when the device has too
  // little; release(nullptr) does nothing.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void release(void* data) noexcept = 0;
  virtual void copy_from_host(void* device_destination, const void* host_source, std::size_t bytes) = 0;
  virtual void copy_to_host(void* host_destination, const void* device_source, std::size_t bytes) = 0;

  // Whether compile() accepts `graph` (why not, when it does not).
  virtual bool compiles(const ir::Graph& graph, std::string* why_not) const = 0;
  // The graph's kernel; throws Error(kInvalidArgument) for a graph compiles()
  // refuses, Error(kRuntime) when the target's compiler fails.
  virtual std::shared_ptr<const CompiledKernel> compile(const ir::Graph& graph) = 0;
  // Runs `kernel` (of this target) over `tensors` (outputs, then inputs;
  // device memory; sizes and strides at the iteration rank `rank`, stride 0
  // for broadcast dims) with `scalars` (compiler::launch_scalars of its
  // graph). It may return before the kernel finishes: synchronize() waits.
  virtual void launch(const CompiledKernel& kernel, std::span<const compiler::VtpuTensorArg> tensors, int rank,
                      std::span<const double> scalars) = 0;
  virtual void synchronize() = 0;
};

// The CPU, always available.
std::unique_ptr<Target> make_host_target();

// The first NVIDIA GPU through CUDA's driver (loaded at run time) and nvcc;
// nullptr with the reason in `why_not` when this machine has no driver, no
// GPU or no nvcc. Kernels go through `cache` when one is given (a warm cache
// loads cubins without running nvcc), else are built in each process.
std::unique_ptr<Target> make_cuda_target(std::string* why_not, std::shared_ptr<cache::CompileCache> cache = nullptr);

// A target by name ("host", "cuda"); nullptr with the reason in `why_not`
// for an unknown name or an unavailable target.
std::unique_ptr<Target> make_target(std::string_view name, std::string* why_not);

}  // namespace vtpu::targets
