// What the host-kernel path knows about ATen's kernels beyond their schemas:
// where meta and CPU kernels disagree about a result, and the ops it learnt
// at run time to treat differently (no meta kernel, out= overloads that are no
// drop-in, results whose shape the meta kernel gets wrong).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <vector>
#include <unordered_set>

namespace vtpu::bridge {

using Stack = torch::jit::Stack;

struct HostResult {
  c10::ScalarType dtype;
  bool empty;
  // The CPU kernel's sizes (a contiguous result) where they are not the meta kernel's.
  std::optional<std::vector<std::int64_t>> sizes;
  // The CPU kernel's memory format (with the meta kernel's sizes) where the
  // meta kernel lays the result out otherwise.
  std::optional<c10::MemoryFormat> memory_format;
  // The CPU kernel returns no tensor here (an undefined one, None in
  // Python) where the meta kernel gives a placeholder.
  bool undefined = false;
};

// The dtype, emptiness or sizes result `result` of `op` must have so that the
// device gives what ATen's CPU kernel gives; `meta_out` is the meta kernel's.
HostResult host_result(const c10::OperatorHandle& op, std::size_t result, const at::Tensor& meta_out,
                       const Stack& stack, std::size_t first);

// Checks the data an op's CPU kernel relies on but does not always check, on
// the host arguments `host` of op `name` right before its kernel runs (on the
// device stream: an error is an asynchronous one, raised at the next
// synchronisation; debug mode raises it at the op). embedding_bag's offsets
// must not decrease and must stay within the indices: ATen's CPU kernel
// checks that only on its multi-threaded path, and on one thread (the
// host-kernel path runs small ops so) it read past its bags and returned
// uninitialised memory.
void check_host_arguments(const std::string& name, const Stack& host);

// Ops that make quantized tensors (quantize_per_tensor, _make_per_tensor_quantized_tensor,
// _empty_affine_quantized, quantized_* kernels). vtpu has no quantized tensor type: they
// are refused at the call (NotImplementedError), as on backends without quantized
// kernels, instead of failing later in the queued CPU kernel. fake_quantize_* make float
// tensors and run.
bool makes_quantized_tensors(const std::string& name);

// A set of ops learnt at run time (thread-safe).
class OpSet {
 public:
  bool contains(const c10::OperatorHandle& op);
  void add(const c10::OperatorHandle& op);

 private:
  std::mutex mutex_;
  std::unordered_set<const c10::FunctionSchema*> ops_;
};

// Ops known to lack a meta kernel: they go straight to the synchronous path.
OpSet& no_meta_ops();
// Ops whose out= overload is no drop-in for the functional op.
OpSet& unusable_out_variants();

// Functional ops whose out= overload is known to be no drop-in, so they never
// take it: the CPU kernel of "aten::max"/"aten::min" checks for no elements
// where max.unary_out returns the reduction's identity; the losses' out=
// kernels (mse, smooth L1, Huber, binary cross-entropy) resize a reduced
// out= to the unreduced shape first, with the CPU's "output was resized"
// warning on every call.
bool out_variant_is_no_drop_in(const std::string& name);

// In-place ops whose CPU kernel may give `self` another number of elements
// (resize_, set_; addbmm_ resizes a 1-d self to the product's shape): every
// other in-place op keeps self's shape or raises, as TensorIterator does.
bool op_may_resize_self(const std::string& name);
// Ops whose meta kernel gives other result shapes than their CPU kernel.
OpSet& meta_disagrees_with_cpu();

// Whether ATen's CPU kernel of `name` should run on the calling thread only:
// its tensors (arguments and results) total at most the serial byte bound
// (VTPU_SERIAL_HOST_OP_BYTES, default 1 MiB; 0 turns it off) and it is one of
// the ops whose work is linear in their data (searches, indexing, cat, bags,
// plain reductions). Inside a step ATen's OpenMP fork-join costs more than
// such a kernel's work: the team's other threads must be woken, and they
// compete with the work-sharing pool's helpers for the same cores.
bool runs_serially(const std::string& name, std::size_t tensor_bytes);

// Raises (and remembers the op) when a CPU kernel produced another shape or
// dtype than promised.
void check_fresh_geometry(const c10::OperatorHandle& op, const at::Tensor& promised, const at::Tensor& produced,
                          const std::string& name);
// Ops whose CPU kernel returns results in a layout their meta kernel does
// not describe (column-major, or a narrowed column-major buffer): they run
// synchronously, so their results take the CPU's strides.
bool cpu_layout_unknown_to_meta(const std::string& name);
// Whether the op's CPU kernel is a Python function registered through
// torch.library (told by the file its registration names: not C/C++ source).
bool cpu_kernel_is_python(const c10::OperatorHandle& op);
// Whether an error is a CPU kernel refusing to resize a device buffer.
bool is_resize_refusal(const c10::Error& error);

// Whether ATen's out= wrapper refused an out= tensor because the functional
// kernel returns no tensor there ("Expected out tensor to have dtype
// nullptr"): that out= variant is no drop-in for the call.
bool is_undefined_result_refusal(const c10::Error& error);

}  // namespace vtpu::bridge
