// The shared tier's directory store: one file per entry on a filesystem other
// servers mount too (NFS, a cluster filesystem).
//
// Why not the disk tier's machinery: its build-once file locks and LRU
// trimming rely on flock and on one machine's view of mtimes, neither of which
// network filesystems promise. Here a writer only writes a temp file and
// renames it into place (atomic on POSIX filesystems, NFS included), and a
// reader reads whatever complete file the name refers to; the tier verifies
// the signature and checksum of what it reads. Whoever else can write the
// directory is not trusted: reads take only regular files of a bounded size
// (no links, no FIFOs), writes go to randomly named files created
// exclusively, never through a link. Two servers building the same
// kernel at once both write it, and the later rename wins: both are valid.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <cctype>
#include <cerrno>
#include <filesystem>

#include "posix_file.h"
#include "vtpu/cache/byte_store.h"
#include "vtpu/cache/key.h"
#include "vtpu/runtime/error.h"

namespace vtpu::cache {
namespace {

using runtime::Error;
using runtime::ErrorKind;

constexpr std::string_view kSuffix = ".vtpu";
constexpr std::string_view kTempPrefix = ".tmp.";

bool is_entry_name(std::string_view file) {
  return file.ends_with(kSuffix) && Key::is_valid_hex(file.substr(0, file.size() - kSuffix.size()));
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "host";
  std::string out;
  for (char c : std::string_view(name))  // a temp file name: keep it to safe characters
    out.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_');
  return out.empty() ? "host" : out;
}

std::string errno_text(int err) { return std::strerror(err); }

class DirectoryStore final : public ByteStore {
 public:
  explicit DirectoryStore(std::string dir) : dir_(std::move(dir)), host_(host_name()) {}

  std::string describe() const override { return "directory " + dir_; }

  std::optional<std::vector<std::uint8_t>> fetch(const std::string& name) override {
    const std::string path = path_of(name);
    // The store is not trusted: never follow a link, never block on a FIFO,
    // and read only a regular file of a plausible size.
    detail::Fd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!fd.valid()) {
      const int err = errno;
      if (err == ENOENT) {
        require_directory();
        return std::nullopt;
      }
      require_directory();
      throw runtime::Error(ErrorKind::kRuntime, "cannot open '" + path + "': " +
                                                    (err == ELOOP ? "a symbolic link" : errno_text(err)));
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) detail::throw_errno(errno, "cannot stat", path);
    if (!S_ISREG(st.st_mode)) throw runtime::Error(ErrorKind::kRuntime, "'" + path + "' is not a regular file");
    if (static_cast<std::uint64_t>(st.st_size) > kMaxStoredEntryBytes)
      throw runtime::Error(ErrorKind::kRuntime, "'" + path + "' is larger than any kernel entry (" +
                                                    std::to_string(st.st_size) + " bytes)");
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(st.st_size) + 1);
    std::size_t got = 0;
    while (got < bytes.size()) {  // one byte more than stat said: a file still growing is refused
      const ssize_t n = ::read(fd.get(), bytes.data() + got, bytes.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) detail::throw_errno(errno, "cannot read", path);
      if (n == 0) break;
      got += static_cast<std::size_t>(n);
    }
    if (got > static_cast<std::size_t>(st.st_size))
      throw runtime::Error(ErrorKind::kRuntime, "'" + path + "' changed while it was read");
    bytes.resize(got);
    return bytes;
  }

  void store(const std::string& name, std::span<const std::uint8_t> bytes) override {
    require_directory();
    // A random name, created exclusively and never through a link: whoever
    // else writes this directory cannot make us write anywhere else.
    detail::Fd fd;
    std::string temp;
    for (int attempt = 0; attempt < 8 && !fd.valid(); ++attempt) {
      temp = dir_ + "/" + std::string(kTempPrefix) + name + "." + host_ + "." + std::to_string(::getpid()) + "." +
             random_suffix();
      // 0644: entries are signed, not secret, and servers may run as other users.
      fd = detail::Fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
      if (!fd.valid() && errno != EEXIST) detail::throw_errno(errno, "cannot create", temp);
    }
    if (!fd.valid()) throw runtime::Error(ErrorKind::kRuntime, "cannot create a temporary file in " + dir_);
    try {
      detail::write_all(fd.get(), bytes.data(), bytes.size(), temp);
      if (::fsync(fd.get()) != 0) detail::throw_errno(errno, "cannot sync", temp);
      fd.reset();
      // rename replaces a link planted under the final name; it never follows it.
      if (::rename(temp.c_str(), path_of(name).c_str()) != 0)
        detail::throw_errno(errno, "cannot rename into place", path_of(name));
    } catch (...) {
      ::unlink(temp.c_str());
      throw;
    }
  }

  bool remove(const std::string& name) override {
    require_directory();
    const std::string path = path_of(name);
    if (::unlink(path.c_str()) == 0) return true;
    if (errno == ENOENT) return false;
    detail::throw_errno(errno, "cannot remove", path);
  }

  void clear() override {
    // Temp files too: a writer killed mid-write leaves one behind, and with no
    // reliable lock across servers only an explicit clear removes them.
    for (const auto& file : list()) {
      const std::string name = file.filename().string();
      if ((is_entry_name(name) || name.starts_with(kTempPrefix)) && ::unlink(file.c_str()) != 0 &&
          errno != ENOENT)
        detail::throw_errno(errno, "cannot remove", file.string());
    }
  }

  StoreUsage usage() override {
    StoreUsage u;
    u.counted = true;
    for (const auto& file : list()) {
      struct stat st {};
      if (!is_entry_name(file.filename().string()) || ::lstat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
        continue;
      ++u.entries;
      u.bytes += static_cast<std::uint64_t>(st.st_size);
    }
    return u;
  }

 private:
  std::string path_of(const std::string& name) const { return dir_ + "/" + name + std::string(kSuffix); }

  // The directory itself missing (not mounted yet, removed) is the store
  // being unavailable, not a problem of one entry.
  void require_directory() const {
    struct stat st {};
    if (::stat(dir_.c_str(), &st) != 0)
      throw StoreUnavailable("shared cache directory '" + dir_ + "': " + errno_text(errno));
    if (!S_ISDIR(st.st_mode)) throw StoreUnavailable("shared cache path '" + dir_ + "' is not a directory");
  }

  static std::string random_suffix() {
    std::random_device device;
    const std::uint64_t value = (std::uint64_t{device()} << 32) ^ device();
    char text[17];
    std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
    return text;
  }

  std::vector<std::filesystem::path> list() const {
    require_directory();
    std::vector<std::filesystem::path> out;
    std::error_code ec;
    std::filesystem::directory_iterator it(dir_, ec), end;
    if (ec) throw StoreUnavailable("cannot list shared cache directory '" + dir_ + "': " + ec.message());
    for (; it != end; it.increment(ec)) out.push_back(it->path());
    if (ec) throw StoreUnavailable("cannot list shared cache directory '" + dir_ + "': " + ec.message());
    return out;
  }

  const std::string dir_;
  const std::string host_;
};

}  // namespace

std::unique_ptr<ByteStore> open_directory_store(const std::string& dir) {
  if (dir.empty()) throw Error(ErrorKind::kInvalidArgument, "VTPU_SHARED_CACHE: empty directory path");
  return std::make_unique<DirectoryStore>(dir);
}

}  // namespace vtpu::cache
