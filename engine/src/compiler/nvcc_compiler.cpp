#include "vtpu/compiler/nvcc_compiler.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "subprocess.h"
#include "vtpu/runtime/error.h"

namespace vtpu::compiler {
namespace {

using runtime::Error;
using runtime::ErrorKind;

std::string default_executable() {
  if (const char* env = std::getenv("VTPU_NVCC"); env != nullptr && *env != '\0') return env;
  // nvcc on PATH first; CUDA's default install prefix when PATH lacks it.
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    std::istringstream dirs(path);
    for (std::string dir; std::getline(dirs, dir, ':');)
      if (!dir.empty() && access((dir + "/nvcc").c_str(), X_OK) == 0) return dir + "/nvcc";
  }
  return "/usr/local/cuda/bin/nvcc";
}

}  // namespace

NvccCompiler::NvccCompiler() : NvccCompiler(default_executable()) {}

NvccCompiler::NvccCompiler(std::string executable) : executable_(std::move(executable)) {
  flags_ = {"-cubin", "-std=c++17", "-O3",
            // No contractions the source does not spell out, IEEE division and
            // square root, subnormals kept: each element's operations round
            // as the host target's do (-ffp-contract=off there).
            "--fmad=false", "-prec-div=true", "-prec-sqrt=true", "-ftz=false",
            // Unused launch scalars of a kernel are not worth a warning.
            "-w"};
  detail::ScratchDir scratch;
  const auto log = scratch.path() / "version.txt";
  if (detail::run_process({executable_, "--version"}, log, detail::compile_timeout()).exit_status != 0)
    throw Error(ErrorKind::kRuntime,
                "[cuda compiler] cannot run nvcc '" + executable_ + "' (set VTPU_NVCC to a working nvcc)");
  // The last line names the release: "Build cuda_13.0.r13.0/compiler.36424714_0".
  std::istringstream text(detail::read_text(log));
  for (std::string line; std::getline(text, line);)
    if (!line.empty()) identity_ = line;
}

std::unique_ptr<NvccCompiler> NvccCompiler::find(std::string* why_not) {
  try {
    return std::make_unique<NvccCompiler>();
  } catch (const Error& e) {
    if (why_not != nullptr) *why_not = e.what();
    return nullptr;
  }
}

std::vector<std::uint8_t> NvccCompiler::compile(const std::string& source, const std::string& arch) const {
  detail::ScratchDir scratch;
  const auto source_path = scratch.path() / "kernel.cu";
  const auto cubin_path = scratch.path() / "kernel.cubin";
  const auto log = scratch.path() / "log.txt";
  detail::write_text(source_path, source);
  std::vector<std::string> argv = {executable_};
  argv.insert(argv.end(), flags_.begin(), flags_.end());
  argv.insert(argv.end(), {"-arch=" + arch, source_path.string(), "-o", cubin_path.string()});
  detail::run_compiler(argv, log, "nvcc");
  std::ifstream in(cubin_path, std::ios::binary);
  std::vector<std::uint8_t> cubin(std::istreambuf_iterator<char>(in), {});
  if (cubin.size() < 4 || std::memcmp(cubin.data(), "\x7f" "ELF", 4) != 0)
    throw Error(ErrorKind::kRuntime, "[cuda compiler] nvcc exited successfully but wrote no cubin");
  return cubin;
}

}  // namespace vtpu::compiler
