// Fused eager mode's pending window. In `fused` mode the elementwise ops that
// strict mode would launch one by one on generated kernels are recorded here
// instead; at a flush point the window becomes as few kernels as possible.
//
// The window is a list of clusters, each one iteration space (the output
// shape) and each launched as one kernel. An op joins the latest cluster of
// its shape that it may legally move back to: every buffer it touches has,
// inside that cluster, the same geometry (so element i only ever meets
// element i, and a value produced earlier in the cluster is forwarded in a
// register), and no cluster created after it writes a buffer the op touches
// or touches a buffer the op writes. Clusters run in the order they were
// created, so every pair of dependent ops keeps its program order.
//
// Flush points are program points, never timing: a launch outside the window
// ("unfused_op"), a host read or synchronisation (counted under its own
// reason), a mode change and the window-size limit ("window_limit").
//
// A cluster's kernel is looked up by its shape-generic pattern. The first
// time a pattern is seen its ops run as the single-op kernels strict mode
// uses while the fused kernel compiles on a background thread; later
// windows with that pattern launch it. Both give the same bits (the
// generator rounds half/bf16 intermediates to their storage type), so the
// swap is invisible. A buffer written in a cluster whose storage Python has
// dropped by the flush, and that no other cluster touches, is not written.
#pragma once

#include <c10/core/Storage.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "call_site.h"
#include "extern_blocks.h"

#include "vtpu/compiler/launch_abi.h"
#include "vtpu/ir/attributes.h"
#include "vtpu/ir/op.h"

namespace vtpu::bridge {

struct WindowOperand {
  bool is_tensor = false;
  ir::DType dtype = ir::DType::kFloat32;
  ir::AttrValue constant;          // a Python scalar's value (when !is_tensor)
  compiler::VtpuTensorArg arg{};   // in the op's iteration space (broadcast dims: stride 0)
  // A 0-dim tensor: it takes part in type promotion as one (a bfloat16
  // tensor times a 0-dim float32 tensor is bfloat16), so the kernel's IR
  // declares it with rank 0, as strict mode's does, not at the op's rank.
  bool zero_dim = false;
  // The allocation the tensor lives in. The window holds no reference to
  // it: memory Python lets go of is reused at once, as in strict mode (the
  // window orders ops by allocation, so a reused block is just one more
  // write to the same buffer). Outputs keep a weak reference, which tells
  // the flush whether anyone can still read them.
  const void* base = nullptr;
  c10::weak_intrusive_ptr<c10::StorageImpl> weak{c10::intrusive_ptr<c10::StorageImpl>()};
};

// One elementwise op, or a reduction (sum, mean, prod, amax, amin) whose
// iteration space is its input's and whose output is described in the
// input's dims (stride 0 along the reduced ones): what fusion needs, and its
// strict single-op launch.
struct WindowOp {
  ir::OpKind op = ir::OpKind::Add;
  bool reduction = false;
  ir::Attributes attrs;
  std::vector<std::int64_t> iter_sizes;
  WindowOperand out;
  std::vector<WindowOperand> inputs;
  compiler::VtpuKernelFn single_op_fn = nullptr;
  std::int64_t single_op_rank = 0;
  std::vector<compiler::VtpuTensorArg> single_op_tensors;
  std::vector<double> single_op_scalars;
};

// True on the issuing thread in fused mode (the stream worker runs nested
// ops at once).
bool fused_recording_active();

// Whether an op over `elements` elements goes into the window: fused
// recording is active, and the op is at least fused_min_elements() large or
// the window already holds work. An op that would start a window over a
// small tensor is launched as in strict mode instead (same kernel, same
// bits): on the host target recording and flushing cost the issuing thread
// more (~0.7 us per op, ~7 us per flush) than the launches they save on the
// stream, and programs over small tensors (decoding with a KV cache) are
// bound by the issuing thread. A program property, not timing: the same
// program makes the same choices. VTPU_FUSED_MIN_ELEMENTS sets the bound
// (default 4096; 0 records every op).
bool records_in_window(std::int64_t elements);
std::int64_t fused_min_elements();
void set_fused_min_elements(std::int64_t elements);
void record_in_window(WindowOp op);

// A matrix product whose launch waits in the window (fused mode) so that the
// elementwise ops recorded next over its result run as its epilogue, block
// by block as the product is written (matmul_epilogue.h). Only products
// that run in blocks on the pool are deferred (gemm_blocking), and, like
// elementwise ops, small ones only into a window already holding work. The
// window flushes its earlier work first, so the product is its first
// cluster; ops join it by the ordinary rules, plus: a reduction that joins
// makes it an ordinary cluster launched after the product (it needs whole
// rows), and no op that writes an operand the product reads joins or moves
// before it (their uses in the cluster have a geometry no op has, so a write
// to them is incompatible and conflicts).
// Any flush point launches it, with whatever epilogue it has by then.
struct WindowProduct {
  // Runs the product, then hands each finished block (or the whole result)
  // to the hook, when one is given.
  std::function<void(const GemmBlockHook*)> run;
  std::string name;  // the op ("aten::mm", "aten::addmm"): the task's name
  CallSite site;     // where it was issued: an error names it
  WindowOperand out;                   // the (rows, columns) result, contiguous
  std::int64_t rows = 0, columns = 0;
  bool by_columns = false;             // the product runs in column blocks
  std::vector<const void*> reads;      // the operands' allocations
};

// Whether fused mode defers products for epilogues (VTPU_MATMUL_EPILOGUES,
// default on).
bool matmul_epilogues_enabled();
// Records `product` (fused recording active): flushes the window's work,
// then holds the product as the window's first cluster.
void record_product_in_window(WindowProduct product);

// One op implemented as several vTPU ops (batch norm's lowering) runs as a
// fused program in strict mode too, as ATen's kernel for it is one fused
// loop: while an instance lives, strict mode records this thread's ops into
// the window, and flush() queues them (the op is then queued like any strict
// op, nothing waits). In fused mode the ops simply join the pending window,
// so they fuse with the ops around them; debug mode runs them one by one.
// Fused kernels give the unfused kernels' bits, so every mode gets the same.
class OpWindow {
 public:
  OpWindow();
  ~OpWindow();  // stops recording; anything left is flushed by the next launch
  OpWindow(const OpWindow&) = delete;
  OpWindow& operator=(const OpWindow&) = delete;
  void flush();

 private:
  bool forced_ = false;
};

// A compiled program's chain boundary (torch_vtpu/compiler/schedule.py): the
// window's clusters are closed and their kernels built, but queued only at
// the next flush, batched with the chains after them. No-op outside fused
// recording.
void end_fused_chain();

struct FusionStats {
  std::uint64_t fused_kernels = 0;                      // launches of multi-op kernels
  std::map<std::uint64_t, std::uint64_t> ops_per_kernel;  // ops -> fused launches
  std::uint64_t dead_stores_skipped = 0;
  std::uint64_t pattern_hits = 0;                       // clusters whose fused kernel was ready
  std::uint64_t pattern_misses = 0;                     // clusters run unfused (first sightings, or
                                                        // their kernel still compiling)
  std::uint64_t unfused_ops = 0;                        // ops run on single-op kernels at a flush
  std::uint64_t background_compiles = 0;
  std::uint64_t matmul_epilogues = 0;     // products launched with a fused epilogue
  std::uint64_t matmul_epilogue_ops = 0;  // ops those epilogues ran
};
FusionStats fusion_stats();
void reset_fusion_stats();

// Blocks until every fused kernel requested so far is built (or failed);
// tests and benchmarks use it to reach the steady state deterministically.
void wait_for_fusion_compiles();

}  // namespace vtpu::bridge
