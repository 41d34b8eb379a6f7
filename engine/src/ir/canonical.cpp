// Canonical form (inputs first, dead code dropped, dims normalised) and the
// stable hash over it. The encoding is a flat word stream; every variable-
// length part is length-prefixed so that different graphs cannot collide by
// concatenation.
#include "vtpu/ir/canonical.h"

#include <algorithm>

namespace vtpu::ir {
namespace {

// Reduction dims as the sorted, wrapped set; "every dim" as the empty list.
std::vector<std::int64_t> normal_dims(const std::vector<std::int64_t>& dims, std::int64_t rank) {
  const std::int64_t r = rank == 0 ? 1 : rank;
  std::vector<std::int64_t> out;
  for (std::int64_t d : dims) out.push_back(d < 0 ? d + r : d);
  std::sort(out.begin(), out.end());
  if (rank == 0 || static_cast<std::int64_t>(out.size()) == rank) out.clear();
  return out;
}

// Rewrites attributes whose spelling varies but whose meaning does not, so
// that sum(dims=[-1]) and sum(dims=[1]) of a matrix share a key.
Attributes normalise(const Node& n, const Graph& g) {
  Attributes a = n.attrs;
  if (n.inputs.empty()) return a;
  const std::int64_t rank = g.type(n.inputs[0]).rank();
  if (category(n.op) == OpCategory::kReduction) {
    std::vector<std::int64_t> dims = normal_dims(a.get_ints("dims", {}), rank);
    if (dims.empty()) a.erase("dims");
    else a.set("dims", std::move(dims));
  }
  if (const AttrValue* d = a.find("dim")) {
    if (const auto* i = std::get_if<std::int64_t>(d); i && *i < 0) {
      a.set("dim", *i + (rank == 0 ? 1 : rank));
    }
  }
  return a;
}

void add_dims(Hasher& h, const std::vector<std::int64_t>& v) {
  h.add(v.size());
  for (std::int64_t x : v) h.add_signed(x);
}

// Generic per-tensor key: dtype, rank and which dims are 1 (they broadcast
// against the other operands, so a kernel must know).
void add_generic_type(Hasher& h, const TensorType& t) {
  h.add(static_cast<std::uint64_t>(t.dtype));
  h.add(t.sizes.size());
  std::uint64_t word = 0;
  for (std::size_t i = 0; i < t.sizes.size(); ++i) {
    if (t.sizes[i] == 1) word |= std::uint64_t{1} << (i % 64);
    if (i % 64 == 63 || i + 1 == t.sizes.size()) {
      h.add(word);
      word = 0;
    }
  }
}

// Attributes that spell out sizes: in generic mode the output type's rank
// already says what a kernel may specialise on.
bool is_size_attr(OpKind op, const std::string& key) {
  return (op == OpKind::Fill && key == "sizes") || (op == OpKind::Arange && key == "size") ||
         (op == OpKind::EmbeddingBackward && key == "num_weights");
}

void add_value(Hasher& h, const AttrValue& v) {
  h.add(v.index());
  struct Visitor {
    Hasher& h;
    void operator()(bool b) { h.add(b ? 1 : 0); }
    void operator()(std::int64_t i) { h.add_signed(i); }
    void operator()(double d) { h.add_double(d); }
    void operator()(const std::string& s) { h.add_string(s); }
    void operator()(const std::vector<std::int64_t>& l) { add_dims(h, l); }
    void operator()(DType t) { h.add(static_cast<std::uint64_t>(t)); }
  };
  std::visit(Visitor{h}, v);
}

}  // namespace

LayoutClass layout_class(const TensorType& t) {
  if (t.is_contiguous()) return {};
  if (t.rank() <= 64) {
    // Drop stride-0 dims; if what is left is row-major, it is an expand.
    std::uint64_t mask = 0;
    std::int64_t expected = 1;
    bool row_major = true;
    for (std::size_t i = t.sizes.size(); i-- > 0;) {
      if (t.sizes[i] == 1) continue;
      if (t.strides[i] == 0) {
        mask |= std::uint64_t{1} << i;
        continue;
      }
      if (t.strides[i] != expected) row_major = false;
      expected *= t.sizes[i];
    }
    if (row_major) return {LayoutKind::kBroadcast, mask};
  }
  return {LayoutKind::kStrided, 0};
}

CanonicalGraph canonicalize(const Graph& g, bool keep_dead) {
  const std::int32_t n = g.size();
  std::vector<bool> live(static_cast<std::size_t>(n), keep_dead);
  for (ValueId o : g.outputs()) live[static_cast<std::size_t>(o)] = true;
  // Ids are topological, so one reverse sweep finds everything outputs use.
  for (std::int32_t i = n; i-- > 0;) {
    if (!live[static_cast<std::size_t>(i)]) continue;
    for (ValueId in : g.node(i).inputs) live[static_cast<std::size_t>(in)] = true;
  }
  CanonicalGraph c;
  c.old_to_new.assign(static_cast<std::size_t>(n), -1);
  for (ValueId in : g.inputs()) {
    c.old_to_new[static_cast<std::size_t>(in)] = c.graph.add_input(g.type(in));
  }
  for (std::int32_t i = 0; i < n; ++i) {
    const Node& node = g.node(i);
    if (node.op == OpKind::Input || !live[static_cast<std::size_t>(i)]) continue;
    std::vector<ValueId> ins;
    for (ValueId in : node.inputs) ins.push_back(c.old_to_new[static_cast<std::size_t>(in)]);
    c.old_to_new[static_cast<std::size_t>(i)] =
        c.graph.add_node(node.op, std::move(ins), normalise(node, g));
  }
  for (ValueId o : g.outputs()) c.graph.mark_output(c.old_to_new[static_cast<std::size_t>(o)]);
  return c;
}

Hash128 hash(const Graph& graph, ShapeMode mode, ScalarMode scalars, DeadNodes dead) {
  const Graph g = canonicalize(graph, dead == DeadNodes::kKept).graph;
  const bool generic = mode == ShapeMode::kGeneric;
  Hasher h;
  h.add(kCanonicalVersion);
  h.add(static_cast<std::uint64_t>(mode));
  h.add(static_cast<std::uint64_t>(scalars));
  h.add(static_cast<std::uint64_t>(g.size()));
  for (const Node& node : g.nodes()) {
    h.add(static_cast<std::uint64_t>(node.op));
    add_dims(h, std::vector<std::int64_t>(node.inputs.begin(), node.inputs.end()));
    if (!generic) {
      // Node types follow from the inputs; only Input strides are free.
      h.add(static_cast<std::uint64_t>(node.type.dtype));
      add_dims(h, node.type.sizes);
      if (node.op == OpKind::Input) add_dims(h, node.type.strides);
    } else {
      add_generic_type(h, node.type);
      if (node.op == OpKind::Input) {
        const LayoutClass lc = layout_class(node.type);
        h.add(static_cast<std::uint64_t>(lc.kind));
        h.add(lc.broadcast_mask);
      }
    }
    const bool param = scalars == ScalarMode::kParameters && node.op == OpKind::Constant;
    // A run-time scalar attribute counts by its presence, not its value.
    const char* runtime_attr = scalars == ScalarMode::kParameters ? runtime_scalar_attribute(node.op) : nullptr;
    std::uint64_t count = 0;
    for (const auto& [key, value] : node.attrs.entries()) {
      if (!(generic && is_size_attr(node.op, key)) && !(param && key == "value")) ++count;
    }
    h.add(count);
    for (const auto& [key, value] : node.attrs.entries()) {
      if (generic && is_size_attr(node.op, key)) continue;
      if (param && key == "value") continue;
      h.add_string(key);
      if (runtime_attr != nullptr && key == runtime_attr) continue;
      if (generic && key == "normalized_shape" && std::holds_alternative<std::vector<std::int64_t>>(value)) {
        h.add(std::get<std::vector<std::int64_t>>(value).size());  // how many dims, not their sizes
        continue;
      }
      add_value(h, value);
    }
  }
  add_dims(h, std::vector<std::int64_t>(g.outputs().begin(), g.outputs().end()));
  return h.finish();
}

}  // namespace vtpu::ir
