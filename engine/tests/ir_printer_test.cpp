// The printer's text, which logs and error reports quote.
#include "vtpu/ir/printer.h"

#include <gtest/gtest.h>

namespace vtpu::ir {
namespace {

using enum DType;
using Sizes = std::vector<std::int64_t>;

TEST(IrPrinterTest, PrintsNodesAttributesTypesAndOutputs) {
  Graph g;
  const ValueId x = g.add_input(TensorType::contiguous(kFloat32, {2, 3}));
  const ValueId y = g.add_input(TensorType{kBFloat16, {2, 3}, {0, 1}});
  const ValueId a = g.add_node(OpKind::Add, {x, y}, {{"alpha", std::int64_t{1}}});
  const ValueId c = g.add_node(OpKind::Constant, {}, {{"value", 2.0}});
  const ValueId d = g.add_node(OpKind::Div, {a, c}, {{"rounding_mode", "floor"}});
  const ValueId s = g.add_node(OpKind::Sum, {d}, {{"keepdim", true}, {"dims", Sizes{0, 1}}, {"dtype", kFloat64}});
  g.mark_output(s);
  g.mark_output(a);
  EXPECT_EQ(to_string(g),
            "%0 = input : float32[2,3]\n"
            "%1 = input : bfloat16[2,3]{strides=[0,1]}\n"
            "%2 = add(%0, %1) {alpha=1} : float32[2,3]\n"
            "%3 = constant {value=2.0} : float64[]\n"
            "%4 = div(%2, %3) {rounding_mode=\"floor\"} : float32[2,3]\n"
            "%5 = sum(%4) {dims=[0,1], dtype=float64, keepdim=true} : float64[1,1]\n"
            "return %5, %2\n");
}

TEST(IrPrinterTest, DoublesPrintShortestRoundTrip) {
  EXPECT_EQ(to_string(AttrValue{0.1}), "0.1");
  EXPECT_EQ(to_string(AttrValue{1e-5}), "1e-05");
  EXPECT_EQ(to_string(AttrValue{-3.0}), "-3.0");
  EXPECT_EQ(to_string(AttrValue{std::int64_t{-3}}), "-3");
  EXPECT_EQ(to_string(AttrValue{Sizes{}}), "[]");
}

}  // namespace
}  // namespace vtpu::ir
