#include "vtpu/compiler/system_compiler.h"

#include <cstdlib>
#include <algorithm>
#include <fstream>
#include <iterator>
#include <sstream>

#include "subprocess.h"
#include "vtpu/runtime/error.h"

namespace vtpu::compiler {

using detail::read_text;
using detail::ScratchDir;
using runtime::Error;
using runtime::ErrorKind;

SystemCompiler::SystemCompiler() : SystemCompiler([] {
  const char* env = std::getenv("VTPU_CXX");
  return std::string(env != nullptr && *env != '\0' ? env : "c++");
}()) {}

SystemCompiler::SystemCompiler(std::string executable) : executable_(std::move(executable)) {
  // -O3 and the host ISA: kernels are built on the machine that runs them
  // (the ISA is part of the cache key through the identity and flags).
  flags_ = {"-std=c++17", "-O3", "-march=native", "-fPIC", "-shared", "-fno-math-errno",
            // No fused multiply-adds the source does not spell out: the vector
            // body and the scalar remainder of a loop round alike.
            "-ffp-contract=off",
            // Without it GCC may not evaluate both arms of a select (a NaN or
            // clamp test in kernel_math.h) because one could raise a floating-point
            // exception flag, and leaves every such loop scalar. Values are
            // unchanged: it only drops the promise to keep exception flags exact.
            "-fno-trapping-math",
            // Signed integer arithmetic wraps, as in ATen's kernels: without it
            // GCC assumed no overflow inside a fused kernel (-a == a was false
            // for INT_MIN, which strict, storing -a first, got right).
            "-fwrapv", "-fvisibility=hidden"};
#if defined(__x86_64__)
  // GCC keeps vectors at 256 bits on AVX-512 hosts unless told otherwise; the
  // polynomial math of kernel_math.h is compute-bound, and 512-bit vectors run
  // it 1.3-1.6x faster (gelu 1.38 -> 0.86 ns per element on a cache-resident
  // row, one thread). No effect on hosts without AVX-512, and no effect on
  // results: every element's operations are the same at any width.
  flags_.push_back("-mprefer-vector-width=512");
#endif
  ScratchDir scratch;
  const auto log = scratch.path() / "version.txt";
  if (detail::run_process({executable_, "--version"}, log, detail::compile_timeout()).exit_status != 0)
    throw Error(ErrorKind::kRuntime, "[compiler] cannot run the kernel compiler '" + executable_ +
                                         "' (set VTPU_CXX to a working C++ compiler)");
  std::istringstream text(read_text(log));
  std::getline(text, identity_);
}

std::vector<std::uint8_t> SystemCompiler::compile(const std::string& source) const {
  ScratchDir scratch;
  const auto source_path = scratch.path() / "kernel.cpp";
  const auto object_path = scratch.path() / "kernel.so";
  const auto log = scratch.path() / "log.txt";
  detail::write_text(source_path, source);
  std::vector<std::string> argv = {executable_};
  argv.insert(argv.end(), flags_.begin(), flags_.end());
  argv.insert(argv.end(), {source_path.string(), "-o", object_path.string()});
  detail::run_compiler(argv, log, executable_);
  std::ifstream in(object_path, std::ios::binary);
  std::vector<std::uint8_t> object(std::istreambuf_iterator<char>(in), {});
  // A "compiler" that exits 0 without writing a shared object (VTPU_CXX=/bin/true)
  // must not put something unloadable into the cache, where every later process
  // would fail to load it with no hint of the compiler.
  static constexpr std::uint8_t kElfMagic[] = {0x7f, 'E', 'L', 'F'};
  if (object.size() < sizeof(kElfMagic) || !std::equal(std::begin(kElfMagic), std::end(kElfMagic), object.begin()))
    throw Error(ErrorKind::kRuntime, "[compiler] '" + executable_ + "' exited successfully but wrote no shared "
                                     "object (" + std::to_string(object.size()) +
                                     " bytes); set VTPU_CXX to a working C++ compiler");
  return object;
}

}  // namespace vtpu::compiler
