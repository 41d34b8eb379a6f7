#include "subprocess.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <thread>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "vtpu/runtime/error.h"

extern char** environ;

namespace vtpu::compiler::detail {

using runtime::Error;
using runtime::ErrorKind;

ScratchDir::ScratchDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "vtpu-cc-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr)
    throw Error(ErrorKind::kRuntime, "[compiler] cannot create a temporary directory");
  path_ = pattern;
}

ScratchDir::~ScratchDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::chrono::milliseconds compile_timeout() {
  const char* env = std::getenv("VTPU_COMPILE_TIMEOUT");
  if (env == nullptr || *env == '\0') return std::chrono::seconds(600);
  char* end = nullptr;
  const double seconds = std::strtod(env, &end);
  if (end == env || *end != '\0' || !std::isfinite(seconds) || seconds <= 0)
    throw Error(ErrorKind::kInvalidArgument,
                "VTPU_COMPILE_TIMEOUT must be a positive number of seconds, got '" + std::string(env) + "'");
  return std::chrono::milliseconds(static_cast<long long>(std::min(seconds, 1e9) * 1000) + 1);
}

RunResult run_process(const std::vector<std::string>& argv, const std::filesystem::path& log,
                      std::chrono::milliseconds timeout) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  // Its own process group, so a timeout also ends what it started (cc1plus, as, ld).
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, args[0], &actions, &attributes, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (spawned != 0) return {-1, "could not start it: " + std::string(std::strerror(spawned))};
  // A hung compiler must not hang the program: wait with a deadline.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto nap = std::chrono::milliseconds(1);
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) return {-1, "could not wait for it: " + std::string(std::strerror(errno))};
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(-pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      RunResult timed_out{-1, "timed out after " + std::to_string(timeout.count() / 1000) +
                                  " s (VTPU_COMPILE_TIMEOUT)"};
      timed_out.timed_out = true;
      return timed_out;
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::milliseconds(20));
  }
  if (WIFEXITED(status)) return {WEXITSTATUS(status), ""};
  if (WIFSIGNALED(status)) return {-1, "killed by signal " + std::to_string(WTERMSIG(status))};
  return {-1, "ended with wait status " + std::to_string(status)};
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) throw Error(ErrorKind::kRuntime, "[compiler] cannot write " + path.string());
}

void run_compiler(const std::vector<std::string>& argv, const std::filesystem::path& log, const std::string& tool) {
  const auto timeout = compile_timeout();
  RunResult result = run_process(argv, log, timeout);
  if (!result.exited_normally() && !result.timed_out) result = run_process(argv, log, timeout);
  if (result.exit_status == 0) return;
  std::string diagnostics = read_text(log);
  if (diagnostics.size() > 4000) diagnostics.resize(4000);
  const std::string how = result.exited_normally() ? "exit status " + std::to_string(result.exit_status) : result.why;
  throw Error(ErrorKind::kRuntime, "[compiler] " + tool + " failed (" + how + "):\n" + diagnostics);
}

}  // namespace vtpu::compiler::detail
