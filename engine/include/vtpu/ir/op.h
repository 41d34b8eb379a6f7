// The IR's op set and per-kind traits. One table (VTPU_IR_OPS) defines every
// kind so that the enum, names, categories and arities cannot drift apart.
//
// Conventions the rest of the engine relies on:
//  - Scalars that vary from call to call (add(x, 2.0), fill values, clamp
//    bounds, arange start/step) are Constant nodes, not attributes, so that a
//    shape-generic kernel can take them as launch arguments.
//  - Optional tensor operands are present or not by a bool attribute
//    (has_min/has_max, has_weight/has_bias, has_mask): the node's inputs are
//    then the present ones, in the documented order.
//  - Ops with several ATen outputs are split into single-output kinds; the
//    statistics ATen returns (layer_norm mean/rstd) are ordinary reductions.
#pragma once

#include <cstdint>
#include <string_view>

namespace vtpu::ir {

enum class OpCategory : std::uint8_t {
  kSource,         // no tensor inputs besides scalars: input, constant, fill, arange
  kUnary,          // elementwise, one tensor (and cast)
  kBinary,         // elementwise, two tensors, broadcast
  kTernary,        // elementwise, three tensors, broadcast
  kReduction,      // over a dim list, keepdim
  kNormalization,  // row-wise over trailing/one dim: softmax, layer/rms norm
  kIndexing,       // data-dependent addressing
  kExtern,         // matrix work done by a library behind an interface
};

// X(Enum, "name", category, min_inputs, max_inputs)  -- attributes in comments.
// The enum order is part of the canonical hash encoding: append, never reorder.
#define VTPU_IR_OPS(X)                                                        \
  /* sources */                                                               \
  X(Input, "input", kSource, 0, 0)                                            \
  X(Constant, "constant", kSource, 0, 0)   /* value: bool|int|double; dtype?  \
                                              A wrapped number (Python scalar)\
                                              for type promotion. */          \
  X(Fill, "fill", kSource, 1, 1)           /* (value) sizes, dtype */         \
  X(Arange, "arange", kSource, 2, 2)       /* (start, step) size, dtype */    \
  /* unary elementwise */                                                     \
  X(Neg, "neg", kUnary, 1, 1)                                                 \
  X(Abs, "abs", kUnary, 1, 1)                                                 \
  X(Exp, "exp", kUnary, 1, 1)                                                 \
  X(Exp2, "exp2", kUnary, 1, 1)                                               \
  X(Log, "log", kUnary, 1, 1)                                                 \
  X(Log2, "log2", kUnary, 1, 1)                                               \
  X(Log10, "log10", kUnary, 1, 1)                                             \
  X(Log1p, "log1p", kUnary, 1, 1)                                             \
  X(Expm1, "expm1", kUnary, 1, 1)                                             \
  X(Sqrt, "sqrt", kUnary, 1, 1)                                               \
  X(Rsqrt, "rsqrt", kUnary, 1, 1)                                             \
  X(Reciprocal, "reciprocal", kUnary, 1, 1)                                   \
  X(Sin, "sin", kUnary, 1, 1)                                                 \
  X(Cos, "cos", kUnary, 1, 1)                                                 \
  X(Tan, "tan", kUnary, 1, 1)                                                 \
  X(Asin, "asin", kUnary, 1, 1)                                               \
  X(Acos, "acos", kUnary, 1, 1)                                               \
  X(Atan, "atan", kUnary, 1, 1)                                               \
  X(Sinh, "sinh", kUnary, 1, 1)                                               \
  X(Cosh, "cosh", kUnary, 1, 1)                                               \
  X(Tanh, "tanh", kUnary, 1, 1)                                               \
  X(Sigmoid, "sigmoid", kUnary, 1, 1)                                         \
  X(Relu, "relu", kUnary, 1, 1)                                               \
  X(Gelu, "gelu", kUnary, 1, 1)            /* approximate: "none"|"tanh" */   \
  X(Silu, "silu", kUnary, 1, 1)                                               \
  X(Erf, "erf", kUnary, 1, 1)                                                 \
  X(Floor, "floor", kUnary, 1, 1)                                             \
  X(Ceil, "ceil", kUnary, 1, 1)                                               \
  X(Round, "round", kUnary, 1, 1)          /* half to even */                 \
  X(Trunc, "trunc", kUnary, 1, 1)                                             \
  X(Sign, "sign", kUnary, 1, 1)                                               \
  X(LogicalNot, "logical_not", kUnary, 1, 1)                                  \
  X(BitwiseNot, "bitwise_not", kUnary, 1, 1)                                  \
  X(IsNan, "isnan", kUnary, 1, 1)                                             \
  X(IsInf, "isinf", kUnary, 1, 1)                                             \
  X(IsFinite, "isfinite", kUnary, 1, 1)                                       \
  X(Cast, "cast", kUnary, 1, 1)            /* dtype */                        \
  /* binary elementwise */                                                    \
  X(Add, "add", kBinary, 2, 2)             /* alpha? (a + alpha*b) */         \
  X(Sub, "sub", kBinary, 2, 2)             /* alpha? (a - alpha*b) */         \
  X(Mul, "mul", kBinary, 2, 2)                                                \
  X(Div, "div", kBinary, 2, 2)             /* rounding_mode? "trunc"|"floor" */\
  X(Pow, "pow", kBinary, 2, 2)                                                \
  X(Maximum, "maximum", kBinary, 2, 2)                                        \
  X(Minimum, "minimum", kBinary, 2, 2)                                        \
  X(Eq, "eq", kBinary, 2, 2)                                                  \
  X(Ne, "ne", kBinary, 2, 2)                                                  \
  X(Lt, "lt", kBinary, 2, 2)                                                  \
  X(Le, "le", kBinary, 2, 2)                                                  \
  X(Gt, "gt", kBinary, 2, 2)                                                  \
  X(Ge, "ge", kBinary, 2, 2)                                                  \
  X(LogicalAnd, "logical_and", kBinary, 2, 2)                                 \
  X(LogicalOr, "logical_or", kBinary, 2, 2)                                   \
  X(LogicalXor, "logical_xor", kBinary, 2, 2)                                 \
  X(BitwiseAnd, "bitwise_and", kBinary, 2, 2)                                 \
  X(BitwiseOr, "bitwise_or", kBinary, 2, 2)                                   \
  X(BitwiseXor, "bitwise_xor", kBinary, 2, 2)                                 \
  X(Fmod, "fmod", kBinary, 2, 2)                                              \
  X(Remainder, "remainder", kBinary, 2, 2)                                    \
  X(Atan2, "atan2", kBinary, 2, 2)                                            \
  /* elementwise backward, (grad, saved) */                                   \
  X(ThresholdBackward, "threshold_backward", kBinary, 2, 2) /* threshold */   \
  X(GeluBackward, "gelu_backward", kBinary, 2, 2)   /* (grad, self) approximate */\
  X(SiluBackward, "silu_backward", kBinary, 2, 2)   /* (grad, self) */        \
  X(SigmoidBackward, "sigmoid_backward", kBinary, 2, 2) /* (grad, output) */  \
  X(TanhBackward, "tanh_backward", kBinary, 2, 2)   /* (grad, output) */      \
  /* ternary elementwise */                                                   \
  X(Where, "where", kTernary, 3, 3)        /* (cond, a, b) */                 \
  X(Clamp, "clamp", kTernary, 1, 3)        /* (x, min?, max?) has_min has_max */\
  X(Lerp, "lerp", kTernary, 3, 3)          /* (start, end, weight) */         \
  X(Addcmul, "addcmul", kTernary, 3, 3)    /* (self, t1, t2) value? */        \
  X(Addcdiv, "addcdiv", kTernary, 3, 3)    /* (self, t1, t2) value? */        \
  X(MaskedFill, "masked_fill", kTernary, 3, 3) /* (x, mask, value 0-dim) */   \
  /* reductions: dims? (empty = all), keepdim?, dtype? */                     \
  X(Sum, "sum", kReduction, 1, 1)                                             \
  X(Mean, "mean", kReduction, 1, 1)                                           \
  X(Prod, "prod", kReduction, 1, 1)                                           \
  X(Amax, "amax", kReduction, 1, 1)                                           \
  X(Amin, "amin", kReduction, 1, 1)                                           \
  X(Argmax, "argmax", kReduction, 1, 1)    /* at most one dim */              \
  X(Argmin, "argmin", kReduction, 1, 1)    /* at most one dim */              \
  X(Var, "var", kReduction, 1, 1)          /* correction? (default 1) */      \
  X(Std, "std", kReduction, 1, 1)          /* correction? (default 1) */      \
  X(LogSumExp, "logsumexp", kReduction, 1, 1)                                 \
  X(Norm, "norm", kReduction, 1, 1)        /* p? (default 2; +-inf ok) */     \
  /* normalizations */                                                        \
  X(Softmax, "softmax", kNormalization, 1, 1)        /* dim, dtype? */        \
  X(LogSoftmax, "log_softmax", kNormalization, 1, 1) /* dim, dtype? */        \
  X(SoftmaxBackward, "softmax_backward", kNormalization, 2, 2)          \
      /* (grad, output) dim */                                                \
  X(LogSoftmaxBackward, "log_softmax_backward", kNormalization, 2, 2)   \
      /* (grad, output) dim */                                                \
  X(LayerNorm, "layer_norm", kNormalization, 1, 3)                            \
      /* (x, weight?, bias?) normalized_shape eps?=1e-5 has_weight has_bias */ \
  X(LayerNormBackward, "layer_norm_backward", kNormalization, 4, 5)           \
      /* (grad, x, mean, rstd, weight?) normalized_shape has_weight -> dx */  \
  X(RmsNorm, "rms_norm", kNormalization, 1, 2)                                \
      /* (x, weight?) normalized_shape eps? has_weight; eps defaults to       \
         torch's finfo(dtype).eps */                                          \
  X(RmsNormBackward, "rms_norm_backward", kNormalization, 3, 4)               \
      /* (grad, x, rstd, weight?) normalized_shape has_weight -> dx */        \
  /* indexing */                                                              \
  X(IndexSelect, "index_select", kIndexing, 2, 2)   /* (x, index) dim */      \
  X(Gather, "gather", kIndexing, 2, 2)              /* (x, index) dim */      \
  X(ScatterAdd, "scatter_add", kIndexing, 3, 3)     /* (self, index, src) dim */\
  X(IndexAdd, "index_add", kIndexing, 3, 3)   /* (self, index, source) dim alpha? */\
  X(Embedding, "embedding", kIndexing, 2, 2)        /* (weight, indices) */   \
  X(EmbeddingBackward, "embedding_backward", kIndexing, 2, 2)                 \
      /* (grad, indices) num_weights padding_idx? scale_grad_by_freq? */      \
  /* extern: matrix work through a library interface */                       \
  X(Matmul, "matmul", kExtern, 2, 2)       /* torch.matmul semantics */       \
  X(Bmm, "bmm", kExtern, 2, 2)                                                \
  X(Addmm, "addmm", kExtern, 3, 3)         /* (bias, a, b) beta? alpha? */    \
  X(Conv, "conv", kExtern, 2, 3)                                              \
      /* (x, w, bias?) stride padding dilation groups transposed?             \
         output_padding? has_bias */                                          \
  X(Sdpa, "sdpa", kExtern, 3, 4)                                              \
      /* (q, k, v, mask?) is_causal? scale? has_mask */                       \
  /* losses (indexing: the target picks one class per row) */                 \
  X(NllLoss, "nll_loss", kIndexing, 2, 3)                                     \
      /* (x [C] or [N, C], target [] or [N] int64|uint8, weight? [C])         \
         reduction?="mean"|"sum"|"none" ignore_index?=-100 has_weight         \
         -> [N] for "none" of a 2-dim x, else 0-dim */                        \
  X(NllLossTotalWeight, "nll_loss_total_weight", kIndexing, 2, 3)             \
      /* nll_loss's second ATen output, same operands and attributes: the     \
         weight of the counted targets (0 for "none" of a 2-dim x) -> 0-dim */\
  X(NllLossBackward, "nll_loss_backward", kIndexing, 4, 5)                    \
      /* (grad, x, target, total_weight, weight?) reduction? ignore_index?    \
         has_weight -> dx (x's shape; x's values are not read) */            \
  /* pooling (indexing: every output takes one element of its window) */      \
  X(MaxPool2d, "max_pool2d", kIndexing, 1, 1)                                 \
      /* (x [C, H, W] or [N, C, H, W], floating) kernel_size [kH, kW]         \
         stride [sH, sW] padding [pH, pW] dilation [dH, dW] ceil_mode?        \
         -> the window maxima (NaN wins), ATen's output size */               \
  X(MaxPool2dIndices, "max_pool2d_indices", kIndexing, 1, 1)                  \
      /* max_pool2d's second ATen output, same operand and attributes:        \
         int64 position h * W + w of each maximum within its plane */         \
  X(MaxPool2dBackward, "max_pool2d_backward", kIndexing, 3, 3)                \
      /* (grad, x, indices) max_pool2d's attributes -> dx (x's shape; x's     \
         values are not read): grad added at each index, in output order */

enum class OpKind : std::uint16_t {
#define VTPU_IR_OP_ENUM(e, n, c, lo, hi) e,
  VTPU_IR_OPS(VTPU_IR_OP_ENUM)
#undef VTPU_IR_OP_ENUM
};

inline constexpr int kNumOpKinds = 0
#define VTPU_IR_OP_COUNT(e, n, c, lo, hi) +1
    VTPU_IR_OPS(VTPU_IR_OP_COUNT)
#undef VTPU_IR_OP_COUNT
    ;

struct OpTraits {
  std::string_view name;
  OpCategory category;
  int min_inputs;
  int max_inputs;  // equal to min_inputs unless the op has optional operands
};

const OpTraits& traits(OpKind op);
inline std::string_view name(OpKind op) { return traits(op).name; }
inline OpCategory category(OpKind op) { return traits(op).category; }
// The fixed number of inputs, or -1 when optional operands make it vary.
inline int arity(OpKind op) {
  const OpTraits& t = traits(op);
  return t.min_inputs == t.max_inputs ? t.min_inputs : -1;
}
bool is_elementwise(OpKind op);  // unary, binary or ternary category

// The double attribute of `op` that is a run-time value rather than part of
// the kernel (Add/Sub alpha, Addcmul/Addcdiv value, ThresholdBackward
// threshold), or nullptr. Generated kernels take it as a launch scalar and
// the shape-generic hash with ScalarMode::kParameters leaves its value out,
// so an optimizer's changing step size never compiles a new kernel.
const char* runtime_scalar_attribute(OpKind op);
std::string_view name(OpCategory c);

}  // namespace vtpu::ir
