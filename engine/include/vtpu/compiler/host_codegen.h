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
// order); scalars = Constant node values in node order; every output has the
// iteration shape, inputs are broadcast to it through stride 0.
#pragma once

#include <string>
#include <vector>

#include "vtpu/ir/graph.h"

namespace vtpu::compiler {

struct GeneratedKernel {
  std::string symbol;  // the extern "C" entry point
  std::string source;  // the kernel's code; needs host_translation_unit()'s preamble
};

// A graph of elementwise ops, or one reduction (sum, mean, prod, amax, amin)
// of one input; see host_codegen_reduction.cpp for the reduction launch
// contract, host_codegen_indexing.cpp for the indexing and source ops'. Throws Error(kInvalidArgument) naming the op when the graph holds
// an op the host generator does not compile (the caller then uses another path).
GeneratedKernel generate_host_kernel(const ir::Graph& graph, const std::string& symbol);

// A complete C++ translation unit: the launch ABI and shared helpers once,
// then the kernels (one for a run-time compile, many for the AOT library).
std::string host_translation_unit(const std::vector<GeneratedKernel>& kernels);

// Whether generate_host_kernel accepts this op kind.
bool host_codegen_supports(ir::OpKind op);

}  // namespace vtpu::compiler
