// Canonical form and hash: stability (a pinned hex), what each shape mode
// keeps and forgets, dead-code elimination and normalisation.
#include "vtpu/ir/canonical.h"

#include <gtest/gtest.h>

#include "vtpu/ir/printer.h"

namespace vtpu::ir {
namespace {

using enum DType;
using Sizes = std::vector<std::int64_t>;

TensorType T(DType d, Sizes s) { return TensorType::contiguous(d, std::move(s)); }

// x * 0.5 + y, summed over the last dim.
Graph sample(Sizes sx, Sizes sy, double scalar = 0.5) {
  Graph g;
  const ValueId x = g.add_input(T(kFloat32, sx));
  const ValueId y = g.add_input(T(kFloat32, sy));
  const ValueId c = g.add_node(OpKind::Constant, {}, {{"value", scalar}});
  const ValueId m = g.add_node(OpKind::Mul, {x, c});
  const ValueId a = g.add_node(OpKind::Add, {m, y}, {{"alpha", std::int64_t{1}}});
  g.mark_output(g.add_node(OpKind::Sum, {a}, {{"dims", Sizes{-1}}}));
  return g;
}

TEST(IrCanonicalTest, HashIsPinned) {
  // If this changes, every cache key changes: bump kCanonicalVersion on
  // purpose, then update the expected values.
  EXPECT_EQ(hash(sample({2, 3}, {2, 3}), ShapeMode::kExact).hex(), "c29a4665e5cbf44256319e0e87f48c02");
  EXPECT_EQ(hash(sample({2, 3}, {2, 3}), ShapeMode::kGeneric).hex(), "49cf2b7b8e94cc5a93969fba48574e7e");
  Hasher h;
  EXPECT_EQ(h.add(1).add_string("vtpu").finish().hex(), "9ae4ddee1b443398a640ff13637bee8e");
}

TEST(IrCanonicalTest, HashIsDeterministicAndHex) {
  const Hash128 a = hash(sample({2, 3}, {2, 3}), ShapeMode::kExact);
  const Hash128 b = hash(sample({2, 3}, {2, 3}), ShapeMode::kExact);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.hex().size(), 32u);
  EXPECT_NE(a.hi, a.lo);
}

TEST(IrCanonicalTest, ExactModeSeesSizesAndStrides) {
  EXPECT_NE(hash(sample({2, 3}, {2, 3}), ShapeMode::kExact),
            hash(sample({4, 3}, {4, 3}), ShapeMode::kExact));
  Graph a, b;
  a.mark_output(a.add_node(OpKind::Exp, {a.add_input(TensorType{kFloat32, {2, 3}, {3, 1}})}));
  b.mark_output(b.add_node(OpKind::Exp, {b.add_input(TensorType{kFloat32, {2, 3}, {1, 2}})}));
  EXPECT_NE(hash(a, ShapeMode::kExact), hash(b, ShapeMode::kExact));
}

TEST(IrCanonicalTest, GenericModeForgetsSizesOfSameRankContiguousTensors) {
  EXPECT_EQ(hash(sample({2, 3}, {2, 3}), ShapeMode::kGeneric),
            hash(sample({40, 7}, {40, 7}), ShapeMode::kGeneric));
  EXPECT_EQ(hash(sample({0, 3}, {0, 3}), ShapeMode::kGeneric),
            hash(sample({40, 7}, {40, 7}), ShapeMode::kGeneric));
  // ...but not rank, dtype, broadcasting (size-1 dims) or layout class.
  EXPECT_NE(hash(sample({2, 3}, {2, 3}), ShapeMode::kGeneric),
            hash(sample({2, 3, 4}, {2, 3, 4}), ShapeMode::kGeneric));
  EXPECT_NE(hash(sample({2, 3}, {2, 3}), ShapeMode::kGeneric),
            hash(sample({2, 3}, {1, 3}), ShapeMode::kGeneric));
  Graph a, b, c;
  a.mark_output(a.add_node(OpKind::Exp, {a.add_input(TensorType{kFloat32, {2, 3}, {3, 1}})}));
  b.mark_output(b.add_node(OpKind::Exp, {b.add_input(TensorType{kFloat32, {2, 3}, {1, 2}})}));
  c.mark_output(c.add_node(OpKind::Exp, {c.add_input(TensorType{kFloat64, {2, 3}, {3, 1}})}));
  EXPECT_NE(hash(a, ShapeMode::kGeneric), hash(b, ShapeMode::kGeneric));
  EXPECT_NE(hash(a, ShapeMode::kGeneric), hash(c, ShapeMode::kGeneric));
}

TEST(IrCanonicalTest, LayoutClasses) {
  EXPECT_EQ(layout_class(T(kFloat32, {2, 3})).kind, LayoutKind::kContiguous);
  EXPECT_EQ(layout_class(TensorType{kFloat32, {1, 3}, {7, 1}}).kind, LayoutKind::kContiguous);
  // Empty tensors are classed by their strides too: an empty operand expanded
  // from a 0-dim tensor is a broadcast, as the fused window's pattern key
  // says (classed contiguous, its kernel read it as a dense buffer when the
  // pattern later ran on a non-empty shape).
  EXPECT_EQ(layout_class(TensorType{kFloat32, {0, 3}, {3, 1}}).kind, LayoutKind::kContiguous);
  EXPECT_EQ(layout_class(TensorType{kFloat32, {0, 3}, {0, 0}}), (LayoutClass{LayoutKind::kBroadcast, 0b11}));
  EXPECT_EQ(layout_class(TensorType{kFloat32, {0, 3}, {5, 9}}).kind, LayoutKind::kStrided);
  EXPECT_EQ(layout_class(TensorType{kFloat32, {4, 3}, {0, 1}}), (LayoutClass{LayoutKind::kBroadcast, 0b01}));
  EXPECT_EQ(layout_class(TensorType{kFloat32, {4, 2, 3}, {3, 0, 1}}),
            (LayoutClass{LayoutKind::kBroadcast, 0b010}));
  EXPECT_EQ(layout_class(TensorType{kFloat32, {2, 3}, {1, 2}}).kind, LayoutKind::kStrided);
  EXPECT_EQ(layout_class(TensorType{kFloat32, {2, 3}, {6, 1}}).kind, LayoutKind::kStrided);
  // Expanded tensors of different sizes share a generic key.
  Graph a, b;
  a.mark_output(a.add_node(OpKind::Neg, {a.add_input(TensorType{kFloat32, {4, 3}, {0, 1}})}));
  b.mark_output(b.add_node(OpKind::Neg, {b.add_input(TensorType{kFloat32, {9, 5}, {0, 1}})}));
  EXPECT_EQ(hash(a, ShapeMode::kGeneric), hash(b, ShapeMode::kGeneric));
}

TEST(IrCanonicalTest, ScalarModeDecidesWhetherConstantValuesCount) {
  EXPECT_NE(hash(sample({2, 3}, {2, 3}, 0.5), ShapeMode::kGeneric),
            hash(sample({2, 3}, {2, 3}, 0.25), ShapeMode::kGeneric));
  EXPECT_EQ(hash(sample({2, 3}, {2, 3}, 0.5), ShapeMode::kGeneric, ScalarMode::kParameters),
            hash(sample({2, 3}, {2, 3}, 0.25), ShapeMode::kGeneric, ScalarMode::kParameters));
  EXPECT_NE(hash(sample({2, 3}, {2, 3}), ShapeMode::kGeneric, ScalarMode::kParameters),
            hash(sample({2, 3}, {2, 3}), ShapeMode::kGeneric, ScalarMode::kValues));
}

TEST(IrCanonicalTest, DeadCodeIsDroppedAndIdsRenumbered) {
  Graph g;
  const ValueId x = g.add_input(T(kFloat32, {3}));
  const ValueId dead = g.add_node(OpKind::Exp, {x});
  g.add_node(OpKind::Log, {dead});
  const ValueId late = g.add_input(T(kFloat32, {3}));  // inputs move first
  const ValueId live = g.add_node(OpKind::Add, {x, late});
  g.mark_output(live);
  const CanonicalGraph c = canonicalize(g);
  EXPECT_EQ(to_string(c.graph),
            "%0 = input : float32[3]\n"
            "%1 = input : float32[3]\n"
            "%2 = add(%0, %1) : float32[3]\n"
            "return %2\n");
  EXPECT_EQ(c.old_to_new, (std::vector<ValueId>{0, -1, -1, 1, 2}));

  Graph clean;
  const ValueId a = clean.add_input(T(kFloat32, {3}));
  const ValueId b = clean.add_input(T(kFloat32, {3}));
  clean.mark_output(clean.add_node(OpKind::Add, {a, b}));
  EXPECT_EQ(hash(g, ShapeMode::kExact), hash(clean, ShapeMode::kExact));
}

TEST(IrCanonicalTest, EquivalentSpellingsShareAHash) {
  auto reduce = [](Attributes attrs) {
    Graph g;
    g.mark_output(g.add_node(OpKind::Sum, {g.add_input(T(kFloat32, {2, 3}))}, std::move(attrs)));
    return hash(g, ShapeMode::kExact);
  };
  EXPECT_EQ(reduce({{"dims", Sizes{-1}}}), reduce({{"dims", Sizes{1}}}));
  EXPECT_EQ(reduce({{"dims", Sizes{1, 0}}}), reduce({}));
  EXPECT_NE(reduce({{"dims", Sizes{0}}}), reduce({{"dims", Sizes{1}}}));
  auto softmax = [](std::int64_t dim) {
    Graph g;
    g.mark_output(g.add_node(OpKind::Softmax, {g.add_input(T(kFloat32, {2, 3}))}, {{"dim", dim}}));
    return hash(g, ShapeMode::kExact);
  };
  EXPECT_EQ(softmax(-1), softmax(1));
}

TEST(IrCanonicalTest, GenericModeDropsSizeAttributes) {
  auto fill = [](Sizes sizes) {
    Graph g;
    const ValueId v = g.add_node(OpKind::Constant, {}, {{"value", 1.0}});
    g.mark_output(g.add_node(OpKind::Fill, {v}, {{"sizes", sizes}, {"dtype", kFloat32}}));
    return g;
  };
  EXPECT_EQ(hash(fill({2, 3}), ShapeMode::kGeneric), hash(fill({5, 6}), ShapeMode::kGeneric));
  EXPECT_NE(hash(fill({2, 3}), ShapeMode::kExact), hash(fill({5, 6}), ShapeMode::kExact));
  EXPECT_NE(hash(fill({1, 3}), ShapeMode::kGeneric), hash(fill({5, 6}), ShapeMode::kGeneric));
}

}  // namespace
}  // namespace vtpu::ir
