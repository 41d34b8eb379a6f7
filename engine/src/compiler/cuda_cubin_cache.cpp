#include "vtpu/compiler/cuda_cubin_cache.h"

#include "vtpu/compiler/cuda_codegen.h"
#include "vtpu/compiler/kernel_provider.h"

namespace vtpu::compiler {

cache::Key cuda_cubin_key(const NvccCompiler& nvcc, const std::string& source, const std::string& arch) {
  std::string flags;
  for (const auto& f : nvcc.flags()) flags += f + " ";
  const std::string abi = "cuda-abi-" + std::to_string(sizeof(VtpuCudaLaunchArgs));
  return cache::make_key({"vtpu-cuda-kernel", source, "target=cuda", arch, nvcc.identity(), flags, abi, kVtpuVersion});
}

std::vector<std::uint8_t> cuda_cubin(cache::CompileCache* cache, const NvccCompiler& nvcc, const std::string& source,
                                     const std::string& arch) {
  if (cache == nullptr) return nvcc.compile(source, arch);
  const auto entry = cache->get_or_create(cuda_cubin_key(nvcc, source, arch), [&] {
    return cache::Entry{nvcc.compile(source, arch), {{"target", "cuda"}, {"arch", arch}}};
  });
  return entry->data;
}

}  // namespace vtpu::compiler
