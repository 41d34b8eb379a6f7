// The pieces of fused mode's window shared by its bookkeeping
// (fused_window.cpp) and its kernel launches (fused_cluster.cpp): where an
// operand lives, which clusters use which allocation, and what a cluster is.
#pragma once

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "fused_window.h"
#include "generated_kernels.h"
#include "vtpu/compiler/host_codegen.h"

namespace vtpu::bridge::fused {

// Where an operand lives: same storage, same first element, same strides
// and dtype over the same iteration space means the same elements.
struct Geometry {
  const void* storage = nullptr;  // the allocation's base address
  const void* data = nullptr;
  ir::DType dtype = ir::DType::kFloat32;
  std::size_t rank = 0;
  std::int64_t strides[compiler::kMaxRank] = {};
  bool operator==(const Geometry& o) const {
    return storage == o.storage && data == o.data && dtype == o.dtype && rank == o.rank &&
           std::equal(strides, strides + rank, o.strides);
  }
};

inline Geometry geometry_of(const WindowOperand& o, std::size_t rank) {
  Geometry g{o.base, o.arg.data, o.dtype, rank, {}};
  std::copy(o.arg.strides, o.arg.strides + rank, g.strides);
  return g;
}

struct Use {
  std::size_t cluster;
  Geometry geometry;
  bool written;
  // The cluster's first access is a read: it needs the value the memory held
  // before the cluster ran.
  bool read_first;
};

using UseMap = std::unordered_map<const void*, std::vector<Use>>;

struct Cluster {
  std::vector<std::int64_t> iter_sizes;
  std::vector<std::size_t> ops;                     // indices into Window::ops, program order
  std::vector<const void*> storages;    // touched (may repeat)
  // The storage a reduction of the cluster writes (at most one reduction per
  // cluster): no other op of the cluster may touch it, since its values are
  // final only once the kernel has reduced whole rows.
  const void* reduction_out = nullptr;
};

// The operands of `op` in order: the output, then the tensor inputs. A
// small fixed array: this runs for every recorded op.
struct TensorOperands {
  const WindowOperand* items[8];
  std::size_t count = 0;
  const WindowOperand* const* begin() const { return items; }
  const WindowOperand* const* end() const { return items + count; }
};

inline TensorOperands tensor_operands(const WindowOp& op) {
  TensorOperands out;
  out.items[out.count++] = &op.out;
  for (const WindowOperand& in : op.inputs)
    if (in.is_tensor && out.count < 8) out.items[out.count++] = &in;
  return out;
}

// Fused launches of one flush, queued as one stream task when there are
// several small ones in a row (a foreach optimizer step: one per parameter),
// so they share one parallel region. Anything else launched in between
// enqueues the batch first, which keeps the program order.
// Launches in one batch run concurrently, so a launch that touches memory
// another one in the batch writes (or writes memory it touches) starts a
// new batch.
class LaunchBatch {
 public:
  // `reads` and `writes`: the allocations (base addresses) the launch uses.
  void add(KernelLaunch launch, std::int64_t elements, std::vector<const void*> reads,
           std::vector<const void*> writes, const std::string& label = "");
  void enqueue();  // queues what was added (one task), then starts afresh
  bool empty() const { return launches_.empty(); }
  std::int64_t elements() const { return elements_; }  // summed over the launches added
  ~LaunchBatch() { enqueue(); }

 private:
  std::vector<KernelLaunch> launches_;
  std::vector<const void*> reads_, writes_;
  std::int64_t elements_ = 0;
  std::string label_;
};

// Launches cluster `index` of the window `ops` at a flush: one fused kernel
// when its pattern's kernel is ready, else its ops on strict's single-op
// kernels (requesting the fused one). `uses` is the window's use map,
// `clusters` the window's clusters.
void launch_cluster(std::vector<WindowOp>& ops, const std::vector<Cluster>& clusters, std::size_t index,
                    const UseMap& uses, FusionStats& stats, LaunchBatch& batch);

// Launches cluster `index`, which is `product`'s (fused_window.h): with
// `as_epilogue`, the product with the cluster's ops as a fused epilogue when
// their kernel is ready, else the product and then its ops on strict's
// single-op kernels (requesting the fused one); without, the product alone,
// then the cluster as any other. Queues `batch` first.
void launch_product_cluster(std::vector<WindowOp>& ops, const std::vector<Cluster>& clusters, std::size_t index,
                            const UseMap& uses, FusionStats& stats, LaunchBatch& batch, WindowProduct& product,
                            bool as_epilogue);

}  // namespace vtpu::bridge::fused
