// The host target: the CPU's memory, the host code generator, the system
// compiler and a dlopen'ed shared object per kernel.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernel_memo.h"
#include "vtpu/compiler/host_codegen.h"
#include "vtpu/compiler/kernel_library.h"
#include "vtpu/compiler/system_compiler.h"
#include "vtpu/runtime/error.h"
#include "vtpu/targets/target.h"

namespace vtpu::targets {
namespace {

using runtime::Error;
using runtime::ErrorKind;

class HostKernel final : public CompiledKernel {
 public:
  HostKernel(const ir::Graph& graph, compiler::KernelLibrary library)
      : CompiledKernel(detail::launch_tensor_count(graph), detail::iteration_rank(graph),
                       static_cast<int>(compiler::launch_scalars(graph).size())),
        library_(std::move(library)),
        fn_(library_.get(detail::kKernelSymbol)) {}
  compiler::VtpuKernelFn fn() const { return fn_; }

 private:
  compiler::KernelLibrary library_;
  compiler::VtpuKernelFn fn_;
};

class HostTarget final : public Target {
 public:
  HostTarget() : name_("host"), isa_(compiler_.identity()), description_("the host CPU (" + isa_ + ")") {}

  const std::string& name() const override { return name_; }
  const std::string& isa() const override { return isa_; }
  const std::string& description() const override { return description_; }

  void* allocate(std::size_t bytes) override {
    // 64-byte alignment, as the runtime's allocator gives (a cache line).
    const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + 63) / 64 * 64;
    void* data = std::aligned_alloc(64, rounded);
    if (data == nullptr) throw runtime::OutOfMemoryError("[host] cannot allocate " + std::to_string(bytes) + " bytes");
    return data;
  }
  void release(void* data) noexcept override { std::free(data); }
  void copy_from_host(void* destination, const void* source, std::size_t bytes) override {
    if (bytes > 0) std::memcpy(destination, source, bytes);
  }
  void copy_to_host(void* destination, const void* source, std::size_t bytes) override {
    if (bytes > 0) std::memcpy(destination, source, bytes);
  }

  bool compiles(const ir::Graph& graph, std::string* why_not) const override {
    // The host generator also builds reductions, norms, ... with launch
    // contracts of their own; launch() here is the elementwise contract.
    for (const auto& node : graph.nodes())
      if (node.op != ir::OpKind::Input && node.op != ir::OpKind::Constant && !ir::is_elementwise(node.op)) {
        if (why_not != nullptr) *why_not = std::string(ir::name(node.op)) + " is not an elementwise op";
        return false;
      }
    try {
      compiler::generate_host_kernel(graph, detail::kKernelSymbol);
      return true;
    } catch (const Error& e) {
      if (why_not != nullptr) *why_not = e.what();
      return false;
    }
  }

  std::shared_ptr<const CompiledKernel> compile(const ir::Graph& graph) override {
    if (std::string why; !compiles(graph, &why)) throw Error(ErrorKind::kInvalidArgument, "[host] " + why);
    const compiler::GeneratedKernel kernel = compiler::generate_host_kernel(graph, detail::kKernelSymbol);
    const std::string source = compiler::host_translation_unit({kernel});
    return memo_.get_or_compile(source, [&] {
      return std::make_shared<HostKernel>(graph, compiler::KernelLibrary::load(compiler_.compile(source)));
    });
  }

  void launch(const CompiledKernel& kernel, std::span<const compiler::VtpuTensorArg> tensors, int rank,
              std::span<const double> scalars) override {
    const auto* host_kernel = dynamic_cast<const HostKernel*>(&kernel);
    if (host_kernel == nullptr) throw Error(ErrorKind::kInvalidArgument, "[host] a kernel of another target");
    kernel.check_launch(tensors, rank, scalars.size(), name_);
    std::vector<compiler::VtpuTensorArg> args(tensors.begin(), tensors.end());
    compiler::VtpuKernelStatus status{};
    // Serial: the differential tests compare targets, not thread counts (the
    // runtime's launches add its thread pool).
    const compiler::VtpuLaunchArgs launch_args{compiler::kLaunchAbiVersion, rank, static_cast<std::int32_t>(args.size()),
                                               args.data(), scalars.data(), nullptr, nullptr, &status};
    host_kernel->fn()(&launch_args);
    if (status.code != compiler::kVtpuOk)
      throw Error(ErrorKind::kInvalidArgument, "[host] index " + std::to_string(status.value) + " out of range");
  }

  void synchronize() override {}  // launches run to completion on the caller's thread

 private:
  compiler::SystemCompiler compiler_;
  std::string name_;
  std::string isa_;
  std::string description_;
  detail::KernelMemo memo_;
};

}  // namespace

std::unique_ptr<Target> make_host_target() { return std::make_unique<HostTarget>(); }

}  // namespace vtpu::targets
