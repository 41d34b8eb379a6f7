// The host-kernel path: every ATen op without a vtpu kernel of its own runs
// ATen's CPU kernel directly on device memory (zero-copy aliases), queued on
// the device stream. Output metadata comes from the op's meta kernel at
// dispatch, so Python never waits; ops whose output shape depends on data,
// or that return host values, synchronise and run at once.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "aten_bridge.h"
#include "boxed_arguments.h"
#include "call_site.h"
#include "device_context.h"
#include "extern_blocks.h"
#include "onednn_gemm.h"
#include "fused_window.h"
#include "generated_kernels.h"
#include "generated_lowering.h"
#include "host_path_rules.h"
#include "iterator_layout.h"
#include "meta_cache.h"
#include "out_variant_index.h"
#include "pool_blocks.h"

namespace vtpu::bridge {
namespace {

using Stack = torch::jit::Stack;

bool is_optional_generator(const c10::Argument& arg) {
  const auto& type = arg.type();
  if (type->kind() != c10::TypeKind::OptionalType) return false;
  return type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

// convolution_backward's `bias_sizes` (SymInt[]?) reaches a boxed kernel as
// None, whether the op comes from autograd or from Python, and its meta
// kernel needs it to shape grad_bias: without this every call would fail the
// meta step and run synchronously. The CPU kernel only needs output_mask.
// grad_bias has one element per output channel.
void fill_convolution_backward_bias_sizes(const c10::FunctionSchema& schema, Stack& args) {
  if (schema.name() != "aten::convolution_backward" || !schema.overload_name().empty()) return;
  const auto bias = schema.argumentIndexWithName("bias_sizes");
  const auto mask = schema.argumentIndexWithName("output_mask");
  const auto weight = schema.argumentIndexWithName("weight");
  const auto transposed = schema.argumentIndexWithName("transposed");
  const auto groups = schema.argumentIndexWithName("groups");
  if (!bias || !mask || !weight || !transposed || !groups || args.size() <= *bias || !args[*bias].isNone()) return;
  const c10::IValue& m = args[*mask];
  if (!m.isBoolList() || m.toBoolList().size() < 3 || !m.toBoolList().get(2) || !args[*weight].isTensor()) return;
  const at::Tensor& w = args[*weight].toTensor();
  if (w.dim() < 2) return;
  const std::int64_t channels = args[*transposed].toBool() ? w.size(1) * args[*groups].toInt() : w.size(0);
  args[*bias] = c10::IValue(std::vector<std::int64_t>{channels});
}

// Like CUDA: tensors of one op live on one device, except CPU scalars (0-dim)
// and index lists, which ATen accepts from the host.
void check_devices(const c10::FunctionSchema& schema, const Stack& stack, std::size_t first) {
  const auto& args = schema.arguments();
  for (std::size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& value = stack[first + i];
    if (!value.isTensor() && !value.isTensorList()) continue;
    for_each_tensor(value, [&](const at::Tensor& t) {
      if (!t.defined() || on_device(t)) return;
      if (t.device().is_cpu() && t.dim() == 0) return;
      TORCH_CHECK(false,
                  "Expected all tensors to be on the same device, but found at least two devices, "
                  "vtpu:0 and ", t.device(), "! (when checking argument '", args[i].name(),
                  "' in method ", schema.operator_name(), ")");
    });
  }
}

// Meta tensors mirroring the device tensors, sharing one meta storage per
// device storage so that meta kernels see the same aliasing.
class MetaMirror {
 public:
  at::Tensor operator()(const at::Tensor& t) {
    if (!on_device(t)) return t;
    c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    c10::Storage* storage = nullptr;
    for (auto& [k, s] : storages_)
      if (k == key) storage = &s;
    if (storage == nullptr) {
      storages_.emplace_back(key, c10::Storage(c10::Storage::use_byte_size_t(), key->nbytes(),
                                               c10::DataPtr(nullptr, c10::Device(c10::kMeta)),
                                               c10::GetAllocator(c10::kMeta), /*resizable=*/true));
      storage = &storages_.back().second;
    }
    at::Tensor meta = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(*storage), c10::DispatchKeySet(c10::DispatchKey::Meta), t.dtype());
    meta.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    if (t.is_conj()) meta._set_conj(true);
    if (t.is_neg()) meta._set_neg(true);
    return meta;
  }

 private:
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 4> storages_;
};

bool dense_strides(const at::Tensor& meta) {
  return meta.is_non_overlapping_and_dense();
}

at::Tensor fresh_output_like(const at::Tensor& meta, c10::ScalarType dtype) {
  if (dense_strides(meta)) return empty_device_strided(meta.sizes(), meta.strides(), dtype);
  return empty_device(meta.sizes(), dtype);
}

// Index of the argument whose alias set the return `ret` shares.
std::optional<std::size_t> aliased_argument(const c10::FunctionSchema& schema, const c10::Argument& ret) {
  if (!ret.alias_info()) return std::nullopt;
  const auto& args = schema.arguments();
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto* info = args[i].alias_info();
    if (info && info->beforeSets() == ret.alias_info()->beforeSets()) return i;
  }
  return std::nullopt;
}

bool returns_only_tensors(const c10::FunctionSchema& schema) {
  for (const auto& ret : schema.returns()) {
    const auto kind = ret.type()->kind();
    if (kind == c10::TypeKind::TensorType) continue;
    if (kind == c10::TypeKind::ListType &&
        ret.type()->castRaw<c10::ListType>()->getElementType()->kind() == c10::TypeKind::TensorType)
      continue;
    return false;
  }
  return true;
}

// CPU aliases for the arguments, built at dispatch: they snapshot each
// tensor's geometry (Python may restride the tensor before the kernel runs);
// `keep_alive`, when given, holds the device storages (callers that run
// the kernel later rely on stream order instead; see step 3 below).
// The positions of the arguments `schema` writes, when each is one defined
// device tensor small enough to snapshot cheaply (batch norm's running
// statistics); nullopt when a written argument is a list, optional, None or
// large. An op without written arguments gives an empty list.
std::optional<std::vector<std::size_t>> small_written_arguments(const c10::FunctionSchema& schema,
                                                                const Stack& stack, std::size_t first) {
  constexpr std::size_t kSnapshotBytes = 64 * 1024;
  std::vector<std::size_t> positions;
  std::size_t bytes = 0;
  const auto& args = schema.arguments();
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (!args[i].alias_info() || !args[i].alias_info()->isWrite()) continue;
    const c10::IValue& value = stack[first + i];
    if (!value.isTensor() || !value.toTensor().defined()) return std::nullopt;
    bytes += value.toTensor().nbytes();
    if (bytes > kSnapshotBytes) return std::nullopt;
    positions.push_back(i);
  }
  return positions;
}

Stack host_arguments(const c10::FunctionSchema& schema, const Stack& stack, std::size_t first,
                     std::vector<c10::Storage>* keep_alive, bool snapshot_cpu_scalars) {
  Stack host;
  const auto& args = schema.arguments();
  host.reserve(args.size());
  CpuAliases aliases;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& value = stack[first + i];
    if (is_optional_generator(args[i])) {
      std::optional<at::Generator> generator;
      if (value.isGenerator()) generator = value.toGenerator();
      host.emplace_back(host_generator_for(generator));
      continue;
    }
    if (value.isDevice()) {
      host.push_back(replace_device(value, c10::DeviceType::CPU));
      continue;
    }
    host.push_back(map_tensors(value, [&](const at::Tensor& t) -> at::Tensor {
      if (on_device(t)) {
        if (keep_alive) keep_alive->push_back(t.storage());
        return aliases(t);
      }
      // The caller may change a host scalar after we return. A Python number
      // ATen wrapped stays one: type promotion counts it as the default float
      // dtype, where a 0-dim float64 tensor makes an integer op compute in
      // double (`fmod(int_tensor, 0.3)` gave fmod(3.0, 0.3) = 1e-16 for the
      // CPU's float32 0.29999989).
      if (!snapshot_cpu_scalars || !t.defined()) return t;
      at::Tensor snapshot = t.clone();
      if (t.unsafeGetTensorImpl()->is_wrapped_number()) snapshot.unsafeGetTensorImpl()->set_wrapped_number(true);
      return snapshot;
    }));
  }
  return host;
}

// The dispatcher's "no kernel" error, as opposed to a kernel refusing a
// dtype ("not implemented for 'Float'"), which is the user's error.
bool is_missing_kernel(const c10::NotImplementedError& error) {
  return error.msg().find("Could not run") != std::string::npos;
}

// ATen's "Could not run 'ns::op' with arguments from the 'CPU' backend" names
// the backend of the host-kernel path's own call, not the device the user
// called the op on: say first what is missing for vtpu, then ATen's message.
[[noreturn]] void raise_missing_kernel(const c10::NotImplementedError& error, const std::string& name) {
  throw c10::NotImplementedError("Could not run '" + name +
                                     "' with arguments from the 'vtpu' backend: it has no vtpu kernel, and no CPU "
                                     "kernel for vtpu's host-kernel path to run. ATen: " +
                                     error.msg(),
                                 error.backtrace(), error.caller());
}

// Test-only: the next kernel of this op (e.g. "aten::mm") adds 1 to its
// first floating result, so that the CPU cross-check can prove it catches a
// wrong kernel. Set through torch_vtpu._C._debug_corrupt_next.
std::mutex corrupt_mutex;
std::string corrupt_next_op;
std::atomic<bool> corrupt_armed{false};

// The conjugate/negative bits of tensor arguments as handed to a kernel.
using LazyBits = std::vector<std::pair<const c10::TensorImpl*, std::uint8_t>>;
std::uint8_t lazy_bits_of(const at::Tensor& t) { return (t.is_conj() ? 1 : 0) | (t.is_neg() ? 2 : 0); }

// ATen's kernels may give a result as a lazy conjugate (or negative) view by
// setting the bit on their out= tensor (linalg_lu_solve and linalg_solve with
// left=False, complex). The device tensor never gets the bit, so the CPU
// alias's memory takes the resolved values instead (the review that found it
// saw the conjugate of the answer). `before`: the bits each written argument
// had when the kernel got it (fresh outputs had none).
void resolve_lazy_bits(const std::vector<at::Tensor>& results, const LazyBits& before) {
  for (const at::Tensor& t : results) {
    if (!t.defined()) continue;
    std::uint8_t had = 0;
    for (const auto& [impl, bits] : before)
      if (impl == t.unsafeGetTensorImpl()) had = bits;
    const std::uint8_t has = lazy_bits_of(t);
    if (has == had) continue;
    const at::Tensor resolved = t.resolve_conj().resolve_neg();
    at::Tensor plain = t;  // the same TensorImpl: the alias itself loses the bits
    plain._set_conj((had & 1) != 0);
    plain._set_neg((had & 2) != 0);
    plain.copy_(resolved);
  }
}

void maybe_corrupt(const std::string& name, const std::vector<at::Tensor>& results) {
  if (!corrupt_armed.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(corrupt_mutex);
  if (corrupt_next_op != name && corrupt_next_op != name.substr(0, name.find('.'))) return;
  for (const at::Tensor& t : results) {
    if (!t.defined() || !at::isFloatingType(t.scalar_type()) || t.numel() == 0) continue;
    at::Tensor wrong = t;  // the CPU alias of the device buffer
    wrong.add_(1);
    corrupt_next_op.clear();
    corrupt_armed = false;
    return;
  }
}

// Runs the op at once on a drained stream and maps its results back to the
// device: data-dependent shapes, host-value returns, ops without meta.
// arange.start_out on the host at once, its result uploaded (queued): the
// op reads no device memory, and only its CPU kernel knows the CPU's length.
// That kernel computes the length in doubles (int64: in integers) where the
// meta kernel uses Python's exact integers; beyond 2^53 they disagree
// (arange(2**53, 2**53 + 3, dtype=float64): 4 elements against 3), and the
// queued CPU kernel could then neither shrink the device output (leaving
// unwritten elements) nor grow it (found by review). Ends with `out`.
void run_arange_on_host(Stack* stack, std::size_t first) {
  const c10::Scalar start = (*stack)[first].toScalar(), end = (*stack)[first + 1].toScalar(),
                    step = (*stack)[first + 2].toScalar();
  at::Tensor out = (*stack)[first + 3].toTensor();
  // The out's own size first: the CPU kernel warns when it must resize a
  // non-empty out, as on the CPU.
  at::Tensor host = at::empty(out.sizes(), out.options().device(at::kCPU));
  at::arange_out(host, start, end, step);
  if (out.sizes() != host.sizes()) out.resize_(host.sizes());
  out.copy_(host, /*non_blocking=*/true);
  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
  stack->emplace_back(std::move(out));
}

void run_synchronously(const c10::OperatorHandle& op, Stack* stack, const char* reason) {
  DeviceContext& context = DeviceContext::get();
  const auto& schema = op.schema();
  const std::size_t num_args = schema.arguments().size();
  const std::size_t first = stack->size() - num_args;
  context.synchronize(reason, schema.name().c_str());

  std::vector<at::Tensor> device_args;
  for (std::size_t i = first; i < stack->size(); ++i)
    for_each_tensor((*stack)[i], [&](const at::Tensor& t) {
      if (on_device(t)) device_args.push_back(t);
    });
  Stack host = host_arguments(schema, *stack, first, nullptr, false);
  // An op that may resize the tensor it writes (addbmm_ grows a 1-d self to
  // the product's 2-d shape, as the CPU does without a warning) cannot work
  // on a CPU alias, whose storage is the device's and not resizable: it
  // writes a CPU copy, which is resized onto the device afterwards.
  std::vector<std::pair<at::Tensor, at::Tensor>> resizable;  // (device argument, CPU copy)
  if (op_may_resize_self(op_name(op))) {
    const auto& args = schema.arguments();
    for (std::size_t i = 0; i < args.size(); ++i) {
      if (!args[i].alias_info() || !args[i].alias_info()->isWrite() || !host[i].isTensor()) continue;
      const at::Tensor& device_arg = (*stack)[first + i].toTensor();
      if (!on_device(device_arg)) continue;
      const at::Tensor& alias = host[i].toTensor();
      at::Tensor copy = alias.is_non_overlapping_and_dense()
                            ? at::empty_strided(alias.sizes(), alias.strides(), alias.options())
                            : at::empty(alias.sizes(), alias.options());
      copy.copy_(alias);
      host[i] = copy;
      resizable.emplace_back(device_arg, copy);
    }
  }
  context.metrics().count_kernel();
  try {
    op.callBoxed(host);
  } catch (c10::NotImplementedError& error) {
    if (!is_missing_kernel(error)) rethrow_annotated(std::current_exception(), op_name(op), capture_call_site());
    try {
      raise_missing_kernel(error, op_name(op));
    } catch (const c10::NotImplementedError&) {
      rethrow_annotated(std::current_exception(), op_name(op), capture_call_site());
    }
  } catch (const c10::Error&) {
    rethrow_annotated(std::current_exception(), op_name(op), capture_call_site());
  }

  for (auto& [device_arg, copy] : resizable) {
    if (copy.sizes() != device_arg.sizes()) device_arg.resize_(copy.sizes());
    context.wait_for_queued_work();  // the resize may have taken a block other threads' work uses
    cpu_alias(device_arg).copy_(copy);
  }
  auto to_device = [&](const at::Tensor& result) -> at::Tensor {
    for (const auto& [device_arg, copy] : resizable)
      if (result.is_same(copy)) return device_arg;
    return host_result_on_device(result, device_args);
  };
  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
  for (const c10::IValue& ret : host) stack->push_back(map_tensors(ret, to_device));
}

// The fresh outputs by return position (undefined where the op returns no
// fresh tensor), for the pool blocks that take an op's outputs that way.
std::vector<at::Tensor> results_by_return(const std::vector<at::Tensor>& fresh, const std::vector<int>& slots) {
  std::vector<at::Tensor> out;
  out.reserve(slots.size());
  for (const int slot : slots) out.push_back(slot >= 0 ? fresh[static_cast<std::size_t>(slot)] : at::Tensor());
  return out;
}

// ATen routes convolutions on backends other than CPU/CUDA to the
// *_overrideable ops; on the host target they are ATen's own convolution
// (meta and CPU kernels included) with the same arguments. The backward
// op additionally takes bias_sizes, which is optional.
const c10::OperatorHandle& substitute(const c10::OperatorHandle& op, Stack* stack) {
  static const auto conv_forward = c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution", "");
  static const auto conv_backward =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution_backward", "");
  const auto& name = op.operator_name().name;
  if (name == "aten::convolution_overrideable") return conv_forward;
  if (name == "aten::convolution_backward_overrideable") {
    const std::size_t first = stack->size() - op.schema().arguments().size();
    stack->insert(stack->begin() + static_cast<std::ptrdiff_t>(first + 3), c10::IValue());
    return conv_backward;
  }
  return op;
}

// The geometry a written argument's CPU alias had before the kernel ran,
// and the dense tensor the kernel writes instead where it would restride a
// view with gaps.
struct WrittenGeometry {
  at::Tensor alias;
  std::vector<std::int64_t> sizes, strides;
  std::int64_t offset;
  at::Tensor stand_in;
};

// The pads' CPU out= kernels resize their out to the input's memory format
// before writing it: an out= view with gaps between its elements (x[..., ::2])
// would have numel elements written from its offset on, over the gaps (the
// CPU's own result; a review found it). They write a dense stand-in instead.
bool restrides_its_out(const std::string& name) {
  static const std::unordered_set<std::string> ops = {"aten::replication_pad2d.out", "aten::replication_pad3d.out",
                                                      "aten::reflection_pad2d.out", "aten::reflection_pad3d.out"};
  return ops.count(name) != 0;
}

std::vector<WrittenGeometry> record_written_geometry(const c10::FunctionSchema& schema, Stack& host,
                                                     const std::string& name) {
  std::vector<WrittenGeometry> written;
  const auto& arguments = schema.arguments();
  for (std::size_t i = 0; i < arguments.size() && i < host.size(); ++i) {
    const auto* alias = arguments[i].alias_info();
    if (alias == nullptr || !alias->isWrite() || !host[i].isTensor()) continue;
    const at::Tensor t = host[i].toTensor();
    if (!t.defined()) continue;
    written.push_back({t, t.sizes().vec(), t.strides().vec(), t.storage_offset(), at::Tensor()});
    if (restrides_its_out(name) && !t.is_non_overlapping_and_dense()) {
      written.back().stand_in = at::empty(t.sizes(), t.options());
      host[i] = written.back().stand_in;
    }
  }
  return written;
}

// Some CPU out= kernels restride their output in place before writing it
// (replication_pad2d's makes it channels-last when the input is, found by a
// review: every element of a channels-last F.pad(mode="replicate") was
// wrong). The CPU alias then describes the memory as written, while the
// device tensor keeps the geometry promised at dispatch: move the values
// into that geometry.
void restore_written_geometry(std::vector<WrittenGeometry>& written, Stack& returns) {
  for (WrittenGeometry& w : written) {
    at::Tensor& t = w.alias;
    if (w.stand_in.defined()) {
      t.copy_(w.stand_in);
      for (c10::IValue& value : returns)
        if (value.isTensor() && value.toTensor().unsafeGetTensorImpl() == w.stand_in.unsafeGetTensorImpl()) value = t;
      continue;
    }
    if (t.sizes() != c10::IntArrayRef(w.sizes)) continue;  // resizes are refused or handled elsewhere
    if (t.strides() == c10::IntArrayRef(w.strides) && t.storage_offset() == w.offset) continue;
    const at::Tensor values = t.clone();
    t.unsafeGetTensorImpl()->set_sizes_and_strides(w.sizes, w.strides, w.offset);
    t.copy_(values);
  }
}

void run_on_host_kernel_path(const c10::OperatorHandle& op, Stack* stack);

void host_kernel_fallback(const c10::OperatorHandle& requested, Stack* stack) {
  run_on_host_kernel_path(substitute(requested, stack), stack);
}

void run_on_host_kernel_path(const c10::OperatorHandle& op, Stack* stack) {
  DeviceContext& context = DeviceContext::get();
  const auto& schema = op.schema();
  const std::size_t num_args = schema.arguments().size();
  const std::size_t first = stack->size() - num_args;
  check_devices(schema, *stack, first);
  // Generated kernels first; they count themselves.
  if (generated_kernels_enabled() && try_generated_lowering(op, stack)) return;
  const std::string name = op_name(op);
  TORCH_CHECK_NOT_IMPLEMENTED(!makes_quantized_tensors(name), "vtpu: quantized tensors are not supported (", name,
                              "); quantize on the CPU");
  context.metrics().count_op();
  context.metrics().count_host_fallback(name);
  if (!returns_only_tensors(schema)) return run_synchronously(op, stack, "host_value_op");
  if (name == "aten::arange.start_out") return run_arange_on_host(stack, first);
  // A Python kernel (torch.library) runs at the call, as on the CPU: queued,
  // it would read Python state as it is when the stream gets to it, and vtpu
  // ops it issues itself would run ahead of the work queued before it.
  if (cpu_kernel_is_python(op)) return run_synchronously(op, stack, "python_kernel");
  if (cpu_layout_unknown_to_meta(name)) return run_synchronously(op, stack, "cpu_result_layout");
  if (no_meta_ops().contains(op)) return run_synchronously(op, stack, "op_without_meta");
  if (meta_disagrees_with_cpu().contains(op)) return run_synchronously(op, stack, "meta_disagrees_with_cpu");

  // 1. Output metadata from the meta kernel, or as remembered for the same
  // arguments' geometry (meta_cache.h). The meta mirrors of the arguments
  // are built only on a miss: a hit needs none, and making them cost a
  // tensor construction per argument on every host-kernel-path op.
  const std::optional<std::string> cache_key = meta_cache_key(op, *stack, first);
  std::optional<std::vector<c10::IValue>> remembered;
  if (cache_key) remembered = meta_cache_find(*cache_key);
  Stack meta;
  if (!remembered) {
    MetaMirror mirror;
    meta.reserve(num_args);
    for (std::size_t i = first; i < stack->size(); ++i)
      meta.push_back(replace_device(map_tensors((*stack)[i], mirror), c10::kMeta));
    fill_convolution_backward_bias_sizes(schema, meta);
  }
  try {
    if (remembered) {
      meta = std::move(*remembered);
    } else {
      op.callBoxed(meta);
      if (cache_key) meta_cache_insert(*cache_key, meta);
    }
  } catch (const c10::NotImplementedError&) {
    no_meta_ops().add(op);
    return run_synchronously(op, stack, "op_without_meta");
  } catch (const std::exception&) {
    // Python meta kernels raise Python exceptions; C++ ones raise c10::Error.
    // Data-dependent output shapes (nonzero, boolean masks) cannot be
    // inferred; genuine argument errors are raised again by the CPU kernel.
    return run_synchronously(op, stack, "data_dependent_op");
  }

  // A sparse result (to_sparse, a sparse gradient of embedding_bag) is built
  // by the CPU kernel itself: run it now and move its components.
  for (const c10::IValue& value : meta) {
    bool sparse = false;
    for_each_tensor(value, [&](const at::Tensor& t) {
      sparse |= t.defined() && (t.layout() != c10::kStrided || t.is_nested());
    });
    if (sparse) return run_synchronously(op, stack, "sparse_result");
  }

  // 2. Device outputs: arguments written in place, views of arguments, or
  //    fresh buffers allocated now.
  const auto& returns = schema.returns();
  std::vector<c10::IValue> outputs(returns.size());
  std::vector<at::Tensor> fresh;  // in return order, for the out= call
  // Per returned tensor (lists flattened, in order): its index in `fresh`, or
  // -1 when it aliases an argument.
  std::vector<int> fresh_slots;
  bool all_fresh_single_tensors = true;
  // An elementwise op's CPU kernel is a TensorIterator, which lays a fresh or
  // resized result out after its inputs; Python reference metas disagreed
  // (logical_xor and neg(out=resized) of a transpose came back row-major,
  // `a // b` followed b: found by a fused-mode fuzzer). Values were right,
  // the strides the CPU's.
  const bool iterator_layout = op.hasTag(at::Tag::pointwise) || name == "aten::floor_divide";
  auto with_iterator_layout = [&](const at::Tensor& meta_out) -> at::Tensor {
    if (!iterator_layout || !dense_strides(meta_out)) return meta_out;
    std::vector<at::Tensor> inputs;
    for (std::size_t i = 0; i < schema.arguments().size(); ++i)
      if (!schema.arguments()[i].is_out() && (*stack)[first + i].isTensor())
        inputs.push_back((*stack)[first + i].toTensor());
    return meta_out.as_strided(meta_out.sizes(), iterator_output_strides(inputs, meta_out.sizes()));
  };
  for (std::size_t r = 0; r < returns.size(); ++r) {
    const c10::Argument& ret = returns[r];
    const auto alias = aliased_argument(schema, ret);
    auto make = [&](const at::Tensor& meta_result, const c10::IValue& base) -> at::Tensor {
      if (!meta_result.defined() || (alias && base.isTensor())) fresh_slots.push_back(-1);
      const bool resized_out = meta_result.defined() && alias && base.isTensor() && ret.alias_info()->isWrite() &&
                               meta_result.sizes() != base.toTensor().sizes();
      const at::Tensor meta_out =
          meta_result.defined() && (!alias || resized_out) ? with_iterator_layout(meta_result) : meta_result;
      if (!meta_out.defined()) return meta_out;
      if (alias && base.isTensor()) {
        const at::Tensor& arg = base.toTensor();
        if (ret.alias_info()->isWrite()) {
          // out= and in-place: the meta kernel may have resized the argument.
          // An out= argument takes the meta result's strides only when its
          // shape changed, as ATen's resize_out restrides only a resized
          // out: an out of the right shape keeps its geometry (a strided
          // view of a larger tensor took a Python meta's fresh contiguous
          // result's and was written over its base: linalg.solve, sort).
          const bool out_argument = schema.arguments()[*alias].is_out();
          const bool resized = meta_out.sizes() != arg.sizes();
          // An output that is also an input (an in-place op, or an out= that
          // is one of the inputs: logical_and_ is logical_and.out(self, self,
          // other)) cannot be resized to a broadcast shape: the CPU's
          // TensorIterator raises. Python reference meta kernels resized it
          // (logical_and_, ldexp_, addr_ of a 0-dim self, logaddexp(x, y,
          // out=x); found by review: the new elements were computed from
          // fresh memory).
          // View-like in-place ops (unsqueeze_, t_, as_strided_: ATen's
          // inplace_view tag) restride self by design. (An element-count
          // test instead let empty tensors be grown: [0, 1, 3] to [0, 10, 3].)
          if (resized && !op.hasTag(at::Tag::inplace_view) && !op_may_resize_self(name)) {
            bool also_input = !out_argument;
            for (std::size_t i = 0; i < schema.arguments().size() && !also_input; ++i)
              if (i != *alias && !schema.arguments()[i].is_out() && (*stack)[first + i].isTensor())
                also_input = (*stack)[first + i].toTensor().is_same(arg);
            TORCH_CHECK(!also_input, "output with shape ", arg.sizes(), " doesn't match the broadcast shape ",
                        meta_out.sizes());
          }
          if (resized || (!out_argument && meta_out.strides() != arg.strides())) {
            arg.unsafeGetTensorImpl()->set_sizes_and_strides(meta_out.sizes(), meta_out.strides(),
                                                             meta_out.storage_offset());
            const std::size_t needed = at::detail::computeStorageNbytes(
                arg.sizes(), arg.strides(), arg.itemsize(), arg.storage_offset());
            if (needed > arg.storage().nbytes()) resize_storage_bytes(arg.storage(), needed);
          }
          return arg;
        }
        return device_view(arg, meta_out);
      }
      const HostResult host = host_result(op, r, meta_out, *stack, first);
      if (host.undefined) {
        fresh_slots.push_back(-1);
        return at::Tensor();
      }
      at::Tensor out = host.sizes           ? empty_device(*host.sizes, host.dtype)
                       : host.memory_format ? empty_device(meta_out.sizes(), host.dtype, host.memory_format)
                       : host.empty         ? empty_device({0}, host.dtype)
                                            : fresh_output_like(meta_out, host.dtype);
      fresh_slots.push_back(static_cast<int>(fresh.size()));
      fresh.push_back(out);
      return out;
    };
    const c10::IValue base = alias ? (*stack)[first + *alias] : c10::IValue();
    if (meta[r].isNone()) {
      outputs[r] = meta[r];
      fresh_slots.push_back(-1);
      all_fresh_single_tensors = false;
    } else if (meta[r].isTensor()) {
      outputs[r] = make(meta[r].toTensor(), base);
      if (alias || !outputs[r].toTensor().defined()) all_fresh_single_tensors = false;
    } else {
      all_fresh_single_tensors = false;
      c10::List<at::Tensor> list;
      const auto metas = meta[r].toTensorList();
      const auto bases = base.isTensorList() ? base.toTensorList() : c10::List<at::Tensor>();
      for (std::size_t k = 0; k < metas.size(); ++k)
        list.push_back(make(metas.get(k), k < bases.size() ? c10::IValue(bases.get(k)) : base));
      outputs[r] = list;
    }
  }

  bool mutates = false;
  for (const auto& arg : schema.arguments()) mutates |= arg.alias_info() && arg.alias_info()->isWrite();
  const std::optional<std::vector<std::size_t>> restorable = small_written_arguments(schema, *stack, first);
  if (fresh.empty() && !mutates) {
    // Pure view op: nothing to compute.
    stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
    for (auto& out : outputs) stack->push_back(std::move(out));
    return;
  }

  // 3. The kernel: CPU aliases snapshotted now, executed in stream order. The
  // device storages are not kept alive by the task: a block Python drops goes
  // back to the allocator at once and is reused only by work queued behind
  // this kernel (stream-ordered reuse), so memory does not grow with the
  // depth of the queue.
  Stack host = host_arguments(schema, *stack, first, nullptr, true);
  std::optional<c10::OperatorHandle> out_op;
  // An op that also writes arguments (batch norm's running statistics) may use
  // its out= variant only if those writes can be undone when the out= call has
  // to be abandoned and the functional op run instead: small written
  // arguments are snapshotted before the out= call and restored then.
  if (all_fresh_single_tensors && (!mutates || restorable) && !fresh.empty() &&
      !unusable_out_variants().contains(op) && !out_variant_is_no_drop_in(name))
    out_op = find_out_variant(op);
  std::vector<std::size_t> written_positions = out_op && mutates ? *restorable : std::vector<std::size_t>{};
  std::vector<at::Tensor> fresh_host;
  for (const at::Tensor& t : fresh) fresh_host.push_back(cpu_alias(t));
  Stack out_host;
  if (out_op) {
    out_host = host;
    for (const at::Tensor& t : fresh_host) out_host.emplace_back(t);
  }
  std::string out_name = out_op ? op_name(*out_op) : std::string();
  std::size_t tensor_bytes = 0;
  for (const c10::IValue& arg : host)
    for_each_tensor(arg, [&](const at::Tensor& t) { tensor_bytes += t.defined() ? t.nbytes() : 0; });
  for (const at::Tensor& t : fresh_host) tensor_bytes += t.defined() ? t.nbytes() : 0;
  const bool serial = runs_serially(name, tensor_bytes) && pool_blocks::SingleThreadedAten::available();
  if (serial) context.metrics().count_host_serial(name);
  // torch.backends.mkldnn.enabled as the op is issued: the stream may run it
  // after a `with torch.backends.mkldnn.flags(enabled=False):` block ended.
  const bool onednn = torch_onednn_flag();
  LazyBits lazy_bits;
  for (const c10::IValue& arg : host)
    for_each_tensor(arg, [&](const at::Tensor& t) {
      if (t.defined()) lazy_bits.emplace_back(t.unsafeGetTensorImpl(), lazy_bits_of(t));
    });
  // A product the window may hold for an elementwise epilogue (fused mode):
  // float32 mm/addmm into a fresh result, run in blocks on the pool.
  // The product's out= call: the dispatcher's own (a structured op's
  // functional form arrives as mm.out with the result it allocated), or the
  // out= variant this path chose for a functional op.
  const bool product_call =
      out_op ? written_positions.empty() && fresh.size() == 1 && (out_name == "aten::mm.out" || out_name == "aten::addmm.out")
             : fresh.empty() && (name == "aten::mm.out" || name == "aten::addmm.out");
  // Like an elementwise op, a small product starts no window (the issuing
  // thread's cost of recording outweighs what fusion saves: fused_window.h).
  const GemmBlocking blocking =
      product_call && context.mode() == Mode::kFused && matmul_epilogues_enabled() &&
              records_in_window(out_op ? fresh.front().numel() : stack->back().toTensor().numel())
          ? gemm_blocking(out_op ? out_name : name, out_op ? out_host : host)
          : GemmBlocking::kNone;
  const bool product_in_window = blocking != GemmBlocking::kNone;
  // `epilogue`: work over the result as its blocks are written (a fused
  // epilogue, fused_window.h), or null.
  auto kernel = [op, out_op, out_name = std::move(out_name), host = std::move(host), out_host = std::move(out_host),
                 fresh_host = std::move(fresh_host), fresh_slots = std::move(fresh_slots),
                 written_positions = std::move(written_positions), name, serial, onednn,
                 lazy_bits = std::move(lazy_bits)](const GemmBlockHook* epilogue) mutable {
    try {
      c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
      check_host_arguments(name, host);
      bool epilogue_ran = false;  // the product's blocks went to `epilogue` as they were written
      std::optional<pool_blocks::SingleThreadedAten> one_thread;
      if (serial) one_thread.emplace();
      const OneDnnFlagAtIssue onednn_as_issued(onednn);
      if (out_op) {
        // The out= kernel writes straight into the device buffers. It must
        // leave them exactly as promised at dispatch; some CPU out= kernels
        // restride their output (channels-last) or resize it to scratch
        // shapes. Then the values are laid out wrongly: recompute with the
        // functional op into temporaries and copy, and stop using out= for it.
        std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> promised;
        for (const at::Tensor& t : fresh_host) promised.emplace_back(t.sizes().vec(), t.strides().vec());
        std::vector<at::Tensor> written_before;
        for (std::size_t position : written_positions) written_before.push_back(host[position].toTensor().clone());
        bool kept_geometry = true;
        try {
          epilogue_ran = run_gemm_in_row_blocks(out_name, out_host, epilogue);
          if (!epilogue_ran && !run_bmm_in_batch_blocks(out_name, out_host) &&
              !run_convolution_in_batch_blocks(out_name, out_host, {}) &&
              !run_convolution_backward_in_batch_blocks(out_name, out_host) &&
              !run_layer_norm_in_row_blocks(out_name, out_host))
            out_op->callBoxed(out_host);
        } catch (const c10::Error& error) {
          if (!is_resize_refusal(error) && !is_undefined_result_refusal(error)) throw;
          kept_geometry = false;
        }
        for (std::size_t i = 0; kept_geometry && i < fresh_host.size(); ++i)
          kept_geometry = fresh_host[i].sizes() == c10::IntArrayRef(promised[i].first) &&
                          fresh_host[i].strides() == c10::IntArrayRef(promised[i].second);
        if (kept_geometry) {
          resolve_lazy_bits(fresh_host, {});
          if (epilogue != nullptr && !epilogue_ran) epilogue->after_product();
          return maybe_corrupt(name, fresh_host);
        }
        unusable_out_variants().add(op);
        for (std::size_t i = 0; i < written_positions.size(); ++i)
          host[written_positions[i]].toTensor().copy_(written_before[i]);
        for (std::size_t i = 0; i < fresh_host.size(); ++i)
          fresh_host[i].unsafeGetTensorImpl()->set_sizes_and_strides(promised[i].first, promised[i].second,
                                                                     fresh_host[i].storage_offset());
      }
      bool fresh_in_return_order = fresh_slots.size() == fresh_host.size();
      for (std::size_t i = 0; fresh_in_return_order && i < fresh_slots.size(); ++i)
        fresh_in_return_order = fresh_slots[i] == static_cast<int>(i);
      epilogue_ran = run_gemm_in_row_blocks(name, host, epilogue);
      if (epilogue_ran || run_bmm_in_batch_blocks(name, host)) {
        const c10::IValue out = host.back();  // mm.out/addmm.out/bmm.out return their out argument
        host.clear();
        host.push_back(out);
      } else if (!(fresh_in_return_order && (run_attention_in_batch_blocks(name, host, fresh_host) ||
                                             run_convolution_in_batch_blocks(name, host, fresh_host))) &&
                 !run_convolution_backward_in_batch_blocks(name, host, results_by_return(fresh_host, fresh_slots))) {
        std::vector<WrittenGeometry> written = record_written_geometry(op.schema(), host, name);
        op.callBoxed(host);
        restore_written_geometry(written, host);
      }
      // Fresh results were computed into CPU temporaries: copy them over.
      // Returned aliases of arguments were written in place already.
      std::size_t slot = 0;
      for (const c10::IValue& ret : host) {
        for_each_tensor(ret, [&](const at::Tensor& result) {
          const int target = slot < fresh_slots.size() ? fresh_slots[slot] : -1;
          ++slot;
          if (target >= 0 && result.defined()) {
            at::Tensor& destination = fresh_host[static_cast<std::size_t>(target)];
            check_fresh_geometry(op, destination, result, name);
            destination.copy_(result);
          } else if (target >= 0) {
            // The CPU kernel returned no tensor where a buffer was promised
            // (a backward given no incoming gradient: flash attention's).
            // Never hand out uninitialised memory: an absent gradient is
            // zero, which is what the buffer then holds.
            fresh_host[static_cast<std::size_t>(target)].zero_();
          }
        });
      }
      if (epilogue != nullptr && !epilogue_ran) epilogue->after_product();
      if (fresh_host.empty()) {
        // in-place and out= forms: the results are the written arguments.
        std::vector<at::Tensor> written;
        for (const c10::IValue& ret : host) for_each_tensor(ret, [&](const at::Tensor& t) { written.push_back(t); });
        resolve_lazy_bits(written, lazy_bits);
        maybe_corrupt(name, written);
      } else {
        maybe_corrupt(name, fresh_host);
      }
    } catch (c10::NotImplementedError& error) {
      if (is_missing_kernel(error)) raise_missing_kernel(error, name);
      throw;
    }
  };
  if (product_in_window) {
    context.metrics().count_kernel();
    context.flush_window("unfused_op");
    WindowProduct product;
    product.run = std::move(kernel);
    product.name = name;
    product.site = capture_call_site();
    const at::Tensor result = out_op ? fresh.front() : stack->back().toTensor();
    product.rows = result.size(0);
    product.columns = result.size(1);
    product.out.is_tensor = true;
    product.out.dtype = ir::DType::kFloat32;
    product.out.arg.data = result.data_ptr();
    for (int d = 0; d < 2; ++d) {
      product.out.arg.sizes[d] = result.size(d);
      product.out.arg.strides[d] = result.stride(d);
    }
    product.out.base = result.storage().data();
    product.out.weak = result.storage().getWeakStorageImpl();
    product.by_columns = blocking == GemmBlocking::kColumns;  // nn.Linear's transposed weight
    // The operands (an operand in the result's allocation, which cannot
    // overlap it, is covered by the result's use: fused_window.cpp).
    for (std::size_t i = first; i < stack->size(); ++i)
      if ((*stack)[i].isTensor() && (*stack)[i].toTensor().defined() &&
          (*stack)[i].toTensor().storage().data() != product.out.base)
        product.reads.push_back((*stack)[i].toTensor().storage().data());
    record_product_in_window(std::move(product));
  } else {
    context.launch([kernel = std::move(kernel)]() mutable { kernel(nullptr); }, name);
  }

  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
  for (auto& out : outputs) stack->push_back(std::move(out));
}

}  // namespace

void run_on_host_kernel_path_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  host_kernel_fallback(op, stack);
}

void run_on_host_kernel_path_at_once_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                                           const char* reason) {
  DeviceContext& context = DeviceContext::get();
  check_devices(op.schema(), *stack, stack->size() - op.schema().arguments().size());
  context.metrics().count_op();
  context.metrics().count_host_fallback(op_name(op));
  run_synchronously(op, stack, reason);
}

void debug_corrupt_next(const std::string& op) {
  std::lock_guard<std::mutex> lock(corrupt_mutex);
  corrupt_next_op = op;
  corrupt_armed = !op.empty();
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&host_kernel_fallback>());
}

// Ops whose CompositeExplicitAutograd kernel would win over a fallback: the
// convolution ones only raise "not implemented"; the others' composites use
// other formulas than ATen's CPU kernels (results would differ from CPU),
// hand the CPU kernel out= buffers it wants to resize (lstsq; the structured
// losses' default-backend kernels call their out= overload with the reduced
// result, and the CPU's out= kernel warns "output was resized"; addr.out's
// composite resizes an out= that is also its input, where the CPU raises),
// or call a CPU kernel stub that has no vtpu entry (conj_physical_: an
// internal assert). The structured pads' and pixel (un)shuffle's
// composites make a contiguous result where the CPU's is channels-last for
// a channels-last input (host_result gives the CPU's layout).
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name : {"convolution_overrideable", "convolution_backward_overrideable",
                           "native_layer_norm", "native_layer_norm_backward", "native_group_norm",
                           "native_group_norm_backward", "addr", "linalg_lstsq", "mse_loss",
                           "smooth_l1_loss", "huber_loss", "conj_physical_", "addr.out",
                           "replication_pad2d", "replication_pad3d", "reflection_pad3d", "pixel_shuffle",
                           "pixel_unshuffle"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&host_kernel_fallback>());
  }
  // CompositeImplicitAutograd kernels that read tensor memory through raw
  // pointers. Device memory is host memory, so on vtpu they read it at once,
  // before queued work has written it (stale or garbage values, found by
  // review); on the host-kernel path they run in stream order.
  for (const char* name : {"_saturate_weight_to_fp16", "choose_qparams_optimized", "fbgemm_linear_quantize_weight"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&host_kernel_fallback>());
  }
  // silu_backward has a CPU kernel and a CompositeImplicitAutograd formula for other
  // backends, which computed mixed dtypes differently from the CPU (a float16 grad with an
  // int32 input gave float32) and integers where the CPU raises; on vtpu it is one
  // generated kernel for one floating dtype and ATen's CPU kernel otherwise.
  m.impl("silu_backward", torch::CppFunction::makeFromBoxedFunction<&host_kernel_fallback>());
  // index.Tensor's structured composite computes its output shape first: with
  // a boolean mask that is a nonzero on the device (a synchronisation), then
  // index.Tensor_out ran at the call again, its CPU kernel taking the mask's
  // nonzero a second time: x[x > 0] took 2.2-2.4x the CPU's time. On the
  // host-kernel path a mask makes the meta step fail, and the CPU's
  // index.Tensor runs once, at the call; integer indices queue as before.
  m.impl("index.Tensor", torch::CppFunction::makeFromBoxedFunction<&host_kernel_fallback>());
}


// A device tensor over `base`'s storage with `meta`'s dtype and geometry:
// the device side of a view that a meta kernel computed (or a CPU kernel made).
at::Tensor device_view(const at::Tensor& base, const at::Tensor& meta) {
  at::Tensor view = at::detail::make_tensor<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(base.storage()), base.key_set(), meta.dtype());
  view.unsafeGetTensorImpl()->set_sizes_and_strides(meta.sizes(), meta.strides(), meta.storage_offset());
  if (meta.is_conj()) view._set_conj(true);
  if (meta.is_neg()) view._set_neg(true);
  return view;
}

at::Tensor host_result_on_device(const at::Tensor& result, const std::vector<at::Tensor>& device_args) {
  if (!result.defined() || !result.device().is_cpu()) return result;
  if (is_sparse_layout(result)) return sparse_copy_on(result, c10::Device(kVtpu, 0));
  if (result.is_nested()) return nested_result_on_device(result, device_args);
  TORCH_CHECK_NOT_IMPLEMENTED(result.layout() == c10::kStrided, "vtpu tensors are strided or sparse; layout ",
                              result.layout(), " is not supported on vtpu");
  // A result over an argument's memory is that argument (in-place/out) or a view of it.
  for (const at::Tensor& arg : device_args) {
    if (result.storage().data() != arg.storage().data() || result.storage().data() == nullptr) continue;
    if (result.sizes() == arg.sizes() && result.strides() == arg.strides() &&
        result.storage_offset() == arg.storage_offset() && result.dtype() == arg.dtype())
      return arg;
    return device_view(arg, result);
  }
  // Written here, on the calling thread: a block other threads' queued work
  // still uses (freed blocks are reused in stream order) must be free of it.
  if (result.is_non_overlapping_and_dense()) {
    at::Tensor out = empty_device_strided(result.sizes(), result.strides(), result.scalar_type());
    DeviceContext::get().wait_for_queued_work();
    cpu_alias(out).copy_(result);
    return out;
  }
  // Any other layout is a view of the kernel's own buffer (linalg_lstsq's
  // solution: the first rows of a column-major buffer): when the view covers
  // most of it, the device gets the whole buffer and the same view of it, so
  // strides are the CPU's. A small view of a big buffer (a Python kernel
  // returning a few columns of a table) is copied compactly instead.
  const std::int64_t nbytes = static_cast<std::int64_t>(result.storage().nbytes());
  const std::int64_t viewed = result.numel() * static_cast<std::int64_t>(result.itemsize());
  if (nbytes > 2 * viewed + 4096) {
    at::Tensor out = empty_device(result.sizes(), result.scalar_type());
    DeviceContext::get().wait_for_queued_work();
    cpu_alias(out).copy_(result);
    return out;
  }
  at::Tensor buffer = empty_device({nbytes}, at::kByte);
  DeviceContext::get().wait_for_queued_work();
  if (nbytes > 0)
    cpu_alias(buffer).copy_(
        at::empty({0}, at::TensorOptions().dtype(at::kByte)).set_(result.storage(), 0, {nbytes}, {1}));
  return device_view(buffer, result);
}

}  // namespace vtpu::bridge
