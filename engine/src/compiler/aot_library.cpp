#include "vtpu/compiler/aot_library.h"

#include <set>
#include <string>

#include "vtpu/compiler/host_codegen.h"
#include "vtpu/runtime/error.h"

namespace vtpu::compiler {

AotBuildResult build_aot_library(const std::vector<ir::Graph>& graphs, KernelProvider& provider) {
  std::vector<GeneratedKernel> kernels;
  std::set<std::string> symbols;
  std::string manifest;
  for (const ir::Graph& graph : graphs) {
    const std::string symbol = KernelProvider::symbol_for(graph);
    if (!symbols.insert(symbol).second) continue;  // two spellings of one kernel
    try {
      kernels.push_back(generate_host_kernel(graph, symbol));
    } catch (const runtime::Error& e) {
      if (e.kind() != runtime::ErrorKind::kInvalidArgument) throw;
      continue;  // outside the generator's set: compiled (or not) at run time
    }
    manifest += provider.key_for(graph).hex() + " " + symbol + "\n";
  }
  std::string source = host_translation_unit(kernels);
  source += std::string("extern \"C\" __attribute__((visibility(\"default\"))) const char* ") + kAotManifestSymbol +
            "(void) {\n  return R\"VTPU_MANIFEST(" + manifest + ")VTPU_MANIFEST\";\n}\n";
  AotBuildResult result;
  result.shared_object = provider.compile(source);
  result.kernels = kernels.size();
  return result;
}

}  // namespace vtpu::compiler
