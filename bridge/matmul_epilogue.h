// A matrix product's fused epilogue (fused eager mode): the elementwise ops
// the window recorded over a pending product's result (a bias or residual
// add, an activation, a scale) as one generated kernel that runs over each
// block of the product right after the block is written, on the thread
// that wrote it, while the block is still in that core's cache. The product
// and its epilogue are one stream task, with no join of the pool between
// them.
//
// The kernel is the one the window builds for the same ops as a cluster of
// their own (fused_cluster.cpp), launched over boxes of its iteration space;
// an elementwise kernel gives each element the same bits whatever box it is
// launched over, so results are strict mode's bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "extern_blocks.h"
#include "generated_kernels.h"

namespace vtpu::bridge {

class MatmulEpilogue final : public GemmBlockHook {
 public:
  // `launch`: the epilogue kernel over the whole product, its tensors in the
  // kernel's iteration space (one dim of rows * columns elements when
  // `flat`, else dims whose last is the product's columns and whose leading
  // ones flatten to its rows); `itemsizes[t]`: bytes per element of tensor t.
  MatmulEpilogue(KernelLaunch launch, std::vector<std::size_t> itemsizes, bool flat, std::int64_t columns);

  // Rows in any kernel; columns only in a kernel that keeps its dims (a flat
  // kernel's elements of some columns are not one range).
  bool takes_blocks(int dim) const override { return dim == 0 || !flat_; }
  void after_block(int dim, std::int64_t begin, std::int64_t count) const override;
  void after_product() const override;

 private:
  // Runs the kernel serially over the box starting at `start` with `sizes`
  // (both in the kernel's dims).
  void run_box(const std::int64_t* start, const std::int64_t* sizes) const;

  KernelLaunch launch_;
  std::vector<std::size_t> itemsizes_;
  bool flat_;
  std::int64_t columns_;  // the product's
};

}  // namespace vtpu::bridge
