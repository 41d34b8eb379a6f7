// The cuda target's kernels in the compile cache (DESIGN.md "Compile cache":
// one cache, keys naming target and ISA): a cubin is keyed by its generated
// source, the architecture, nvcc's identity and flags, the launch ABI and the
// vtpu version, so a warm process or server loads it without running nvcc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vtpu/cache/compile_cache.h"
#include "vtpu/cache/key.h"
#include "vtpu/compiler/nvcc_compiler.h"

namespace vtpu::compiler {

cache::Key cuda_cubin_key(const NvccCompiler& nvcc, const std::string& source, const std::string& arch);

// The cubin of `source` for `arch`: from `cache` when it holds it, else built
// by nvcc and stored there. `cache` may be null (always built).
std::vector<std::uint8_t> cuda_cubin(cache::CompileCache* cache, const NvccCompiler& nvcc, const std::string& source,
                                     const std::string& arch);

}  // namespace vtpu::compiler
