#include "vtpu/targets/target.h"

#include "vtpu/runtime/error.h"

namespace vtpu::targets {

void CompiledKernel::check_launch(std::span<const compiler::VtpuTensorArg> tensors, int rank, std::size_t scalars,
                                  const std::string& target) const {
  auto refuse = [&](const std::string& why) {
    throw runtime::Error(runtime::ErrorKind::kInvalidArgument, "[" + target + "] launch refused: " + why);
  };
  if (tensors.size() != static_cast<std::size_t>(num_tensors_))
    refuse(std::to_string(tensors.size()) + " tensors for a kernel of " + std::to_string(num_tensors_));
  if (rank != rank_) refuse("rank " + std::to_string(rank) + " for a kernel of rank " + std::to_string(rank_));
  if (scalars != static_cast<std::size_t>(num_scalars_))
    refuse(std::to_string(scalars) + " launch scalars for a kernel of " + std::to_string(num_scalars_));
  for (const auto& t : tensors)
    for (int d = 0; d < rank; ++d)
      if (t.sizes[d] < 0 || t.sizes[d] != tensors[0].sizes[d]) refuse("tensor sizes differ from the iteration shape");
}

std::unique_ptr<Target> make_target(std::string_view name, std::string* why_not) {
  if (name == "host") return make_host_target();
  if (name == "cuda") return make_cuda_target(why_not);
  if (why_not != nullptr) *why_not = "no target named '" + std::string(name) + "' (targets: host, cuda)";
  return nullptr;
}

}  // namespace vtpu::targets
