// RMS norm (F.rms_norm, nn.RMSNorm) as one fused program in every mode.
//
// ATen's rms_norm calls _fused_rms_norm, which has kernels for CUDA and MPS
// only; elsewhere its composite ran op by op, so strict mode launched six
// kernels for the forward and about twenty with the backward (4096x1024
// float32 forward + backward: 23 ms in strict mode, 10.5 ms with this file).
// Registered for the device, the forward runs the composite's own ops inside
// an OpWindow: strict mode records them and queues them as fused kernels (the
// squares and the mean in one reduction, the scaling in one elementwise
// kernel), fused mode lets them join the ops around them, debug mode runs
// them one by one. Fused kernels give the unfused kernels' bits, so all three
// modes, and strict mode before this file, give the same forward bits.
//
// With a device kernel for the forward, autograd records
// _fused_rms_norm_backward (as on CUDA), which has no CPU kernel either: it
// runs here the same way, from the gradient of y = x * rstd * w with
// rstd = (mean(x^2) + eps)^-1/2:
//   dx = (g*w - x_hat * sum(g*w * x_hat) / N) * rstd,  x_hat = x * rstd
//   dw = sum over the leading dims of g * x_hat
// computed in the op-math dtype (float for 16-bit inputs) and cast back. Its
// rounding differs from the composite's autograd by the order of operations
// (tests compare against the CPU with tolerances, and the modes bitwise).
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "aten_bridge.h"
#include "fused_window.h"

namespace vtpu::bridge {
namespace {

bool has(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// The leading (outer) and normalized (inner) dims, checked as ATen's
// rms_norm checks them: a direct call of the op gets the same errors.
struct Split {
  std::vector<std::int64_t> inner, outer;
  std::int64_t rows = 1, cols = 1;
};

Split split_dims(const at::Tensor& input, c10::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight) {
  const auto nd = static_cast<std::int64_t>(normalized_shape.size());
  TORCH_CHECK(nd >= 1, "Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one element, ",
              "but got normalized_shape = ", normalized_shape);
  TORCH_CHECK(!has(weight) || weight->sizes().equals(normalized_shape), "Expected weight to be of same shape as ",
              "normalized_shape, but got weight of shape ", weight->sizes(), " and normalized_shape = ", normalized_shape);
  TORCH_CHECK(input.dim() >= nd && input.sizes().slice(static_cast<std::size_t>(input.dim() - nd)).equals(normalized_shape),
              "Given normalized_shape=", normalized_shape, ", expected input with shape [*, ",
              c10::Join(", ", normalized_shape), "], but got input of size", input.sizes());
  Split s;
  for (std::int64_t d = 0; d < input.dim(); ++d) {
    if (d < input.dim() - nd) {
      s.outer.push_back(d);
      s.rows *= input.size(d);
    } else {
      s.inner.push_back(d);
      s.cols *= input.size(d);
    }
  }
  return s;
}

bool channels_last(const at::Tensor& t) {
  const auto format = t.suggest_memory_format();
  return format == at::MemoryFormat::ChannelsLast || format == at::MemoryFormat::ChannelsLast3d;
}

std::tuple<at::Tensor, at::Tensor> fused_rms_norm(const at::Tensor& input, c10::IntArrayRef normalized_shape,
                                                  const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  const Split s = split_dims(input, normalized_shape, weight);
  const at::ScalarType opmath = at::toOpMathType(input.scalar_type());
  // The composite's eps: a float for float (and complex float) math, so a
  // double eps is rounded to float first, as ATen's does.
  const bool single = opmath == at::kFloat || opmath == at::kComplexFloat;
  const double eps_value = single ? static_cast<double>(static_cast<float>(eps.value_or(std::numeric_limits<float>::epsilon())))
                                  : eps.value_or(std::numeric_limits<double>::epsilon());
  OpWindow fused;
  const at::Tensor x = input.to(opmath);
  at::Tensor rstd;
  {
    // Temporaries die before the flush: fused kernels never store them.
    at::Tensor mean_square = at::pow(x, 2).mean(s.inner, /*keepdim=*/true);
    rstd = at::rsqrt(mean_square.add_(eps_value));
  }
  at::Tensor y = x.mul(rstd);
  if (has(weight)) y = y.mul(*weight);
  if (!channels_last(input)) {
    y = y.contiguous();
    rstd = rstd.contiguous();
  }
  y = y.type_as(input);
  fused.flush();
  return {std::move(y), std::move(rstd)};
}

std::tuple<at::Tensor, at::Tensor> fused_rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& input,
                                                           c10::IntArrayRef normalized_shape, const at::Tensor& rstd,
                                                           const std::optional<at::Tensor>& weight,
                                                           std::array<bool, 2> output_mask) {
  const Split s = split_dims(input, normalized_shape, weight);
  TORCH_CHECK(grad_out.sizes().equals(input.sizes()), "_fused_rms_norm_backward: grad_out of size ", grad_out.sizes(),
              " does not match input of size ", input.sizes());
  TORCH_CHECK(rstd.numel() == s.rows, "_fused_rms_norm_backward: rstd has ", rstd.numel(), " elements, expected one per ",
              "row (", s.rows, ")");
  at::Tensor dx, dw;
  if (s.rows == 0 || s.cols == 0) {
    if (output_mask[0]) dx = at::zeros_like(input, at::MemoryFormat::Contiguous);
    if (output_mask[1] && has(weight)) dw = at::zeros_like(*weight, at::MemoryFormat::Contiguous);
    return {dx, dw};
  }
  // rstd as one value per row, broadcasting over the normalized dims.
  std::vector<std::int64_t> stat_shape(input.sizes().begin(), input.sizes().end());
  for (std::int64_t d : s.inner) stat_shape[static_cast<std::size_t>(d)] = 1;
  const at::ScalarType opmath = at::toOpMathType(input.scalar_type());
  OpWindow fused;
  const at::Tensor r = rstd.to(opmath).reshape(stat_shape);
  const at::Tensor g = grad_out.to(opmath);
  const at::Tensor x_hat = input.to(opmath).mul(r);
  if (output_mask[0]) {
    const at::Tensor g_hat = has(weight) ? g.mul(*weight) : g;
    at::Tensor projection = g_hat.mul(x_hat).sum(s.inner, /*keepdim=*/true).div_(static_cast<double>(s.cols));
    dx = g_hat.sub(x_hat.mul(projection)).mul_(r).to(input.scalar_type());
  }
  if (output_mask[1] && has(weight)) {
    at::Tensor per_element = g.mul(x_hat);
    dw = (s.outer.empty() ? per_element : per_element.sum(s.outer)).to(weight->scalar_type());
  }
  fused.flush();
  return {dx, dw};
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_fused_rms_norm", TORCH_FN(fused_rms_norm));
  m.impl("_fused_rms_norm_backward", TORCH_FN(fused_rms_norm_backward));
}

}  // namespace
}  // namespace vtpu::bridge
