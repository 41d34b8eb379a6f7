#include "vtpu/ir/printer.h"

namespace vtpu::ir {

std::string to_string(const Node& node, ValueId id) {
  // Appends rather than operator+ chains: GCC 12 warns falsely (-Wrestrict)
  // on `"%" + std::to_string(...)`.
  std::string s = "%";
  s += std::to_string(id);
  s += " = ";
  s += name(node.op);
  if (!node.inputs.empty()) {
    s += "(";
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      if (i) s += ", ";
      s += '%';
      s += std::to_string(node.inputs[i]);
    }
    s += ")";
  }
  if (!node.attrs.empty()) {
    s += " {";
    bool first = true;
    for (const auto& [key, value] : node.attrs.entries()) {
      if (!first) s += ", ";
      first = false;
      s += key + "=" + to_string(value);
    }
    s += "}";
  }
  return s + " : " + to_string(node.type);
}

std::string to_string(const Graph& graph) {
  std::string s;
  for (ValueId i = 0; i < graph.size(); ++i) s += to_string(graph.node(i), i) + "\n";
  s += "return";
  for (std::size_t i = 0; i < graph.outputs().size(); ++i) {
    s += i ? ", %" : " %";
    s += std::to_string(graph.outputs()[i]);
  }
  return s + "\n";
}

}  // namespace vtpu::ir
