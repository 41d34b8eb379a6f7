#include "vtpu/cache/disk_tier.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <tuple>
#include <vector>

#include "posix_file.h"
#include "vtpu/cache/entry_codec.h"
#include "vtpu/runtime/error.h"
#include "vtpu/runtime/memory_size.h"

namespace vtpu::cache {
namespace {

using detail::FileLock;
using detail::Fd;

constexpr std::string_view kEntrySuffix = ".entry";
constexpr std::string_view kLockSuffix = ".lock";
constexpr std::string_view kTempPrefix = ".tmp.";
constexpr std::string_view kTrimLockName = ".trim.lock";

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::string(value) : std::string();
}

std::string home_dir() {
  if (auto home = env_or_empty("HOME"); !home.empty()) return home;
  if (const passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_dir && *pw->pw_dir) return pw->pw_dir;
  throw runtime::Error(runtime::ErrorKind::kRuntime,
                       "[compile cache] no home directory (HOME unset); set VTPU_CACHE_DIR");
}

// The key of "<32 hex>.entry" / "<32 hex>.lock", or nullopt for other names.
std::optional<std::string> key_of(std::string_view name, std::string_view suffix) {
  if (!name.ends_with(suffix)) return std::nullopt;
  name.remove_suffix(suffix.size());
  if (!Key::is_valid_hex(name)) return std::nullopt;
  return std::string(name);
}

struct EntryFile {
  std::string path;
  std::string key_hex;
  std::uint64_t size;
  std::int64_t used_ns;  // mtime = last use
};

struct DirListing {
  std::vector<EntryFile> entries;
  std::vector<std::string> temps;
  std::vector<std::string> locks;
  std::uint64_t entry_bytes = 0;
};

// Files vanish concurrently (other processes evict); those are skipped.
DirListing list_dir(const std::string& dir) {
  DirListing out;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec), end;
  if (ec) detail::throw_errno(ec.value(), "cannot list cache directory", dir);
  for (; it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string path = it->path().string();
    if (name.starts_with(kTempPrefix)) {
      out.temps.push_back(path);
    } else if (key_of(name, kLockSuffix)) {
      out.locks.push_back(path);
    } else if (auto key = key_of(name, kEntrySuffix)) {
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0) continue;
      const std::int64_t used = std::int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
      out.entries.push_back({path, *key, static_cast<std::uint64_t>(st.st_size), used});
      out.entry_bytes += static_cast<std::uint64_t>(st.st_size);
    }
  }
  if (ec) detail::throw_errno(ec.value(), "cannot list cache directory", dir);
  return out;
}

// Deletes a lock or temp file unless someone holds it (a builder waiting on a
// lock, or a live writer's temp file). Safe under the lock-file protocol.
void remove_if_unlocked(const std::string& path) {
  if (auto lock = FileLock::try_acquire(path)) lock->unlink_file();
}

}  // namespace

DiskTier::Options DiskTier::Options::from_env() {
  Options options;
  options.dir = env_or_empty("VTPU_CACHE_DIR");
  if (options.dir.empty()) options.dir = home_dir() + "/.cache/vtpu";
  // "~/x" as a service file or .env passes it (no shell to expand it): the
  // user's home, as `python -m torch_vtpu cache` reads it too, not "./~/x".
  if (options.dir == "~" || options.dir.starts_with("~/")) options.dir = home_dir() + options.dir.substr(1);
  if (auto text = env_or_empty("VTPU_CACHE_MAX_BYTES"); !text.empty()) {
    try {
      options.max_bytes = runtime::parse_memory_size(text);
    } catch (const runtime::Error& e) {
      throw runtime::Error(runtime::ErrorKind::kInvalidArgument,
                           std::string("VTPU_CACHE_MAX_BYTES: ") + e.what());
    }
  }
  return options;
}

DiskTier::DiskTier(Options options) : dir_(std::move(options.dir)), max_bytes_(options.max_bytes) {
  if (dir_.empty())
    throw runtime::Error(runtime::ErrorKind::kInvalidArgument, "[compile cache] empty cache directory");
  detail::make_dirs(dir_);
}

std::string DiskTier::entry_path(const Key& key) const {
  return dir_ + "/" + key.hex() + std::string(kEntrySuffix);
}

std::string DiskTier::lock_path(const Key& key) const {
  return dir_ + "/" + key.hex() + std::string(kLockSuffix);
}

std::shared_ptr<const Entry> DiskTier::load(const Key& key) {
  const std::string path = entry_path(key);
  Fd fd = detail::open_if_exists(path);
  if (!fd.valid()) return nullptr;
  const auto bytes = detail::read_all(fd.get(), path);
  std::optional<Entry> entry = decode_entry(bytes, key);
  if (!entry) {
    // Delete only if the name still refers to the file we read: a writer may
    // have just renamed a good entry over it.
    if (detail::same_file(fd.get(), path)) ::unlink(path.c_str());
    corrupt_discarded_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  detail::set_file_time(fd.get(), detail::unique_now_ns());
  return std::make_shared<const Entry>(std::move(*entry));
}

std::shared_ptr<const Entry> DiskTier::get(const Key& key) {
  auto entry = load(key);
  (entry ? hits_ : misses_).fetch_add(1, std::memory_order_relaxed);
  return entry;
}

void DiskTier::write(const Key& key, const Entry& entry) {
  const std::vector<std::uint8_t> bytes = encode_entry(key, entry);
  const std::string final_path = entry_path(key);
  // A unique temp name that we hold locked while writing, so trim() in another
  // process can tell it from the leftovers of a killed writer.
  std::optional<FileLock> temp;
  while (!temp) {
    const std::string temp_path = dir_ + "/" + std::string(kTempPrefix) + key.hex() + "." +
                                  std::to_string(::getpid()) + "." +
                                  std::to_string(temp_counter_.fetch_add(1));
    Fd fd(::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd.valid()) {
      if (errno == EEXIST) continue;  // a leftover from an earlier process with our pid
      detail::throw_errno(errno, "cannot create", temp_path);
    }
    // nullopt only if a cleaner deleted the file between open and flock: retry.
    temp = FileLock::lock_fd(std::move(fd), temp_path, /*wait=*/true);
  }
  try {
    detail::write_all(temp->fd(), bytes.data(), bytes.size(), temp->path());
    detail::set_file_time(temp->fd(), detail::unique_now_ns());
    if (::fsync(temp->fd()) != 0) detail::throw_errno(errno, "cannot sync", temp->path());
    if (::rename(temp->path().c_str(), final_path.c_str()) != 0)
      detail::throw_errno(errno, "cannot rename into place", final_path);
  } catch (...) {
    ::unlink(temp->path().c_str());  // e.g. ENOSPC: leave nothing half-written behind
    throw;
  }
  detail::fsync_dir(dir_);  // make the rename itself durable
}

void DiskTier::put(const Key& key, std::shared_ptr<const Entry> entry) {
  if (!entry)
    throw runtime::Error(runtime::ErrorKind::kInvalidArgument,
                         "[compile cache] put of a null entry for key " + key.hex());
  write(key, *entry);
  trim();
}

std::shared_ptr<const Entry> DiskTier::get_or_create(const Key& key,
                                                     const std::function<Entry()>& build) {
  if (auto hit = load(key)) {
    hits_.fetch_add(1, std::memory_order_relaxed);
    return hit;
  }
  std::shared_ptr<const Entry> made;
  {
    const FileLock lock = FileLock::acquire(lock_path(key));
    if (auto hit = load(key)) {  // built by another process while we waited
      hits_.fetch_add(1, std::memory_order_relaxed);
      return hit;
    }
    misses_.fetch_add(1, std::memory_order_relaxed);
    made = std::make_shared<const Entry>(build());
    write(key, *made);
  }  // release before trimming: waiters can read the entry already
  trim();
  return made;
}

bool DiskTier::remove(const Key& key) {
  const std::string path = entry_path(key);
  if (::unlink(path.c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  detail::throw_errno(errno, "cannot remove", path);
}

void DiskTier::trim() {
  // One trimmer at a time across processes, so two do not both evict for the
  // same overshoot. Blocking is fine: a trim is a directory scan.
  const FileLock trim_lock = FileLock::acquire(dir_ + "/" + std::string(kTrimLockName));
  DirListing listing = list_dir(dir_);
  for (const auto& temp : listing.temps) remove_if_unlocked(temp);
  if (listing.entry_bytes <= max_bytes_) return;

  auto& entries = listing.entries;
  std::sort(entries.begin(), entries.end(), [](const EntryFile& a, const EntryFile& b) {
    return std::tie(a.used_ns, a.key_hex) < std::tie(b.used_ns, b.key_hex);
  });
  std::uint64_t total = listing.entry_bytes;
  for (const auto& victim : entries) {
    if (total <= max_bytes_) break;
    if (::unlink(victim.path.c_str()) == 0) {
      evictions_.fetch_add(1, std::memory_order_relaxed);
      remove_if_unlocked(dir_ + "/" + victim.key_hex + std::string(kLockSuffix));
    } else if (errno != ENOENT) {
      detail::throw_errno(errno, "cannot evict", victim.path);
    }
    total -= victim.size;  // ENOENT: someone else removed it; it is gone either way
  }
}

TierStats DiskTier::stats() const {
  const DirListing listing = list_dir(dir_);
  TierStats s;
  s.entries = listing.entries.size();
  s.bytes = listing.entry_bytes;
  s.hits = hits_.load(std::memory_order_relaxed);
  s.misses = misses_.load(std::memory_order_relaxed);
  s.corrupt_discarded = corrupt_discarded_.load(std::memory_order_relaxed);
  s.evictions = evictions_.load(std::memory_order_relaxed);
  return s;
}

void DiskTier::clear() {
  const FileLock trim_lock = FileLock::acquire(dir_ + "/" + std::string(kTrimLockName));
  const DirListing listing = list_dir(dir_);
  for (const auto& entry : listing.entries)
    if (::unlink(entry.path.c_str()) != 0 && errno != ENOENT)
      detail::throw_errno(errno, "cannot remove", entry.path);
  for (const auto& temp : listing.temps) remove_if_unlocked(temp);
  for (const auto& lock : listing.locks) remove_if_unlocked(lock);
}

}  // namespace vtpu::cache
