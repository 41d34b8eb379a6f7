// Helpers for boxed kernels (the host-kernel path, the sparse host path):
// walking the tensors of a boxed argument and naming the op.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

#include "aten_bridge.h"

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

// `sparse` (COO or a compressed layout) with its indices and values copied
// to `device`: a new tensor (sparse_tensors.cpp).
at::Tensor sparse_copy_on(const at::Tensor& sparse, c10::Device device);
bool is_sparse_layout(const at::Tensor& t);  // COO or compressed

}  // namespace vtpu::bridge
