// Helpers for boxed kernels (the host-kernel path, the sparse and nested host paths):
// walking the tensors of a boxed argument and naming the op.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/library.h>

#include "aten_bridge.h"
#include "call_site.h"

namespace vtpu::bridge {

inline bool on_device(const at::Tensor& t) { return t.defined() && t.device().type() == kVtpu; }

// Applies `fn` to every tensor inside an argument (tensor, optional tensor,
// tensor list, list of optional tensors) and returns the rewritten value.
template <typename Fn>
c10::IValue map_tensors(const c10::IValue& value, Fn&& fn) {
  if (value.isTensor()) return fn(value.toTensor());
  if (value.isTensorList()) {
    c10::List<at::Tensor> out;
    const auto list = value.toTensorList();
    out.reserve(list.size());
    for (const at::Tensor& t : list) out.push_back(fn(t));
    return out;
  }
  if (value.isList()) {
    const auto list = value.toList();
    bool has_tensor = false;
    for (const c10::IValue& e : list) has_tensor |= e.isTensor();
    if (!has_tensor) return value;
    c10::impl::GenericList out(list.elementType());
    out.reserve(list.size());
    for (const c10::IValue& e : list) out.push_back(e.isTensor() ? c10::IValue(fn(e.toTensor())) : e);
    return out;
  }
  return value;
}

template <typename Fn>
void for_each_tensor(const c10::IValue& value, Fn&& fn) {
  if (value.isTensor()) {
    fn(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList()) fn(t);
  } else if (value.isList()) {
    for (const c10::IValue& e : value.toListRef())
      if (e.isTensor()) fn(e.toTensor());
  }
}

inline c10::IValue replace_device(const c10::IValue& value, c10::DeviceType to) {
  if (value.isDevice() && value.toDevice().type() == kVtpu) return c10::Device(to);
  return value;
}

inline std::string op_name(const c10::OperatorHandle& op) {
  const auto& name = op.operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

// A CPU result of an ATen kernel run on CPU aliases of `device_args`, as a
// device tensor: the argument it is (in place, out=), a device view of the
// argument whose memory it views, or a device copy of a fresh result.
at::Tensor host_result_on_device(const at::Tensor& result, const std::vector<at::Tensor>& device_args);

// A device tensor over `base`'s storage with `meta`'s dtype and geometry.
at::Tensor device_view(const at::Tensor& base, const at::Tensor& meta);

// Nested tensors (nested_tensors.cpp): `nested` with its buffer copied to
// `device`; a CPU kernel's nested result on the device, a view of the
// argument whose memory it views or a copy.
at::Tensor nested_copy_on(const at::Tensor& nested, c10::Device device);
at::Tensor nested_result_on_device(const at::Tensor& result, const std::vector<at::Tensor>& device_args);

// Registers `Kernel` for every aten op that has a kernel for `cpu_key` and
// none for `vtpu_key` (SparseCPU -> SparsePrivateUse1, ...): a
// CompositeExplicitAutograd kernel would otherwise win over the key's
// fallback and treat the tensor as a dense one. Call it at library load,
// after libtorch registered its kernels.
template <void (*Kernel)(const c10::OperatorHandle&, torch::jit::Stack*)>
std::unique_ptr<torch::Library> kernel_for_every_cpu_op(c10::DispatchKey cpu_key, c10::DispatchKey vtpu_key,
                                                        const char* file, std::uint32_t line) {
  auto library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", vtpu_key, file, line);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNamesForDispatchKey(cpu_key)) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    const auto op = dispatcher.findOp(name);
    if (!op || op->hasKernelForDispatchKey(vtpu_key)) continue;
    std::string qualified = name.name.substr(6);
    if (!name.overload_name.empty()) qualified += "." + name.overload_name;
    library->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<Kernel>());
  }
  return library;
}

// Runs ATen's CPU kernel of `op` on the host arguments `host` for a boxed
// host path over tensors of kind `what` ("sparse", "nested"): its errors are
// raised annotated with the op and the user's line, and a missing CPU kernel
// says that the vtpu path has none either.
inline void call_cpu_kernel(const c10::OperatorHandle& op, torch::jit::Stack& host, const std::string& name,
                            const char* what) {
  try {
    op.callBoxed(host);
  } catch (c10::NotImplementedError& error) {
    error.add_context("[vtpu] " + name + " on " + what + " vtpu tensors runs ATen's CPU kernel, and it has none");
    rethrow_annotated(std::current_exception(), name, capture_call_site());
  } catch (const c10::Error&) {
    rethrow_annotated(std::current_exception(), name, capture_call_site());
  }
}

// `sparse` (COO or a compressed layout) with its indices and values copied
// to `device`: a new tensor (sparse_tensors.cpp).
at::Tensor sparse_copy_on(const at::Tensor& sparse, c10::Device device);
bool is_sparse_layout(const at::Tensor& t);  // COO or compressed

}  // namespace vtpu::bridge
