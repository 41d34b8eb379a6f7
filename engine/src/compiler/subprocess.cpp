#include "subprocess.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
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

RunResult run_process(const std::vector<std::string>& argv, const std::filesystem::path& log) {
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

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) throw Error(ErrorKind::kRuntime, "[compiler] cannot write " + path.string());
}

void run_compiler(const std::vector<std::string>& argv, const std::filesystem::path& log, const std::string& tool) {
  RunResult result = run_process(argv, log);
  if (!result.exited_normally()) result = run_process(argv, log);
  if (result.exit_status == 0) return;
  std::string diagnostics = read_text(log);
  if (diagnostics.size() > 4000) diagnostics.resize(4000);
  const std::string how = result.exited_normally() ? "exit status " + std::to_string(result.exit_status) : result.why;
  throw Error(ErrorKind::kRuntime, "[compiler] " + tool + " failed (" + how + "):\n" + diagnostics);
}

}  // namespace vtpu::compiler::detail
