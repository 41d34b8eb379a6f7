#include "extern_blocks.h"

#include <ATen/core/Tensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/mm.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <optional>
#include <vector>

#include "generated_kernels.h"
#include "memory_overlap.h"
#include "onednn_gemm.h"
#include "pool_blocks.h"
#include "vtpu/runtime/skinny_gemm.h"

namespace vtpu::bridge {
using namespace pool_blocks;  // NOLINT: this file is the helpers' main user
namespace {

std::atomic<std::uint64_t> g_row_block_runs{0};
std::atomic<std::uint64_t> g_attention_block_runs{0};
std::atomic<std::uint64_t> g_convolution_block_runs{0};

bool row_blocks_enabled() {
  static const bool enabled = env_flag_on("VTPU_GEMM_ROW_BLOCKS");
  return enabled;
}

std::atomic<std::uint64_t> g_column_block_runs{0};

bool column_blocks_enabled() {
  static const bool enabled = env_flag_on("VTPU_GEMM_COLUMN_BLOCKS");
  return enabled;
}

struct GemmBlocks {
  at::Tensor out, mat1, mat2, bias;  // bias defined for addmm
  // Blocks of the product's columns instead of its rows: for a transposed
  // right-hand matrix (nn.Linear's x @ W.t()), see run_gemm_in_row_blocks.
  bool by_columns = false;
  // Each call (block or whole product) on oneDNN instead of MKL
  // (onednn_gemm.h).
  bool onednn = false;
  std::int64_t block_size = 0;       // rows (or columns) per block
  bool bias_by_row = false;          // a (M, N) bias is split with the rows
  c10::Scalar beta, alpha;
  FirstError error;
  // Runs after each block, on the thread that ran it (a fused epilogue).
  const GemmBlockHook* after = nullptr;
};

// out = bias + mat1 @ mat2 (job's beta and alpha; no bias for mm) on
// oneDNN or MKL, as the job says.
void multiply(const GemmBlocks& job, at::Tensor& out, const at::Tensor& mat1, const at::Tensor& mat2,
              const at::Tensor& bias) {
  if (job.onednn)
    onednn_gemm(out, mat1, mat2, bias);
  else if (bias.defined())
    at::addmm_out(out, bias, mat1, mat2, job.beta, job.alpha);
  else
    at::mm_out(out, mat1, mat2);
}

// Columns [begin, begin + count) of the product: the right-hand matrix's
// columns and the bias's, broadcast to the product's shape first.
void run_column_block(GemmBlocks& job, std::int64_t begin, std::int64_t count) {
  at::Tensor out = job.out.narrow(1, begin, count);
  const at::Tensor mat2 = job.mat2.narrow(1, begin, count);
  const at::Tensor bias =
      job.bias.defined() ? job.bias.expand(job.out.sizes()).narrow(1, begin, count) : at::Tensor();
  multiply(job, out, job.mat1, mat2, bias);
}

// Row (or column) blocks [first, last) of the product, one single-threaded
// MKL or oneDNN call each. The blocks' boundaries depend only on the shapes,
// never on which thread runs them or whether the pool shares them: the
// libraries' summation order can depend on a block's size, so this keeps
// the bits deterministic.
void run_blocks(std::int64_t first, std::int64_t last, void* raw) {
  auto& job = *static_cast<GemmBlocks*>(raw);
  job.error.run([&] {
    // oneDNN threads with OpenMP, MKL with its own per-thread count.
    std::optional<SingleThreadedAten> single_aten;
    std::optional<SingleThreadedMkl> single_mkl;
    if (job.onednn)
      single_aten.emplace();
    else
      single_mkl.emplace();
    const std::int64_t total = job.out.size(job.by_columns ? 1 : 0);
    for_blocks(first, last, job.block_size, total, [&](std::int64_t begin, std::int64_t count) {
      if (job.by_columns) {
        run_column_block(job, begin, count);
        if (job.after != nullptr) job.after->after_block(1, begin, count);
        return;
      }
      at::Tensor out = job.out.narrow(0, begin, count);
      const at::Tensor mat1 = job.mat1.narrow(0, begin, count);
      const at::Tensor bias =
          !job.bias.defined() ? at::Tensor() : job.bias_by_row ? job.bias.narrow(0, begin, count) : job.bias;
      multiply(job, out, mat1, job.mat2, bias);
      if (job.after != nullptr) job.after->after_block(0, begin, count);
    });
  });
}

std::atomic<std::uint64_t> g_skinny_runs{0};

bool skinny_gemm_enabled() {
  static const bool enabled = env_flag_on("VTPU_SKINNY_GEMM");
  return enabled;
}

void run_skinny_columns(std::int64_t begin, std::int64_t end, void* raw) {
  runtime::skinny_gemm_columns(*static_cast<const runtime::SkinnyGemm*>(raw), begin, end);
}

// A float32 or bfloat16 product of a few rows by nn.Linear's transposed
// weight (decoding one token, or a few): our memory-bound kernel on the pool
// by column blocks
// (vtpu/runtime/skinny_gemm.h; MKL runs it on one thread at a third of the
// bandwidth). Fills `g` and says whether it takes `job`, which has passed
// plan_gemm's checks.
bool plan_skinny_gemm(const GemmBlocks& job, runtime::SkinnyGemm& g) {
  const at::Tensor& out = job.out;
  const std::int64_t rows = out.size(0), k = job.mat1.size(1), n = out.size(1);
  // A right-hand matrix under 64 KB stays in a core's cache, where MKL is as
  // fast and gives the CPU's bits.
  constexpr std::int64_t kMinRightHandBytes = std::int64_t{1} << 16;
  const std::int64_t item = out.element_size();
  if (!skinny_gemm_enabled() || rows > runtime::kSkinnyGemmMaxRows || k == 0 || n == 0 ||
      k * n * item < kMinRightHandBytes)
    return false;
  if (job.mat2.stride(0) != 1 || (job.mat1.stride(1) != 1 && k > 1)) return false;
  g.dtype = out.scalar_type() == at::kBFloat16 ? runtime::SkinnyGemmDtype::kBFloat16 : runtime::SkinnyGemmDtype::kFloat32;
  g.rows = rows;
  g.k = k;
  g.n = n;
  g.a = job.mat1.const_data_ptr();
  g.a_row_stride = job.mat1.stride(0);
  g.b = job.mat2.const_data_ptr();
  g.b_k_stride = 1;
  g.b_n_stride = job.mat2.stride(1);
  g.c = out.mutable_data_ptr();
  g.c_row_stride = out.stride(0);
  if (job.bias.defined()) {
    // Complex alpha/beta with float tensors: ATen's kernel raises its error.
    if (job.alpha.isComplex() || job.beta.isComplex()) return false;
    const at::Tensor bias = job.bias.expand(out.sizes());
    g.bias = bias.const_data_ptr();
    g.bias_row_stride = bias.stride(0);
    g.bias_n_stride = bias.stride(1);
    g.alpha = job.alpha.to<float>();
    g.beta = job.beta.to<float>();
  }
  return runtime::skinny_gemm_accepts(g);
}

void run_skinny_gemm(const GemmBlocks& job, const runtime::SkinnyGemm& g) {
  // Chunks of at least ~32 KB of the weight: smaller ones are not worth a
  // helper's wake-up; a product below one chunk runs on the calling thread.
  const std::int64_t grain =
      std::max<std::int64_t>(1, (std::int64_t{1} << 15) / (job.mat1.size(1) * job.out.element_size()));
  parallel_over(job.out.size(1), grain, &run_skinny_columns, const_cast<runtime::SkinnyGemm*>(&g));
  g_skinny_runs.fetch_add(1, std::memory_order_relaxed);
}

// How a product runs: ATen's kernel (the caller's), the skinny GEMM, MKL or
// oneDNN in row or column blocks on the pool, or one oneDNN call on its
// OpenMP threads.
enum class GemmRoute { kAten, kSkinny, kRows, kColumns, kWholeOneDnn };

// Reads the out= call `s` of `name` into `job` and decides its route, from
// the operands' dtypes, shapes, strides and addresses only (so a product
// planned at dispatch runs the same way on the stream). Runs nothing.
GemmRoute plan_gemm(const std::string& name, const torch::jit::Stack& s, GemmBlocks& job,
                    runtime::SkinnyGemm& skinny) {
  if (name == "aten::mm.out" && s.size() == 3) {
    job.mat1 = s[0].toTensor();
    job.mat2 = s[1].toTensor();
    job.out = s[2].toTensor();
  } else if (name == "aten::addmm.out" && s.size() == 6) {
    job.bias = s[0].toTensor();
    job.mat1 = s[1].toTensor();
    job.mat2 = s[2].toTensor();
    job.beta = s[3].toScalar();
    job.alpha = s[4].toScalar();
    job.out = s[5].toTensor();
  } else {
    return GemmRoute::kAten;
  }
  const at::Tensor& out = job.out;
  // float32 (and bfloat16 for the skinny GEMM; other dtypes take other GEMM
  // kernels), the out= buffer the dispatch allocated: row-major, so a block
  // of rows is a block of memory.
  const at::ScalarType dtype = out.scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16) return GemmRoute::kAten;
  for (const at::Tensor* t : {&job.mat1, &job.mat2, &job.out})
    if (t->scalar_type() != dtype || t->dim() != 2) return GemmRoute::kAten;
  if (!out.is_contiguous() || out.size(0) != job.mat1.size(0) || out.size(1) != job.mat2.size(1) ||
      job.mat1.size(1) != job.mat2.size(0))
    return GemmRoute::kAten;
  if (job.bias.defined()) {
    if (job.bias.scalar_type() != dtype || job.bias.dim() > 2) return GemmRoute::kAten;
    job.bias_by_row = job.bias.dim() == 2 && job.bias.size(0) == out.size(0) && out.size(0) > 1;
    // A bias of the wrong shape: ATen's kernel raises, naming the whole
    // product's sizes (a block's call would name the block's).
    if (!at::is_expandable_to(job.bias.sizes(), out.sizes())) return GemmRoute::kAten;
  }
  // An out= whose memory overlaps an operand: every block reads all of
  // mat2 and (unless it is split by rows) the bias while others write, and
  // MKL may write a block's rows before it has read all of mat1's (panels
  // of the summed dimension). ATen's kernel handles what can be handled.
  // Exception: the in-place addmm_, out the very (M, N) bias, whose rows
  // each block reads before writing them, as ATen does.
  const bool in_place_bias = job.bias_by_row && job.bias.const_data_ptr() == out.const_data_ptr() &&
                             job.bias.sizes() == out.sizes() && job.bias.strides() == out.strides();
  if (spans_intersect(out, job.mat1) || spans_intersect(out, job.mat2) ||
      (job.bias.defined() && !in_place_bias && spans_intersect(out, job.bias)))
    return GemmRoute::kAten;
  if (plan_skinny_gemm(job, skinny)) return GemmRoute::kSkinny;
  // oneDNN for products of at least 16M multiply-adds: its call costs
  // ~12 us more than MKL's (one thread: 1.43x MKL's time at 1M, 0.98 at 8M).
  // Its operands must be laid out as it reads them in place: ATen's
  // mkldnn_matmul copies any other layout first.
  constexpr std::int64_t kMinOneDnnMultiplyAdds = std::int64_t{1} << 24;
  const bool onednn_whole =
      onednn_gemm_enabled() && onednn_gemm_accepts(out, job.mat1, job.mat2, job.bias, job.beta, job.alpha) &&
      out.size(0) * job.mat1.size(1) * out.size(1) >= kMinOneDnnMultiplyAdds && onednn_reads_in_place(job.mat1) &&
      onednn_reads_in_place(job.mat2);
  job.onednn = onednn_whole;
  // What is not split into blocks runs as one call on the library's threads.
  const GemmRoute whole = onednn_whole ? GemmRoute::kWholeOneDnn : GemmRoute::kAten;
  if (dtype != at::kFloat || !row_blocks_enabled() || mkl_set_local_threads() == nullptr ||
      (onednn_whole && !SingleThreadedAten::available()))
    return whole;
  const std::int64_t rows = out.size(0), k = job.mat1.size(1), n = out.size(1);
  // Blocks of at least 16 rows and ~1M multiply-adds (each block packs the
  // right-hand matrix again, which 16 rows amortise, and a smaller block is
  // not worth a helper's time), at most kMaxBlocks of them. oneDNN's blocks
  // are at least 128 rows (or columns) wide: thinner ones ran no faster
  // than MKL's (one thread: 32x256x768 and 256x256x96 at 0.99 of MKL's
  // time, 256x768x256 at 0.77-0.82), and the Qwen3-style step's GEMM time
  // was 0.93-1.0 of MKL's in blocks of 32 rows, 0.78-0.89 in blocks of 128
  // (in-process A/B, 2026-12-07).
  constexpr std::int64_t kMaxBlocks = 8;
  constexpr std::int64_t kMaxRightHandElements = std::int64_t{1} << 19;  // 2 MB of float32
  const std::int64_t per_row = std::max<std::int64_t>(1, k * n);
  // MKL's own threads are better for a product of more than ~64M
  // multiply-adds (its join is then a small share: MLP's 256x1024x1024
  // products ran 20-50% slower in blocks, each block packing the right-hand
  // matrix again), for a right-hand matrix beyond a core's L2, and for much
  // work in too few rows to share.
  if (rows * per_row > (std::int64_t{1} << 26)) return whole;
  // A transposed right-hand matrix (column-major: nn.Linear's x @ W.t())
  // is split by columns. Each row block would pack the whole right-hand
  // matrix again, transposing it as it packs; each column block packs only
  // its own columns, and the left-hand matrix again instead: 256x256x768
  // one-thread blocks of 32 rows took 807 us, of 96 columns 655 us, one call
  // 593 us. Left-hand matrices beyond a core's L2 keep rows. (A column
  // block of a transposed matrix is one oneDNN reads in place.)
  const bool transposed_right = job.mat2.stride(0) == 1 && job.mat2.stride(1) != 1;
  const std::int64_t per_column = std::max<std::int64_t>(1, rows * k);
  const std::int64_t min_columns = std::max<std::int64_t>(
      onednn_whole ? 128 : 32, ((std::int64_t{1} << 20) + per_column - 1) / per_column);
  // Every column block reads all of mat1 and of the bias's rows: the
  // in-place addmm_ keeps rows.
  if (transposed_right && column_blocks_enabled() && !in_place_bias && per_column <= kMaxRightHandElements &&
      n >= 2 * min_columns) {
    job.by_columns = true;
    job.block_size = std::max(min_columns, (n + kMaxBlocks - 1) / kMaxBlocks);
    return GemmRoute::kColumns;
  }
  if (per_row > kMaxRightHandElements) return whole;
  // A row block of a transposed left-hand matrix (a weight gradient's
  // g.t() @ x) is a strided slice that oneDNN copies first, a cost that
  // only wide products amortise (ms, MKL blocks / one whole oneDNN call /
  // oneDNN blocks, 3 alternating processes: 512x512x100 0.42 / 0.46 / 0.63,
  // 512x256x256 0.42 / 0.46 / 0.51, 256x512x512 0.85 / 0.79 / 0.72,
  // 256x256x768 0.63 / 0.65 / 0.53): oneDNN's blocks from 512 columns on,
  // MKL's below.
  job.onednn = onednn_whole && (job.mat1.stride(1) == 1 || n >= 512);
  const std::int64_t min_rows =
      std::max<std::int64_t>(job.onednn ? 128 : 16, ((std::int64_t{1} << 20) + per_row - 1) / per_row);
  if (rows < 2 * min_rows && rows * per_row > (std::int64_t{1} << 23)) {
    job.onednn = onednn_whole;
    return whole;
  }
  job.block_size = std::max(min_rows, (rows + kMaxBlocks - 1) / kMaxBlocks);
  return GemmRoute::kRows;
}

}  // namespace

GemmBlocking gemm_blocking(const std::string& name, const torch::jit::Stack& out_stack) {
  GemmBlocks job;
  runtime::SkinnyGemm skinny;
  switch (plan_gemm(name, out_stack, job, skinny)) {
    case GemmRoute::kRows:
      return GemmBlocking::kRows;
    case GemmRoute::kColumns:
      return GemmBlocking::kColumns;
    default:
      return GemmBlocking::kNone;
  }
}

bool run_gemm_in_row_blocks(const std::string& name, torch::jit::Stack& s, const GemmBlockHook* after) {
  GemmBlocks job;
  runtime::SkinnyGemm skinny;
  switch (plan_gemm(name, s, job, skinny)) {
    case GemmRoute::kAten:
      return false;
    case GemmRoute::kSkinny:
      run_skinny_gemm(job, skinny);
      if (after != nullptr) after->after_product();
      return true;
    case GemmRoute::kWholeOneDnn:
      multiply(job, job.out, job.mat1, job.mat2, job.bias);
      count_onednn_gemm_run();
      if (after != nullptr) after->after_product();
      return true;
    case GemmRoute::kRows:
    case GemmRoute::kColumns:
      break;
  }
  const int dim = job.by_columns ? 1 : 0;
  if (after != nullptr && after->takes_blocks(dim)) job.after = after;
  parallel_over((job.out.size(dim) + job.block_size - 1) / job.block_size, 1, &run_blocks, &job);
  job.error.rethrow();
  if (after != nullptr && job.after == nullptr) after->after_product();
  g_row_block_runs.fetch_add(1, std::memory_order_relaxed);
  if (job.onednn) count_onednn_gemm_run();
  if (job.by_columns) g_column_block_runs.fetch_add(1, std::memory_order_relaxed);
  return true;
}

std::uint64_t skinny_gemm_runs() { return g_skinny_runs.load(std::memory_order_relaxed); }

std::uint64_t gemm_column_block_runs() { return g_column_block_runs.load(std::memory_order_relaxed); }

std::uint64_t gemm_row_block_runs() { return g_row_block_runs.load(std::memory_order_relaxed); }

namespace {

std::atomic<std::uint64_t> g_bmm_block_runs{0};

bool bmm_blocks_enabled() {
  static const bool enabled = env_flag_on("VTPU_BMM_BATCH_BLOCKS");
  return enabled;
}

struct BmmBlocks {
  at::Tensor out, left, right;
  std::int64_t block = 1;  // batch elements per block
  bool onednn = false;     // each block one oneDNN call instead of MKL's
  FirstError error;
};

// Blocks [first, last) of `block` products: each product of a batched
// matrix product reads only its own pair of matrices.
void run_bmm_blocks(std::int64_t first, std::int64_t last, void* raw) {
  auto& job = *static_cast<BmmBlocks*>(raw);
  job.error.run([&] {
    SingleThreadedAten single;
    for_blocks(first, last, job.block, job.out.size(0), [&](std::int64_t begin, std::int64_t count) {
      at::Tensor out = job.out.narrow(0, begin, count);
      const at::Tensor left = job.left.narrow(0, begin, count), right = job.right.narrow(0, begin, count);
      if (job.onednn)
        onednn_gemm(out, left, right, at::Tensor());
      else
        at::bmm_out(out, left, right);
    });
  });
}

}  // namespace

bool run_bmm_in_batch_blocks(const std::string& name, torch::jit::Stack& s) {
  if (!bmm_blocks_enabled() || !SingleThreadedAten::available()) return false;
  if (name != "aten::bmm.out" || s.size() != 3 || !s[0].isTensor() || !s[1].isTensor() || !s[2].isTensor())
    return false;
  BmmBlocks job;
  job.left = s[0].toTensor();
  job.right = s[1].toTensor();
  job.out = s[2].toTensor();
  for (const at::Tensor* t : {&job.left, &job.right, &job.out})
    if (t->scalar_type() != at::kFloat || t->dim() != 3) return false;
  const std::int64_t batch = job.out.size(0);
  // The out= buffer the dispatch allocated (contiguous, the product's shape),
  // and enough work to share: at least ~1M multiply-adds.
  if (!job.out.is_contiguous() || batch < 2 || job.left.size(0) != batch || job.right.size(0) != batch ||
      job.left.size(2) != job.right.size(1) || job.out.size(1) != job.left.size(1) ||
      job.out.size(2) != job.right.size(2))
    return false;
  if (batch * job.left.size(1) * job.left.size(2) * job.right.size(2) < (std::int64_t{1} << 20)) return false;
  // An out= whose memory overlaps an operand: blocks would read matrices
  // other blocks (or their own call) are writing. ATen's kernel gives the
  // CPU's result.
  if (spans_intersect(job.out, job.left) || spans_intersect(job.out, job.right)) return false;
  // At most 8 blocks, boundaries from the batch size only.
  constexpr std::int64_t kMaxBlocks = 8;
  job.block = (batch + kMaxBlocks - 1) / kMaxBlocks;
  // oneDNN (onednn_gemm.h) where each block's call has at least ~8M
  // multiply-adds (oneDNN's call costs ~12 us more than MKL's) and every
  // operand lies as oneDNN reads it: attention's batched products of
  // 96x128x64x128 ran in 0.83-0.91 of MKL's time, 48x512x512x64 in 0.71
  // (two threads, `/tmp` probe, 2026-12-07).
  const std::int64_t per_batch = job.left.size(1) * job.left.size(2) * job.right.size(2);
  job.onednn = onednn_gemm_enabled() && job.block * per_batch >= (std::int64_t{1} << 23) &&
               onednn_reads_in_place(job.left) && onednn_reads_in_place(job.right);
  parallel_over((batch + job.block - 1) / job.block, 1, &run_bmm_blocks, &job);
  job.error.rethrow();
  if (job.onednn) count_onednn_gemm_run();
  const c10::IValue out = s[2];
  s.clear();
  s.push_back(out);
  g_bmm_block_runs.fetch_add(1, std::memory_order_relaxed);
  return true;
}

std::uint64_t bmm_batch_block_runs() { return g_bmm_block_runs.load(std::memory_order_relaxed); }

namespace {

bool attention_blocks_enabled() {
  static const bool enabled = env_flag_on("VTPU_ATTENTION_BATCH_BLOCKS");
  return enabled;
}

struct AttentionBlocks {
  bool backward = false;
  // Forward: query, key, value. Backward: grad_out, query, key, value, out, logsumexp.
  std::vector<at::Tensor> inputs;
  double dropout_p = 0;
  bool is_causal = false;
  std::optional<double> scale;
  std::vector<at::Tensor> results;
  FirstError error;
};

// Batch elements [first, last): attention of one batch element does not
// read another's, so each block gives the whole call's bits for its rows.
void run_attention_batches(std::int64_t first, std::int64_t last, void* raw) {
  auto& job = *static_cast<AttentionBlocks*>(raw);
  job.error.run([&] {
    SingleThreadedAten single;
    for (std::int64_t b = first; b < last; ++b) {
      std::vector<at::Tensor> in;
      for (const at::Tensor& t : job.inputs) in.push_back(t.narrow(0, b, 1));
      std::vector<at::Tensor> out;
      if (job.backward) {
        auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
            in[0], in[1], in[2], in[3], in[4], in[5], job.dropout_p, job.is_causal, std::nullopt, job.scale);
        out = {gq, gk, gv};
      } else {
        auto [o, lse] = at::_scaled_dot_product_flash_attention_for_cpu(in[0], in[1], in[2], job.dropout_p,
                                                                          job.is_causal, std::nullopt, job.scale);
        out = {o, lse};
      }
      for (std::size_t i = 0; i < out.size(); ++i) job.results[i].narrow(0, b, 1).copy_(out[i]);
    }
  });
}

}  // namespace

bool run_attention_in_batch_blocks(const std::string& name, torch::jit::Stack& s,
                                   const std::vector<at::Tensor>& results) {
  if (!attention_blocks_enabled() || !SingleThreadedAten::available()) return false;
  AttentionBlocks job;
  std::size_t next = 0;
  if (name == "aten::_scaled_dot_product_flash_attention_for_cpu" && s.size() == 7 && results.size() == 2) {
    next = 3;
  } else if (name == "aten::_scaled_dot_product_flash_attention_for_cpu_backward" && s.size() == 10 &&
             results.size() == 3) {
    job.backward = true;
    next = 6;
  } else {
    return false;
  }
  for (std::size_t i = 0; i < next; ++i) {
    if (!s[i].isTensor()) return false;
    job.inputs.push_back(s[i].toTensor());
  }
  job.dropout_p = s[next].toDouble();
  job.is_causal = s[next + 1].toBool();
  // Dropout draws per call (a batch element's draws depend on the others'),
  // and a mask may broadcast over the batch: both stay on ATen's kernel.
  const c10::IValue& mask = s[next + 2];  // None, or an undefined tensor for None
  if (job.dropout_p != 0.0 || !(mask.isNone() || (mask.isTensor() && !mask.toTensor().defined()))) return false;
  if (!s[next + 3].isNone()) job.scale = s[next + 3].toDouble();
  const std::int64_t batch = job.inputs[0].dim() == 4 ? job.inputs[0].size(0) : 0;
  if (batch < 2) return false;
  // An undefined incoming gradient (no gradient flows back): ATen's kernel
  // returns no gradients, which the host-kernel path turns into zeros.
  for (const at::Tensor& t : job.inputs)
    if (!t.defined() || t.dim() < 1 || t.size(0) != batch) return false;
  for (const at::Tensor& t : results)
    if (!t.defined() || t.dim() < 1 || t.size(0) != batch) return false;
  job.results = results;
  parallel_over(batch, 1, &run_attention_batches, &job);
  job.error.rethrow();
  s.clear();
  for (const at::Tensor& t : results) s.emplace_back(t);
  g_attention_block_runs.fetch_add(1, std::memory_order_relaxed);
  return true;
}

std::uint64_t attention_batch_block_runs() { return g_attention_block_runs.load(std::memory_order_relaxed); }

namespace {

std::atomic<std::uint64_t> g_convolution_blocks{0};

bool convolution_blocks_enabled() {
  static const bool enabled = env_flag_on("VTPU_CONV_BATCH_BLOCKS");
  return enabled;
}

struct ConvolutionBlocks {
  at::Tensor input, weight, out;
  std::optional<at::Tensor> bias;
  std::vector<std::int64_t> stride, padding, dilation, output_padding;
  bool transposed = false;
  std::int64_t groups = 1;
  std::int64_t block = 1;  // batch elements per block
  FirstError error;
};

// Blocks [first, last) of `block` batch elements each: a convolution's
// output for one batch element reads only that element's input.
void run_convolution_blocks(std::int64_t first, std::int64_t last, void* raw) {
  auto& job = *static_cast<ConvolutionBlocks*>(raw);
  job.error.run([&] {
    SingleThreadedAten single;
    for_blocks(first, last, job.block, job.input.size(0), [&](std::int64_t begin, std::int64_t count) {
      const at::Tensor result =
          at::convolution(job.input.narrow(0, begin, count), job.weight, job.bias, job.stride, job.padding,
                          job.dilation, job.transposed, job.output_padding, job.groups);
      job.out.narrow(0, begin, count).copy_(result);
    });
  });
}

}  // namespace

bool run_convolution_in_batch_blocks(const std::string& name, torch::jit::Stack& s,
                                     const std::vector<at::Tensor>& results) {
  if (!convolution_blocks_enabled() || !SingleThreadedAten::available()) return false;
  const bool out_form = name == "aten::convolution.out";
  if (!(out_form && s.size() == 10) && !(name == "aten::convolution" && s.size() == 9 && results.size() == 1))
    return false;
  ConvolutionBlocks job;
  if (!s[0].isTensor() || !s[1].isTensor()) return false;
  job.input = s[0].toTensor();
  job.weight = s[1].toTensor();
  if (s[2].isTensor() && s[2].toTensor().defined()) job.bias = s[2].toTensor();
  else if (!s[2].isNone() && !s[2].isTensor()) return false;
  job.stride = s[3].toIntVector();
  job.padding = s[4].toIntVector();
  job.dilation = s[5].toIntVector();
  job.transposed = s[6].toBool();
  job.output_padding = s[7].toIntVector();
  job.groups = s[8].toInt();
  job.out = out_form ? s[9].toTensor() : results[0];
  const std::int64_t batch = job.input.dim() == 4 ? job.input.size(0) : 0;
  if (batch < 2 || job.weight.dim() != 4 || job.out.dim() != 4 || job.out.size(0) != batch) return false;
  for (const at::Tensor* t : {&job.input, &job.weight, &job.out})
    if (t->scalar_type() != at::kFloat) return false;
  if (job.bias && job.bias->scalar_type() != at::kFloat) return false;
  job.block = convolution_forward_block_size(batch, job.out.numel() / batch * job.out.element_size());
  const std::int64_t blocks = (batch + job.block - 1) / job.block;
  parallel_over(blocks, 1, &run_convolution_blocks, &job);
  job.error.rethrow();
  const at::Tensor out = job.out;
  s.clear();
  s.emplace_back(out);
  g_convolution_block_runs.fetch_add(1, std::memory_order_relaxed);
  g_convolution_blocks.fetch_add(static_cast<std::uint64_t>(blocks), std::memory_order_relaxed);
  return true;
}

std::int64_t convolution_forward_block_size(std::int64_t batch, std::int64_t output_bytes_per_element) {
  // Up to 8 blocks, or more and smaller ones where a block's output would
  // outgrow kBlockOutputBytes (down to one batch element): oneDNN computes a plain (NCHW) convolution in its blocked layout and
  // reorders the output back, and that reorder slowed ~15x once a block's
  // output outgrew the core's L2 (1 MB here: the output plus its blocked
  // copy). CNN middle layer, 32x32x32 -> 64 channels, one thread: 0.65 ms
  // per image in blocks of 4, 0.37 in blocks of 2. Boundaries depend on the
  // shapes only, so every mode and run cuts the batch alike.
  constexpr std::int64_t kMaxBlocks = 8;
  constexpr std::int64_t kBlockOutputBytes = 512 * 1024;
  const std::int64_t fewest_blocks = (batch + kMaxBlocks - 1) / kMaxBlocks;
  const std::int64_t fitting =
      std::max<std::int64_t>(1, kBlockOutputBytes / std::max<std::int64_t>(1, output_bytes_per_element));
  return std::max<std::int64_t>(1, std::min(fewest_blocks, fitting));
}

std::uint64_t convolution_batch_block_runs() { return g_convolution_block_runs.load(std::memory_order_relaxed); }

std::uint64_t convolution_batch_blocks() { return g_convolution_blocks.load(std::memory_order_relaxed); }

namespace {

std::atomic<std::uint64_t> g_convolution_backward_block_runs{0};

bool convolution_backward_blocks_enabled() {
  static const bool enabled = env_flag_on("VTPU_CONV_BACKWARD_BATCH_BLOCKS");
  return enabled;
}

struct ConvolutionBackwardBlocks {
  at::Tensor grad_output, input, weight;
  at::OptionalIntArrayRef bias_sizes;
  std::vector<std::int64_t> bias_sizes_storage;
  std::vector<std::int64_t> stride, padding, dilation, output_padding;
  std::int64_t groups = 1;
  std::array<bool, 3> mask{};
  at::Tensor grad_input;                              // defined when mask[0]
  std::vector<at::Tensor> weight_grads, bias_grads;   // one partial sum per block
  std::int64_t block = 1;
  FirstError error;
};

// Blocks [first, last) of `block` batch elements: the input gradient of a
// batch element reads only that element's output gradient; the weight and
// bias gradients are sums over the batch, kept per block and added later.
void run_convolution_backward_blocks(std::int64_t first, std::int64_t last, void* raw) {
  auto& job = *static_cast<ConvolutionBackwardBlocks*>(raw);
  job.error.run([&] {
    SingleThreadedAten single;
    for_blocks(first, last, job.block, job.input.size(0), [&](std::int64_t begin, std::int64_t count) {
      auto [grad_input, grad_weight, grad_bias] = at::convolution_backward(
          job.grad_output.narrow(0, begin, count), job.input.narrow(0, begin, count), job.weight, job.bias_sizes,
          job.stride, job.padding, job.dilation, false, job.output_padding, job.groups, job.mask);
      if (job.mask[0]) job.grad_input.narrow(0, begin, count).copy_(grad_input);
      const auto index = static_cast<std::size_t>(begin / job.block);
      job.weight_grads[index] = grad_weight;
      job.bias_grads[index] = grad_bias;
    });
  });
}

}  // namespace

bool run_convolution_backward_in_batch_blocks(const std::string& name, torch::jit::Stack& s,
                                              const std::vector<at::Tensor>& results) {
  // convolution_backward.out(grad_output, input, weight, bias_sizes?, stride, padding,
  //                          dilation, transposed, output_padding, groups, output_mask,
  //                          out0, out1, out2); the functional form has no outs on the
  // stack and gets them as `results` (undefined where the mask is false).
  if (!convolution_backward_blocks_enabled() || !SingleThreadedAten::available()) return false;
  const bool functional = name == "aten::convolution_backward" && s.size() == 11 && results.size() == 3;
  if (!functional && !(name == "aten::convolution_backward.out" && s.size() == 14)) return false;
  const std::size_t arguments = s.size();
  if (functional) s.insert(s.end(), results.begin(), results.end());
  // Leaves the stack as it came when the blocks do not apply.
  bool ran = false;
  struct Restore {
    torch::jit::Stack& stack;
    std::size_t size;
    const bool& ran;
    ~Restore() {
      if (!ran) stack.resize(size);
    }
  } restore{s, arguments, ran};
  for (std::size_t i : {0, 1, 2})
    if (!s[i].isTensor()) return false;
  for (std::size_t i : {11, 12, 13})
    if (!s[i].isTensor() && !s[i].isNone()) return false;  // an undefined output may come as None
  if (!s[10].isBoolList() || s[7].toBool()) return false;  // transposed convolutions stay on ATen's kernel
  ConvolutionBackwardBlocks job;
  const auto mask = s[10].toBoolList().vec();
  if (mask.size() != 3 || !mask[1]) return false;  // without a weight gradient there is nothing to sum
  job.mask = {mask[0], mask[1], mask[2]};
  job.grad_output = s[0].toTensor();
  job.input = s[1].toTensor();
  job.weight = s[2].toTensor();
  if (s[3].isIntList()) {
    job.bias_sizes_storage = s[3].toIntVector();
    job.bias_sizes = job.bias_sizes_storage;
  } else if (!s[3].isNone()) {
    return false;
  }
  job.stride = s[4].toIntVector();
  job.padding = s[5].toIntVector();
  job.dilation = s[6].toIntVector();
  job.output_padding = s[8].toIntVector();
  job.groups = s[9].toInt();
  const std::int64_t batch = job.input.dim() == 4 ? job.input.size(0) : 0;
  if (batch < 2 || job.weight.dim() != 4 || job.grad_output.dim() != 4 || job.grad_output.size(0) != batch)
    return false;
  for (const at::Tensor* t : {&job.grad_output, &job.input, &job.weight})
    if (t->scalar_type() != at::kFloat) return false;
  const auto tensor_or_undefined = [](const c10::IValue& v) { return v.isTensor() ? v.toTensor() : at::Tensor(); };
  at::Tensor grad_input = tensor_or_undefined(s[11]), grad_weight = tensor_or_undefined(s[12]),
             grad_bias = tensor_or_undefined(s[13]);
  if (job.mask[0] && (!grad_input.defined() || grad_input.sizes() != job.input.sizes())) return false;
  if (!grad_weight.defined() || grad_weight.sizes() != job.weight.sizes()) return false;
  if (job.mask[2] && !grad_bias.defined()) return false;
  job.grad_input = grad_input;
  // At most 8 blocks (the forward's), boundaries from the batch size only.
  constexpr std::int64_t kMaxBlocks = 8;
  job.block = (batch + kMaxBlocks - 1) / kMaxBlocks;
  const std::int64_t blocks = (batch + job.block - 1) / job.block;
  job.weight_grads.resize(static_cast<std::size_t>(blocks));
  job.bias_grads.resize(static_cast<std::size_t>(blocks));
  parallel_over(blocks, 1, &run_convolution_backward_blocks, &job);
  job.error.rethrow();
  sum_in_order(grad_weight, job.weight_grads);
  if (job.mask[2]) sum_in_order(grad_bias, job.bias_grads);
  const c10::IValue out0 = s[11], out1 = s[12], out2 = s[13];
  s.clear();
  s.push_back(out0);
  s.push_back(out1);
  s.push_back(out2);
  ran = true;
  g_convolution_backward_block_runs.fetch_add(1, std::memory_order_relaxed);
  return true;
}

std::uint64_t convolution_backward_batch_block_runs() {
  return g_convolution_backward_block_runs.load(std::memory_order_relaxed);
}

}  // namespace vtpu::bridge
