// Readable text of a graph, one node a line, for logs, error reports and tests:
//   %0 = input : float32[2,3]
//   %2 = add(%0, %1) {alpha=1} : float32[2,3]
//   return %2
#pragma once

#include <string>

#include "vtpu/ir/graph.h"

namespace vtpu::ir {

std::string to_string(const Node& node, ValueId id);
std::string to_string(const Graph& graph);

}  // namespace vtpu::ir
