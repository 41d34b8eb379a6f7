#include "generated_kernels.h"
#include "env_knobs.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <string>
#include <unordered_map>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "aten_bridge.h"
#include "memory_overlap.h"
#include "device_context.h"
#include "fused_window.h"
#include "vtpu/cache/compile_cache.h"
#include "vtpu/cache/shared_tier.h"
#include "vtpu/compiler/host_codegen.h"
#include "vtpu/compiler/kernel_provider.h"
#include "vtpu/ir/canonical.h"
#include "vtpu/ir/graph.h"
#include "vtpu/runtime/error.h"
#include "vtpu/runtime/work_sharing_pool.h"

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

// The ahead-of-time kernel library installed beside this module (the
// package's libvtpu_kernels.so); VTPU_AOT_KERNELS=0 leaves it out, so every
// kernel comes from the cache or the compiler.
std::optional<std::string> aot_library_path() {
  if (!env_switch("VTPU_AOT_KERNELS", true)) return std::nullopt;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&aot_library_path), &info) == 0 || info.dli_fname == nullptr)
    return std::nullopt;
  const auto path = std::filesystem::path(info.dli_fname).parent_path() / "libvtpu_kernels.so";
  if (!std::filesystem::exists(path)) return std::nullopt;
  return path.string();
}

c10::ScalarType from_ir(ir::DType t) {
  switch (t) {
    case ir::DType::kBool: return at::kBool;
    case ir::DType::kUInt8: return at::kByte;
    case ir::DType::kInt8: return at::kChar;
    case ir::DType::kInt16: return at::kShort;
    case ir::DType::kInt32: return at::kInt;
    case ir::DType::kInt64: return at::kLong;
    case ir::DType::kFloat16: return at::kHalf;
    case ir::DType::kBFloat16: return at::kBFloat16;
    case ir::DType::kFloat32: return at::kFloat;
    case ir::DType::kFloat64: return at::kDouble;
  }
  return at::kFloat;
}

compiler::KernelProvider* provider() {
  // Built on first use; nullptr when the cache cannot be set up (then every
  // op stays on ATen's kernels, with one warning).
  static compiler::KernelProvider* instance = []() -> compiler::KernelProvider* {
    compiler::KernelProvider* created = nullptr;
    try {
      created = new compiler::KernelProvider(cache::CompileCache::from_env());
    } catch (const std::exception& e) {
      TORCH_WARN("vtpu: generated kernels disabled: ", e.what());
      return nullptr;
    }
    // A refused entry or an unreachable store is said once, as a Python
    // warning (or on stderr from a background thread), not only counted.
    for (const auto& tier : created->cache().tiers())
      if (auto* shared = dynamic_cast<cache::SharedTier*>(tier.get()))
        shared->set_notice([](const std::string& message) { TORCH_WARN("vtpu: ", message); });
    if (const auto path = aot_library_path()) {
      try {
        created->attach_aot(std::make_shared<compiler::KernelLibrary>(compiler::KernelLibrary::open(*path)));
      } catch (const std::exception& e) {
        // Not fatal: the kernels compile at run time instead.
        TORCH_WARN("vtpu: ahead-of-time kernel library not used (", *path, "): ", e.what());
      }
    }
    return created;
  }();
  return instance;
}

std::atomic<std::uint64_t> g_launches{0};

// What a queued generated kernel needs of one tensor: its data pointer and
// geometry. The storage is deliberately not kept alive: when Python drops a
// tensor its block returns to the allocator at once and the next allocation
// may reuse it, which is safe because that allocation's kernels are queued
// behind this one on the in-order stream (CUDA's stream-ordered reuse).
// Holding the storage instead kept every output of a long queue alive and
// made memory grow with the queue depth.
struct KernelTensor {
  compiler::VtpuTensorArg arg{};
};

void* data_of(const at::Tensor& t) {
  return static_cast<char*>(t.storage().mutable_data()) + t.storage_offset() * static_cast<std::int64_t>(t.itemsize());
}

KernelTensor kernel_tensor(const at::Tensor& t, c10::IntArrayRef out_sizes) {
  KernelTensor k;
  k.arg.data = data_of(t);
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

// A tensor described in its own rank (the indexing kernels' contract).
KernelTensor own_rank_kernel_tensor(const at::Tensor& t) {
  KernelTensor k;
  k.arg.data = data_of(t);
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    k.arg.sizes[d] = t.size(d);
    k.arg.strides[d] = t.stride(d);
  }
  return k;
}

// A contiguous tensor as one dimension of all its elements.
KernelTensor flat_kernel_tensor(const at::Tensor& t) {
  KernelTensor k;
  k.arg.data = data_of(t);
  k.arg.sizes[0] = t.numel();
  k.arg.strides[0] = 1;
  return k;
}

// The launch ABI's parallel_for: the work-sharing pool (the caller never
// waits for a helper to wake; see work_sharing_pool.h), started with
// ATen's thread count, each launch using torch.get_num_threads() threads
// (the pool starts more helpers when that was raised). VTPU_WORK_SHARING=0 uses ATen's parallel_for instead (OpenMP's
// fork-join), for comparison.
bool work_sharing_enabled() {
  static const bool enabled = env_switch("VTPU_WORK_SHARING", true);
  return enabled;
}

runtime::WorkSharingPool& work_sharing_pool() {
  // Leaked on purpose, like the device context: kernels may still run while
  // static destructors do.
  static runtime::WorkSharingPool* pool = new runtime::WorkSharingPool(std::max(at::get_num_threads() - 1, 0));
  return *pool;
}

}  // namespace

void parallel_over(std::int64_t total, std::int64_t grain, compiler::VtpuParallelBody body, void* context) {
  if (work_sharing_enabled()) {
    work_sharing_pool().run(total, grain, at::get_num_threads(), body, context);
    return;
  }
  at::parallel_for(0, total, grain, [&](std::int64_t begin, std::int64_t end) { body(begin, end, context); });
}

namespace {

void launch_parallel_for(std::int64_t total, std::int64_t grain, compiler::VtpuParallelBody body, void* context,
                         void*) {
  parallel_over(total, grain, body, context);
}

// Queues the kernel; device pointers are resolved when it runs (storages
// are kept alive by the task).
void enqueue(compiler::VtpuKernelFn fn, ir::OpKind op, std::int64_t rank, std::vector<KernelTensor> tensors,
             std::vector<double> scalars = {}) {
  DeviceContext& context = DeviceContext::get();
  context.metrics().count_op();
  ++g_launches;
  std::vector<compiler::VtpuTensorArg> args;
  args.reserve(tensors.size());
  for (const auto& t : tensors) args.push_back(t.arg);
  context.launch([fn, op, rank, args = std::move(args), scalars = std::move(scalars)]() {
    run_generated_kernel(fn, op, rank, args, scalars);
  }, std::string(ir::name(op)));
}

// Finishes `graph` with the node `add_result` appends and returns its
// kernel, or nullptr (having warned once about a failed compile) when the op
// is outside the generator's set, the IR's inferred result disagrees with
// ATen's `out` (then it is not the same op), or the kernel cannot be built.
// ATen's kernel then runs instead, so no result is lost.
// `sizes` is the iteration shape the graph must produce (out's, or its flat
// element count).
template <typename AddResult>
compiler::VtpuKernelFn resolve_kernel(ir::Graph& graph, const at::Tensor& out, c10::IntArrayRef sizes,
                                      AddResult add_result) {
  try {
    const ir::ValueId result = add_result();
    if (graph.type(result).dtype != *to_ir(out.scalar_type()) || graph.type(result).sizes != sizes.vec())
      return nullptr;
    graph.mark_output(result);
    compiler::KernelProvider* kernels = provider();
    return kernels == nullptr ? nullptr : kernels->get(graph);
  } catch (const runtime::Error& e) {
    if (e.kind() == runtime::ErrorKind::kRuntime) TORCH_WARN_ONCE("vtpu: generated kernel unavailable: ", e.what());
    return nullptr;
  }
}

}  // namespace

std::optional<ir::DType> to_ir_dtype(c10::ScalarType t) { return to_ir(t); }

compiler::KernelProvider* generated_kernel_provider() { return provider(); }

void count_generated_launches(std::uint64_t n) { g_launches += n; }

void run_generated_kernels_batch(const std::vector<KernelLaunch>& launches) {
  // Each launch of the batch is small (its own parallel_for is off); threads
  // share the launches.
  parallel_over(static_cast<std::int64_t>(launches.size()), 1, [](std::int64_t begin, std::int64_t end, void* raw) {
    const auto& all = *static_cast<const std::vector<KernelLaunch>*>(raw);
    for (std::int64_t i = begin; i < end; ++i) {
      const KernelLaunch& k = all[static_cast<std::size_t>(i)];
      compiler::VtpuKernelStatus status{};
      compiler::VtpuLaunchArgs launch{compiler::kLaunchAbiVersion, static_cast<std::int32_t>(k.rank),
                                      static_cast<std::int32_t>(k.tensors.size()),
                                      const_cast<compiler::VtpuTensorArg*>(k.tensors.data()), k.scalars.data(),
                                      nullptr, nullptr, &status};
      k.fn(&launch);
    }
  }, const_cast<std::vector<KernelLaunch>*>(&launches));
}

void run_generated_kernel(compiler::VtpuKernelFn fn, ir::OpKind op, std::int64_t rank,
                          const std::vector<compiler::VtpuTensorArg>& tensors, const std::vector<double>& scalars) {
  compiler::VtpuKernelStatus status{};
  compiler::VtpuLaunchArgs launch{compiler::kLaunchAbiVersion, static_cast<std::int32_t>(rank),
                                  static_cast<std::int32_t>(tensors.size()),
                                  const_cast<compiler::VtpuTensorArg*>(tensors.data()), scalars.data(),
                                  &launch_parallel_for, nullptr, &status};
  fn(&launch);
  // The kernel skipped the bad elements; the error is ATen's for the same
  // input (the launch adds the op's name and call site on the way out).
  if (status.code != compiler::kVtpuOk) {
    // nll_loss: ATen's TORCH_CHECK_INDEX (IndexError) naming the target.
    TORCH_CHECK_INDEX(op != ir::OpKind::NllLoss && op != ir::OpKind::NllLossBackward, "Target ", status.value,
                      " is out of bounds.");
    // ATen's CPU kernel does not check: it would write outside the plane.
    TORCH_CHECK_INDEX(op != ir::OpKind::MaxPool2dBackward, "max_pool2d backward: index ", status.value,
                      " is out of range for an input plane of ", status.bound, " elements");
    // gather/scatter_add check with TORCH_CHECK (RuntimeError), the others
    // with TORCH_CHECK_INDEX (IndexError).
    TORCH_CHECK(op != ir::OpKind::Gather && op != ir::OpKind::ScatterAdd, "index ", status.value,
                " is out of bounds for dimension ", status.dim, " with size ", status.bound);
    TORCH_CHECK_INDEX(false, "index out of range in self");
  }
}

bool generated_kernels_enabled() {
  // On by default; VTPU_GENERATED_KERNELS=0 runs ATen's CPU kernels instead.
  static const bool enabled = env_switch("VTPU_GENERATED_KERNELS", true);
  return enabled;
}

namespace {

// A Python number ATen wrapped into a 0-dim CPU tensor.
bool is_python_scalar(const at::Tensor& t) {
  return t.device().is_cpu() && t.dim() == 0 && t.unsafeGetTensorImpl()->is_wrapped_number();
}

// Any 0-dim CPU tensor: ATen's elementwise kernels read it once as a scalar
// (wrapped or not), and CPU tensors are computed when their op returns, so
// its value at dispatch is the value the op sees. Compiled optimizer steps
// pass bias corrections this way (torch.optim keeps `step` on the CPU).
// Type promotion can differ from a wrapped number's (a 0-dim float64 tensor
// beside an int tensor gives float64); resolve_kernel() then refuses the
// kernel, as the IR's dtype differs from the output ATen allocated.
bool is_host_scalar(const at::Tensor& t) { return t.device().is_cpu() && t.dim() == 0; }

// A host scalar's value read from its memory, as item() gives it: item()
// goes through the dispatcher, and a launch with a Python scalar reads it up
// to three times (memo key, launch scalars, fused recording). Other dtypes
// (half, complex, ...) take item().
c10::Scalar host_scalar(const at::Tensor& t) {
  const void* p = t.const_data_ptr();
  switch (t.scalar_type()) {
    case at::kDouble: return c10::Scalar(*static_cast<const double*>(p));
    case at::kFloat: return c10::Scalar(static_cast<double>(*static_cast<const float*>(p)));
    case at::kLong: return c10::Scalar(*static_cast<const std::int64_t*>(p));
    case at::kInt: return c10::Scalar(static_cast<std::int64_t>(*static_cast<const std::int32_t*>(p)));
    case at::kBool: return c10::Scalar(*static_cast<const bool*>(p));
    default: return t.item();
  }
}

// A Python scalar as a Constant node (same promotion rules as a wrapped
// number); its value is passed at launch, so the kernel serves every value.
ir::ValueId add_python_scalar(ir::Graph& graph, const at::Tensor& t) {
  const c10::Scalar value = host_scalar(t);
  ir::AttrValue attr = value.isBoolean() ? ir::AttrValue(value.toBool())
                       : value.isIntegral(false) ? ir::AttrValue(value.toLong())
                                                 : ir::AttrValue(value.toDouble());
  return graph.add_node(ir::OpKind::Constant, {}, {{"value", attr}});
}

ir::AttrValue python_scalar_value(const at::Tensor& t) {
  const c10::Scalar value = host_scalar(t);
  return value.isBoolean() ? ir::AttrValue(value.toBool())
         : value.isIntegral(false) ? ir::AttrValue(value.toLong())
                                   : ir::AttrValue(value.toDouble());
}

// Fused mode: the elementwise op goes into the pending window, with the
// launch strict mode would make (fused_window.h). `tensors`/`scalars` are
// that launch's arguments.
void record(ir::OpKind op, const ir::Attributes& attrs, const at::Tensor& out, c10::ArrayRef<at::Tensor> inputs,
            compiler::VtpuKernelFn fn, std::int64_t rank, const std::vector<KernelTensor>& tensors,
            std::vector<double> scalars) {
  DeviceContext::get().metrics().count_op();
  WindowOp w;
  w.op = op;
  w.attrs = attrs;
  w.iter_sizes = out.sizes().vec();
  auto tensor_operand = [&](const at::Tensor& t) {
    WindowOperand o;
    o.is_tensor = true;
    o.dtype = *to_ir(t.scalar_type());
    o.arg = kernel_tensor(t, out.sizes()).arg;
    o.zero_dim = t.dim() == 0;
    o.base = t.storage().data();
    return o;
  };
  w.out = tensor_operand(out);
  w.out.weak = out.storage().getWeakStorageImpl();
  w.inputs.reserve(inputs.size());
  w.single_op_tensors.reserve(tensors.size());
  for (const at::Tensor& t : inputs) {
    if (t.device().type() == kVtpu) {
      w.inputs.push_back(tensor_operand(t));
    } else {
      WindowOperand o;
      o.constant = python_scalar_value(t);
      w.inputs.push_back(std::move(o));
    }
  }
  w.single_op_fn = fn;
  w.single_op_rank = rank;
  for (const KernelTensor& t : tensors) w.single_op_tensors.push_back(t.arg);
  w.single_op_scalars = std::move(scalars);
  record_in_window(std::move(w));
}

// Fused mode: a reduction into the window. Its iteration space is its
// input's; its output is described in the input's dims (`tensors[0]`, the
// launch's own description: stride 0 along the reduced dims).
void record_reduction(ir::OpKind op, const ir::Attributes& attrs, const at::Tensor& out, const at::Tensor& input,
                      compiler::VtpuKernelFn fn, const std::vector<KernelTensor>& tensors) {
  DeviceContext::get().metrics().count_op();
  WindowOp w;
  w.op = op;
  w.reduction = true;
  w.attrs = attrs;
  w.iter_sizes = input.sizes().vec();
  w.out.is_tensor = true;
  w.out.dtype = *to_ir(out.scalar_type());
  w.out.arg = tensors[0].arg;
  w.out.base = out.storage().data();
  w.out.weak = out.storage().getWeakStorageImpl();
  WindowOperand in;
  in.is_tensor = true;
  in.dtype = *to_ir(input.scalar_type());
  in.arg = tensors[1].arg;
  in.base = input.storage().data();
  w.inputs.push_back(std::move(in));
  w.single_op_fn = fn;
  w.single_op_rank = input.dim();
  for (const KernelTensor& t : tensors) w.single_op_tensors.push_back(t.arg);
  record_in_window(std::move(w));
}

// What the shape-generic hash knows of a device input of a non-flat launch:
// rank, which dims are 1, and its layout class (contiguous, broadcast with
// its stride-0 dims, or strided).
void append_generic_layout(std::string& key, const at::Tensor& t) {
  const ir::TensorType type{ir::DType::kFloat32, t.sizes().vec(), t.strides().vec()};
  const ir::LayoutClass layout = ir::layout_class(type);
  std::uint64_t ones = 0;
  for (std::int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) == 1) ones |= std::uint64_t{1} << d;
  key += std::to_string(t.dim()) + ':' + std::to_string(ones) + ':' +
         std::to_string(static_cast<int>(layout.kind)) + ':' + std::to_string(layout.broadcast_mask);
}

// Launches (below) resolve their kernel through a memo keyed by all that
// decides it: op, out dtype, each operand's dtype or Python-scalar kind,
// for a non-flat launch each device input's generic layout, and the
// attributes (run-time scalar values left out, as in the shape-generic
// hash). A hit skips building the graph, canonicalising and hashing it, the
// bulk of a small op's dispatch cost (~3 us of a broadcast add's 5).
std::string launch_memo_key(ir::OpKind op, bool flat, const at::Tensor& out, c10::ArrayRef<at::Tensor> inputs,
                            const ir::Attributes& attrs) {
  std::string key;
  key.reserve(48);
  key += static_cast<char>(op);
  key += flat ? 'F' : 'N';
  key += static_cast<char>(out.scalar_type());
  if (!flat) key += static_cast<char>('0' + out.dim());  // the kernel's rank
  for (const at::Tensor& t : inputs) {
    if (t.device().type() == kVtpu) {
      key += 'T';
      key += static_cast<char>(t.scalar_type());
      if (!flat) append_generic_layout(key, t);
    } else {
      const c10::Scalar value = host_scalar(t);
      key += value.isBoolean() ? 'b' : value.isIntegral(false) ? 'i' : 'd';
    }
  }
  const char* runtime = ir::runtime_scalar_attribute(op);
  for (const auto& [name, value] : attrs.entries()) {
    key += '|';
    key += name;
    if (runtime == nullptr || name != runtime) key += "=" + ir::to_string(value);
  }
  return key;
}

// Each input of a non-flat launch broadcasts into the output's shape (ATen
// sized the output so): checked on a memo hit, since the key holds ranks
// and unit dims but not sizes.
bool broadcasts_into(const at::Tensor& t, c10::IntArrayRef out_sizes) {
  const std::int64_t pad = static_cast<std::int64_t>(out_sizes.size()) - t.dim();
  if (pad < 0) return false;
  for (std::int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) != 1 && t.size(d) != out_sizes[static_cast<std::size_t>(d + pad)]) return false;
  return true;
}

// On a memo hit (the key holds ranks and unit dims, not sizes): the device
// inputs broadcast into the output's shape and together make all of it. An
// out= larger than their broadcast (1 -> 4 rows) is ATen's to resize; the
// miss path refuses it, and a hit wrote the broadcast into every row, the
// out keeping its wrong shape (found by review).
bool inputs_make_out_shape(c10::ArrayRef<at::Tensor> inputs, c10::IntArrayRef out_sizes) {
  std::vector<std::int64_t> shape;  // the inputs' broadcast, right-aligned
  for (const at::Tensor& t : inputs) {
    if (t.device().type() != kVtpu) continue;
    if (!broadcasts_into(t, out_sizes)) return false;
    if (static_cast<std::size_t>(t.dim()) > shape.size()) shape.insert(shape.begin(), t.dim() - shape.size(), 1);
    const std::size_t pad = shape.size() - static_cast<std::size_t>(t.dim());
    for (std::int64_t d = 0; d < t.dim(); ++d)
      if (t.size(d) != 1) shape[pad + static_cast<std::size_t>(d)] = t.size(d);
  }
  return c10::IntArrayRef(shape) == out_sizes;
}

std::mutex g_launch_memo_mutex;
std::unordered_map<std::string, compiler::VtpuKernelFn>& launch_memo() {
  static auto* memo = new std::unordered_map<std::string, compiler::VtpuKernelFn>();
  return *memo;
}

}  // namespace

bool converts_without_overflow(const c10::Scalar& value, c10::ScalarType dtype) {
  try {
    AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, dtype, "converts_without_overflow",
                               [&] { (void)value.to<scalar_t>(); });
  } catch (const std::exception&) {  // c10's overflow report is a std::runtime_error
    return false;
  }
  return true;
}

bool exact_in_double(const c10::Scalar& value) {
  constexpr std::int64_t kExact = std::int64_t{1} << 53;
  if (value.isIntegral(/*includeBool=*/false)) {
    if (value.type() == c10::ScalarType::UInt64) return value.toUInt64() <= static_cast<std::uint64_t>(kExact);
    const std::int64_t v = value.toLong();
    return v >= -kExact && v <= kExact;
  }
  return true;
}

bool launch_generated(ir::OpKind op, const at::Tensor& out, c10::ArrayRef<at::Tensor> inputs,
                      const ir::Attributes& attrs) {
  if (out.dim() > compiler::kMaxRank || !to_ir(out.scalar_type())) return false;
  for (const at::Tensor& t : inputs)
    if (is_host_scalar(t) && !exact_in_double(host_scalar(t))) return false;
  // An output that may be one location in several places (unfold's
  // windows: chunks on several threads raced), or that shares memory with
  // an input it is not: ATen's kernel, in the CPU's element order.
  if (may_overlap_itself(out)) return false;
  for (const at::Tensor& t : inputs)
    if (t.device().type() == kVtpu && partly_overlaps(out, t)) return false;
  // Argument checks of ATen's functions that the IR does not make (found by
  // review): subtraction of bool tensors, abs and pow of bool, integers to
  // a negative scalar power. ATen's kernel raises the CPU's error.
  const auto is_bool = [](const at::Tensor& t) { return t.scalar_type() == at::kBool; };
  if (op == ir::OpKind::Sub && std::any_of(inputs.begin(), inputs.end(), is_bool)) return false;
  if (op == ir::OpKind::Abs && is_bool(out)) return false;
  if (op == ir::OpKind::Pow && is_bool(out)) return false;  // ATen has no bool pow (and the kernel did not compile)
  if (op == ir::OpKind::Pow && at::isIntegralType(out.scalar_type(), /*includeBool=*/true) && inputs.size() == 2 &&
      is_host_scalar(inputs[1]) && host_scalar(inputs[1]).toDouble() < 0)
    return false;
  for (const at::Tensor& t : inputs)
    if (!to_ir(t.scalar_type()) || t.is_conj() || t.is_neg()) return false;
  // When an elementwise op's tensors are all contiguous with the output's
  // shape the launch is one flat dimension: the kernel needs only the element count, so one kernel
  // serves every rank (the ahead-of-time library holds these).
  // The same when they are all dense in one other order of dims (all
  // channels-last): element i of the memory block is the same element of
  // each. Such tensors took the per-element odometer before (a ReLU of a
  // channels-last 32x64x32x32 tensor 2.6 ms, of a contiguous one 0.34).
  const auto same_walk = [&](const at::Tensor& t) {
    if (t.sizes() != out.sizes()) return false;
    for (std::int64_t d = 0; d < out.dim(); ++d)
      if (out.size(d) != 1 && t.stride(d) != out.stride(d)) return false;
    return true;
  };
  bool flat = ir::is_elementwise(op) && out.dim() >= 1 && out.is_non_overlapping_and_dense();
  for (const at::Tensor& t : inputs) {
    if (t.device().type() == kVtpu) flat = flat && same_walk(t);
    else if (!is_host_scalar(t)) return false;
  }
  std::string memo_key = launch_memo_key(op, flat, out, inputs, attrs);
  compiler::VtpuKernelFn memo_fn = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_launch_memo_mutex);
    if (auto it = launch_memo().find(memo_key); it != launch_memo().end()) memo_fn = it->second;
  }
  if (memo_fn != nullptr && !flat && !inputs_make_out_shape(inputs, out.sizes())) memo_fn = nullptr;
  if (memo_fn != nullptr) {
    // The launch scalars as launch_scalars() orders them for this graph:
    // the Constants in operand order, then the op's run-time attribute.
    std::vector<double> scalars;
    std::vector<KernelTensor> tensors{flat ? flat_kernel_tensor(out) : kernel_tensor(out, out.sizes())};
    for (const at::Tensor& t : inputs) {
      if (t.device().type() == kVtpu) tensors.push_back(flat ? flat_kernel_tensor(t) : kernel_tensor(t, out.sizes()));
      else scalars.push_back(host_scalar(t).toDouble());
    }
    if (const char* runtime = ir::runtime_scalar_attribute(op); runtime != nullptr && attrs.has(runtime))
      scalars.push_back(attrs.get_double(runtime));
    const std::int64_t rank = flat ? 1 : out.dim();
    if (ir::is_elementwise(op) && records_in_window(out.numel()))
      record(op, attrs, out, inputs, memo_fn, rank, tensors, std::move(scalars));
    else
      enqueue(memo_fn, op, rank, std::move(tensors), std::move(scalars));
    return true;
  }
  const std::vector<std::int64_t> iter_sizes = flat ? std::vector<std::int64_t>{out.numel()} : out.sizes().vec();
  ir::Graph graph;
  std::vector<ir::ValueId> ids;
  std::vector<at::Tensor> device_inputs;
  for (const at::Tensor& t : inputs) {
    const auto dtype = to_ir(t.scalar_type());
    if (!dtype || t.is_conj() || t.is_neg()) return false;
    if (t.device().type() == kVtpu) {
      ids.push_back(graph.add_input(flat ? ir::TensorType{*dtype, iter_sizes, {1}}
                                         : ir::TensorType{*dtype, t.sizes().vec(), t.strides().vec()}));
      device_inputs.push_back(t);
    } else if (is_host_scalar(t)) {
      ids.push_back(add_python_scalar(graph, t));
    } else {
      return false;
    }
  }
  const compiler::VtpuKernelFn fn =
      resolve_kernel(graph, out, iter_sizes, [&] { return graph.add_node(op, ids, attrs); });
  if (fn == nullptr) return false;
  {
    std::lock_guard<std::mutex> lock(g_launch_memo_mutex);
    launch_memo().emplace(std::move(memo_key), fn);
  }

  std::vector<KernelTensor> tensors;
  tensors.push_back(flat ? flat_kernel_tensor(out) : kernel_tensor(out, out.sizes()));
  for (const at::Tensor& t : device_inputs)
    tensors.push_back(flat ? flat_kernel_tensor(t) : kernel_tensor(t, out.sizes()));
  // Constant values and run-time attributes (alpha, value, ...), in node order.
  const auto rank = static_cast<std::int64_t>(iter_sizes.size());
  if (ir::is_elementwise(op) && records_in_window(out.numel()))
    record(op, attrs, out, inputs, fn, rank, tensors, compiler::launch_scalars(graph));
  else
    enqueue(fn, op, rank, std::move(tensors), compiler::launch_scalars(graph));
  return true;
}

at::Tensor launch_generated_indexed(ir::OpKind op, at::Tensor out, c10::ArrayRef<at::Tensor> inputs,
                                   const ir::Attributes& attrs) {
  ir::Graph graph;
  std::vector<ir::ValueId> ids;
  std::vector<at::Tensor> device_inputs;
  for (const at::Tensor& t : inputs) {
    const auto dtype = to_ir(t.scalar_type());
    if (!dtype || t.is_conj() || t.is_neg() || t.dim() > compiler::kMaxRank) return {};
    if (t.device().type() == kVtpu) {
      ids.push_back(graph.add_input(ir::TensorType{*dtype, t.sizes().vec(), t.strides().vec()}));
      device_inputs.push_back(t);
    } else if (is_python_scalar(t)) {
      ids.push_back(add_python_scalar(graph, t));
    } else {
      return {};
    }
  }
  ir::ValueId result = -1;
  try {
    result = graph.add_node(op, ids, attrs);
  } catch (const runtime::Error&) {
    return {};  // not what the IR accepts: ATen's kernel raises its own error
  }
  const ir::TensorType type = graph.type(result);
  if (type.rank() > static_cast<std::size_t>(compiler::kMaxRank)) return {};
  if (!out.defined()) out = empty_device(type.sizes, from_ir(type.dtype));
  if (out.device().type() != kVtpu || out.dim() > compiler::kMaxRank) return {};
  // An out= sharing memory with an input, or expanded: ATen's kernel raises
  // the CPU's error.
  if (may_overlap_itself(out)) return {};
  for (const at::Tensor& t : device_inputs)
    if (spans_intersect(out, t)) return {};
  const compiler::VtpuKernelFn fn = resolve_kernel(graph, out, out.sizes(), [&] { return result; });
  if (fn == nullptr) return {};
  std::vector<KernelTensor> tensors;
  tensors.push_back(own_rank_kernel_tensor(out));
  for (const at::Tensor& t : device_inputs) tensors.push_back(own_rank_kernel_tensor(t));
  enqueue(fn, op, out.dim(), std::move(tensors), compiler::launch_scalars(graph));
  return out;
}

bool launch_generated_reduction(ir::OpKind op, const at::Tensor& out, const at::Tensor& input,
                                std::vector<std::int64_t> dims, bool keepdim, const ir::Attributes& extra,
                                std::vector<double> scalars) {
  const auto in_dtype = to_ir(input.scalar_type());
  if (input.device().type() != kVtpu || out.device().type() != kVtpu || !in_dtype || input.dim() > compiler::kMaxRank ||
      input.is_conj() || input.is_neg() || !to_ir(out.scalar_type()))
    return false;
  // An out= (or a dtype=) of another dtype than a floating input's (or a
  // floating out= for an integral input): ATen converts the input to the
  // out's dtype before reducing (sum of 0.6, 0.6, 0.6 into int64 is 0, not
  // 1) or refuses the dtype (norms); the generated kernel converts the
  // result. Integral to wider integral is exact either way, and so is a
  // float widened (float16/bfloat16 to float32/float64, float32 to float64)
  // before a sum, mean or product, which the kernel accumulates in double
  // (`x.sum(dtype=torch.float32)` of a float16 x, a mixed-precision loss).
  const bool floating_involved =
      at::isFloatingType(input.scalar_type()) || at::isFloatingType(out.scalar_type());
  const auto width = [](at::ScalarType t) {
    return t == at::kDouble ? 3 : t == at::kFloat ? 2 : (t == at::kHalf || t == at::kBFloat16) ? 1 : 0;
  };
  const bool exact_widening = (op == ir::OpKind::Sum || op == ir::OpKind::Mean || op == ir::OpKind::Prod) &&
                              width(input.scalar_type()) > 0 && width(out.scalar_type()) > width(input.scalar_type());
  if (out.scalar_type() != input.scalar_type() && floating_involved && !exact_widening && op != ir::OpKind::Argmax &&
      op != ir::OpKind::Argmin)
    return false;
  // Extremes of an empty input have no value: ATen raises (max() of no
  // elements) or sizes the result itself.
  const bool extreme = op == ir::OpKind::Amax || op == ir::OpKind::Amin || op == ir::OpKind::Argmax ||
                       op == ir::OpKind::Argmin;
  if (extreme && input.numel() == 0) return false;
  const std::int64_t rank = input.dim();
  std::vector<bool> reduced(static_cast<std::size_t>(rank), dims.empty());
  for (std::int64_t d : dims) {
    if (d < -rank || d >= rank || rank == 0) return false;
    reduced[static_cast<std::size_t>(d < 0 ? d + rank : d)] = true;
  }
  // A channels-last input is reduced in memory order: the same reduction
  // over the (N, H, W, C) view, so a batch norm's statistics over N, H, W
  // become column sums instead of one walk at stride C per channel (sum over
  // N, H, W of 32x64x32x32: 4.7 -> 0.6 ms). The order of each output's sum is
  // then memory order (every mode takes this path alike). Only the plain
  // reductions (an argmax's index follows the logical order), and only
  // channels-last: in fused mode the permuted reduction no longer shares an
  // iteration space with the elementwise work before it, a loss that pays
  // off against stride-C walks but not for a transposed matrix's rows.
  const bool plain = op == ir::OpKind::Sum || op == ir::OpKind::Mean || op == ir::OpKind::Prod ||
                     op == ir::OpKind::Amax || op == ir::OpKind::Amin;
  const bool channels_last = !input.is_contiguous() &&
                             ((rank == 4 && input.is_contiguous(at::MemoryFormat::ChannelsLast)) ||
                              (rank == 5 && input.is_contiguous(at::MemoryFormat::ChannelsLast3d)));
  if (plain && channels_last) {
    std::vector<std::int64_t> order(static_cast<std::size_t>(rank));
    for (std::int64_t d = 0; d < rank; ++d) order[static_cast<std::size_t>(d)] = d;
    // Size-1 dims keep their place relative to each other; their stride means nothing.
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
      const std::int64_t sa = input.size(a) == 1 ? 0 : input.stride(a), sb = input.size(b) == 1 ? 0 : input.stride(b);
      return sa > sb;
    });
    bool identity = true;
    for (std::int64_t d = 0; d < rank; ++d) identity = identity && order[static_cast<std::size_t>(d)] == d;
    // Only for an output already of the reduction's shape (an out= argument
    // to resize keeps the logical path, which resizes it).
    std::vector<std::int64_t> expected;
    for (std::int64_t d = 0; d < rank; ++d)
      if (!reduced[static_cast<std::size_t>(d)]) expected.push_back(input.size(d));
      else if (keepdim) expected.push_back(1);
    if (!identity && input.permute(order).is_contiguous() && out.sizes().equals(expected)) {
      // The output in the input's rank (size 1 where reduced), permuted alike.
      at::Tensor out_full = out;
      if (!keepdim)
        for (std::int64_t d = 0; d < rank; ++d)
          if (reduced[static_cast<std::size_t>(d)]) out_full = out_full.unsqueeze(d);
      std::vector<std::int64_t> permuted_dims;
      for (std::int64_t k = 0; k < rank; ++k)
        if (reduced[static_cast<std::size_t>(order[static_cast<std::size_t>(k)])]) permuted_dims.push_back(k);
      return launch_generated_reduction(op, out_full.permute(order), input.permute(order), std::move(permuted_dims),
                                        /*keepdim=*/true, extra, std::move(scalars));
    }
  }
  ir::Attributes attrs = extra;
  attrs.set("dims", dims);
  attrs.set("keepdim", keepdim);
  if (out.scalar_type() != input.scalar_type() && op != ir::OpKind::Argmax && op != ir::OpKind::Argmin)
    attrs.set("dtype", *to_ir(out.scalar_type()));
  // The launch memo (as for elementwise launches): the kernel depends on the
  // op, the dtypes, the input's generic layout and the attributes (dims,
  // keepdim, dtype and the op's own). Empty inputs always resolve, so the
  // memo never serves a kernel that was only checked against non-empty ones.
  std::string memo_key;
  compiler::VtpuKernelFn fn = nullptr;
  if (input.numel() > 0) {
    memo_key += static_cast<char>(op);
    memo_key += 'R';
    memo_key += static_cast<char>(out.scalar_type());
    memo_key += static_cast<char>(input.scalar_type());
    append_generic_layout(memo_key, input);
    for (const auto& [name, value] : attrs.entries()) {
      memo_key += '|';
      memo_key += name;
      memo_key += '=';
      memo_key += ir::to_string(value);
    }
    std::lock_guard<std::mutex> lock(g_launch_memo_mutex);
    if (auto it = launch_memo().find(memo_key); it != launch_memo().end()) fn = it->second;
  }
  if (fn != nullptr) {
    // The key holds no sizes: on a hit, `out` must still have the shape the
    // reduction gives (an out= argument of another shape goes to ATen,
    // which resizes it), as resolve_kernel checks on a miss.
    std::int64_t out_dim = 0;
    bool same_shape = true;
    for (std::int64_t d = 0; d < rank && same_shape; ++d) {
      if (reduced[static_cast<std::size_t>(d)] && !keepdim) continue;
      const std::int64_t size = reduced[static_cast<std::size_t>(d)] ? 1 : input.size(d);
      same_shape = out_dim < out.dim() && out.size(out_dim++) == size;
    }
    if (!same_shape || out_dim != out.dim()) fn = nullptr;
  }
  if (fn == nullptr) {
    ir::Graph graph;
    fn = resolve_kernel(graph, out, out.sizes(), [&] {
      const ir::ValueId x = graph.add_input(ir::TensorType{*in_dtype, input.sizes().vec(), input.strides().vec()});
      return graph.add_node(op, {x}, attrs);
    });
    if (fn == nullptr) return false;
    if (!memo_key.empty()) {
      std::lock_guard<std::mutex> lock(g_launch_memo_mutex);
      launch_memo().emplace(std::move(memo_key), fn);
    }
  }
  // The output described in the input's dims: reduced dims have stride 0.
  KernelTensor out_tensor;
  out_tensor.arg.data = data_of(out);
  std::int64_t out_dim = 0;
  for (std::int64_t d = 0; d < rank; ++d) {
    out_tensor.arg.sizes[d] = input.size(d);
    if (reduced[static_cast<std::size_t>(d)]) {
      out_tensor.arg.strides[d] = 0;
      if (keepdim) ++out_dim;
    } else {
      out_tensor.arg.strides[d] = out.stride(out_dim++);
    }
  }
  std::vector<KernelTensor> tensors;
  tensors.push_back(std::move(out_tensor));
  tensors.push_back(kernel_tensor(input, input.sizes()));
  // Fused mode: the plain reductions join the window, where one fuses with
  // the elementwise work that computes its input.
  const bool windowed = op == ir::OpKind::Sum || op == ir::OpKind::Mean || op == ir::OpKind::Prod ||
                        op == ir::OpKind::Amax || op == ir::OpKind::Amin;
  if (windowed && scalars.empty() && rank > 0 && input.numel() > 0 && records_in_window(input.numel())) {
    record_reduction(op, attrs, out, input, fn, tensors);
    return true;
  }
  enqueue(fn, op, rank, std::move(tensors), std::move(scalars));
  return true;
}

namespace {

// The IR node of an ATen op's second output, computed by the same kernel.
std::optional<ir::OpKind> second_output(ir::OpKind op) {
  if (op == ir::OpKind::NllLoss) return ir::OpKind::NllLossTotalWeight;
  if (op == ir::OpKind::MaxPool2d) return ir::OpKind::MaxPool2dIndices;
  return std::nullopt;
}

}  // namespace

bool launch_generated_node(ir::OpKind op, const std::vector<at::Tensor>& outputs, c10::ArrayRef<at::Tensor> inputs,
                           const ir::Attributes& attrs) {
  ir::Graph graph;
  std::vector<ir::ValueId> ids;
  for (const at::Tensor& t : inputs) {
    const auto dtype = to_ir(t.scalar_type());
    if (!dtype || t.device().type() != kVtpu || t.is_conj() || t.is_neg() || t.dim() > compiler::kMaxRank) return false;
    ids.push_back(graph.add_input(ir::TensorType{*dtype, t.sizes().vec(), t.strides().vec()}));
  }
  std::vector<ir::ValueId> results;
  try {
    results.push_back(graph.add_node(op, ids, attrs));
    // A second ATen output is its own IR node of the same operands.
    if (outputs.size() == 2 && second_output(op)) results.push_back(graph.add_node(*second_output(op), ids, attrs));
  } catch (const runtime::Error&) {
    return false;  // not what the IR accepts: ATen's kernel raises its own error
  }
  if (results.size() != outputs.size()) return false;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor& out = outputs[i];
    const ir::TensorType& type = graph.type(results[i]);
    if (!out.defined() || out.device().type() != kVtpu || to_ir(out.scalar_type()) != type.dtype) return false;
    for (const at::Tensor& t : inputs)
      if (out.storage().is_alias_of(t.storage())) return false;
  }
  // Kernel first, so that nothing is resized when the op stays on ATen.
  compiler::VtpuKernelFn fn = nullptr;
  try {
    for (ir::ValueId r : results) graph.mark_output(r);
    compiler::KernelProvider* kernels = provider();
    if (kernels != nullptr) fn = kernels->get(graph);
  } catch (const runtime::Error& e) {
    if (e.kind() == runtime::ErrorKind::kRuntime) TORCH_WARN_ONCE("vtpu: generated kernel unavailable: ", e.what());
  }
  if (fn == nullptr) return false;
  std::vector<KernelTensor> tensors;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor& out = outputs[i];
    const auto& sizes = graph.type(results[i]).sizes;
    if (out.sizes() != c10::IntArrayRef(sizes)) out.resize_(sizes);
    tensors.push_back(own_rank_kernel_tensor(out));
  }
  for (const at::Tensor& t : inputs) tensors.push_back(own_rank_kernel_tensor(t));
  enqueue(fn, op, 0, std::move(tensors));
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
  s.cache_hits = {{"memory", p.memory_hits + c.hits_in("memory")},
                  {"disk", c.hits_in("disk")},
                  {"shared", c.hits_in("shared")},
                  {"aot", p.aot_hits}};
  for (const auto& [name, tier] : c.tiers) {
    if (name != "shared") continue;
    s.shared_refused = tier.refused;
    s.shared_errors = tier.errors;
  }
  return s;
}

void reset_generated_kernel_launches() { g_launches = 0; }

}  // namespace vtpu::bridge
