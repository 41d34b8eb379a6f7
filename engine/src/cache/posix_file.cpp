#include "posix_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "vtpu/runtime/error.h"

namespace vtpu::cache::detail {

void throw_errno(int err, const std::string& what, const std::string& path) {
  throw runtime::Error(runtime::ErrorKind::kRuntime,
                       "[compile cache] " + what + " '" + path + "': " + std::strerror(err));
}

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

void Fd::reset() noexcept {
  if (fd_ >= 0) ::close(fd_);  // closing also drops any flock held through it
  fd_ = -1;
}

bool same_file(int fd, const std::string& path) {
  struct stat by_fd {}, by_name {};
  if (::fstat(fd, &by_fd) != 0 || ::stat(path.c_str(), &by_name) != 0) return false;
  return by_fd.st_dev == by_name.st_dev && by_fd.st_ino == by_name.st_ino;
}

std::optional<FileLock> FileLock::lock_fd(Fd fd, std::string path, bool wait) {
  const int op = LOCK_EX | (wait ? 0 : LOCK_NB);
  while (::flock(fd.get(), op) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) return std::nullopt;
    throw_errno(errno, "cannot lock", path);
  }
  if (!same_file(fd.get(), path)) return std::nullopt;  // deleted or replaced while we waited
  return FileLock(std::move(fd), std::move(path));
}

FileLock FileLock::acquire(const std::string& path) {
  for (;;) {
    Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (!fd.valid()) throw_errno(errno, "cannot open lock file", path);
    if (auto lock = lock_fd(std::move(fd), path, /*wait=*/true)) return std::move(*lock);
  }
}

std::optional<FileLock> FileLock::try_acquire(const std::string& path) {
  Fd fd = open_if_exists(path);
  if (!fd.valid()) return std::nullopt;
  return lock_fd(std::move(fd), path, /*wait=*/false);
}

void FileLock::unlink_file() {
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT) throw_errno(errno, "cannot remove", path_);
}

Fd open_if_exists(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid() && errno != ENOENT) throw_errno(errno, "cannot open", path);
  return fd;
}

std::vector<std::uint8_t> read_all(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_errno(errno, "cannot stat", path);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  // Read to EOF rather than trusting st_size alone; grow if the file is longer.
  for (;;) {
    if (done == out.size()) out.resize(out.size() + 4096);
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno(errno, "cannot read", path);
    }
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  out.resize(done);
  return out;
}

void write_all(int fd, const void* data, std::size_t size, const std::string& path) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno(errno, "cannot write", path);
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

std::int64_t unique_now_ns() {
  static std::atomic<std::int64_t> last{0};
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  const std::int64_t now = std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
  std::int64_t prev = last.load(std::memory_order_relaxed);
  std::int64_t next;
  do {
    next = now > prev ? now : prev + 1;
  } while (!last.compare_exchange_weak(prev, next, std::memory_order_relaxed));
  return next;
}

void set_file_time(int fd, std::int64_t ns) noexcept {
  const timespec t{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  const timespec times[2] = {t, t};
  // Best effort: failing to stamp only makes LRU order less precise.
  (void)::futimens(fd, times);
}

void fsync_dir(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) throw_errno(errno, "cannot open directory", dir);
  // EINVAL: the filesystem does not support syncing directories; nothing to do.
  if (::fsync(fd.get()) != 0 && errno != EINVAL) throw_errno(errno, "cannot sync directory", dir);
}

void make_dirs(const std::string& dir) {
  std::filesystem::path partial;
  for (const auto& part : std::filesystem::path(dir)) {
    partial /= part;
    if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST)
      throw_errno(errno, "cannot create cache directory", partial.string());
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) throw_errno(errno, "cannot stat cache directory", dir);
  if (!S_ISDIR(st.st_mode))
    throw runtime::Error(runtime::ErrorKind::kRuntime,
                         "[compile cache] cache path '" + dir + "' exists and is not a directory");
}

}  // namespace vtpu::cache::detail
