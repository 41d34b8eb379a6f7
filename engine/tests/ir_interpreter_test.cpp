// The reference interpreter on small hand-computed cases: strided and
// broadcast (stride-0) inputs, zero-size tensors, integer wrap, 16-bit float
// rounding, and each op family.
#include "vtpu/ir/interpreter.h"

#include <gtest/gtest.h>

#include <cmath>

#include "vtpu/ir/half.h"
#include "vtpu/runtime/error.h"

namespace vtpu::ir {
namespace {

using enum DType;
using Sizes = std::vector<std::int64_t>;
using Doubles = std::vector<double>;
using Ints = std::vector<std::int64_t>;

TensorType T(DType d, Sizes s) { return TensorType::contiguous(d, std::move(s)); }

// A buffer of `type` whose raw storage holds `storage` in order.
Buffer strided(TensorType type, const Doubles& storage) {
  Buffer flat = make_buffer(type.dtype, {static_cast<std::int64_t>(storage.size())}, storage);
  flat.type = std::move(type);
  return flat;
}

// Single-op graph over the given buffers, evaluated.
Buffer run(OpKind op, std::vector<Buffer> in, Attributes attrs = {}) {
  std::vector<TensorType> types;
  for (const Buffer& b : in) types.push_back(b.type);
  return interpret(single_op(op, types, std::move(attrs)), in)[0];
}

void expect_near(const Doubles& got, const Doubles& want, double tol = 1e-6) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "at " << i;
    } else {
      EXPECT_NEAR(got[i], want[i], tol) << "at " << i;
    }
  }
}

TEST(IrInterpreterTest, AddOverTransposedAndExpandedInputs) {
  // x = [[1,2,3],[4,5,6]] stored column-major; y = row [10,20,30] expanded.
  const Buffer x = strided({kFloat32, {2, 3}, {1, 2}}, {1, 4, 2, 5, 3, 6});
  const Buffer y = strided({kFloat32, {2, 3}, {0, 1}}, {10, 20, 30});
  EXPECT_EQ(to_doubles(x), (Doubles{1, 2, 3, 4, 5, 6}));
  const Buffer out = run(OpKind::Add, {x, y}, {{"alpha", 2.0}});
  EXPECT_EQ(out.type, T(kFloat32, {2, 3}));
  EXPECT_EQ(to_doubles(out), (Doubles{21, 42, 63, 24, 45, 66}));
  // Implicit broadcasting by shape: (2,1) + (3) -> (2,3).
  EXPECT_EQ(to_doubles(run(OpKind::Mul, {make_buffer(kFloat32, {2, 1}, {1, 2}),
                                         make_buffer(kFloat32, {3}, {1, 2, 3})})),
            (Doubles{1, 2, 3, 2, 4, 6}));
}

TEST(IrInterpreterTest, ZeroSizeTensors) {
  const Buffer e = make_buffer(kFloat32, {0, 3}, {});
  const Buffer out = run(OpKind::Add, {e, make_buffer(kFloat32, {1, 3}, {1, 2, 3})});
  EXPECT_EQ(out.type.sizes, (Sizes{0, 3}));
  EXPECT_TRUE(out.bytes.empty());
  EXPECT_EQ(to_doubles(run(OpKind::Sum, {e}, {{"dims", Sizes{0}}})), (Doubles{0, 0, 0}));
  EXPECT_EQ(to_doubles(run(OpKind::Prod, {e}, {{"dims", Sizes{0}}})), (Doubles{1, 1, 1}));
  expect_near(to_doubles(run(OpKind::Mean, {e})), {NAN});
  EXPECT_TRUE(to_doubles(run(OpKind::Softmax, {e}, {{"dim", std::int64_t{1}}})).empty());
}

TEST(IrInterpreterTest, IntegerArithmeticWrapsAndRoundsLikeTorch) {
  const Buffer a = make_int_buffer(kInt8, {3}, {1, 2, 3});
  const Buffer h = make_int_buffer(kInt8, {3}, {100, 100, 100});
  EXPECT_EQ(to_int64s(run(OpKind::Mul, {a, h})), (Ints{100, -56, 44}));
  const Buffer n = make_int_buffer(kInt64, {2}, {-7, 7});
  const Buffer d = make_int_buffer(kInt64, {2}, {2, -2});
  EXPECT_EQ(to_int64s(run(OpKind::Div, {n, d}, {{"rounding_mode", "floor"}})), (Ints{-4, -4}));
  EXPECT_EQ(to_int64s(run(OpKind::Div, {n, d}, {{"rounding_mode", "trunc"}})), (Ints{-3, -3}));
  EXPECT_EQ(to_doubles(run(OpKind::Div, {n, d})), (Doubles{-3.5, -3.5}));  // true division
  EXPECT_EQ(to_int64s(run(OpKind::Remainder, {n, d})), (Ints{1, -1}));
  EXPECT_EQ(to_int64s(run(OpKind::Fmod, {n, d})), (Ints{-1, 1}));
  EXPECT_EQ(to_int64s(run(OpKind::Pow, {d, make_int_buffer(kInt64, {2}, {10, 3})})), (Ints{1024, -8}));
  EXPECT_EQ(to_int64s(run(OpKind::BitwiseXor, {n, d})), (Ints{-7 ^ 2, 7 ^ -2}));
  EXPECT_THROW(run(OpKind::Div, {n, make_int_buffer(kInt64, {2}, {0, 1})}, {{"rounding_mode", "floor"}}),
               runtime::Error);
}

TEST(IrInterpreterTest, FloatRemainderAndFloorDivideFollowPython) {
  const Buffer n = make_buffer(kFloat64, {2}, {-7, 7});
  const Buffer d = make_buffer(kFloat64, {2}, {2, -2});
  EXPECT_EQ(to_doubles(run(OpKind::Remainder, {n, d})), (Doubles{1, -1}));
  EXPECT_EQ(to_doubles(run(OpKind::Div, {n, d}, {{"rounding_mode", "floor"}})), (Doubles{-4, -4}));
}

TEST(IrInterpreterTest, SixteenBitFloatsComputeInFloat32AndRoundEachNode) {
  auto bf = [](float f) { return bfloat16_bits_to_float(float_to_bfloat16_bits(f)); };
  const Buffer a = make_buffer(kBFloat16, {2}, {1.0, 1.0 + 0x1p-7});
  const Buffer b = make_buffer(kBFloat16, {2}, {0x1p-8, 0x1p-8});
  // Exact sums are ties: 1 + 2^-8 -> 1 (even), 1 + 3*2^-8 -> 1 + 2^-6 (even).
  EXPECT_EQ(to_doubles(run(OpKind::Add, {a, b})), (Doubles{1.0, 1.0 + 0x1p-6}));
  // A chain rounds after each node, as generated kernels that store bf16 do.
  Graph g;
  const ValueId x = g.add_input(T(kBFloat16, {1}));
  const ValueId third = g.add_node(OpKind::Constant, {}, {{"value", 1.0 / 3.0}});
  const ValueId m = g.add_node(OpKind::Mul, {x, third});
  g.mark_output(g.add_node(OpKind::Mul, {m, g.add_node(OpKind::Constant, {}, {{"value", 3.0}})}));
  const auto out = to_doubles(interpret(g, {make_buffer(kBFloat16, {1}, {1.0})})[0]);
  EXPECT_EQ(out[0], bf(bf(1.0f / 3.0f) * 3.0f));
  // float16 + a wrapped double scalar: the scalar enters as float32.
  const auto h = to_doubles(run(OpKind::Add, {make_buffer(kFloat16, {1}, {1.0}), make_buffer(kFloat16, {1}, {0.1})}));
  EXPECT_EQ(h[0], half_bits_to_float(float_to_half_bits(1.0f + half_bits_to_float(float_to_half_bits(0.1f)))));
}

TEST(IrInterpreterTest, UnaryOpsAndCasts) {
  const Buffer x = make_buffer(kFloat32, {4}, {-1.5, -0.0, 2.5, NAN});
  expect_near(to_doubles(run(OpKind::Relu, {x})), {0, -0.0, 2.5, NAN});
  expect_near(to_doubles(run(OpKind::Sign, {x})), {-1, 0, 1, 0});
  expect_near(to_doubles(run(OpKind::Round, {x})), {-2, -0.0, 2, NAN});
  EXPECT_EQ(to_int64s(run(OpKind::IsNan, {x})), (Ints{0, 0, 0, 1}));
  expect_near(to_doubles(run(OpKind::Sigmoid, {make_buffer(kFloat32, {1}, {0})})), {0.5});
  expect_near(to_doubles(run(OpKind::Gelu, {make_buffer(kFloat32, {2}, {1, -1})})), {0.8413447, -0.1586553});
  expect_near(to_doubles(run(OpKind::Gelu, {make_buffer(kFloat32, {1}, {1})}, {{"approximate", "tanh"}})),
              {0.8411920});
  // int -> float ops.
  const Buffer ints = make_int_buffer(kInt32, {2}, {0, 1});
  const Buffer e = run(OpKind::Exp, {ints});
  EXPECT_EQ(e.type.dtype, kFloat32);
  expect_near(to_doubles(e), {1.0, 2.7182817});
  // Casts truncate toward zero and wrap, as torch on x86 does.
  EXPECT_EQ(to_int64s(run(OpKind::Cast, {make_buffer(kFloat32, {3}, {-1.7, 2.9, 300.7})}, {{"dtype", kUInt8}})),
            (Ints{255, 2, 44}));
  EXPECT_EQ(to_int64s(run(OpKind::Cast, {make_buffer(kFloat32, {1}, {1e20})}, {{"dtype", kInt32}})),
            (Ints{-2147483648}));
  EXPECT_EQ(to_int64s(run(OpKind::Cast, {make_buffer(kFloat32, {3}, {0, -0.5, NAN})}, {{"dtype", kBool}})),
            (Ints{0, 1, 1}));
}

TEST(IrInterpreterTest, TernaryOps) {
  const Buffer cond = make_int_buffer(kBool, {2, 1}, {1, 0});
  const Buffer a = make_buffer(kFloat32, {3}, {1, 2, 3});
  const Buffer b = make_buffer(kFloat32, {}, {-1});
  EXPECT_EQ(to_doubles(run(OpKind::Where, {cond, a, b})), (Doubles{1, 2, 3, -1, -1, -1}));
  EXPECT_EQ(to_doubles(run(OpKind::Clamp, {a, make_buffer(kFloat32, {}, {2})}, {{"has_max", true}})),
            (Doubles{1, 2, 2}));
  EXPECT_EQ(to_doubles(run(OpKind::Clamp, {a, make_buffer(kFloat32, {}, {3}), make_buffer(kFloat32, {}, {2})},
                           {{"has_min", true}, {"has_max", true}})),
            (Doubles{2, 2, 2}));  // min > max gives max, like torch
  EXPECT_EQ(to_doubles(run(OpKind::MaskedFill, {a, make_int_buffer(kBool, {3}, {0, 1, 0}), b})),
            (Doubles{1, -1, 3}));
  EXPECT_EQ(to_doubles(run(OpKind::Lerp, {make_buffer(kFloat32, {1}, {1}), make_buffer(kFloat32, {1}, {3}),
                                          make_buffer(kFloat32, {}, {0.75})})),
            (Doubles{2.5}));
  EXPECT_EQ(to_doubles(run(OpKind::Addcmul, {a, a, a}, {{"value", 0.5}})), (Doubles{1.5, 4, 7.5}));
}

TEST(IrInterpreterTest, Sources) {
  Graph g;
  const ValueId start = g.add_node(OpKind::Constant, {}, {{"value", 0.5}});
  const ValueId step = g.add_node(OpKind::Constant, {}, {{"value", 0.25}});
  g.mark_output(g.add_node(OpKind::Arange, {start, step}, {{"size", std::int64_t{4}}, {"dtype", kFloat32}}));
  g.mark_output(g.add_node(OpKind::Fill, {step}, {{"sizes", Sizes{2}}, {"dtype", kInt32}}));
  const auto out = interpret(g, {});
  EXPECT_EQ(to_doubles(out[0]), (Doubles{0.5, 0.75, 1.0, 1.25}));
  EXPECT_EQ(to_int64s(out[1]), (Ints{0, 0}));
}

TEST(IrInterpreterTest, Reductions) {
  // x = arange(6).reshape(2, 3), stored transposed to exercise the strides.
  const Buffer x = strided({kFloat32, {2, 3}, {1, 2}}, {0, 3, 1, 4, 2, 5});
  const Attributes row{{"dims", Sizes{1}}};
  EXPECT_EQ(to_doubles(run(OpKind::Sum, {x}, row)), (Doubles{3, 12}));
  EXPECT_EQ(to_doubles(run(OpKind::Sum, {x}, {{"dims", Sizes{0}}, {"keepdim", true}})), (Doubles{3, 5, 7}));
  EXPECT_EQ(to_doubles(run(OpKind::Mean, {x}, row)), (Doubles{1, 4}));
  EXPECT_EQ(to_doubles(run(OpKind::Prod, {x}, row)), (Doubles{0, 60}));
  EXPECT_EQ(to_doubles(run(OpKind::Var, {x}, row)), (Doubles{1, 1}));
  expect_near(to_doubles(run(OpKind::Var, {x}, {{"correction", 0.0}})), {35.0 / 12.0});
  expect_near(to_doubles(run(OpKind::Std, {x})), {std::sqrt(3.5)});
  EXPECT_EQ(to_doubles(run(OpKind::Amax, {x}, {{"dims", Sizes{0}}})), (Doubles{3, 4, 5}));
  expect_near(to_doubles(run(OpKind::LogSumExp, {x}, row)), {2.4076059644, 5.4076059644});
  expect_near(to_doubles(run(OpKind::Norm, {x}, {{"p", 3.0}})), {6.0822019955734}, 1e-5);
  expect_near(to_doubles(run(OpKind::Norm, {x}, {{"p", INFINITY}})), {5});
  EXPECT_EQ(to_int64s(run(OpKind::Argmax, {x})), (Ints{5}));
  EXPECT_EQ(to_int64s(run(OpKind::Argmin, {x}, {{"dims", Sizes{0}}})), (Ints{0, 0, 0}));
  // Ties pick the first index; NaN counts as the maximum.
  EXPECT_EQ(to_int64s(run(OpKind::Argmax, {make_buffer(kFloat32, {4}, {1, 7, 7, 2})})), (Ints{1}));
  EXPECT_EQ(to_int64s(run(OpKind::Argmax, {make_buffer(kFloat32, {4}, {1, NAN, 5, NAN})})), (Ints{1}));
  expect_near(to_doubles(run(OpKind::Amax, {make_buffer(kFloat32, {3}, {1, NAN, 2})})), {NAN});
  // Integer sums are int64 and exact.
  const Buffer big = make_int_buffer(kInt32, {2}, {2147483647, 2147483647});
  const Buffer s = run(OpKind::Sum, {big});
  EXPECT_EQ(s.type.dtype, kInt64);
  EXPECT_EQ(to_int64s(s), (Ints{4294967294}));
}

TEST(IrInterpreterTest, SoftmaxFamily) {
  const Buffer x = make_buffer(kFloat32, {1, 3}, {1, 2, 3});
  const Attributes last{{"dim", std::int64_t{-1}}};
  const Buffer y = run(OpKind::Softmax, {x}, last);
  expect_near(to_doubles(y), {0.09003057, 0.24472847, 0.66524096});
  const Buffer ly = run(OpKind::LogSoftmax, {x}, last);
  expect_near(to_doubles(ly), {-2.40760596, -1.40760596, -0.40760596});
  const Buffer g = make_buffer(kFloat32, {1, 3}, {1, 0, 0});
  // d softmax_0 / dx = y0 * (onehot - y0).
  const double y0 = 0.09003057;
  expect_near(to_doubles(run(OpKind::SoftmaxBackward, {g, y}, last)),
              {y0 * (1 - y0), -y0 * 0.24472847, -y0 * 0.66524096});
  expect_near(to_doubles(run(OpKind::LogSoftmaxBackward, {g, ly}, last)),
              {1 - 0.09003057, -0.24472847, -0.66524096});
}

TEST(IrInterpreterTest, LayerAndRmsNorm) {
  const Buffer x = make_buffer(kFloat32, {1, 4}, {1, 2, 3, 4});
  const Buffer w = make_buffer(kFloat32, {4}, {1, 1, 2, 2});
  const Buffer b = make_buffer(kFloat32, {4}, {0, 0, 0, 1});
  const double r = 1.0 / std::sqrt(1.25 + 1e-5);
  expect_near(to_doubles(run(OpKind::LayerNorm, {x, w, b},
                             {{"normalized_shape", Sizes{4}}, {"has_weight", true}, {"has_bias", true}})),
              {-1.5 * r, -0.5 * r, 1.0 * r, 3.0 * r + 1});
  const double q = 1.0 / std::sqrt(12.5);
  expect_near(to_doubles(run(OpKind::RmsNorm, {make_buffer(kFloat32, {2}, {3, 4})},
                             {{"normalized_shape", Sizes{2}}, {"eps", 0.0}})),
              {3 * q, 4 * q});
  // Backward with a constant gradient: layer norm's dx is 0 (the mean and
  // scale absorb a shift), rms norm's is rstd * (1 - xhat * mean(xhat)).
  const Buffer ones = make_buffer(kFloat32, {1, 4}, {1, 1, 1, 1});
  const Buffer mean = make_buffer(kFloat32, {1, 1}, {2.5});
  const Buffer rstd = make_buffer(kFloat32, {1, 1}, {r});
  expect_near(to_doubles(run(OpKind::LayerNormBackward, {ones, x, mean, rstd}, {{"normalized_shape", Sizes{4}}})),
              {0, 0, 0, 0}, 1e-6);
  const Buffer x2 = make_buffer(kFloat32, {2}, {3, 4});
  const auto dx = to_doubles(run(OpKind::RmsNormBackward, {make_buffer(kFloat32, {2}, {1, 1}), x2,
                                                           make_buffer(kFloat32, {}, {q})},
                                 {{"normalized_shape", Sizes{2}}}));
  const double m = (3 * q + 4 * q) / 2;
  expect_near(dx, {q * (1 - 3 * q * m), q * (1 - 4 * q * m)}, 1e-6);
}

TEST(IrInterpreterTest, Indexing) {
  const Buffer x = make_buffer(kFloat32, {3, 2}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(to_doubles(run(OpKind::IndexSelect, {x, make_int_buffer(kInt64, {2}, {2, 0})}, {{"dim", std::int64_t{0}}})),
            (Doubles{5, 6, 1, 2}));
  EXPECT_EQ(to_doubles(run(OpKind::Gather, {x, make_int_buffer(kInt64, {3, 1}, {1, 0, 1})}, {{"dim", std::int64_t{1}}})),
            (Doubles{2, 3, 6}));
  EXPECT_EQ(to_doubles(run(OpKind::Embedding, {x, make_int_buffer(kInt32, {2}, {1, 1})})), (Doubles{3, 4, 3, 4}));
  EXPECT_EQ(to_doubles(run(OpKind::ScatterAdd, {x, make_int_buffer(kInt64, {1, 2}, {2, 2}),
                                                make_buffer(kFloat32, {1, 2}, {10, 20})},
                           {{"dim", std::int64_t{0}}})),
            (Doubles{1, 2, 3, 4, 15, 26}));
  EXPECT_EQ(to_doubles(run(OpKind::IndexAdd, {x, make_int_buffer(kInt64, {2}, {0, 0}),
                                              make_buffer(kFloat32, {2, 2}, {1, 1, 2, 2})},
                           {{"dim", std::int64_t{0}}, {"alpha", 2.0}})),
            (Doubles{7, 8, 3, 4, 5, 6}));
  EXPECT_EQ(to_doubles(run(OpKind::EmbeddingBackward, {make_buffer(kFloat32, {3, 2}, {1, 1, 2, 2, 4, 4}),
                                                       make_int_buffer(kInt64, {3}, {0, 2, 0})},
                           {{"num_weights", std::int64_t{3}}, {"scale_grad_by_freq", true}})),
            (Doubles{2.5, 2.5, 0, 0, 2, 2}));
  EXPECT_THROW(run(OpKind::IndexSelect, {x, make_int_buffer(kInt64, {1}, {3})}, {{"dim", std::int64_t{0}}}),
               runtime::Error);
}

TEST(IrInterpreterTest, ExternMatrixOps) {
  const Buffer a = make_buffer(kFloat32, {2, 3}, {1, 2, 3, 4, 5, 6});
  // b = [[1,0],[0,1],[1,1]] stored transposed.
  const Buffer b = strided({kFloat32, {3, 2}, {1, 3}}, {1, 0, 1, 0, 1, 1});
  EXPECT_EQ(to_doubles(run(OpKind::Matmul, {a, b})), (Doubles{4, 5, 10, 11}));
  EXPECT_EQ(to_doubles(run(OpKind::Addmm, {make_buffer(kFloat32, {2}, {100, 200}), a, b},
                           {{"beta", 0.5}, {"alpha", 2.0}})),
            (Doubles{58, 110, 70, 122}));
  EXPECT_EQ(to_doubles(run(OpKind::Matmul, {make_buffer(kFloat32, {3}, {1, 1, 1}), b})), (Doubles{2, 2}));
  const Buffer ba = make_buffer(kFloat32, {2, 1, 2}, {1, 2, 3, 4});
  const Buffer bb = make_buffer(kFloat32, {2, 2, 1}, {1, 1, 2, 0});
  EXPECT_EQ(to_doubles(run(OpKind::Bmm, {ba, bb})), (Doubles{3, 6}));
  // SDPA with one key: the output is that key's value, whatever the scores.
  const Buffer q = make_buffer(kFloat32, {1, 2, 2}, {1, 0, 0, 1});
  const Buffer k = make_buffer(kFloat32, {1, 1, 2}, {5, 5});
  const Buffer v = make_buffer(kFloat32, {1, 1, 3}, {7, 8, 9});
  EXPECT_EQ(to_doubles(run(OpKind::Sdpa, {q, k, v})), (Doubles{7, 8, 9, 7, 8, 9}));
}

TEST(IrInterpreterTest, RejectsInputsThatDoNotMatchTheGraph) {
  Graph h = single_op(OpKind::Exp, {T(kFloat32, {2})});
  EXPECT_THROW(interpret(h, {Buffer::zeros(T(kFloat32, {3}))}), runtime::Error);
  EXPECT_THROW(interpret(h, {Buffer::zeros(T(kFloat64, {2}))}), runtime::Error);
  EXPECT_THROW(interpret(h, {}), runtime::Error);
  Buffer short_storage = Buffer::zeros(T(kFloat32, {2}));
  short_storage.bytes.resize(4);
  EXPECT_THROW(interpret(h, {short_storage}), runtime::Error);
}

}  // namespace
}  // namespace vtpu::ir
