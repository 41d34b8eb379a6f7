// The batch-norm pieces nn.SyncBatchNorm calls between its collectives
// (per-device statistics, their merge across ranks, the elementwise
// normalisation and the two halves of the backward). ATen has them for CUDA
// only, so the host-kernel path had no kernel to run; here they are written
// with ATen ops on vtpu tensors (generated reductions and elementwise
// kernels), computing in float for 16-bit inputs as CUDA does.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "aten_bridge.h"

namespace vtpu::bridge {
namespace {

// Every dimension but the channels (1).
std::vector<std::int64_t> reduced_dims(const at::Tensor& input) {
  std::vector<std::int64_t> dims;
  for (std::int64_t d = 0; d < input.dim(); ++d)
    if (d != 1) dims.push_back(d);
  return dims;
}

// A per-channel vector shaped to broadcast against `input`: [1, C, 1, ...].
at::Tensor per_channel(const at::Tensor& values, const at::Tensor& input) {
  std::vector<std::int64_t> shape(static_cast<std::size_t>(input.dim()), 1);
  shape[1] = values.numel();
  return values.reshape(shape);
}

at::ScalarType compute_type(const at::Tensor& input) {
  return at::isReducedFloatingType(input.scalar_type()) ? at::kFloat : input.scalar_type();
}

void check_channels(const at::Tensor& input, const char* op) {
  TORCH_CHECK(input.dim() >= 2, op, ": expected an input with at least 2 dimensions (N, C, ...), got ",
              input.dim());
}

std::tuple<at::Tensor, at::Tensor> batch_norm_stats(const at::Tensor& input, double eps) {
  check_channels(input, "batch_norm_stats");
  const at::Tensor x = input.to(compute_type(input));
  const auto dims = reduced_dims(x);
  at::Tensor mean = x.mean(dims);
  at::Tensor var = (x - per_channel(mean, x)).square().mean(dims);  // biased, as CUDA's Welford
  return {mean, (var + eps).rsqrt()};
}

// Merges the ranks' statistics (rows of `mean` and `invstd`, `counts`
// elements each) into the global ones, and updates the running statistics
// with the unbiased variance.
std::tuple<at::Tensor, at::Tensor> gather_stats_with_counts(const at::Tensor& input, const at::Tensor& mean,
                                                            const at::Tensor& invstd,
                                                            const std::optional<at::Tensor>& running_mean,
                                                            const std::optional<at::Tensor>& running_var,
                                                            double momentum, double eps, const at::Tensor& counts) {
  TORCH_CHECK(mean.dim() == 2 && invstd.sizes() == mean.sizes() && counts.numel() == mean.size(0),
              "batch_norm_gather_stats_with_counts: expected mean and invstd of shape [world, C] and one count "
              "per row, got ", mean.sizes(), ", ", invstd.sizes(), " and ", counts.sizes());
  const at::Tensor n = counts.to(mean.scalar_type()).reshape({-1, 1});
  const at::Tensor total = n.sum();
  const at::Tensor global_mean = (mean * n).sum(0) / total;
  const at::Tensor local_var = invstd.pow(-2) - eps;
  const at::Tensor var_n = (local_var * n).sum(0) + ((mean - global_mean).square() * n).sum(0);
  const at::Tensor global_invstd = (var_n / total + eps).rsqrt();
  at::NoGradGuard no_grad;
  if (running_mean.has_value() && running_mean->defined())
    running_mean->mul_(1 - momentum).add_(global_mean.to(running_mean->scalar_type()), momentum);
  if (running_var.has_value() && running_var->defined())
    running_var->mul_(1 - momentum).add_((var_n / (total - 1)).to(running_var->scalar_type()), momentum);
  return {global_mean, global_invstd};
}

std::tuple<at::Tensor, at::Tensor> gather_stats(const at::Tensor& input, const at::Tensor& mean,
                                                const at::Tensor& invstd,
                                                const std::optional<at::Tensor>& running_mean,
                                                const std::optional<at::Tensor>& running_var, double momentum,
                                                double eps, std::int64_t count) {
  const at::Tensor counts = at::full({mean.size(0)}, static_cast<double>(count), mean.options());
  return gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps, counts);
}

at::Tensor batch_norm_elemt(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& invstd,
                            double) {
  check_channels(input, "batch_norm_elemt");
  at::Tensor out = (input.to(mean.scalar_type()) - per_channel(mean, input)) * per_channel(invstd, input);
  if (weight.has_value() && weight->defined()) out = out * per_channel(weight->to(out.scalar_type()), input);
  if (bias.has_value() && bias->defined()) out = out + per_channel(bias->to(out.scalar_type()), input);
  return out.to(input.scalar_type());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_reduce(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& weight, bool input_g, bool weight_g, bool bias_g) {
  check_channels(input, "batch_norm_backward_reduce");
  const auto dims = reduced_dims(input);
  const at::Tensor dy = grad_out.to(mean.scalar_type());
  const at::Tensor sum_dy = dy.sum(dims);
  const at::Tensor sum_dy_xmu = (dy * (input.to(mean.scalar_type()) - per_channel(mean, input))).sum(dims);
  const at::ScalarType param_type =
      weight.has_value() && weight->defined() ? weight->scalar_type() : mean.scalar_type();
  return {input_g ? sum_dy : at::Tensor(), input_g ? sum_dy_xmu : at::Tensor(),
          weight_g ? (sum_dy_xmu * invstd).to(param_type) : at::Tensor(),
          bias_g ? sum_dy.to(param_type) : at::Tensor()};
}

// `count`: the elements per channel on each rank; sum_dy and sum_dy_xmu are
// already summed over the ranks.
at::Tensor backward_elemt(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
                          const at::Tensor& invstd, const std::optional<at::Tensor>& weight,
                          const at::Tensor& sum_dy, const at::Tensor& sum_dy_xmu, const at::Tensor& count) {
  check_channels(input, "batch_norm_backward_elemt");
  const at::ScalarType type = mean.scalar_type();
  const at::Tensor norm = count.to(type).sum().reciprocal();
  const at::Tensor grad_mean = per_channel(sum_dy * norm, input);
  const at::Tensor proj_scale = per_channel(sum_dy_xmu * norm * invstd * invstd, input);
  at::Tensor grad_scale = invstd;
  if (weight.has_value() && weight->defined()) grad_scale = grad_scale * weight->to(type);
  const at::Tensor x_mu = input.to(type) - per_channel(mean, input);
  return ((grad_out.to(type) - grad_mean - x_mu * proj_scale) * per_channel(grad_scale, input))
      .to(input.scalar_type());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("batch_norm_stats", &batch_norm_stats);
  m.impl("batch_norm_gather_stats_with_counts", &gather_stats_with_counts);
  m.impl("batch_norm_gather_stats", &gather_stats);
  m.impl("batch_norm_elemt", &batch_norm_elemt);
  m.impl("batch_norm_backward_reduce", &backward_reduce);
  m.impl("batch_norm_backward_elemt", &backward_elemt);
}

}  // namespace
}  // namespace vtpu::bridge
