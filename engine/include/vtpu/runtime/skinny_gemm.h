// Matrix products with a few rows on the left, C = alpha * A B + beta * bias
// (float32 or bfloat16):
// a decoding step's nn.Linear (one token: A is 1 x k, B the k x n weight).
//
// Why not the BLAS: such a product reads all of B once and does two flops per
// element of it, so it is bound by memory bandwidth, and MKL runs it on one
// thread (~8 GB/s on the 2-core development host, where one thread streams
// 15-21 GB/s and two 26-37). Decoding 64 tokens of the Qwen3-style model spent
// 1.4 of its 2.0 ms per token in 29 such products. Here the columns of C are
// cut into blocks that threads of the work-sharing pool take, each block
// streaming its part of B once.
//
// Every element of C is computed by one thread, in an order fixed by k alone
// (never by the block it falls in or the thread that runs it), so results are
// the same bits whatever the blocking, the thread count or the vector width
// (this file is compiled without floating-point contraction).
#pragma once

#include <cstdint>

namespace vtpu::runtime {

// Rows of A (and C) this kernel takes; more rows make the product
// compute-bound, the BLAS's ground.
constexpr std::int64_t kSkinnyGemmMaxRows = 8;

// The dtype of A, B, the bias and C (all four the same). bfloat16 operands
// are widened to float32 exactly, multiplied and summed in float32, and C is
// rounded once (to nearest even), as ATen's CPU bfloat16 GEMM accumulates.
enum class SkinnyGemmDtype { kFloat32, kBFloat16 };

struct SkinnyGemm {
  SkinnyGemmDtype dtype = SkinnyGemmDtype::kFloat32;
  std::int64_t rows = 0, k = 0, n = 0;
  // A, rows x k, rows `a_row_stride` apart, each row contiguous.
  const void* a = nullptr;
  std::int64_t a_row_stride = 0;
  // B, k x n, each column contiguous (b_k_stride == 1): the transpose of
  // nn.Linear's row-major weight, so each element of C is a dot product of
  // two contiguous vectors. Row-major B (x @ W) is not taken: streaming its
  // rows in column tiles ran no faster than MKL here.
  const void* b = nullptr;
  std::int64_t b_k_stride = 1, b_n_stride = 0;
  // Optional bias, broadcast to rows x n by its strides (0 along a broadcast
  // dim). With beta == 0 it is not read (NaN in it does not propagate).
  const void* bias = nullptr;
  std::int64_t bias_row_stride = 0, bias_n_stride = 0;
  // alpha = 0 is refused (skinny_gemm_accepts): the BLAS then reads neither
  // A nor B, and the caller's BLAS does that.
  float alpha = 1.0f, beta = 1.0f;
  // C, rows x n, each row contiguous, rows `c_row_stride` apart.
  void* c = nullptr;
  std::int64_t c_row_stride = 0;
};

// Whether `g` has a shape and layout this kernel takes.
bool skinny_gemm_accepts(const SkinnyGemm& g);

// Columns [begin, end) of C. Blocks of columns may run concurrently.
void skinny_gemm_columns(const SkinnyGemm& g, std::int64_t begin, std::int64_t end);

}  // namespace vtpu::runtime
