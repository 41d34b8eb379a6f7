// Running an external compiler (the host's C++ compiler, nvcc): a private
// scratch directory and a child process whose output goes to a log file.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

namespace vtpu::compiler::detail {

// A private scratch directory, removed with everything in it on scope exit.
class ScratchDir {
 public:
  ScratchDir();  // throws Error(kRuntime) when it cannot be created
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// How a run ended: its exit status, or why there is none.
struct RunResult {
  int exit_status = -1;  // -1: no normal exit (see why)
  std::string why;       // spawn or wait errno, the signal that ended it, or the timeout
  bool timed_out = false;
  bool exited_normally() const { return exit_status >= 0; }
};

// VTPU_COMPILE_TIMEOUT (seconds), default 600; throws Error(kInvalidArgument)
// naming the variable for anything but a positive number.
std::chrono::milliseconds compile_timeout();

// Runs argv (argv[0] looked up on PATH, in a process group of its own) with
// stdout+stderr sent to `log`; after `timeout` the group is killed and the
// result says so.
RunResult run_process(const std::vector<std::string>& argv, const std::filesystem::path& log,
                      std::chrono::milliseconds timeout = std::chrono::hours(24));

// A file's whole text ("" when it cannot be read).
std::string read_text(const std::filesystem::path& path);

// Writes `text` to `path`; throws Error(kRuntime) when it cannot.
void write_text(const std::filesystem::path& path, const std::string& text);

// Runs argv, bounded by compile_timeout(), once more when the first run did
// not exit (killed, or not started: a busy or short-of-memory machine; a
// compile error or a timeout is not retried); throws Error(kRuntime) with the tool's diagnostics from `log`
// unless it exited with status 0. `tool` names it in the message.
void run_compiler(const std::vector<std::string>& argv, const std::filesystem::path& log, const std::string& tool);

}  // namespace vtpu::compiler::detail
