// Layer norm of the host-kernel path as row blocks on the work-sharing pool
// (extern_blocks.h): each block one single-threaded ATen call over a range
// of rows.
//
// Why: ATen's layer norm kernels split rows over OpenMP's team, and the
// fork-join waits for the second thread to wake and finish; in an MLP
// training step on this 2-core VM a 256x1024 forward took ~0.35 ms in the
// step against ~0.09 ms alone, its CPU samples the same (the rest was
// waiting). Blocks claimed from the pool start at once on the stream thread.
//
// Bits: the forward normalises each row on its own, so every block gives the
// whole call's bits for its rows (ATen's, on any thread count). The backward's
// input gradient is per row too; the weight and bias gradients sum over rows:
// each block sums its rows, and the blocks' partial sums are added in block
// order. Block boundaries depend only on the shape, so the result is the same
// on every run and thread count (ATen's own sums depend on its thread count).
#include <ATen/core/Tensor.h>
#include <ATen/ops/native_layer_norm.h>
#include <ATen/ops/native_layer_norm_backward.h>

#include <atomic>
#include <optional>
#include <vector>

#include "extern_blocks.h"
#include "generated_kernels.h"
#include "pool_blocks.h"

namespace vtpu::bridge {
namespace {

using pool_blocks::FirstError;
using pool_blocks::for_blocks;
using pool_blocks::SingleThreadedAten;

std::atomic<std::uint64_t> g_layer_norm_block_runs{0};

bool layer_norm_blocks_enabled() {
  static const bool enabled = pool_blocks::env_flag_on("VTPU_LAYER_NORM_ROW_BLOCKS");
  return enabled;
}

// Of `dtype`, contiguous, and `numel` elements (any shape).
bool plain(const at::Tensor& t, std::int64_t numel, at::ScalarType dtype) {
  return t.defined() && t.scalar_type() == dtype && t.is_contiguous() && t.numel() == numel;
}

struct LayerNormBlocks {
  bool backward = false;
  std::int64_t rows = 0, cols = 0, block_rows = 0;
  at::Tensor input, grad_out, mean_in, rstd_in;  // viewed (rows, cols) / (rows, 1)
  std::optional<at::Tensor> weight, bias;
  double eps = 0;
  at::Tensor out, mean_out, rstd_out;            // forward results; backward: out = input gradient
  std::vector<at::Tensor> weight_grads, bias_grads;  // backward: one partial sum per block
  FirstError error;
};

void run_layer_norm_blocks(std::int64_t first, std::int64_t last, void* raw) {
  auto& job = *static_cast<LayerNormBlocks*>(raw);
  job.error.run([&] {
    SingleThreadedAten single;
    for_blocks(first, last, job.block_rows, job.rows, [&](std::int64_t begin, std::int64_t count) {
      const at::Tensor x = job.input.narrow(0, begin, count);
      if (!job.backward) {
        auto [y, mean, rstd] = at::native_layer_norm(x, {job.cols}, job.weight, job.bias, job.eps);
        job.out.narrow(0, begin, count).copy_(y);
        job.mean_out.narrow(0, begin, count).copy_(mean);
        job.rstd_out.narrow(0, begin, count).copy_(rstd);
        return;
      }
      auto [dx, dweight, dbias] = at::native_layer_norm_backward(
          job.grad_out.narrow(0, begin, count), x, {job.cols}, job.mean_in.narrow(0, begin, count),
          job.rstd_in.narrow(0, begin, count), job.weight, job.bias, {true, true, true});
      job.out.narrow(0, begin, count).copy_(dx);
      const std::size_t block = static_cast<std::size_t>(begin / job.block_rows);
      job.weight_grads[block] = dweight;
      job.bias_grads[block] = dbias;
    });
  });
}

// The normalised size: the product of normalized_shape.
std::optional<std::int64_t> normalized_size(const c10::IValue& shape) {
  if (!shape.isIntList()) return std::nullopt;
  std::int64_t n = 1;
  for (const std::int64_t d : shape.toIntVector()) n *= d;
  return n;
}

}  // namespace

bool run_layer_norm_in_row_blocks(const std::string& name, torch::jit::Stack& s) {
  if (!layer_norm_blocks_enabled() || !SingleThreadedAten::available()) return false;
  LayerNormBlocks job;
  // native_layer_norm.out(input, normalized_shape, weight?, bias?, eps, out0, out1, out2);
  // native_layer_norm_backward.out(grad_out, input, normalized_shape, mean, rstd,
  //                                weight?, bias?, output_mask, out0, out1, out2).
  std::size_t at_input = 0;
  if (name == "aten::native_layer_norm_backward.out" && s.size() == 11) {
    job.backward = true;
    at_input = 1;
  } else if (!(name == "aten::native_layer_norm.out" && s.size() == 8)) {
    return false;
  }
  const std::size_t at_weight = job.backward ? 5 : 2, at_out = job.backward ? 8 : 5;
  if (!s[at_input].isTensor()) return false;
  const at::Tensor input = s[at_input].toTensor();
  const auto cols = normalized_size(s[at_input + 1]);
  if (!cols || *cols <= 0 || input.numel() % *cols != 0) return false;
  job.cols = *cols;
  job.rows = input.numel() / job.cols;
  // The forward in float32, bfloat16 and float16 (ATen's .out form of a
  // 16-bit layer norm took 1.8 against its functional form's 0.7 ms on
  // 2048 x 2048: the blocks call the functional one); the backward's weight
  // and bias gradients are partial sums added here, in float32 only (16-bit
  // partials would round where ATen's whole-call sums do not).
  const at::ScalarType dtype = input.scalar_type();
  if (dtype != at::kFloat && (job.backward || (dtype != at::kBFloat16 && dtype != at::kHalf))) return false;
  auto plain_of_dtype = [dtype](const at::Tensor& t, std::int64_t numel) { return plain(t, numel, dtype); };
  if (!plain_of_dtype(input, job.rows * job.cols)) return false;
  for (std::size_t i : {at_weight, at_weight + 1}) {
    if (s[i].isNone()) continue;
    if (!s[i].isTensor() || !plain_of_dtype(s[i].toTensor(), job.cols)) return false;
    // Viewed over the one normalised dim the blocks see ([8, 128] -> [1024]).
    (i == at_weight ? job.weight : job.bias) = s[i].toTensor().view({job.cols});
  }
  for (std::size_t i = at_out; i < at_out + 3; ++i)
    if (!s[i].isTensor()) return false;
  const at::Tensor out = s[at_out].toTensor();
  if (!plain_of_dtype(out, job.rows * job.cols) || out.sizes() != input.sizes()) return false;
  if (job.backward) {
    // All three gradients asked for, over an affine layer norm.
    const auto mask = s[7].isBoolList() ? s[7].toBoolList().vec() : std::vector<bool>{};
    if (mask != std::vector<bool>{true, true, true} || !job.weight || !job.bias) return false;
    if (!s[0].isTensor() || !s[3].isTensor() || !s[4].isTensor()) return false;
    const at::Tensor grad_out = s[0].toTensor(), mean = s[3].toTensor(), rstd = s[4].toTensor();
    if (!plain_of_dtype(grad_out, job.rows * job.cols) || !plain_of_dtype(mean, job.rows) || !plain_of_dtype(rstd, job.rows))
      return false;
    if (!plain_of_dtype(s[9].toTensor(), job.cols) || !plain_of_dtype(s[10].toTensor(), job.cols)) return false;
    job.grad_out = grad_out.view({job.rows, job.cols});
    job.mean_in = mean.view({job.rows, 1});
    job.rstd_in = rstd.view({job.rows, 1});
  } else {
    if (!s[4].isDouble()) return false;
    job.eps = s[4].toDouble();
    if (!plain_of_dtype(s[6].toTensor(), job.rows) || !plain_of_dtype(s[7].toTensor(), job.rows)) return false;
    job.mean_out = s[6].toTensor().view({job.rows, 1});
    job.rstd_out = s[7].toTensor().view({job.rows, 1});
  }
  job.input = input.view({job.rows, job.cols});
  job.out = out.view({job.rows, job.cols});
  // Blocks of at least 16k elements, at most kMaxBlocks; fewer than two
  // blocks' worth stays on ATen's kernel (nothing to share).
  constexpr std::int64_t kMaxBlocks = 8, kMinBlockElements = 16384;
  const std::int64_t min_rows = (kMinBlockElements + job.cols - 1) / job.cols;
  job.block_rows = std::max(min_rows, (job.rows + kMaxBlocks - 1) / kMaxBlocks);
  const std::int64_t blocks = (job.rows + job.block_rows - 1) / job.block_rows;
  if (blocks < 2) return false;
  job.weight_grads.resize(static_cast<std::size_t>(blocks));
  job.bias_grads.resize(static_cast<std::size_t>(blocks));
  parallel_over(blocks, 1, &run_layer_norm_blocks, &job);
  job.error.rethrow();
  if (job.backward) {
    // The partial sums in block order: the same bits on every run.
    pool_blocks::sum_in_order(s[9].toTensor(), job.weight_grads);
    pool_blocks::sum_in_order(s[10].toTensor(), job.bias_grads);
  }
  const c10::IValue out0 = s[at_out], out1 = s[at_out + 1], out2 = s[at_out + 2];
  s.clear();
  s.push_back(out0);
  s.push_back(out1);
  s.push_back(out2);
  g_layer_norm_block_runs.fetch_add(1, std::memory_order_relaxed);
  return true;
}

std::uint64_t layer_norm_row_block_runs() { return g_layer_norm_block_runs.load(std::memory_order_relaxed); }

}  // namespace vtpu::bridge
