// Private POSIX helpers for the disk tier: an owning file descriptor, whole-
// file reads and writes, and flock-based locks on files that may be deleted.
//
// Lock-file protocol (why deleting lock files is safe): flock locks an inode,
// not a name. If one process deleted a lock file while another waited on it, a
// third could create a fresh file under the same name and lock that, and two
// processes would both "hold the lock". So:
//   * a locker, once it holds the flock, checks that the name still refers to
//     the inode it locked, and retries from open() if not;
//   * a deleter unlinks a lock file only while holding its flock (and after
//     the same check).
// Then a name can only change while nobody holds the lock on the old inode,
// and whoever holds a lock holds the one that every later locker will find.
// In-flight temp files use the same protocol, so a cleaner can tell a temp file
// of a live writer (locked) from one left by a killed writer (unlocked).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace vtpu::cache::detail {

// Throws runtime::Error(kRuntime): "[compile cache] <what> '<path>': <strerror>".
[[noreturn]] void throw_errno(int err, const std::string& what, const std::string& path);

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  int release() noexcept {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset() noexcept;

 private:
  int fd_ = -1;
};

// An exclusive flock held on a file, released when this object dies.
class FileLock {
 public:
  // Blocks until the lock on `path` (created 0600 if absent) is held.
  static FileLock acquire(const std::string& path);

  // Locks an existing file without waiting. nullopt when the file is absent,
  // held by someone else, or was replaced meanwhile.
  static std::optional<FileLock> try_acquire(const std::string& path);

  // Takes an already-open descriptor of `path` and locks it (waiting or not).
  // nullopt when not obtained or when `path` no longer names that file.
  static std::optional<FileLock> lock_fd(Fd fd, std::string path, bool wait);

  // Deletes the locked file by name; safe under the protocol above.
  void unlink_file();

  int fd() const noexcept { return fd_.get(); }
  const std::string& path() const noexcept { return path_; }

 private:
  FileLock(Fd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}
  Fd fd_;
  std::string path_;
};

// Opens `path` read-only; an invalid Fd when it does not exist.
Fd open_if_exists(const std::string& path);

std::vector<std::uint8_t> read_all(int fd, const std::string& path);
void write_all(int fd, const void* data, std::size_t size, const std::string& path);

// True when `fd` is the file that `path` names now.
bool same_file(int fd, const std::string& path);

// A strictly increasing wall-clock time (ns resolution) for LRU stamps.
// Why not let the kernel stamp: file times come from a coarse clock (ms
// granularity), which ties entries written or read in quick succession.
std::int64_t unique_now_ns();
void set_file_time(int fd, std::int64_t ns) noexcept;

void fsync_dir(const std::string& dir);

// mkdir -p with mode 0700 for the directories it creates (cache entries are
// code: other users must not be able to plant them).
void make_dirs(const std::string& dir);

}  // namespace vtpu::cache::detail
