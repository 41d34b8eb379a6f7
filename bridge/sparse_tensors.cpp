// Sparse tensors on vtpu: ATen's SparseTensorImpl (COO) and
// SparseCsrTensorImpl (the compressed layouts CSR, CSC, BSR, BSC) whose
// indices and values are ordinary vtpu tensors. COO is what
// `nn.Embedding(sparse=True)` and `nn.EmbeddingBag(sparse=True)` produce as
// gradients, and what SGD, Adagrad and SparseAdam consume (DLRM-style
// training); CSR is what graph models multiply by (`torch.sparse.mm`).
//
// Metadata ops (construction, indices, values, nnz, dims, coalesced flag,
// resize, copy) are ATen's own device-independent sparse kernels. Every other
// op that sees a sparse vtpu tensor reaches the boxed fallback below: it runs
// ATen's CPU (SparseCPU, SparseCsrCPU) kernel synchronously on CPU copies of the sparse
// arguments and CPU aliases of the dense ones, then gives the sparse results
// vtpu components again. Sparse work is a small part of such a step (the
// touched rows only), so a synchronous host kernel costs little, and every
// result is the CPU's by construction.
#include <ATen/ATen.h>
#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/ops/_sparse_compressed_tensor_unsafe.h>
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_dimI_native.h>
#include <ATen/ops/_dimV_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/empty_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/sparse_resize_and_clear_native.h>
#include <ATen/ops/sparse_resize_native.h>
#include <ATen/ops/values_native.h>
#include <ATen/ops/ccol_indices_native.h>
#include <ATen/ops/clone_native.h>
#include <ATen/ops/col_indices_native.h>
#include <ATen/ops/crow_indices_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/resize_as_sparse_native.h>
#include <ATen/ops/row_indices_native.h>
#include <torch/library.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "aten_bridge.h"
#include "boxed_arguments.h"
#include "call_site.h"
#include "device_context.h"

namespace vtpu::bridge {

namespace {

// CSR, CSC, BSR or BSC (`is_sparse_csr()` is true for CSR only).
bool is_compressed(const at::Tensor& t) {
  const c10::Layout layout = t.layout();
  return layout == c10::kSparseCsr || layout == c10::kSparseCsc || layout == c10::kSparseBsr ||
         layout == c10::kSparseBsc;
}

at::SparseCsrTensorImpl* compressed_impl(const at::Tensor& t) {
  return static_cast<at::SparseCsrTensorImpl*>(t.unsafeGetTensorImpl());
}

}  // namespace

bool is_sparse_layout(const at::Tensor& t) { return t.is_sparse() || is_compressed(t); }

at::Tensor sparse_copy_on(const at::Tensor& sparse, c10::Device device) {
  if (is_compressed(sparse)) {
    const at::SparseCsrTensorImpl* impl = compressed_impl(sparse);
    return at::_sparse_compressed_tensor_unsafe(impl->compressed_indices().to(device),
                                                impl->plain_indices().to(device), impl->values().to(device),
                                                sparse.sizes(), sparse.options().device(device));
  }
  return at::_sparse_coo_tensor_with_dims_and_tensors(
      sparse.sparse_dim(), sparse.dense_dim(), sparse.sizes(), sparse._indices().to(device),
      sparse._values().to(device), sparse.options().device(device), sparse.is_coalesced());
}

namespace {

using Stack = torch::jit::Stack;

// Makes the device tensor `target` hold what the kernel left in `host`, its
// CPU copy (an in-place op on a sparse tensor replaces its components).
void assign_sparse(const at::Tensor& target, const at::Tensor& host) {
  const c10::Device device = target.device();
  if (is_compressed(target)) {
    const at::SparseCsrTensorImpl* from = compressed_impl(host);
    compressed_impl(target)->set_member_tensors(from->compressed_indices().to(device),
                                                from->plain_indices().to(device), from->values().to(device),
                                                host.sizes());
    return;
  }
  auto* impl = static_cast<at::SparseTensorImpl*>(target.unsafeGetTensorImpl());
  impl->raw_resize_(host.sparse_dim(), host.dense_dim(), host.sizes());
  impl->set_indices_and_values_unsafe(host._indices().to(device), host._values().to(device));
  impl->set_coalesced(host.is_coalesced());
}

// An argument of a queued sparse op, captured at dispatch: a dense device
// tensor, a sparse one (its components), or any other value as it is.
struct QueuedArgument {
  enum class Kind { kValue, kDense, kSparse, kCompressed } kind = Kind::kValue;
  c10::IValue value;
  KernelOperand dense;  // kDense; kSparse, kCompressed: the values
  KernelOperand indices;  // kCompressed: the compressed indices
  KernelOperand plain_indices;  // kCompressed
  c10::TensorOptions options;  // kCompressed: dtype and layout
  std::vector<std::int64_t> sizes;
  std::int64_t sparse_dim = 0;
  std::int64_t dense_dim = 0;
  bool coalesced = false;

  c10::IValue host() const {
    switch (kind) {
      case Kind::kDense: return dense.host();
      case Kind::kSparse: {
        const at::Tensor values = dense.host();
        return at::_sparse_coo_tensor_with_dims_and_tensors(sparse_dim, dense_dim, sizes, indices.host(), values,
                                                            values.options().layout(c10::kSparse), coalesced);
      }
      case Kind::kCompressed:
        return at::_sparse_compressed_tensor_unsafe(indices.host(), plain_indices.host(), dense.host(), sizes,
                                                    options.device(c10::kCPU));
      default: return value;
    }
  }
};

// An op whose only results are dense device tensors it writes in place needs
// nothing at dispatch: a parameter's add_ of its sparse gradient (SGD's step,
// Adagrad's sums) is queued as host-kernel-path ops are, instead of draining
// the stream. The CPU kernel then runs on aliases of the components.
bool writes_only_dense_arguments(const c10::FunctionSchema& schema, const Stack& stack, std::size_t first) {
  for (const c10::Argument& ret : schema.returns())
    if (!ret.alias_info() || !ret.alias_info()->isWrite() || ret.type()->kind() != c10::TypeKind::TensorType)
      return false;
  const auto& args = schema.arguments();
  for (std::size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& value = stack[first + i];
    const bool written = args[i].alias_info() && args[i].alias_info()->isWrite();
    if (value.isTensorList() || value.isList() || value.isGenerator()) return false;
    if (!value.isTensor()) {
      if (written) return false;
      continue;
    }
    const at::Tensor& t = value.toTensor();
    if (!t.defined()) continue;
    if (!on_device(t) || (written && t.layout() != c10::kStrided)) return false;
    if (t.layout() != c10::kStrided && !is_sparse_layout(t)) return false;
  }
  return true;
}

void queue_sparse_op(const c10::OperatorHandle& op, Stack* stack, std::size_t first, const std::string& name) {
  const std::size_t count = op.schema().arguments().size();
  std::vector<QueuedArgument> captured(count);
  for (std::size_t i = 0; i < count; ++i) {
    const c10::IValue& value = (*stack)[first + i];
    QueuedArgument& arg = captured[i];
    if (!value.isTensor() || !value.toTensor().defined()) {
      arg.value = value;
      continue;
    }
    const at::Tensor& t = value.toTensor();
    if (is_compressed(t)) {
      const at::SparseCsrTensorImpl* impl = compressed_impl(t);
      arg.kind = QueuedArgument::Kind::kCompressed;
      arg.indices = KernelOperand::capture(impl->compressed_indices());
      arg.plain_indices = KernelOperand::capture(impl->plain_indices());
      arg.dense = KernelOperand::capture(impl->values());
      arg.options = t.options();
      arg.sizes = t.sizes().vec();
    } else if (t.layout() == c10::kSparse) {
      arg.kind = QueuedArgument::Kind::kSparse;
      arg.indices = KernelOperand::capture(t._indices());
      arg.dense = KernelOperand::capture(t._values());
      arg.sizes = t.sizes().vec();
      arg.sparse_dim = t.sparse_dim();
      arg.dense_dim = t.dense_dim();
      arg.coalesced = t.is_coalesced();
    } else {
      arg.kind = QueuedArgument::Kind::kDense;
      arg.dense = KernelOperand::capture(t);
    }
  }
  DeviceContext::get().launch([op, captured = std::move(captured)] {
    Stack host;
    host.reserve(captured.size());
    for (const QueuedArgument& arg : captured) host.push_back(arg.host());
    op.callBoxed(host);
  }, name);
  // The results are the written arguments themselves.
  std::vector<c10::IValue> results;
  const auto& returns = op.schema().returns();
  const auto& args = op.schema().arguments();
  for (const c10::Argument& ret : returns)
    for (std::size_t i = 0; i < args.size(); ++i)
      if (args[i].alias_info() && args[i].alias_info()->beforeSets() == ret.alias_info()->beforeSets()) {
        results.push_back((*stack)[first + i]);
        break;
      }
  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
  for (c10::IValue& result : results) stack->push_back(std::move(result));
}

void sparse_host_fallback(const c10::OperatorHandle& op, Stack* stack) {
  DeviceContext& context = DeviceContext::get();
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  const std::size_t first = stack->size() - args.size();
  const std::string name = op_name(op);
  context.metrics().count_op();
  context.metrics().count_host_fallback(name);
  if (writes_only_dense_arguments(schema, *stack, first)) return queue_sparse_op(op, stack, first, name);
  // Dense arguments are read and written in place through CPU aliases: queued
  // kernels must have finished with them.
  context.synchronize("sparse_op", name.c_str());

  c10::Device device(kVtpu, 0);
  std::vector<std::pair<at::Tensor, at::Tensor>> sparse_args;  // (device tensor, CPU copy)
  std::vector<at::Tensor> dense_args;
  CpuAliases aliases;
  Stack host;
  host.reserve(args.size());
  for (std::size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& value = (*stack)[first + i];
    if (value.isDevice()) {
      host.push_back(replace_device(value, c10::DeviceType::CPU));
      continue;
    }
    host.push_back(map_tensors(value, [&](const at::Tensor& t) -> at::Tensor {
      if (!on_device(t)) return t;
      device = t.device();
      if (is_sparse_layout(t)) {
        // One copy per tensor: an op given the same tensor twice (smm's
        // sspaddmm(result, result, ...) with out=result) must see one
        // tensor, as ATen's kernels compare their arguments' identity.
        for (const auto& [target, copy] : sparse_args)
          if (target.is_same(t)) return copy;
        at::Tensor copy = sparse_copy_on(t, c10::Device(c10::kCPU));
        sparse_args.emplace_back(t, copy);
        return copy;
      }
      dense_args.push_back(t);
      return aliases(t);
    }));
  }

  context.metrics().count_kernel();
  call_cpu_kernel(op, host, name, "sparse");

  // Sparse arguments the op writes get their new components back.
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (!args[i].alias_info() || !args[i].alias_info()->isWrite()) continue;
    for_each_tensor((*stack)[first + i], [&](const at::Tensor& t) {
      for (const auto& [target, copy] : sparse_args)
        if (target.is_same(t)) assign_sparse(target, copy);
    });
  }
  auto to_device = [&](const at::Tensor& result) -> at::Tensor {
    if (!result.defined() || !result.device().is_cpu()) return result;
    for (const auto& [target, copy] : sparse_args)
      if (result.is_same(copy)) return target;  // coalesce() of a coalesced tensor, in place
    if (is_sparse_layout(result)) return sparse_copy_on(result, device);
    return host_result_on_device(result, dense_args);
  };
  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
  for (const c10::IValue& ret : host) stack->push_back(map_tensors(ret, to_device));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  m.impl("_sparse_coo_tensor_with_dims_and_tensors", TORCH_FN(at::native::new_with_dims_and_tensor_sparse_symint));
  m.impl("_sparse_coo_tensor_with_dims", TORCH_FN(at::native::new_with_dims_sparse));
  m.impl("empty.memory_format", TORCH_FN(at::native::empty_sparse));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse));
  m.impl("_indices", TORCH_FN(at::native::_indices_sparse));
  m.impl("_values", TORCH_FN(at::native::_values_sparse));
  m.impl("indices", TORCH_FN(at::native::indices_sparse));
  m.impl("values", TORCH_FN(at::native::values_sparse));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_dimI", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("_dimV", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("is_coalesced", TORCH_FN(at::native::is_coalesced_sparse));
  m.impl("_coalesced_", TORCH_FN(at::native::_coalesced_sparse_));
  m.impl("sparse_resize_", TORCH_FN(at::native::sparse_resize_));
  m.impl("sparse_resize_and_clear_", TORCH_FN(at::native::sparse_resize_and_clear_));
  m.impl("copy_", TORCH_FN(at::native::copy_sparse_));
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_host_fallback>());
}

// The compressed layouts' metadata kernels: ATen's, device-independent (the
// ones SparseCsrMeta uses as well).
TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(at::native::empty_sparse_compressed));
  m.impl("empty_like", TORCH_FN(at::native::empty_like_sparse_csr));
  m.impl("crow_indices", TORCH_FN(at::native::crow_indices_sparse_csr));
  m.impl("col_indices", TORCH_FN(at::native::col_indices_sparse_csr));
  m.impl("ccol_indices", TORCH_FN(at::native::ccol_indices_sparse_csr));
  m.impl("row_indices", TORCH_FN(at::native::row_indices_sparse_csr));
  m.impl("values", TORCH_FN(at::native::values_sparse_csr));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse_csr));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse_csr));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse_csr));
  m.impl("resize_as_sparse_", TORCH_FN(at::native::resize_as_sparse_compressed_));
  m.impl("copy_", TORCH_FN(at::native::copy_sparse_compressed_));
  m.impl("clone", TORCH_FN(at::native::clone_sparse_compressed));
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_host_fallback>());
}

namespace {

// Ops with a SparseCPU (SparseCsrCPU) kernel and a CompositeExplicitAutograd
// one: the composite would win over the fallback and treat the sparse tensor
// as a dense one (sum() returned its input unchanged). Runs when this library
// loads, after the registrations above (same file, in order).
struct SparseCpuKernelsForVtpu {
  std::unique_ptr<torch::Library> coo = kernel_for_every_cpu_op<&sparse_host_fallback>(
      c10::DispatchKey::SparseCPU, c10::DispatchKey::SparsePrivateUse1, __FILE__, __LINE__);
  std::unique_ptr<torch::Library> compressed = kernel_for_every_cpu_op<&sparse_host_fallback>(
      c10::DispatchKey::SparseCsrCPU, c10::DispatchKey::SparseCsrPrivateUse1, __FILE__, __LINE__);
};
const SparseCpuKernelsForVtpu sparse_cpu_kernels_for_vtpu;

}  // namespace

}  // namespace vtpu::bridge
