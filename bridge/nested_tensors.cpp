// Nested tensors (torch.nested with layout=torch.strided) on vtpu: ATen's
// NestedTensorImpl whose buffer is device memory; its sizes, strides and
// offsets are CPU tensors, as on every device. nn.TransformerEncoder takes
// this path in inference with a padding mask (its default
// enable_nested_tensor=True): the padded batch becomes a nested tensor, the
// layers run ATen's nested encoder kernel, and the result is padded again.
//
// Every op that sees a nested vtpu tensor reaches the boxed kernel below: the
// stream is drained, nested arguments become CPU nested tensors over CPU
// aliases of their device buffers (zero-copy, so in-place ops write device
// memory), dense ones CPU aliases, and ATen's NestedTensorCPU kernel runs.
// Nested results over an argument's buffer are views of it on the device;
// other nested results get a device copy of their buffer. Results are the
// CPU's bits by construction.
#include <ATen/ATen.h>
#include <ATen/NestedTensorImpl.h>
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

// The nested tensor `like` (sizes, strides, offsets) over `storage`, a 1-d
// tensor of the whole buffer on any device.
at::Tensor nested_over(const at::Tensor& like, const at::Tensor& storage) {
  const auto* impl = at::native::get_nested_tensor_impl(like);
  return at::detail::make_tensor<at::native::NestedTensorImpl>(storage, impl->get_nested_sizes(),
                                                               impl->get_nested_strides(),
                                                               impl->get_storage_offsets());
}

at::Tensor whole_buffer(const at::Tensor& nested) {
  return at::native::get_nested_tensor_impl(nested)->get_unsafe_storage_as_tensor();
}

}  // namespace

at::Tensor nested_copy_on(const at::Tensor& nested, c10::Device device) {
  return nested_over(nested, whole_buffer(nested).to(device));
}

at::Tensor nested_result_on_device(const at::Tensor& result, const std::vector<at::Tensor>& device_args) {
  const void* data = result.storage().data();
  for (const at::Tensor& arg : device_args) {
    if (data == nullptr || arg.storage().data() != data) continue;
    // A view of an argument's memory: the same view of the device memory.
    const at::Tensor storage = arg.is_nested() ? whole_buffer(arg) : at::Tensor();
    if (storage.defined()) return nested_over(result, storage);
    return nested_over(result, device_view(arg, whole_buffer(result)));
  }
  return nested_copy_on(result, device_args.empty() ? c10::Device(kVtpu, 0) : device_args.front().device());
}

namespace {

using Stack = torch::jit::Stack;

void nested_host_fallback(const c10::OperatorHandle& op, Stack* stack) {
  DeviceContext& context = DeviceContext::get();
  const auto& args = op.schema().arguments();
  const std::size_t first = stack->size() - args.size();
  const std::string name = op_name(op);
  context.metrics().count_op();
  context.metrics().count_host_fallback(name);
  // Arguments are read and written through CPU aliases: queued kernels must
  // have finished with them.
  context.synchronize("nested_op", name.c_str());

  // An explicit CPU device argument (`nt.to("cpu")`) asks for CPU results.
  bool results_on_cpu = false;
  std::vector<std::pair<at::Tensor, at::Tensor>> nested_args;  // (device tensor, CPU alias)
  std::vector<at::Tensor> device_args;
  std::vector<at::Tensor> dense_args;
  CpuAliases aliases;
  Stack host;
  host.reserve(args.size());
  for (std::size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& value = (*stack)[first + i];
    if (value.isDevice()) {
      results_on_cpu |= value.toDevice().is_cpu();
      host.push_back(replace_device(value, c10::DeviceType::CPU));
      continue;
    }
    host.push_back(map_tensors(value, [&](const at::Tensor& t) -> at::Tensor {
      if (!on_device(t)) return t;
      device_args.push_back(t);
      if (!t.is_nested()) {
        dense_args.push_back(t);
        return aliases(t);
      }
      at::Tensor alias = nested_over(t, aliases(whole_buffer(t)));
      nested_args.emplace_back(t, alias);
      return alias;
    }));
  }

  context.metrics().count_kernel();
  call_cpu_kernel(op, host, name, "nested");

  auto to_device = [&](const at::Tensor& result) -> at::Tensor {
    if (!result.defined() || !result.device().is_cpu() || results_on_cpu) return result;
    for (const auto& [target, alias] : nested_args)
      if (result.is_same(alias)) return target;  // an in-place op returns its argument
    if (result.is_nested()) return nested_result_on_device(result, device_args);
    // A dense view of a nested argument's buffer (unbind, select).
    for (const auto& [target, alias] : nested_args)
      if (result.storage().data() != nullptr && result.storage().data() == alias.storage().data())
        return device_view(whole_buffer(target), result);
    return host_result_on_device(result, dense_args);
  };
  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
  for (const c10::IValue& ret : host) stack->push_back(map_tensors(ret, to_device));
}

}  // namespace

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&nested_host_fallback>());
}

namespace {

// Each aten op with a NestedTensorCPU kernel gets the boxed kernel above, so
// that no CompositeExplicitAutograd kernel wins over the fallback and treats
// the nested tensor as a dense one.
const auto nested_cpu_kernels_for_vtpu =
    kernel_for_every_cpu_op<&nested_host_fallback>(c10::DispatchKey::NestedTensorCPU,
                                                    c10::DispatchKey::NestedTensorPrivateUse1, __FILE__, __LINE__);

}  // namespace

}  // namespace vtpu::bridge
