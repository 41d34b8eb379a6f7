// Shared between the host code generator's files (not a public header).
#pragma once

#include <functional>
#include <sstream>
#include <string>

#include "vtpu/compiler/host_codegen.h"
#include "vtpu/ir/graph.h"

namespace vtpu::compiler::detail {

// The text of kernel_math.h (vectorisable float math), embedded by CMake.
extern const char* const kKernelMathSource;

// The helpers generated kernels of every target share (kernel_helpers.cpp);
// each target's prelude defines the 16-bit float types and conversions first.
extern const char* const kPortableHelpersSource;

// Storage type of a dtype in generated code (16-bit floats are raw bits).
const char* storage_type(ir::DType t);

// The combine of a lane loop (vtpu_lanes_reduce) whose accumulators are
// `acc` and whose step is `expr` of a and b: the prelude's max or min functor
// for "vtpu_max(a, b)" and "vtpu_min(a, b)" (the lane loops take a faster
// path for them, with the same bits, but call value(i) twice on a NaN: only
// for values without side effects), else a lambda.
std::string lane_combine(const std::string& acc, const std::string& expr);

bool host_reduction_supports(ir::OpKind op);
GeneratedKernel emit_reduction(const ir::Graph& graph, const std::string& symbol);
// One reduction fused with elementwise work over its input's iteration space
// (host_codegen_fused_reduction.cpp, launch contract there).
GeneratedKernel emit_fused_reduction(const ir::Graph& graph, const std::string& symbol);

// The elementwise kernels' per-element statements (host_codegen.cpp), for
// generators that fuse elementwise work into their loops: every node except
// those `skip` names becomes a v<id> variable in its compute type; Inputs
// read `load(position, dtype)` (an lvalue of the storage type), Constants and
// run-time attributes c.scalars in launch_scalars() order.
void emit_elementwise_values(std::ostringstream& s, const ir::Graph& graph,
                             const std::function<std::string(int, ir::DType)>& load,
                             const std::function<bool(const ir::Node&)>& skip);

bool host_softmax_supports(ir::OpKind op);
GeneratedKernel emit_softmax(const ir::Graph& graph, const std::string& symbol);

// argmax, argmin, var, std, logsumexp, norm (host_codegen_reduction_stats.cpp).
bool host_reduction_stats_supports(ir::OpKind op);
GeneratedKernel emit_reduction_stats(const ir::Graph& graph, const std::string& symbol);

// layer_norm, rms_norm and their backward (host_codegen_norm.cpp).
bool host_norm_supports(ir::OpKind op);
GeneratedKernel emit_norm(const ir::Graph& graph, const std::string& symbol);
// dweight/dbias of a norm backward node (host_codegen_norm_param_grad.cpp).
GeneratedKernel emit_norm_param_grads(const ir::Graph& graph, const std::string& symbol);

// index_select, embedding, gather, embedding_backward, index_add,
// scatter_add, fill, arange: see host_codegen_indexing.cpp's launch contract.
bool host_indexing_supports(ir::OpKind op);
GeneratedKernel emit_indexing(const ir::Graph& graph, const std::string& symbol);

// nll_loss (with nll_loss_total_weight) and nll_loss_backward: see
// host_codegen_loss.cpp's launch contract.
bool host_loss_supports(ir::OpKind op);
GeneratedKernel emit_loss(const ir::Graph& graph, const std::string& symbol);

// max_pool2d (with max_pool2d_indices) and max_pool2d_backward: see
// host_codegen_pooling.cpp's launch contract.
bool host_pooling_supports(ir::OpKind op);
GeneratedKernel emit_pooling(const ir::Graph& graph, const std::string& symbol);

// Throws Error(kInvalidArgument) "[host codegen] <op>: <why>": a graph a
// generator does not handle (the bridge then keeps the op on ATen's kernel).
[[noreturn]] void refuse(ir::OpKind op, const std::string& why);

// Generated-code helper `run(args, items, cost_per_item, body, context)`:
// body over [0, items) through args->parallel_for when there are more items
// than a grain of about 32k units of cost, else inline.
extern const char* const kParallelRunSource;

// The node of a graph that is one op of a family (`family`), computed whole:
// its operands are the graph's inputs in order, and its outputs the node,
// optionally followed by `second` of the same operands and attributes (ATen's
// second output of a `first` op). Refuses (throws) any other graph; `what`
// names the kernel family in the messages.
const ir::Node& single_op_node(const ir::Graph& graph, bool (*family)(ir::OpKind), ir::OpKind first, ir::OpKind second,
                               const char* what);

}  // namespace vtpu::compiler::detail
