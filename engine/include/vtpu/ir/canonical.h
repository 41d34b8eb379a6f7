// Canonical form and stable hash of a graph: the compile-cache key's IR part.
//
// Canonical form: Input nodes first in input order, then the other nodes in
// the order they were built, minus nodes no output depends on (dead code),
// with ids renumbered densely. Every input is kept even if unused: the inputs
// are the kernel's parameter list.
#pragma once

#include <cstdint>
#include <vector>

#include "vtpu/ir/graph.h"
#include "vtpu/ir/hash.h"

namespace vtpu::ir {

enum class ShapeMode : std::uint8_t {
  // Sizes and strides of every input, and size attributes, are in the key.
  kExact,
  // Per tensor only dtype, rank, which dims have size 1 (they broadcast) and
  // the layout class: the key of a shape-generic kernel, whose sizes and
  // strides are launch arguments.
  kGeneric,
};

enum class ScalarMode : std::uint8_t {
  kValues,      // Constant values are in the key: the kernel bakes them in
  kParameters,  // only their dtypes: the kernel takes them as launch arguments
};

enum class LayoutKind : std::uint8_t {
  kContiguous,  // row-major (torch's is_contiguous)
  kBroadcast,   // row-major after dropping stride-0 dims (an expanded tensor)
  kStrided,     // anything else: the kernel indexes through the strides
};

struct LayoutClass {
  LayoutKind kind = LayoutKind::kContiguous;
  std::uint64_t broadcast_mask = 0;  // kBroadcast: bit d set when dim d has stride 0
  bool operator==(const LayoutClass&) const = default;
};

// Dims of size 1 never count as broadcast (their stride is meaningless).
LayoutClass layout_class(const TensorType& type);

struct CanonicalGraph {
  Graph graph;
  std::vector<ValueId> old_to_new;  // per original node; -1 for a dropped one
};

// Dead nodes are dropped unless `keep_dead` (then only renumbered).
CanonicalGraph canonicalize(const Graph& graph, bool keep_dead = false);

// Hash of the canonical form. Bumped kCanonicalVersion changes every key, for
// when the encoding or an op's meaning changes.
inline constexpr std::uint64_t kCanonicalVersion = 1;
// DeadNodes::kKept hashes dead nodes too: the key of code generated from the
// graph as it is, whose launch scalars are numbered over every node, dead
// Constants included (a fused window's dropped temporary leaves dead nodes).
enum class DeadNodes : std::uint8_t { kDropped, kKept };
Hash128 hash(const Graph& graph, ShapeMode mode,
             ScalarMode scalars = ScalarMode::kValues, DeadNodes dead = DeadNodes::kDropped);

}  // namespace vtpu::ir
