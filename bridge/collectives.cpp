// What torch_vtpu/distributed.py needs from the bridge to run c10d
// collectives over vtpu tensors with Gloo: a wait for the device, zero-copy
// host aliases that keep device memory alive, and a future that completes
// with the caller's vtpu tensors in place of those aliases.
#include <ATen/ATen.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <utility>
#include <vector>

#include "aten_bridge.h"
#include "device_context.h"

namespace py = pybind11;

namespace vtpu::bridge {
namespace {

// Gloo's result with every alias in `aliases` replaced by the device tensor
// at the same position of `originals`; lists are rebuilt at any depth
// (allgather's result is a list of lists).
c10::IValue on_device(const c10::IValue& value, const std::vector<at::Tensor>& aliases,
                      const std::vector<at::Tensor>& originals) {
  if (value.isTensor()) {
    const c10::TensorImpl* impl = value.toTensor().unsafeGetTensorImpl();
    for (std::size_t i = 0; i < aliases.size(); ++i)
      if (aliases[i].unsafeGetTensorImpl() == impl) return originals[i];
    return value;
  }
  if (value.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : value.toTensorList()) out.push_back(on_device(t, aliases, originals).toTensor());
    return out;
  }
  if (value.isList()) {
    const auto list = value.toList();
    c10::impl::GenericList out(list.elementType());
    for (const c10::IValue& e : list) out.push_back(on_device(e, aliases, originals));
    return out;
  }
  return value;
}

}  // namespace

void register_collectives(py::module& m) {
  // Waits for the device stream's queued work (fused mode: flushes the window
  // first), counted in metrics()["syncs"]["collective"].
  m.def("_synchronize_for_collective", [] {
    HANDLE_TH_ERRORS
    py::gil_scoped_release no_gil;
    DeviceContext::get().synchronize("collective");
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_host_alias", [](const at::Tensor& t) {
    if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1 || t.layout() != c10::kStrided)
      throw py::value_error("_host_alias expects a strided vtpu tensor");
    return owning_cpu_alias(t);
  });
  // The callback is C++, not Python: Gloo completes futures on its own
  // threads, and one that completes while the interpreter finalises (a work
  // nobody waited for) cannot take the GIL there; a Python callback aborted
  // the process then.
  m.def("_future_on_device", [](const py::object& host_future, std::vector<at::Tensor> aliases,
                                std::vector<at::Tensor> originals) {
    if (aliases.size() != originals.size()) throw py::value_error("_future_on_device: aliases and originals differ in length");
    auto future = torch::jit::toIValue(host_future, c10::FutureType::create(c10::AnyType::get())).toFuture();
    auto mapped = future->then(
        [aliases = std::move(aliases), originals = std::move(originals)](c10::ivalue::Future& done) {
          return on_device(done.value(), aliases, originals);
        },
        future->elementType());
    return torch::jit::toPyObject(c10::IValue(std::move(mapped)));
  });
}

}  // namespace vtpu::bridge
