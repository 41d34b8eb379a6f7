// The host target's code generator: an IR graph of elementwise ops becomes
// the C++ source of one kernel that follows the launch ABI (launch_abi.h).
//
// Kernels are shape-generic: sizes and strides arrive at launch; the source
// specialises only on dtypes, rank and whether every tensor is contiguous
// (then one flat loop the compiler vectorises; otherwise an odometer walk
// through the strides). Constant nodes are launch scalars, so add(x, 2) and
// add(x, 3) share a kernel.
//
// Launch contract: tensors = graph outputs (in order) then graph inputs (in
// order); scalars = launch_scalars(graph): per node in node order, a
// Constant's value or a node's run-time scalar attribute
// (ir::runtime_scalar_attribute: alpha, value, threshold); every output has
// the iteration shape, inputs are broadcast to it through stride 0.
#pragma once

#include <string>
#include <vector>

#include "vtpu/ir/graph.h"

namespace vtpu::compiler {

struct GeneratedKernel {
  std::string symbol;  // the extern "C" entry point
  std::string source;  // the kernel's code; needs host_translation_unit()'s preamble
};

// A graph of elementwise ops; or one reduction (sum, mean, prod, amax, amin;
// argmax, argmin, var, std, logsumexp, norm) of one input; or one row op
// (softmax family; layer/rms norm and their backward); or one indexing or
// source op (index_select, embedding, gather, embedding_backward, index_add,
// scatter_add, fill, arange); or one loss (nll_loss with its total weight,
// nll_loss_backward). The launch contracts of the non-elementwise
// kernels are at the top of host_codegen_reduction.cpp,
// host_codegen_reduction_stats.cpp, host_codegen_softmax.cpp,
// host_codegen_norm.cpp, host_codegen_indexing.cpp and host_codegen_loss.cpp. Throws Error(kInvalidArgument) naming the op when the graph holds
// an op the host generator does not compile (the caller then uses another path).
//
// Elementwise kernels read the results of 16-bit transcendental ops from
// lookup tables they fill on first use (host_codegen.cpp, "Lookup tables");
// kComputed spells those ops as computed instead, with the same bits (for
// the tests that check exactly that).
enum class LookupTables { kUsed, kComputed };
GeneratedKernel generate_host_kernel(const ir::Graph& graph, const std::string& symbol,
                                     LookupTables tables = LookupTables::kUsed);

// The weight (and, for layer norm, bias) gradients of a graph of one
// layer_norm_backward or rms_norm_backward node: a second kernel of the same
// node, whose IR output is dx only. Launch contract at the top of
// host_codegen_norm_param_grad.cpp. Throws Error(kInvalidArgument) for other
// graphs.
GeneratedKernel generate_norm_param_grad_kernel(const ir::Graph& graph, const std::string& symbol);

// A complete C++ translation unit: the launch ABI and shared helpers once,
// then the kernels (one for a run-time compile, many for the AOT library).
std::string host_translation_unit(const std::vector<GeneratedKernel>& kernels);

// The launch scalars of `graph` (see the launch contract above).
std::vector<double> launch_scalars(const ir::Graph& graph);

// Whether generate_host_kernel accepts this op kind.
bool host_codegen_supports(ir::OpKind op);

}  // namespace vtpu::compiler
