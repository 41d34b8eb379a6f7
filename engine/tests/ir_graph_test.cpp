// Graph construction and type inference: broadcasting, promotion through the
// graph (wrapped constants), per-family shape rules, and the error messages.
#include "vtpu/ir/graph.h"

#include <gtest/gtest.h>

#include "vtpu/runtime/error.h"

namespace vtpu::ir {
namespace {

using enum DType;
using Sizes = std::vector<std::int64_t>;

TensorType T(DType d, Sizes s) { return TensorType::contiguous(d, std::move(s)); }

// The message of the Error(kInvalidArgument) that `fn` throws.
template <class Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const runtime::Error& e) {
    EXPECT_EQ(e.kind(), runtime::ErrorKind::kInvalidArgument);
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

TensorType out_type(OpKind op, std::vector<TensorType> in, Attributes a = {}) {
  Graph g = single_op(op, std::move(in), std::move(a));
  return g.type(g.outputs()[0]);
}

TEST(IrGraphTest, BroadcastsShapes) {
  EXPECT_EQ(out_type(OpKind::Add, {T(kFloat32, {2, 1, 3}), T(kFloat32, {4, 1})}).sizes, (Sizes{2, 4, 3}));
  EXPECT_EQ(out_type(OpKind::Mul, {T(kFloat32, {}), T(kFloat32, {5})}).sizes, (Sizes{5}));
  EXPECT_EQ(out_type(OpKind::Add, {T(kFloat32, {0, 3}), T(kFloat32, {1, 3})}).sizes, (Sizes{0, 3}));
  EXPECT_EQ(out_type(OpKind::Where, {T(kBool, {3, 1}), T(kFloat32, {1, 4}), T(kFloat32, {})}).sizes,
            (Sizes{3, 4}));
  EXPECT_EQ(broadcast_shapes({2, 3}, {3}), (Sizes{2, 3}));
  EXPECT_FALSE(broadcast_shapes({2, 3}, {2}).has_value());
}

TEST(IrGraphTest, BroadcastErrorsNameTheOpAndShapes) {
  EXPECT_EQ(error_of([] { out_type(OpKind::Add, {T(kFloat32, {2, 3}), T(kFloat32, {4, 5})}); }),
            "[add] shapes (2, 3) and (4, 5) cannot be broadcast");
  EXPECT_EQ(error_of([] {
              out_type(OpKind::Where, {T(kBool, {2}), T(kFloat32, {3}), T(kFloat32, {2})});
            }),
            "[where] shapes (2), (3) and (2) cannot be broadcast");
  EXPECT_EQ(error_of([] { out_type(OpKind::Add, {T(kFloat32, {0}), T(kFloat32, {2})}); }),
            "[add] shapes (0) and (2) cannot be broadcast");
}

TEST(IrGraphTest, OutputsAreContiguousWhateverTheInputStrides) {
  Graph g;
  TensorType strided{kFloat32, {2, 3}, {1, 2}};  // a transpose
  TensorType expanded{kFloat32, {2, 3}, {0, 1}};
  const ValueId a = g.add_input(strided), b = g.add_input(expanded);
  const ValueId c = g.add_node(OpKind::Add, {a, b});
  EXPECT_EQ(g.type(c).strides, (Sizes{3, 1}));
  EXPECT_TRUE(g.type(c).is_contiguous());
  EXPECT_FALSE(g.type(a).is_contiguous());
}

TEST(IrGraphTest, PromotionFollowsTorch) {
  EXPECT_EQ(out_type(OpKind::Add, {T(kInt32, {2}), T(kFloat16, {2})}).dtype, kFloat16);
  EXPECT_EQ(out_type(OpKind::Add, {T(kUInt8, {2}), T(kInt8, {2})}).dtype, kInt16);
  EXPECT_EQ(out_type(OpKind::Add, {T(kBFloat16, {2}), T(kFloat16, {2})}).dtype, kFloat32);
  // A rank-0 input is a zero-dim tensor: it raises the category only.
  EXPECT_EQ(out_type(OpKind::Add, {T(kFloat32, {2}), T(kFloat64, {})}).dtype, kFloat32);
  EXPECT_EQ(out_type(OpKind::Add, {T(kInt32, {2}), T(kFloat64, {})}).dtype, kFloat64);
  // Comparisons and predicates give bool; their common dtype is kept.
  Graph g = single_op(OpKind::Lt, {T(kInt32, {2}), T(kFloat16, {2})});
  EXPECT_EQ(g.type(2).dtype, kBool);
  EXPECT_EQ(g.node(2).common_dtype, kFloat16);
  EXPECT_EQ(out_type(OpKind::IsNan, {T(kFloat32, {2})}).dtype, kBool);
  EXPECT_EQ(out_type(OpKind::LogicalAnd, {T(kFloat32, {2}), T(kInt8, {2})}).dtype, kBool);
  // int -> float for transcendental ops and true division, not for the rest.
  EXPECT_EQ(out_type(OpKind::Exp, {T(kInt32, {2})}).dtype, kFloat32);
  EXPECT_EQ(out_type(OpKind::Sqrt, {T(kBool, {2})}).dtype, kFloat32);
  EXPECT_EQ(out_type(OpKind::Abs, {T(kInt32, {2})}).dtype, kInt32);
  EXPECT_EQ(out_type(OpKind::Div, {T(kInt64, {2}), T(kInt64, {2})}).dtype, kFloat32);
  EXPECT_EQ(out_type(OpKind::Div, {T(kInt64, {2}), T(kInt64, {2})}, {{"rounding_mode", "floor"}}).dtype,
            kInt64);
  EXPECT_EQ(out_type(OpKind::Cast, {T(kFloat32, {2})}, {{"dtype", kBFloat16}}).dtype, kBFloat16);
}

TEST(IrGraphTest, ConstantsAreWrappedNumbers) {
  Graph g;
  const ValueId x = g.add_input(T(kFloat16, {4}));
  const ValueId i = g.add_input(T(kInt32, {4}));
  const ValueId half = g.add_node(OpKind::Constant, {}, {{"value", 0.5}});
  const ValueId two = g.add_node(OpKind::Constant, {}, {{"value", std::int64_t{2}}});
  EXPECT_EQ(g.type(half).dtype, kFloat64);
  EXPECT_EQ(g.type(half).rank(), 0);
  EXPECT_EQ(g.type(g.add_node(OpKind::Mul, {x, half})).dtype, kFloat16);  // not float64
  EXPECT_EQ(g.type(g.add_node(OpKind::Mul, {i, half})).dtype, kFloat32);  // default float
  EXPECT_EQ(g.type(g.add_node(OpKind::Mul, {i, two})).dtype, kInt32);
  // clamp(int tensor, min=0.5) promotes, like torch.
  EXPECT_EQ(g.type(g.add_node(OpKind::Clamp, {i, half}, {{"has_min", true}})).dtype, kFloat32);
}

TEST(IrGraphTest, ElementwiseRejects) {
  EXPECT_EQ(error_of([] { out_type(OpKind::BitwiseAnd, {T(kFloat32, {2}), T(kInt32, {2})}); }),
            "[bitwise_and] not supported for floating point dtype float32");
  EXPECT_EQ(error_of([] { out_type(OpKind::Where, {T(kInt32, {2}), T(kFloat32, {2}), T(kFloat32, {2})}); }),
            "[where] condition must be bool, got int32");
  EXPECT_EQ(error_of([] { out_type(OpKind::Gelu, {T(kInt64, {2})}); }),
            "[gelu] expected a floating point input, got int64");
  EXPECT_EQ(error_of([] { out_type(OpKind::Clamp, {T(kFloat32, {2}), T(kFloat32, {2})}); }),
            "[clamp] got 2 inputs but the flags (has_min, has_max) call for 1");
  EXPECT_EQ(error_of([] { out_type(OpKind::Add, {T(kInt32, {2}), T(kInt32, {2})}, {{"alpha", 0.5}}); }),
            "[add] alpha must not be a floating point number for int32 inputs");
  EXPECT_EQ(error_of([] { out_type(OpKind::Cast, {T(kFloat32, {2})}); }),
            "[cast] attribute 'dtype' is required");
  EXPECT_EQ(error_of([] { out_type(OpKind::Div, {T(kFloat32, {2}), T(kFloat32, {2})}, {{"rounding_mode", 3.0}}); }),
            "[div] attribute 'rounding_mode' has type double, expected string");
  EXPECT_EQ(error_of([] { out_type(OpKind::Neg, {T(kFloat32, {2}), T(kFloat32, {2})}); }),
            "[neg] expected 1 inputs, got 2");
  EXPECT_EQ(error_of([] { Graph g; g.add_node(OpKind::Exp, {3}); }),
            "[exp] input %3 does not exist (graph has 0 nodes)");
  EXPECT_EQ(error_of([] { Graph g; g.add_input(TensorType{kFloat32, {2, 3}, {1}}); }),
            "[input] sizes (2, 3) and strides (1) differ in rank");
}

TEST(IrGraphTest, ReductionShapes) {
  const TensorType x = T(kFloat32, {2, 3, 4});
  EXPECT_EQ(out_type(OpKind::Sum, {x}, {{"dims", Sizes{1}}}).sizes, (Sizes{2, 4}));
  EXPECT_EQ(out_type(OpKind::Sum, {x}, {{"dims", Sizes{-1, 0}}, {"keepdim", true}}).sizes, (Sizes{1, 3, 1}));
  EXPECT_EQ(out_type(OpKind::Mean, {x}).sizes, (Sizes{}));
  EXPECT_EQ(out_type(OpKind::Amax, {x}, {{"keepdim", true}}).sizes, (Sizes{1, 1, 1}));
  EXPECT_EQ(out_type(OpKind::Argmax, {x}, {{"dims", Sizes{2}}}).sizes, (Sizes{2, 3}));
  EXPECT_EQ(out_type(OpKind::Argmax, {x}, {{"dims", Sizes{2}}}).dtype, kInt64);
  EXPECT_EQ(out_type(OpKind::Sum, {T(kFloat32, {})}, {{"dims", Sizes{-1}}}).sizes, (Sizes{}));
  EXPECT_EQ(out_type(OpKind::Sum, {T(kFloat32, {0, 3})}, {{"dims", Sizes{0}}}).sizes, (Sizes{3}));
  // dtypes: integer sums are int64; mean needs floats; logsumexp floats ints.
  EXPECT_EQ(out_type(OpKind::Sum, {T(kBool, {3})}).dtype, kInt64);
  EXPECT_EQ(out_type(OpKind::Prod, {T(kInt8, {3})}).dtype, kInt64);
  EXPECT_EQ(out_type(OpKind::Sum, {T(kInt8, {3})}, {{"dtype", kFloat32}}).dtype, kFloat32);
  EXPECT_EQ(out_type(OpKind::Sum, {T(kBFloat16, {3})}).dtype, kBFloat16);
  EXPECT_EQ(out_type(OpKind::LogSumExp, {T(kInt32, {3})}).dtype, kFloat32);
  EXPECT_EQ(out_type(OpKind::Amin, {T(kInt16, {3})}).dtype, kInt16);
}

TEST(IrGraphTest, ReductionErrors) {
  const TensorType x = T(kFloat32, {2, 3});
  EXPECT_EQ(error_of([&] { out_type(OpKind::Sum, {x}, {{"dims", Sizes{2}}}); }),
            "[sum] dim 2 is out of range for a tensor of rank 2");
  EXPECT_EQ(error_of([&] { out_type(OpKind::Sum, {x}, {{"dims", Sizes{1, -1}}}); }),
            "[sum] dim 1 appears multiple times in the list of dims");
  EXPECT_EQ(error_of([&] { out_type(OpKind::Argmin, {x}, {{"dims", Sizes{0, 1}}}); }),
            "[argmin] reduces at most one dim, got 2");
  EXPECT_EQ(error_of([] { out_type(OpKind::Mean, {T(kInt64, {3})}); }),
            "[mean] expected a floating point input, got int64");
  EXPECT_EQ(error_of([] { out_type(OpKind::Amax, {T(kFloat32, {0, 3})}, {{"dims", Sizes{0}}}); }),
            "[amax] cannot reduce over zero-size dim 0 of shape (0, 3)");
}

TEST(IrGraphTest, NormalizationShapes) {
  const TensorType x = T(kBFloat16, {2, 3, 4});
  EXPECT_EQ(out_type(OpKind::Softmax, {x}, {{"dim", std::int64_t{-1}}}), x);
  EXPECT_EQ(out_type(OpKind::LogSoftmax, {x}, {{"dim", std::int64_t{1}}, {"dtype", kFloat32}}).dtype, kFloat32);
  EXPECT_EQ(out_type(OpKind::LayerNorm, {x, T(kBFloat16, {3, 4}), T(kBFloat16, {3, 4})},
                     {{"normalized_shape", Sizes{3, 4}}, {"has_weight", true}, {"has_bias", true}}),
            x);
  EXPECT_EQ(out_type(OpKind::LayerNormBackward, {x, x, T(kFloat32, {2, 1, 1}), T(kFloat32, {2, 1, 1})},
                     {{"normalized_shape", Sizes{3, 4}}}),
            x);
  EXPECT_EQ(error_of([&] {
              out_type(OpKind::LayerNorm, {x}, {{"normalized_shape", Sizes{5}}});
            }),
            "[layer_norm] input shape (2, 3, 4) does not end with normalized_shape (5)");
  EXPECT_EQ(error_of([&] {
              out_type(OpKind::RmsNorm, {x, T(kBFloat16, {3})},
                       {{"normalized_shape", Sizes{4}}, {"has_weight", true}});
            }),
            "[rms_norm] weight shape (3) differs from normalized_shape (4)");
  EXPECT_EQ(error_of([&] { out_type(OpKind::Softmax, {x}, {{"dim", std::int64_t{3}}}); }),
            "[softmax] dim 3 is out of range for a tensor of rank 3");
}

TEST(IrGraphTest, IndexingShapes) {
  const TensorType x = T(kFloat32, {5, 6});
  EXPECT_EQ(out_type(OpKind::IndexSelect, {x, T(kInt64, {3})}, {{"dim", std::int64_t{1}}}).sizes, (Sizes{5, 3}));
  EXPECT_EQ(out_type(OpKind::Gather, {x, T(kInt64, {2, 6})}, {{"dim", std::int64_t{0}}}).sizes, (Sizes{2, 6}));
  EXPECT_EQ(out_type(OpKind::Embedding, {x, T(kInt32, {2, 7})}).sizes, (Sizes{2, 7, 6}));
  EXPECT_EQ(out_type(OpKind::EmbeddingBackward, {T(kFloat32, {2, 7, 6}), T(kInt64, {2, 7})},
                     {{"num_weights", std::int64_t{5}}})
                .sizes,
            (Sizes{5, 6}));
  EXPECT_EQ(out_type(OpKind::ScatterAdd, {x, T(kInt64, {2, 2}), T(kFloat32, {3, 3})}, {{"dim", std::int64_t{0}}}), x);
  EXPECT_EQ(out_type(OpKind::IndexAdd, {x, T(kInt64, {2}), T(kFloat32, {2, 6})}, {{"dim", std::int64_t{0}}}), x);
  EXPECT_EQ(error_of([&] { out_type(OpKind::IndexSelect, {x, T(kFloat32, {3})}, {{"dim", std::int64_t{0}}}); }),
            "[index_select] index must be int32 or int64, got float32");
  EXPECT_EQ(error_of([&] { out_type(OpKind::Gather, {x, T(kInt64, {2, 7})}, {{"dim", std::int64_t{0}}}); }),
            "[gather] index shape (2, 7) is larger than input shape (5, 6) in dim 1");
}

TEST(IrGraphTest, ExternShapes) {
  EXPECT_EQ(out_type(OpKind::Matmul, {T(kFloat32, {2, 3}), T(kFloat32, {3, 4})}).sizes, (Sizes{2, 4}));
  EXPECT_EQ(out_type(OpKind::Matmul, {T(kFloat32, {7, 1, 2, 3}), T(kFloat32, {5, 3, 4})}).sizes,
            (Sizes{7, 5, 2, 4}));
  EXPECT_EQ(out_type(OpKind::Matmul, {T(kFloat32, {3}), T(kFloat32, {3})}).sizes, (Sizes{}));
  EXPECT_EQ(out_type(OpKind::Matmul, {T(kFloat32, {2, 3}), T(kFloat32, {3})}).sizes, (Sizes{2}));
  EXPECT_EQ(out_type(OpKind::Bmm, {T(kFloat32, {4, 2, 3}), T(kFloat32, {4, 3, 5})}).sizes, (Sizes{4, 2, 5}));
  EXPECT_EQ(out_type(OpKind::Addmm, {T(kFloat32, {4}), T(kFloat32, {2, 3}), T(kFloat32, {3, 4})}).sizes,
            (Sizes{2, 4}));
  EXPECT_EQ(out_type(OpKind::Conv, {T(kFloat32, {1, 4, 9, 9}), T(kFloat32, {8, 2, 3, 3})},
                     {{"stride", Sizes{2}}, {"padding", Sizes{1}}, {"groups", std::int64_t{2}}})
                .sizes,
            (Sizes{1, 8, 5, 5}));
  EXPECT_EQ(out_type(OpKind::Sdpa, {T(kFloat32, {2, 4, 5, 8}), T(kFloat32, {2, 4, 6, 8}), T(kFloat32, {2, 4, 6, 3})})
                .sizes,
            (Sizes{2, 4, 5, 3}));
  EXPECT_EQ(error_of([] { out_type(OpKind::Matmul, {T(kFloat32, {2, 3}), T(kFloat32, {4, 5})}); }),
            "[matmul] inner dimensions differ: got (2, 3) and (4, 5)");
  EXPECT_EQ(error_of([] { out_type(OpKind::Matmul, {T(kFloat32, {2, 3}), T(kFloat64, {3, 5})}); }),
            "[matmul] expected operands of the same dtype, got float32 and float64");
}

TEST(IrGraphTest, SourcesAndOutputs) {
  Graph g;
  const ValueId v = g.add_node(OpKind::Constant, {}, {{"value", 1.5}});
  const ValueId f = g.add_node(OpKind::Fill, {v}, {{"sizes", Sizes{2, 3}}, {"dtype", kBFloat16}});
  const ValueId one = g.add_node(OpKind::Constant, {}, {{"value", std::int64_t{1}}});
  const ValueId r = g.add_node(OpKind::Arange, {one, one}, {{"size", std::int64_t{5}}, {"dtype", kInt32}});
  EXPECT_EQ(g.type(f), T(kBFloat16, {2, 3}));
  EXPECT_EQ(g.type(r), T(kInt32, {5}));
  g.mark_output(r);
  g.mark_output(r);
  EXPECT_EQ(g.outputs(), (std::vector<ValueId>{r, r}));
  EXPECT_TRUE(g.inputs().empty());
  EXPECT_THROW(g.mark_output(99), runtime::Error);
  EXPECT_EQ(traits(OpKind::Clamp).max_inputs, 3);
  EXPECT_EQ(arity(OpKind::Clamp), -1);
  EXPECT_EQ(arity(OpKind::Where), 3);
  EXPECT_EQ(category(OpKind::Matmul), OpCategory::kExtern);
  EXPECT_EQ(name(OpKind::LogSoftmaxBackward), "log_softmax_backward");
}

}  // namespace
}  // namespace vtpu::ir
