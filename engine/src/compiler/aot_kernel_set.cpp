// The single-op graphs of the ahead-of-time kernel library. Each is built the
// way the bridge builds it for one ATen op (same inputs, attributes and
// Constant operands), so that its shape-generic key is the one strict mode
// looks up: contiguous same-shape launches arrive flattened to one dim,
// Python scalars are Constant nodes, reductions keep the dims as the user
// wrote them (hence both -1 and the positive spelling).
#include <string>
#include <vector>

#include "vtpu/compiler/aot_library.h"

namespace vtpu::compiler {
namespace {

using ir::Attributes;
using ir::DType;
using ir::Graph;
using ir::OpKind;
using ir::TensorType;

Graph with_constant(OpKind op, DType dtype, double value_kind_sample, Attributes attrs) {
  Graph graph;
  const ir::ValueId x = graph.add_input(TensorType::contiguous(dtype, {16}));
  const ir::ValueId c = graph.add_node(OpKind::Constant, {}, {{"value", value_kind_sample}});
  graph.mark_output(graph.add_node(op, {x, c}, std::move(attrs)));
  return graph;
}

Graph with_constant_int(OpKind op, DType dtype, Attributes attrs) {
  Graph graph;
  const ir::ValueId x = graph.add_input(TensorType::contiguous(dtype, {16}));
  const ir::ValueId c = graph.add_node(OpKind::Constant, {}, {{"value", std::int64_t{1}}});
  graph.mark_output(graph.add_node(op, {x, c}, std::move(attrs)));
  return graph;
}

Attributes alpha_for(OpKind op) {
  return (op == OpKind::Add || op == OpKind::Sub) ? Attributes{{"alpha", 1.0}} : Attributes{};
}

void add_elementwise(std::vector<Graph>& set, DType dt) {
  const TensorType flat = TensorType::contiguous(dt, {16});
  for (OpKind op : {OpKind::Exp, OpKind::Log, OpKind::Neg, OpKind::Abs, OpKind::Sqrt, OpKind::Rsqrt,
                    OpKind::Reciprocal, OpKind::Sin, OpKind::Cos, OpKind::Tanh, OpKind::Sigmoid, OpKind::Silu,
                    OpKind::Erf, OpKind::Floor, OpKind::Ceil, OpKind::Trunc, OpKind::Exp2, OpKind::Log2,
                    OpKind::Log1p, OpKind::Expm1, OpKind::Sign, OpKind::Relu})
    set.push_back(ir::single_op(op, {flat}));
  for (const char* approximate : {"none", "tanh"})
    set.push_back(ir::single_op(OpKind::Gelu, {flat}, {{"approximate", std::string(approximate)}}));
  for (OpKind op : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Maximum, OpKind::Minimum, OpKind::Pow,
                    OpKind::Eq, OpKind::Ne, OpKind::Lt, OpKind::Le, OpKind::Gt, OpKind::Ge,
                    OpKind::SigmoidBackward, OpKind::TanhBackward, OpKind::SiluBackward})
    set.push_back(ir::single_op(op, {flat, flat}, alpha_for(op)));
  set.push_back(ir::single_op(OpKind::ThresholdBackward, {flat, flat}, {{"threshold", 0.0}}));
  set.push_back(ir::single_op(OpKind::GeluBackward, {flat, flat}, {{"approximate", std::string("none")}}));
  // x op python-scalar
  for (OpKind op : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Pow, OpKind::Eq, OpKind::Ne,
                    OpKind::Lt, OpKind::Gt}) {
    set.push_back(with_constant(op, dt, 1.0, alpha_for(op)));                      // x op 2.0
    set.push_back(with_constant_int(op, dt, alpha_for(op)));                        // x op 2
  }
  set.push_back(ir::single_op(OpKind::Where, {TensorType::contiguous(DType::kBool, {16}), flat, flat}));
}

void add_broadcasts(std::vector<Graph>& set, DType dt) {
  // Bias-like rows and per-row scales over rank 2 and 3.
  const std::vector<std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>> shapes = {
      {{4, 8}, {8}}, {{2, 4, 8}, {8}}, {{4, 8}, {4, 1}}, {{2, 4, 8}, {2, 4, 1}}};
  for (const auto& [big, small] : shapes)
    for (OpKind op : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div})
      set.push_back(ir::single_op(op, {TensorType::contiguous(dt, big), TensorType::contiguous(dt, small)},
                                  alpha_for(op)));
}

void add_reductions(std::vector<Graph>& set, DType dt) {
  struct Spec {
    std::vector<std::int64_t> sizes;
    std::vector<std::int64_t> dims;
  };
  const std::vector<Spec> specs = {{{4, 8}, {-1}}, {{4, 8}, {1}}, {{4, 8}, {0}}, {{2, 4, 8}, {-1}},
                                   {{2, 4, 8}, {2}}, {{2, 4, 8}, {0, 1}}, {{16}, {}}, {{4, 8}, {}}, {{2, 4, 8}, {}},
                                   {{2, 2, 4, 8}, {-1}}};  // per-head norms
  for (OpKind op : {OpKind::Sum, OpKind::Mean, OpKind::Amax})
    for (const Spec& spec : specs)
      for (bool keepdim : {false, true})
        set.push_back(ir::single_op(op, {TensorType::contiguous(dt, spec.sizes)},
                                    {{"dims", spec.dims}, {"keepdim", keepdim}}));
}

void add_softmax(std::vector<Graph>& set, DType dt, bool backward) {
  for (const std::vector<std::int64_t>& sizes : {std::vector<std::int64_t>{4, 8}, {2, 4, 8}, {2, 2, 4, 8}}) {
    const TensorType t = TensorType::contiguous(dt, sizes);
    for (std::int64_t dim : {std::int64_t{-1}, static_cast<std::int64_t>(sizes.size()) - 1}) {
      set.push_back(ir::single_op(OpKind::Softmax, {t}, {{"dim", dim}}));
      if (!backward) continue;
      set.push_back(ir::single_op(OpKind::LogSoftmax, {t}, {{"dim", dim}}));
      set.push_back(ir::single_op(OpKind::SoftmaxBackward, {t, t}, {{"dim", dim}}));
      set.push_back(ir::single_op(OpKind::LogSoftmaxBackward, {t, t}, {{"dim", dim}}));
    }
  }
}

// fill_/zero_ (every tensor in its own rank, the value a Constant of the
// output's kind) and device-to-device copies of contiguous tensors (a flat Cast).
void add_fills_and_copies(std::vector<Graph>& set) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
    const ir::AttrValue value = ir::is_floating(dt) ? ir::AttrValue(0.0) : ir::AttrValue(std::int64_t{0});
    for (std::size_t rank = 0; rank <= 4; ++rank) {
      Graph graph;
      const ir::ValueId c = graph.add_node(OpKind::Constant, {}, {{"value", value}});
      graph.mark_output(graph.add_node(OpKind::Fill, {c}, {{"sizes", std::vector<std::int64_t>(rank, 3)}, {"dtype", dt}}));
      set.push_back(std::move(graph));
    }
  }
  const std::pair<DType, DType> casts[] = {{DType::kFloat32, DType::kFloat32}, {DType::kFloat32, DType::kBFloat16},
                                           {DType::kBFloat16, DType::kFloat32}, {DType::kBFloat16, DType::kBFloat16},
                                           {DType::kInt64, DType::kInt64}};
  for (const auto& [from, to] : casts)
    set.push_back(ir::single_op(OpKind::Cast, {TensorType::contiguous(from, {16})}, {{"dtype", to}}));
}

// The classifier loss as F.cross_entropy reaches it: nll_loss of a float32
// [N, C] log-probability matrix, int64 targets, mean, no weight, the default
// ignore_index; the forward writes the loss and the total weight.
void add_losses(std::vector<Graph>& set) {
  const ir::Attributes attrs{{"reduction", std::string("mean")}, {"ignore_index", std::int64_t{-100}},
                             {"has_weight", false}};
  const TensorType x = TensorType::contiguous(DType::kFloat32, {8, 10});
  const TensorType target = TensorType::contiguous(DType::kInt64, {8});
  Graph forward;
  const ir::ValueId fx = forward.add_input(x), ft = forward.add_input(target);
  forward.mark_output(forward.add_node(OpKind::NllLoss, {fx, ft}, attrs));
  forward.mark_output(forward.add_node(OpKind::NllLossTotalWeight, {fx, ft}, attrs));
  set.push_back(std::move(forward));
  const TensorType scalar = TensorType::contiguous(DType::kFloat32, {});
  set.push_back(ir::single_op(OpKind::NllLossBackward, {scalar, x, target, scalar}, attrs));
}

// nn.MaxPool2d(2) as a CNN uses it: float32 NCHW, 2x2 windows of stride 2,
// values with indices, and the backward.
void add_max_pool(std::vector<Graph>& set) {
  const ir::Attributes attrs{{"kernel_size", std::vector<std::int64_t>{2, 2}},
                             {"stride", std::vector<std::int64_t>{2, 2}},
                             {"padding", std::vector<std::int64_t>{0, 0}},
                             {"dilation", std::vector<std::int64_t>{1, 1}},
                             {"ceil_mode", false}};
  const TensorType x = TensorType::contiguous(DType::kFloat32, {2, 3, 8, 8});
  Graph forward;
  const ir::ValueId fx = forward.add_input(x);
  forward.mark_output(forward.add_node(OpKind::MaxPool2d, {fx}, attrs));
  forward.mark_output(forward.add_node(OpKind::MaxPool2dIndices, {fx}, attrs));
  set.push_back(std::move(forward));
  const TensorType pooled = TensorType::contiguous(DType::kFloat32, {2, 3, 4, 4});
  set.push_back(ir::single_op(OpKind::MaxPool2dBackward,
                              {pooled, x, TensorType::contiguous(DType::kInt64, {2, 3, 4, 4})}, attrs));
}

}  // namespace

std::vector<Graph> aot_kernel_set() {
  std::vector<Graph> set;
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) add_elementwise(set, dt);
  add_broadcasts(set, DType::kFloat32);
  add_reductions(set, DType::kFloat32);
  add_softmax(set, DType::kFloat32, true);
  add_softmax(set, DType::kBFloat16, false);
  add_fills_and_copies(set);
  add_losses(set);
  add_max_pool(set);
  return set;
}

}  // namespace vtpu::compiler
