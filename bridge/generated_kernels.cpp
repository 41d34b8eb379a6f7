#include "generated_kernels.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "aten_bridge.h"
#include "device_context.h"
#include "vtpu/cache/compile_cache.h"
#include "vtpu/compiler/kernel_provider.h"
#include "vtpu/ir/graph.h"
#include "vtpu/runtime/error.h"

namespace vtpu::bridge {
namespace {

std::optional<ir::DType> to_ir(c10::ScalarType t) {
  switch (t) {
    case at::kBool: return ir::DType::kBool;
    case at::kByte: return ir::DType::kUInt8;
    case at::kChar: return ir::DType::kInt8;
    case at::kShort: return ir::DType::kInt16;
    case at::kInt: return ir::DType::kInt32;
    case at::kLong: return ir::DType::kInt64;
    case at::kHalf: return ir::DType::kFloat16;
    case at::kBFloat16: return ir::DType::kBFloat16;
    case at::kFloat: return ir::DType::kFloat32;
    case at::kDouble: return ir::DType::kFloat64;
    default: return std::nullopt;
  }
}

compiler::KernelProvider* provider() {
  // Built on first use; nullptr when the cache cannot be set up (then every
  // op stays on ATen's kernels, with one warning).
  static compiler::KernelProvider* instance = []() -> compiler::KernelProvider* {
    try {
      return new compiler::KernelProvider(cache::CompileCache::from_env());
    } catch (const std::exception& e) {
      TORCH_WARN("vtpu: generated kernels disabled: ", e.what());
      return nullptr;
    }
  }();
  return instance;
}

std::atomic<std::uint64_t> g_launches{0};

// What a queued generated kernel needs of one tensor: its storage (kept
// alive), byte offset and geometry aligned to the iteration space.
struct KernelTensor {
  c10::Storage storage;
  std::int64_t byte_offset = 0;
  compiler::VtpuTensorArg arg{};
};

KernelTensor kernel_tensor(const at::Tensor& t, c10::IntArrayRef out_sizes) {
  KernelTensor k;
  k.storage = t.storage();
  k.byte_offset = t.storage_offset() * static_cast<std::int64_t>(t.itemsize());
  const std::size_t rank = out_sizes.size();
  const std::size_t pad = rank - static_cast<std::size_t>(t.dim());
  for (std::size_t d = 0; d < rank; ++d) {
    k.arg.sizes[d] = out_sizes[d];
    if (d < pad) {
      k.arg.strides[d] = 0;  // a missing leading dim broadcasts
    } else {
      const auto src = static_cast<int64_t>(d - pad);
      k.arg.strides[d] = (t.size(src) == 1 && out_sizes[d] != 1) ? 0 : t.stride(src);
    }
  }
  return k;
}

// The launch ABI's parallel_for on ATen's intra-op pool: generated kernels
// and ATen's own kernels share one set of threads.
void aten_parallel_for(std::int64_t total, std::int64_t grain, compiler::VtpuParallelBody body, void* context,
                       void*) {
  at::parallel_for(0, total, grain, [&](std::int64_t begin, std::int64_t end) { body(begin, end, context); });
}

}  // namespace

bool generated_kernels_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("VTPU_GENERATED_KERNELS");
    return env != nullptr && std::string(env) == "1";
  }();
  return enabled;
}

bool launch_generated(ir::OpKind op, const at::Tensor& out, std::initializer_list<at::Tensor> inputs,
                      const ir::Attributes& attrs) {
  if (out.dim() > compiler::kMaxRank || !to_ir(out.scalar_type())) return false;
  ir::Graph graph;
  std::vector<ir::ValueId> ids;
  for (const at::Tensor& t : inputs) {
    const auto dtype = to_ir(t.scalar_type());
    if (t.device().type() != kVtpu || !dtype || t.is_conj() || t.is_neg()) return false;
    ids.push_back(graph.add_input(ir::TensorType{*dtype, t.sizes().vec(), t.strides().vec()}));
  }
  compiler::VtpuKernelFn fn = nullptr;
  try {
    const ir::ValueId result = graph.add_node(op, ids, attrs);
    // The IR's inference must agree with ATen's, or this is not the same op.
    if (graph.type(result).dtype != *to_ir(out.scalar_type()) || graph.type(result).sizes != out.sizes().vec())
      return false;
    graph.mark_output(result);
    compiler::KernelProvider* kernels = provider();
    if (kernels == nullptr) return false;
    fn = kernels->get(graph);
  } catch (const runtime::Error& e) {
    // Outside the generator's set (kInvalidArgument) or a failed compile:
    // ATen's kernel runs instead, so no result is lost.
    if (e.kind() == runtime::ErrorKind::kRuntime) TORCH_WARN_ONCE("vtpu: generated kernel unavailable: ", e.what());
    return false;
  }

  std::vector<KernelTensor> tensors;
  tensors.push_back(kernel_tensor(out, out.sizes()));
  for (const at::Tensor& t : inputs) tensors.push_back(kernel_tensor(t, out.sizes()));
  const auto rank = static_cast<std::int32_t>(out.dim());
  DeviceContext& context = DeviceContext::get();
  context.metrics().count_op();
  ++g_launches;
  context.launch([fn, rank, tensors = std::move(tensors)]() mutable {
    std::vector<compiler::VtpuTensorArg> args;
    args.reserve(tensors.size());
    for (auto& t : tensors) {
      compiler::VtpuTensorArg arg = t.arg;
      arg.data = static_cast<char*>(t.storage.unsafeGetStorageImpl()->mutable_data()) + t.byte_offset;
      args.push_back(arg);
    }
    compiler::VtpuLaunchArgs launch{compiler::kLaunchAbiVersion, rank, static_cast<std::int32_t>(args.size()),
                                    args.data(), nullptr, &aten_parallel_for, nullptr};
    fn(&launch);
  });
  return true;
}

GeneratedKernelStats generated_kernel_stats() {
  GeneratedKernelStats s;
  s.launches = g_launches.load();
  if (!generated_kernels_enabled()) return s;
  compiler::KernelProvider* kernels = provider();
  if (kernels == nullptr) return s;
  const auto p = kernels->stats();
  s.compiles = p.compiles;
  s.compile_seconds = p.compile_seconds;
  const auto c = kernels->cache_stats();
  s.cache_misses = c.misses;
  s.cache_hits = {{"memory", p.memory_hits + c.hits_in("memory")}, {"disk", c.hits_in("disk")}};
  return s;
}

void reset_generated_kernel_launches() { g_launches = 0; }

}  // namespace vtpu::bridge
