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

// The channel dim is 1; statistics reduce every other dim. The work runs in
// a view where the channels are the innermost dim when the input is
// channels-last (N, H, W, C): there the statistics are column sums, which
// stream through memory; reducing N, H, W of each channel in place would walk
// the tensor at stride C once per channel (12.5 ms instead of 1.6 for a
// 32x64x32x32 forward). Every tensor of the op's size goes through `work`
// and every result back through `result`.
struct Geometry {
  std::int64_t channels = 0;
  std::int64_t count = 0;                   // values per channel
  bool channels_last = false;
  std::vector<std::int64_t> reduce_dims;    // in the working view
  std::vector<std::int64_t> channel_shape;  // broadcasts a [C] statistic in the working view
  std::vector<std::int64_t> to_work, to_result;  // permutations (channels_last)

  at::Tensor work(const at::Tensor& t) const { return channels_last ? t.permute(to_work) : t; }
  at::Tensor result(const at::Tensor& t) const { return channels_last ? t.permute(to_result) : t; }
  at::Tensor per_channel(const at::Tensor& t) const { return t.view(channel_shape); }
};

std::optional<Geometry> geometry_of(const at::Tensor& input) {
  if (!is_device_float(input) || input.dim() < 2 || input.numel() == 0) return std::nullopt;
  Geometry g;
  const std::int64_t dim = input.dim();
  g.channels = input.size(1);
  g.count = input.numel() / g.channels;
  g.channels_last = !input.is_contiguous() &&
                    ((dim == 4 && input.is_contiguous(at::MemoryFormat::ChannelsLast)) ||
                     (dim == 5 && input.is_contiguous(at::MemoryFormat::ChannelsLast3d)));
  g.channel_shape.assign(static_cast<std::size_t>(dim), 1);
  if (g.channels_last) {
    g.to_work.push_back(0);
    for (std::int64_t d = 2; d < dim; ++d) g.to_work.push_back(d);
    g.to_work.push_back(1);
    g.to_result = {0, dim - 1};
    for (std::int64_t d = 1; d < dim - 1; ++d) g.to_result.push_back(d);
    for (std::int64_t d = 0; d < dim - 1; ++d) g.reduce_dims.push_back(d);
    g.channel_shape.back() = g.channels;
  } else {
    g.reduce_dims.push_back(0);
    for (std::int64_t d = 2; d < dim; ++d) g.reduce_dims.push_back(d);
    g.channel_shape[1] = g.channels;
  }
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
  const at::Tensor x = g->work(input);
  const at::Tensor mean = at::sum(x, g->reduce_dims) / count;
  at::Tensor var_sum;
  {
    // A temporary: dropped before the window flushes, so in fused mode it is
    // computed inside the reduction's kernel and never stored.
    at::Tensor centred = x - g->per_channel(mean);
    var_sum = at::sum(centred.mul_(centred), g->reduce_dims);
  }
  const at::Tensor invstd = at::rsqrt(var_sum / count + eps);
  // ATen's transform: out = x * alpha + beta per channel. In place where a
  // temporary would be: every temporary is allocated at dispatch even when
  // fused mode never writes it, and ATen's kernel allocates nothing beyond
  // its results.
  const at::Tensor alpha = weight ? invstd * *weight : invstd;
  const at::Tensor beta = bias ? *bias - mean * alpha : -(mean * alpha);
  at::Tensor out = x * g->per_channel(alpha);
  out.add_(g->per_channel(beta));
  out = g->result(out);
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
  const at::Tensor x = g->work(input);
  const at::Tensor dy = g->work(grad_out);
  const at::Tensor mean_b = g->per_channel(mean);
  // ATen's formulas: with sum_dy = sum(dy) and dot = sum(dy * (x - mean)) per
  // channel, grad_input = (dy - sum_dy / N - (x - mean) * dot * invstd^2 / N)
  // * invstd * weight, grad_weight = dot * invstd, grad_bias = sum_dy.
  const at::Tensor sum_dy = at::sum(dy, g->reduce_dims);
  const at::Tensor dot = at::sum((x - mean_b).mul_(dy), g->reduce_dims);
  at::Tensor grad_input, grad_weight, grad_bias;
  if (mask[0]) {
    // As (x * -k + (mean * k - sum_dy / N) + dy) * invstd * weight, k = dot *
    // invstd^2 / N: the first op reads a value of dot, so in fused mode the
    // whole expression runs in one kernel after dot's (written in ATen's
    // order, its first op would join dot's kernel and store its result).
    const at::Tensor k = dot * invstd * invstd / count;
    const at::Tensor shift = g->per_channel(mean * k - sum_dy / count);
    const at::Tensor scale = g->per_channel(weight ? invstd * *weight : invstd);
    grad_input = x * g->per_channel(-k);
    grad_input.add_(shift).add_(dy).mul_(scale);
    grad_input = g->result(grad_input);
  }
  if (mask[1]) grad_weight = dot * invstd;
  if (mask[2]) grad_bias = sum_dy;
  fused.flush();
  return {grad_input, grad_weight, grad_bias};
}

}  // namespace vtpu::bridge
