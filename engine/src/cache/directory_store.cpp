// The shared tier's directory store: one file per entry on a filesystem other
// servers mount too (NFS, a cluster filesystem).
//
// Why not the disk tier's machinery: its build-once file locks and LRU
// trimming rely on flock and on one machine's view of mtimes, neither of which
// network filesystems promise. Here a writer only writes a temp file and
// renames it into place (atomic on POSIX filesystems, NFS included), and a
// reader reads whatever complete file the name refers to; the tier verifies
// the signature and checksum of what it reads. Two servers building the same
// kernel at once both write it, and the later rename wins: both are valid.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
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

class DirectoryStore final : public ByteStore {
 public:
  explicit DirectoryStore(std::string dir) : dir_(std::move(dir)), host_(host_name()) {}

  std::string describe() const override { return "directory " + dir_; }

  std::optional<std::vector<std::uint8_t>> fetch(const std::string& name) override {
    const std::string path = path_of(name);
    detail::Fd fd = detail::open_if_exists(path);
    if (!fd.valid()) return std::nullopt;
    return detail::read_all(fd.get(), path);
  }

  void store(const std::string& name, std::span<const std::uint8_t> bytes) override {
    // host and pid keep writers on different servers from colliding.
    const std::string temp = dir_ + "/" + std::string(kTempPrefix) + name + "." + host_ + "." +
                             std::to_string(::getpid()) + "." + std::to_string(counter_.fetch_add(1));
    // 0644: entries are signed, not secret, and servers may run as other users.
    detail::Fd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.valid()) detail::throw_errno(errno, "cannot create", temp);
    try {
      detail::write_all(fd.get(), bytes.data(), bytes.size(), temp);
      if (::fsync(fd.get()) != 0) detail::throw_errno(errno, "cannot sync", temp);
      fd.reset();
      if (::rename(temp.c_str(), path_of(name).c_str()) != 0)
        detail::throw_errno(errno, "cannot rename into place", path_of(name));
    } catch (...) {
      ::unlink(temp.c_str());
      throw;
    }
  }

  bool remove(const std::string& name) override {
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
      if (!is_entry_name(file.filename().string()) || ::stat(file.c_str(), &st) != 0) continue;
      ++u.entries;
      u.bytes += static_cast<std::uint64_t>(st.st_size);
    }
    return u;
  }

 private:
  std::string path_of(const std::string& name) const { return dir_ + "/" + name + std::string(kSuffix); }

  std::vector<std::filesystem::path> list() const {
    std::vector<std::filesystem::path> out;
    std::error_code ec;
    std::filesystem::directory_iterator it(dir_, ec), end;
    if (ec) detail::throw_errno(ec.value(), "cannot list shared cache directory", dir_);
    for (; it != end; it.increment(ec)) out.push_back(it->path());
    if (ec) detail::throw_errno(ec.value(), "cannot list shared cache directory", dir_);
    return out;
  }

  const std::string dir_;
  const std::string host_;
  std::atomic<std::uint64_t> counter_{0};
};

}  // namespace

std::unique_ptr<ByteStore> open_directory_store(const std::string& dir) {
  struct stat st {};
  if (dir.empty() || ::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw Error(ErrorKind::kInvalidArgument,
                "VTPU_SHARED_CACHE: '" + dir + "' is not an existing directory (create or mount it first)");
  return std::make_unique<DirectoryStore>(dir);
}

}  // namespace vtpu::cache
