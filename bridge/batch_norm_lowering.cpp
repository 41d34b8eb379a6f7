// Batch norm in training mode as vTPU ops instead of ATen's CPU kernel.
//
// ATen's CPU batch norm collects each channel's statistics in a serial loop
// with a double accumulator (one thread per channel, no vectors), then
// normalises; and the ReLU that follows it in nearly every model is one more
// pass over memory. Written with the bridge's own ops, the statistics are
// generated reductions over N, H, W (one row of H*W per image, vectorised),
// and in fused mode the normalisation lands in the same kernel as the ops
// around it (the ReLU after it; the ReLU's backward and the gradient sums in
// the backward). Strict and fused mode run the same ops, so they give the same
// bits; against the CPU the results differ by rounding (the ops are those of
// ATen's formulas, the summation order is not).
//
// Cases outside this (evaluation mode, other dtypes than float32, one value
// per channel, a missing statistic) return no results: ATen's kernel runs.
#include "batch_norm_lowering.h"

#include <ATen/core/Tensor.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/sum.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "aten_bridge.h"
#include "fused_window.h"

namespace vtpu::bridge {
namespace {

std::optional<at::Tensor> optional_tensor(const c10::IValue& v) {
  if (v.isTensor() && v.toTensor().defined()) return v.toTensor();
  return std::nullopt;
}

bool is_device_float(const at::Tensor& t) { return t.device().type() == kVtpu && t.scalar_type() == at::kFloat; }

// The channel dim is 1; statistics reduce every other dim.
struct Geometry {
  std::int64_t channels = 0;
  std::int64_t count = 0;                 // values per channel
  std::vector<std::int64_t> reduce_dims;  // 0, 2, 3, ...
  std::vector<std::int64_t> channel_shape;  // 1, C, 1, ...: broadcasts a [C] statistic
};

std::optional<Geometry> geometry_of(const at::Tensor& input) {
  if (!is_device_float(input) || input.dim() < 2 || input.numel() == 0) return std::nullopt;
  Geometry g;
  g.channels = input.size(1);
  g.count = input.numel() / g.channels;
  g.reduce_dims.push_back(0);
  g.channel_shape.assign(static_cast<std::size_t>(input.dim()), 1);
  g.channel_shape[1] = g.channels;
  for (std::int64_t d = 2; d < input.dim(); ++d) g.reduce_dims.push_back(d);
  return g;
}

// A per-channel parameter or statistic the lowering can read: absent, or a
// float32 device vector of C values.
bool usable_vector(const std::optional<at::Tensor>& t, std::int64_t channels) {
  return !t || (is_device_float(*t) && t->dim() == 1 && t->size(0) == channels);
}

// (out, save_mean, save_invstd), updating the running statistics in place as
// ATen's kernel does: running = momentum * batch + (1 - momentum) * running,
// the variance unbiased.
std::vector<at::Tensor> training_forward(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                         const std::optional<at::Tensor>& bias,
                                         const std::optional<at::Tensor>& running_mean,
                                         const std::optional<at::Tensor>& running_var, double momentum, double eps) {
  const auto g = geometry_of(input);
  // One value per channel has no variance (ATen's kernel divides by zero for
  // the running variance); left to ATen, as are parameters of other types.
  if (!g || g->count < 2) return {};
  for (const auto* t : {&weight, &bias, &running_mean, &running_var})
    if (!usable_vector(*t, g->channels)) return {};
  const double count = static_cast<double>(g->count);
  OpWindow fused;
  const at::Tensor mean = at::sum(input, g->reduce_dims) / count;
  const at::Tensor mean_b = mean.view(g->channel_shape);
  at::Tensor var_sum;
  {
    // A temporary: dropped before the window flushes, so in fused mode it is
    // computed inside the reduction's kernel and never stored.
    at::Tensor centred = input - mean_b;
    var_sum = at::sum(centred.mul_(centred), g->reduce_dims);
  }
  const at::Tensor invstd = at::rsqrt(var_sum / count + eps);
  // ATen's transform: out = x * alpha + beta per channel.
  const at::Tensor alpha = weight ? invstd * *weight : invstd;
  const at::Tensor beta = bias ? *bias - mean * alpha : -(mean * alpha);
  // In place where a temporary would be: every temporary is allocated at
  // dispatch even when fused mode never writes it, and ATen's kernel
  // allocates nothing beyond its results.
  at::Tensor out = input * alpha.view(g->channel_shape);
  out.add_(beta.view(g->channel_shape));
  if (running_mean) running_mean->mul_(1 - momentum).add_(mean * momentum);
  if (running_var) running_var->mul_(1 - momentum).add_(var_sum * (momentum / (count - 1)));
  fused.flush();
  return {std::move(out), mean, invstd};
}

}  // namespace

std::vector<at::Tensor> lower_native_batch_norm(c10::ArrayRef<c10::IValue> a) {
  // native_batch_norm(input, weight?, bias?, running_mean?, running_var?, training, momentum, eps)
  if (!a[5].toBool()) return {};
  return training_forward(a[0].toTensor(), optional_tensor(a[1]), optional_tensor(a[2]), optional_tensor(a[3]),
                          optional_tensor(a[4]), a[6].toDouble(), a[7].toDouble());
}

std::vector<at::Tensor> lower_native_batch_norm_legit(c10::ArrayRef<c10::IValue> a, bool with_stats) {
  // _native_batch_norm_legit(input, weight?, bias?, running_mean!, running_var!, training, momentum, eps)
  // _native_batch_norm_legit.no_stats(input, weight?, bias?, training, momentum, eps)
  const std::size_t flags = with_stats ? 5 : 3;
  if (!a[flags].toBool()) return {};
  return training_forward(a[0].toTensor(), optional_tensor(a[1]), optional_tensor(a[2]),
                          with_stats ? optional_tensor(a[3]) : std::nullopt,
                          with_stats ? optional_tensor(a[4]) : std::nullopt, a[flags + 1].toDouble(),
                          a[flags + 2].toDouble());
}

std::vector<at::Tensor> lower_native_batch_norm_backward(c10::ArrayRef<c10::IValue> a) {
  // native_batch_norm_backward(grad_out, input, weight?, running_mean?, running_var?,
  //                            save_mean?, save_invstd?, train, eps, output_mask[3])
  const at::Tensor& grad_out = a[0].toTensor();
  const at::Tensor& input = a[1].toTensor();
  const auto weight = optional_tensor(a[2]);
  const auto save_mean = optional_tensor(a[5]);
  const auto save_invstd = optional_tensor(a[6]);
  const auto g = geometry_of(input);
  if (!a[7].toBool() || !g || !save_mean || !save_invstd || !is_device_float(grad_out) ||
      !grad_out.sizes().equals(input.sizes()))
    return {};
  for (const auto* t : {&weight, &save_mean, &save_invstd})
    if (!usable_vector(*t, g->channels)) return {};
  const auto mask = a[9].toBoolList();
  const double count = static_cast<double>(g->count);
  OpWindow fused;
  const at::Tensor& mean = *save_mean;
  const at::Tensor& invstd = *save_invstd;
  const at::Tensor mean_b = mean.view(g->channel_shape);
  // ATen's formulas: with sum_dy = sum(dy) and dot = sum(dy * (x - mean)) per
  // channel, grad_input = (dy - sum_dy / N - (x - mean) * dot * invstd^2 / N)
  // * invstd * weight, grad_weight = dot * invstd, grad_bias = sum_dy.
  const at::Tensor sum_dy = at::sum(grad_out, g->reduce_dims);
  const at::Tensor dot = at::sum((input - mean_b).mul_(grad_out), g->reduce_dims);
  at::Tensor grad_input, grad_weight, grad_bias;
  if (mask[0]) {
    // As (x * -k + (mean * k - sum_dy / N) + dy) * invstd * weight, k = dot *
    // invstd^2 / N: the first op reads a value of dot, so in fused mode the
    // whole expression runs in one kernel after dot's (written in ATen's
    // order, its first op would join dot's kernel and store its result).
    const at::Tensor k = dot * invstd * invstd / count;
    const at::Tensor shift = (mean * k - sum_dy / count).view(g->channel_shape);
    const at::Tensor scale = (weight ? invstd * *weight : invstd).view(g->channel_shape);
    grad_input = input * (-k).view(g->channel_shape);
    grad_input.add_(shift).add_(grad_out).mul_(scale);
  }
  if (mask[1]) grad_weight = dot * invstd;
  if (mask[2]) grad_bias = sum_dy;
  fused.flush();
  return {grad_input, grad_weight, grad_bias};
}

}  // namespace vtpu::bridge
