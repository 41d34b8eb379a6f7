// Ops that ATen answers differently for "other" backends than for CPU, where
// the generic host-kernel path alone would be wrong, slow or missing:
// shallow-copy compatibility (.data =, tied weights across .to()), the fused
// RNN cells ATen only has for CUDA, the SDPA backend choice,
// scalar_tensor's conversion of its value, record_stream, and max_pool1d's
// index-free kernel, which ATen keeps for CPU tensors.
#include <ATen/ATen.h>
#include <ATen/TensorSubclassLikeUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <torch/library.h>

#include "aten_bridge.h"

// ATen's CPU policy for the SDPA backend (attention.cpp; exported, not in a
// header). It reads only shapes, strides, dtypes and flags.
namespace at::native {
int64_t _fused_sdp_choice_cpp(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                              const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                              std::optional<double> scale, bool enable_gqa);
}  // namespace at::native

namespace vtpu::bridge {
namespace {

// Dense vtpu and CPU tensors can take each other's payload, as CPU and CUDA
// ones do (Module.to() moves parameters in place this way, which keeps tied
// weights tied); without it `param.data = t` fails across the two devices.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == at::kStrided && (t.device().type() == kVtpu || t.device().is_cpu());
  };
  return dense(self) && dense(from);
}

at::Tensor with_bias(const at::Tensor& gates, const std::optional<at::Tensor>& bias) {
  return bias.has_value() && bias->defined() ? gates + *bias : gates;
}

// ATen calls the fused cells for every non-CPU device but implements them for
// CUDA only. Registered for AutogradPrivateUse1 and written with ATen ops, so
// autograd differentiates the pieces. Gate order and rounding order follow
// ATen's CPU LSTMCell/GRUCell.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  const at::Tensor gates = with_bias(hidden_gates, hidden_bias) + with_bias(input_gates, input_bias);
  auto chunks = gates.unsafe_chunk(4, 1);
  const at::Tensor in_gate = chunks[0].sigmoid();
  const at::Tensor forget_gate = chunks[1].sigmoid();
  const at::Tensor cell_gate = chunks[2].tanh();
  const at::Tensor out_gate = chunks[3].sigmoid();
  at::Tensor cy = forget_gate * cx + in_gate * cell_gate;
  at::Tensor hy = out_gate * cy.tanh();
  // The third result is CUDA's backward workspace; nothing reads it here.
  return {hy, cy, gates};
}

std::tuple<at::Tensor, at::Tensor> fused_gru_cell(const at::Tensor& input_gates,
                                                  const at::Tensor& hidden_gates, const at::Tensor& hx,
                                                  const std::optional<at::Tensor>& input_bias,
                                                  const std::optional<at::Tensor>& hidden_bias) {
  auto in = with_bias(input_gates, input_bias).unsafe_chunk(3, 1);
  auto hid = with_bias(hidden_gates, hidden_bias).unsafe_chunk(3, 1);
  const at::Tensor reset_gate = (hid[0] + in[0]).sigmoid();
  const at::Tensor input_gate = (hid[1] + in[1]).sigmoid();
  const at::Tensor new_gate = (in[2] + hid[2] * reset_gate).tanh();
  at::Tensor hy = (hx - new_gate) * input_gate + new_gate;
  return {hy, at::cat({in[0], in[1], in[2], hid[2], hx}, 1)};
}

// The choice depends on shapes, dtypes and flags only, so asking ATen's CPU
// policy about aliases of the device tensors costs no synchronisation and
// gives the CPU's fused kernel (flash attention for CPU), not the math one.
int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  std::optional<at::Tensor> mask;
  if (attn_mask.has_value() && attn_mask->defined())
    mask = attn_mask->device().type() == kVtpu ? cpu_alias(*attn_mask) : *attn_mask;
  return at::_fused_sdp_choice(cpu_alias(query), cpu_alias(key), cpu_alias(value), mask, dropout_p,
                               is_causal, scale, enable_gqa);
}

// The CPU makes a scalar tensor by storing the value unchecked for floating
// types (a float16 -1e9 is -inf: `torch.where(mask, half, -1e9)`, an attention
// masking idiom, goes through here) and checked for integers; ATen's composite
// for other devices fills an empty tensor, which raises for both. The value is
// made on the CPU by the CPU's rule, then copied.
at::Tensor scalar_tensor(const c10::Scalar& value, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
  const at::Tensor host = at::scalar_tensor(value, at::TensorOptions().dtype(dtype).layout(layout));
  return empty_device({}, host.scalar_type()).copy_(host);
}

}  // namespace

// F.scaled_dot_product_attention asks the backend's `_fused_sdp_choice_stub`
// (not the op above), and without an entry for PrivateUse1 it decomposes into
// the math path: ~16 ops and two bmm per call (~150 us of dispatch for one
// decoding step's attention, against ~10 us for the fused op). With the CPU
// policy as our entry, it calls `_scaled_dot_product_flash_attention_for_cpu`
// (forward and backward), which the host-kernel path runs asynchronously on
// ATen's CPU kernel, giving CPU's bits in every mode. The policy sees only
// metadata, so fake tensors (Dynamo, AOTAutograd) get the same answer.
int64_t fused_sdp_choice_for_stub(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                  const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                                  std::optional<double> scale, bool enable_gqa) {
  return at::native::_fused_sdp_choice_cpp(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
}

}  // namespace vtpu::bridge

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &vtpu::bridge::fused_sdp_choice_for_stub)
}  // namespace at::native

namespace vtpu::bridge {
namespace {

// `t.record_stream(s)` tells CUDA's caching allocator that stream `s` uses
// `t`, so its block is not reused before that stream's work is done (FSDP and
// prefetching code call it). vtpu has one in-order stream, whose blocks are
// reused in stream order already: nothing to record, but the stream must be
// a vtpu one, as CUDA requires a CUDA stream.
void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == kVtpu, "record_stream: expected a vtpu stream for a vtpu tensor, got a ",
              stream.device_type(), " stream");
  TORCH_CHECK(stream.device_index() == self.device().index() || stream.device_index() < 0,
              "record_stream: the stream is on device ", static_cast<int>(stream.device_index()),
              ", the tensor on ", self.device());
}

}  // namespace
// ATen's kaiser_window is a composite that fills its window through
// `kaiser_window_stub`, which has CPU and CUDA kernels only ("DispatchStub:
// missing kernel for vtpu" for any length above 1; found by review): the
// window is made on the CPU by its kernel (its argument checks included),
// then copied. ATen's other overloads call its implementation directly, so
// each is registered (with ATen's defaults: periodic, beta 12).
at::Tensor kaiser_window(int64_t window_length, bool periodic, double beta, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
  const at::Tensor host =
      at::kaiser_window(window_length, periodic, beta, at::TensorOptions().dtype(dtype).layout(layout));
  return empty_device(host.sizes(), host.scalar_type()).copy_(host);
}

at::Tensor kaiser_window_periodic(int64_t window_length, bool periodic, std::optional<c10::ScalarType> dtype,
                                  std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                  std::optional<bool> pin_memory) {
  return kaiser_window(window_length, periodic, 12.0, dtype, layout, device, pin_memory);
}

at::Tensor kaiser_window_default(int64_t window_length, std::optional<c10::ScalarType> dtype,
                                 std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                 std::optional<bool> pin_memory) {
  return kaiser_window(window_length, true, 12.0, dtype, layout, device, pin_memory);
}

// max_pool1d is composite: for CPU tensors that need no gradient ATen runs
// an index-free 1-d kernel, for every other device max_pool1d_with_indices.
// Ours took 3-8x the CPU's time without gradients (the 2-d pooling kernel,
// writing int64 indices nobody reads; a performance review). Without a
// gradient to track, the op runs on the host-kernel path, where ATen's
// composite sees CPU aliases and takes its 1-d kernel (the CPU's bits).
at::Tensor max_pool1d_on_host(const at::Tensor& self, c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                              c10::IntArrayRef padding, c10::IntArrayRef dilation, bool ceil_mode) {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::max_pool1d", "");
  torch::jit::Stack stack;
  torch::jit::push(stack, self, kernel_size, stride, padding, dilation, ceil_mode);
  // The 1-d kernel is floating only, while the meta step (the indexed
  // kernel's) takes any dtype: queued, an integer input raised at the next
  // synchronisation instead of at the call. Those run at once, where the CPU
  // raises what it raises.
  const c10::ScalarType dtype = self.scalar_type();
  const bool cpu_kernel_takes = dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf ||
                                dtype == at::kBFloat16;
  if (cpu_kernel_takes) run_on_host_kernel_path_boxed(op, &stack);
  else run_on_host_kernel_path_at_once_boxed(op, &stack, "meta_disagrees_with_cpu");
  return stack.back().toTensor();
}

at::Tensor max_pool1d(const at::Tensor& self, c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                      c10::IntArrayRef padding, c10::IntArrayRef dilation, bool ceil_mode) {
  // ATen's own condition for the indexed kernel, but for the device: a
  // gradient to track, or a tensor that is not a plain vtpu tensor (fake,
  // functional, a __torch_dispatch__ subclass, a dispatch mode active), which
  // must see the decomposed ops rather than a host kernel (torch.compile and
  // make_fx failed, or baked the traced input's values in; found by review).
  if ((at::GradMode::is_enabled() && self.requires_grad()) || self._fw_grad(/*level=*/0).defined() ||
      at::isTensorSubclassLike(self))
    return std::get<0>(at::max_pool1d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode));
  return max_pool1d_on_host(self, kernel_size, stride, padding, dilation, ceil_mode);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("max_pool1d", TORCH_FN(max_pool1d_on_host));
  m.impl("kaiser_window", TORCH_FN(kaiser_window_default));
  m.impl("kaiser_window.periodic", TORCH_FN(kaiser_window_periodic));
  m.impl("kaiser_window.beta", TORCH_FN(kaiser_window));
  m.impl("record_stream", TORCH_FN(record_stream));
  m.impl("scalar_tensor", TORCH_FN(scalar_tensor));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  m.impl("_fused_sdp_choice", TORCH_FN(fused_sdp_choice));
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("max_pool1d", TORCH_FN(max_pool1d));
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell));
}

// Under torch.inference_mode the autograd keys are skipped and the cells
// dispatch to the backend key, where ATen's CPU has no kernel for them:
// nn.LSTM/nn.GRU raised NotImplementedError there (found by review).
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell));
}

}  // namespace vtpu::bridge
