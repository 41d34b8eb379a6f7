// The reference convolution against values printed by torch.nn.functional
// (conv2d / conv_transpose1d) for small integer-valued inputs.
#include <gtest/gtest.h>

#include "vtpu/ir/interpreter.h"

namespace vtpu::ir {
namespace {

using enum DType;
using Sizes = std::vector<std::int64_t>;
using Doubles = std::vector<double>;

// values[i] = i % mod - shift, shaped `sizes`.
Buffer pattern(Sizes sizes, int mod, int shift) {
  const TensorType t = TensorType::contiguous(kFloat32, sizes);
  Doubles v(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(static_cast<int>(i) % mod - shift);
  return make_buffer(kFloat32, std::move(sizes), v);
}

Buffer conv(std::vector<Buffer> in, Attributes attrs) {
  std::vector<TensorType> types;
  for (const Buffer& b : in) types.push_back(b.type);
  return interpret(single_op(OpKind::Conv, types, std::move(attrs)), in)[0];
}

TEST(IrInterpreterConvTest, GroupedStridedPaddedConv2dMatchesTorch) {
  const Buffer x = pattern({2, 4, 5, 5}, 7, 3);
  const Buffer w = pattern({4, 2, 3, 3}, 5, 2);
  const Buffer b = make_buffer(kFloat32, {4}, {1, -1, 2, 0});
  const Buffer y = conv({x, w, b}, {{"stride", Sizes{2}}, {"padding", Sizes{1}}, {"groups", std::int64_t{2}},
                                    {"has_bias", true}});
  EXPECT_EQ(y.type.sizes, (Sizes{2, 4, 3, 3}));
  EXPECT_EQ(to_doubles(y),
            (Doubles{8,   -12, -4, -11, -9,  6,   10,  20,  -9, -13, 6,   13, 3,   10,  -12, 2,   -13, 1,
                     3,   -2,  -7, -11, 5,   7,   5,   24,  -7, -5,  0,   18, -3,  -5,  -17, 9,   -15, 1,
                     -7,  -10, 17, 1,   20,  -7,  15,  -15, 0,  2,   21,  -10, 3,  -23, 8,   -13, -4,  1,
                     -2,  -10, 20, -2,  -2,  -2,  20,  -10, -2, -5,  26,  -9,  5,  -14, -3,  -10, 5,   7}));
}

TEST(IrInterpreterConvTest, DilatedAsymmetricPaddingMatchesTorch) {
  // torch: conv2d(x, w[:, :, :2, :], stride=1, padding=(0, 2), dilation=(2, 1), groups=2):
  // shape (2, 4, 3, 7), sum 28.
  const Buffer x = pattern({2, 4, 5, 5}, 7, 3);
  const Buffer wf = pattern({4, 2, 3, 3}, 5, 2);
  const auto all = to_doubles(wf);
  Doubles cut;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if ((i / 3) % 3 != 2) cut.push_back(all[i]);  // keep kernel rows 0 and 1
  }
  const Buffer w = make_buffer(kFloat32, {4, 2, 2, 3}, cut);
  const Buffer y = conv({x, w}, {{"padding", Sizes{0, 2}}, {"dilation", Sizes{2, 1}}, {"groups", std::int64_t{2}}});
  EXPECT_EQ(y.type.sizes, (Sizes{2, 4, 3, 7}));
  double sum = 0;
  for (double v : to_doubles(y)) sum += v;
  EXPECT_EQ(sum, 28.0);
}

TEST(IrInterpreterConvTest, TransposedConv1dMatchesTorch) {
  const Buffer x = pattern({1, 4, 3}, 5, 2);
  const Buffer w = pattern({4, 3, 2}, 4, 1);
  const Buffer b = make_buffer(kFloat32, {6}, {0.5, 0, 0, 0, 0, -0.5});
  const Buffer y = conv({x, w, b}, {{"stride", Sizes{2}}, {"padding", Sizes{1}}, {"output_padding", Sizes{1}},
                                    {"groups", std::int64_t{2}}, {"dilation", Sizes{2}}, {"transposed", true},
                                    {"has_bias", true}});
  EXPECT_EQ(y.type.sizes, (Sizes{1, 6, 6}));
  EXPECT_EQ(to_doubles(y), (Doubles{0.5, 5.5, 0.5, 2.5, 0.5, -3.5, 0, -7, 0, 0,   0,    0,    0,   5,    0, 2,   0,    -4,
                                    0,   2,   0,   -6,  0,   -2,   0, 0,  0, 2,   0,    2,    -0.5, 1.5, -0.5, -6.5, -0.5, -2.5}));
}

}  // namespace
}  // namespace vtpu::ir
