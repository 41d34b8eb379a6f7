// Extern kernels of the host-kernel path split into independent blocks on
// the work-sharing pool, each block one single-threaded ATen/MKL call (or
// oneDNN's, for large float32 products: onednn_gemm.h):
// matrix products (mm and addmm, out= form) and layer norm (forward and
// backward, norm_blocks.cpp) by rows; batched products (bmm), CPU flash
// attention and 2-d convolutions (each forward and backward) by batch.
//
// Why: MKL and ATen thread their kernels with OpenMP, whose fork-join waits
// for every thread of the stream thread's team to wake and finish. On this
// 2-core VM that wait was ~9 of ~36 ms of GEMM time and ~3 of ~7.5 ms of
// attention time in a fused Qwen3-style training step. Blocks claimed from
// the pool start at once on the stream thread; a helper joins when it wakes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/stack.h>

namespace vtpu::bridge {

// Runs the out= call `out_stack` of op `name` ("aten::mm.out",
// "aten::addmm.out") as row blocks on the pool, or as one oneDNN call on its
// own threads (onednn_gemm.h), or, for a float32 or bfloat16
// product of at most 8 rows by a transposed right-hand matrix of at least 64 KB
// (nn.Linear's x @ W.t() while decoding), as column blocks of vTPU's skinny GEMM
// (vtpu/runtime/skinny_gemm.h; VTPU_SKINNY_GEMM=0 leaves them to MKL).
// Returns false, having done nothing, when the op, dtypes or layout are not
// handled (or MKL's per-thread control is missing from this torch build):
// the caller runs ATen's kernel.
// `after`, when given, sees the whole product once it is written: block by
// block on the threads that ran them where it takes blocks along the split
// dimension (a matrix product's fused epilogue, matmul_epilogue.h), else
// once after the last block.
class GemmBlockHook;
bool run_gemm_in_row_blocks(const std::string& name, torch::jit::Stack& out_stack,
                            const GemmBlockHook* after = nullptr);

// How run_gemm_in_row_blocks splits this out= call: row blocks or column
// blocks of MKL, or neither (the skinny GEMM, ATen's kernel). Decided from
// the operands' dtypes, shapes, strides and addresses, so the answer at
// dispatch holds when the product runs.
enum class GemmBlocking { kNone, kRows, kColumns };
GemmBlocking gemm_blocking(const std::string& name, const torch::jit::Stack& out_stack);

// Work that runs over parts of a product as soon as they are written.
class GemmBlockHook {
 public:
  virtual ~GemmBlockHook() = default;
  // Whether after_block() takes blocks of the product's rows (dim 0) or
  // columns (dim 1).
  virtual bool takes_blocks(int dim) const = 0;
  // Rows or columns [begin, begin + count) of the product are final. Called
  // concurrently for disjoint blocks; must not throw.
  virtual void after_block(int dim, std::int64_t begin, std::int64_t count) const = 0;
  // The whole product is final (it ran otherwise than in blocks this hook
  // takes).
  virtual void after_product() const = 0;
};

// Products run by the skinny GEMM so far.
std::uint64_t skinny_gemm_runs();

// Products run in row blocks so far (one per call, inline or shared), and
// those of them split by columns instead (a transposed right-hand matrix).
std::uint64_t gemm_row_block_runs();
std::uint64_t gemm_column_block_runs();

// Runs "aten::bmm.out" (float32, at least ~1M multiply-adds) in blocks of
// batch elements on the pool, each block one single-threaded ATen call, and
// leaves the out tensor on the stack. Returns false, having done nothing,
// otherwise: the caller runs ATen's kernel.
bool run_bmm_in_batch_blocks(const std::string& name, torch::jit::Stack& out_stack);

// Batched products run in batch blocks so far.
std::uint64_t bmm_batch_block_runs();

// Runs `_scaled_dot_product_flash_attention_for_cpu` or its backward (op
// `name`, arguments `args`) one batch element per block, writing the
// results into `results` (the op's fresh outputs, in return order), and
// leaves those results on `args` as the op's returns. Returns false, having
// done nothing, for other ops, dropout, an attention mask, a batch of one,
// or without per-thread OpenMP/MKL control: the caller runs ATen's kernel.
bool run_attention_in_batch_blocks(const std::string& name, torch::jit::Stack& args,
                                   const std::vector<at::Tensor>& results);

// Attention calls run in batch blocks so far.
std::uint64_t attention_batch_block_runs();

// Runs a 2-d `convolution` (op `name`: "aten::convolution" with its fresh
// output `results[0]`, or "aten::convolution.out" with the out tensor last
// on `args`) in blocks of batch elements, and leaves the output on `args`
// as the op's return. Returns false, having done nothing, for other ops,
// dtypes than float32, a batch of one, or without per-thread OpenMP/MKL
// control: the caller runs ATen's kernel.
bool run_convolution_in_batch_blocks(const std::string& name, torch::jit::Stack& args,
                                     const std::vector<at::Tensor>& results);

// Convolutions run in batch blocks so far, and their blocks in all.
std::uint64_t convolution_batch_block_runs();
std::uint64_t convolution_batch_blocks();

// Batch elements per block of a convolution forward over `batch` elements
// whose output takes `output_bytes_per_element` bytes per batch element.
std::int64_t convolution_forward_block_size(std::int64_t batch, std::int64_t output_bytes_per_element);

// Runs "aten::convolution_backward.out" (the out= stack `args`) or
// "aten::convolution_backward" (its arguments, with the op's fresh outputs
// in return order as `results`, undefined where the output mask is false) of
// a float32 2-d, non-transposed convolution with a weight gradient asked for,
// in blocks of batch elements: input gradients per block, weight and bias
// gradients as per-block partial sums added in block order. Leaves the three
// outputs on the stack; returns false, having done nothing, otherwise.
bool run_convolution_backward_in_batch_blocks(const std::string& name, torch::jit::Stack& args,
                                              const std::vector<at::Tensor>& results = {});

// Convolution backwards run in batch blocks so far.
std::uint64_t convolution_backward_batch_block_runs();

// Runs the out= call `out_stack` of "aten::native_layer_norm.out" or
// "aten::native_layer_norm_backward.out" (contiguous; the forward in
// float32, bfloat16 or float16 with every tensor of one dtype, the backward
// in float32 of an affine layer norm with all three gradients) as row blocks on the
// pool (norm_blocks.cpp), and leaves its three outputs on the stack.
// Returns false, having done nothing, otherwise: the caller runs ATen's.
bool run_layer_norm_in_row_blocks(const std::string& name, torch::jit::Stack& out_stack);

// Layer norms (forward or backward) run in row blocks so far.
std::uint64_t layer_norm_row_block_runs();

}  // namespace vtpu::bridge
