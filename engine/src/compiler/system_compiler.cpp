#include "vtpu/compiler/system_compiler.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "vtpu/runtime/error.h"

extern char** environ;

namespace vtpu::compiler {
namespace {

using runtime::Error;
using runtime::ErrorKind;

// A private scratch directory, removed with everything in it on scope exit.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "vtpu-cc-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr)
      throw Error(ErrorKind::kRuntime, "[compiler] cannot create a temporary directory");
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// How a compiler run ended: its exit status, or why there is none.
struct RunResult {
  int exit_status = -1;  // -1: no normal exit (see why)
  std::string why;       // spawn or wait errno, or the signal that ended it
  bool exited_normally() const { return exit_status >= 0; }
};

// Runs argv with stdout+stderr sent to `log`.
RunResult run(const std::vector<std::string>& argv, const std::filesystem::path& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return {-1, "could not start it: " + std::string(std::strerror(spawned))};
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return {-1, "could not wait for it: " + std::string(std::strerror(errno))};
  }
  if (WIFEXITED(status)) return {WEXITSTATUS(status), ""};
  if (WIFSIGNALED(status)) return {-1, "killed by signal " + std::to_string(WTERMSIG(status))};
  return {-1, "ended with wait status " + std::to_string(status)};
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

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
  if (run({executable_, "--version"}, log).exit_status != 0)
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
  {
    std::ofstream out(source_path);
    out << source;
    if (!out) throw Error(ErrorKind::kRuntime, "[compiler] cannot write " + source_path.string());
  }
  std::vector<std::string> argv = {executable_};
  argv.insert(argv.end(), flags_.begin(), flags_.end());
  argv.insert(argv.end(), {source_path.string(), "-o", object_path.string()});
  RunResult result = run(argv, log);
  // A run that did not exit (killed, or not started: a busy or short-of-memory
  // machine) is tried once more; a compile error is not.
  if (!result.exited_normally()) result = run(argv, log);
  if (result.exit_status != 0) {
    std::string diagnostics = read_text(log);
    if (diagnostics.size() > 4000) diagnostics.resize(4000);
    const std::string how = result.exited_normally() ? "exit status " + std::to_string(result.exit_status) : result.why;
    throw Error(ErrorKind::kRuntime, "[compiler] " + executable_ + " failed (" + how + "):\n" + diagnostics);
  }
  std::ifstream in(object_path, std::ios::binary);
  return std::vector<std::uint8_t>(std::istreambuf_iterator<char>(in), {});
}

}  // namespace vtpu::compiler
