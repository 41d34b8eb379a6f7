// The cuda target: device memory through CUDA's driver, kernels from the cuda
// code generator built by nvcc for the GPU's architecture, launched on the
// primary context's default stream. Every driver call runs with the target's
// context pushed for its duration (ScopedCurrent), so the caller's own
// current context, if any, is left as it was.
#include <algorithm>
#include <cstring>

#include "cuda_driver.h"
#include "kernel_memo.h"
#include "vtpu/compiler/cuda_codegen.h"
#include "vtpu/compiler/cuda_cubin_cache.h"
#include "vtpu/compiler/nvcc_compiler.h"
#include "vtpu/runtime/error.h"
#include "vtpu/targets/target.h"

namespace vtpu::targets {
namespace {

using cuda::CUdeviceptr;
using runtime::Error;
using runtime::ErrorKind;

// A loaded module and its kernel. It holds the context it was loaded into,
// so the module is unloaded before the context is released, whichever of
// target and kernel goes last.
class CudaKernel final : public CompiledKernel {
 public:
  CudaKernel(const ir::Graph& graph, std::shared_ptr<const cuda::PrimaryContext> context,
             const std::vector<std::uint8_t>& cubin)
      : CompiledKernel(detail::launch_tensor_count(graph), detail::iteration_rank(graph),
                       static_cast<int>(compiler::launch_scalars(graph).size())),
        context_(std::move(context)) {
    const cuda::Driver& driver = context_->driver();
    const cuda::ScopedCurrent current(*context_);
    driver.check(driver.module_load_data(&module_, cubin.data()), "loading a kernel module");
    const cuda::CUresult found = driver.module_get_function(&function_, module_, detail::kKernelSymbol);
    if (found != 0) {
      driver.module_unload(module_);
      driver.check(found, "finding the kernel in its module");
    }
  }
  ~CudaKernel() override {
    try {
      const cuda::ScopedCurrent current(*context_);
      context_->driver().module_unload(module_);
    } catch (const Error&) {
      // The context could not be made current: the module goes with it.
    }
  }
  CudaKernel(const CudaKernel&) = delete;
  CudaKernel& operator=(const CudaKernel&) = delete;
  cuda::CUfunction function() const { return function_; }

 private:
  std::shared_ptr<const cuda::PrimaryContext> context_;
  cuda::CUmodule module_ = nullptr;
  cuda::CUfunction function_ = nullptr;
};

class CudaTarget final : public Target {
 public:
  CudaTarget(std::shared_ptr<const cuda::PrimaryContext> context, std::unique_ptr<compiler::NvccCompiler> nvcc,
             std::shared_ptr<cache::CompileCache> cache)
      : context_(std::move(context)),
        driver_(context_->driver()),
        nvcc_(std::move(nvcc)),
        cache_(std::move(cache)),
        name_("cuda") {
    const cuda::CUdevice device = context_->device();
    int major = 0, minor = 0;
    driver_.check(driver_.device_get_attribute(&major, cuda::kAttributeComputeCapabilityMajor, device),
                  "reading the compute capability");
    driver_.check(driver_.device_get_attribute(&minor, cuda::kAttributeComputeCapabilityMinor, device),
                  "reading the compute capability");
    driver_.check(driver_.device_get_attribute(&multiprocessors_, cuda::kAttributeMultiprocessorCount, device),
                  "reading the multiprocessor count");
    char name[256] = {};
    driver_.check(driver_.device_get_name(name, sizeof(name) - 1, device), "reading the device name");
    isa_ = "sm_" + std::to_string(major) + std::to_string(minor);
    description_ = std::string(name) + ", " + isa_ + ", " + std::to_string(multiprocessors_) + " multiprocessors";
  }

  const std::string& name() const override { return name_; }
  const std::string& isa() const override { return isa_; }
  const std::string& description() const override { return description_; }

  void* allocate(std::size_t bytes) override {
    const cuda::ScopedCurrent current(*context_);
    CUdeviceptr ptr = 0;
    const cuda::CUresult r = driver_.mem_alloc(&ptr, std::max<std::size_t>(bytes, 1));
    if (r == 2)  // CUDA_ERROR_OUT_OF_MEMORY
      throw runtime::OutOfMemoryError("[cuda] out of device memory allocating " + std::to_string(bytes) + " bytes on " +
                                      description_);
    driver_.check(r, "allocating device memory");
    return reinterpret_cast<void*>(ptr);
  }
  void release(void* data) noexcept override {
    if (data == nullptr) return;
    try {
      const cuda::ScopedCurrent current(*context_);
      driver_.mem_free(reinterpret_cast<CUdeviceptr>(data));
    } catch (const Error&) {
      // No current context: the memory goes with the context.
    }
  }
  void copy_from_host(void* destination, const void* source, std::size_t bytes) override {
    if (bytes == 0) return;
    const cuda::ScopedCurrent current(*context_);
    driver_.check(driver_.memcpy_htod(reinterpret_cast<CUdeviceptr>(destination), source, bytes),
                  "copying to the device");
  }
  void copy_to_host(void* destination, const void* source, std::size_t bytes) override {
    if (bytes == 0) return;
    const cuda::ScopedCurrent current(*context_);
    driver_.check(driver_.memcpy_dtoh(destination, reinterpret_cast<CUdeviceptr>(source), bytes),
                  "copying from the device");
  }

  bool compiles(const ir::Graph& graph, std::string* why_not) const override {
    return compiler::cuda_codegen_supports(graph, why_not);
  }

  std::shared_ptr<const CompiledKernel> compile(const ir::Graph& graph) override {
    const compiler::GeneratedKernel kernel = compiler::generate_cuda_kernel(graph, detail::kKernelSymbol);
    const std::string source = compiler::cuda_translation_unit({kernel});
    return memo_.get_or_compile(source, [&] {
      return std::make_shared<CudaKernel>(graph, context_, compiler::cuda_cubin(cache_.get(), *nvcc_, source, isa_));
    });
  }

  void launch(const CompiledKernel& kernel, std::span<const compiler::VtpuTensorArg> tensors, int rank,
              std::span<const double> scalars) override {
    const auto* cuda_kernel = dynamic_cast<const CudaKernel*>(&kernel);
    if (cuda_kernel == nullptr) throw Error(ErrorKind::kInvalidArgument, "[cuda] a kernel of another target");
    kernel.check_launch(tensors, rank, scalars.size(), name_);
    compiler::VtpuCudaLaunchArgs args{};
    args.rank = rank;
    args.total = 1;
    for (int d = 0; d < rank; ++d) {
      args.sizes[d] = tensors[0].sizes[d];
      if (args.sizes[d] != 0 && args.total > INT64_MAX / args.sizes[d])
        throw Error(ErrorKind::kInvalidArgument, "[cuda] launch refused: the element count overflows int64");
      args.total *= args.sizes[d];
    }
    if (args.total == 0) return;
    // Dense: every tensor row-major over the iteration shape (size-1 dims
    // aside), so element i is at offset i in each.
    args.dense = 1;
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      args.data[t] = static_cast<char*>(tensors[t].data);
      std::int64_t expected = 1;
      for (int d = rank - 1; d >= 0; --d) {
        args.strides[t][d] = tensors[t].strides[d];
        if (args.sizes[d] != 1 && args.strides[t][d] != expected) args.dense = 0;
        expected *= args.sizes[d];
      }
    }
    std::copy(scalars.begin(), scalars.end(), args.scalars);
    // Enough blocks to fill every multiprocessor several times over; the
    // grid-stride loop covers the rest.
    const std::int64_t wanted = (args.total + compiler::kCudaBlockSize - 1) / compiler::kCudaBlockSize;
    const auto blocks = static_cast<unsigned>(std::min<std::int64_t>(wanted, std::int64_t{multiprocessors_} * 32));
    void* params[] = {&args};
    const cuda::ScopedCurrent current(*context_);
    driver_.check(driver_.launch_kernel(cuda_kernel->function(), blocks, 1, 1, compiler::kCudaBlockSize, 1, 1, 0,
                                        nullptr, params, nullptr),
                  "launching a kernel");
  }

  // Waits for all work in the context (its default stream: the target has
  // no stream of its own yet).
  void synchronize() override {
    const cuda::ScopedCurrent current(*context_);
    driver_.check(driver_.ctx_synchronize(), "running the device's kernels");
  }

 private:
  std::shared_ptr<const cuda::PrimaryContext> context_;
  const cuda::Driver& driver_;
  int multiprocessors_ = 0;
  std::unique_ptr<compiler::NvccCompiler> nvcc_;
  std::shared_ptr<cache::CompileCache> cache_;  // may be null
  std::string name_;
  std::string isa_;
  std::string description_;
  detail::KernelMemo memo_;
};

}  // namespace

std::unique_ptr<Target> make_cuda_target(std::string* why_not, std::shared_ptr<cache::CompileCache> cache) {
  const cuda::Driver* driver = cuda::load_driver(why_not);
  if (driver == nullptr) return nullptr;
  int count = 0;
  if (driver->device_get_count(&count) != 0 || count == 0) {
    if (why_not != nullptr) *why_not = "the CUDA driver sees no GPU";
    return nullptr;
  }
  std::unique_ptr<compiler::NvccCompiler> nvcc = compiler::NvccCompiler::find(why_not);
  if (nvcc == nullptr) return nullptr;
  try {
    cuda::CUdevice device = 0;
    driver->check(driver->device_get(&device, 0), "opening GPU 0");
    auto target =
        std::make_unique<CudaTarget>(std::make_shared<const cuda::PrimaryContext>(*driver, device), std::move(nvcc),
                                     std::move(cache));
    // nvcc must build for this GPU (an nvcc older than the GPU's architecture
    // cannot): found now, not at the first kernel.
    const ir::Graph probe =
        ir::single_op(ir::OpKind::Neg, {ir::TensorType::contiguous(ir::DType::kFloat32, {1})});
    target->compile(probe);
    return target;
  } catch (const Error& e) {
    if (why_not != nullptr) *why_not = e.what();
    return nullptr;
  }
}

}  // namespace vtpu::targets
