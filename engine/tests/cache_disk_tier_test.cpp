// The local-directory tier: persistence, verification of every read (flipped
// bytes, a writer killed mid-write), build-once across processes and threads,
// LRU eviction under the byte bound, clear(), and configuration from the env.
#include "vtpu/cache/disk_tier.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "scoped_env.h"
#include "temp_dir.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <thread>
#include <vector>

#include "vtpu/cache/entry_codec.h"
#include "vtpu/runtime/error.h"

namespace vtpu::cache {
namespace {

namespace fs = std::filesystem;

using vtpu::testing::TempDir;

using vtpu::testing::ScopedEnv;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::string> temp_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& f : fs::directory_iterator(dir))
    if (f.path().filename().string().starts_with(".tmp.")) out.push_back(f.path().string());
  return out;
}

DiskTier make_tier(const std::string& dir, std::uint64_t max_bytes = DiskTier::kDefaultMaxBytes) {
  return DiskTier(DiskTier::Options{dir, max_bytes});
}

Entry kernel(const std::string& body) { return Entry::from_string(body, {{"symbol", "vtpu_kernel"}}); }

TEST(CacheDiskTierTest, PutGetRoundTripAndSurvivesANewInstance) {
  TempDir tmp;
  const Key key = make_key({"roundtrip"});
  {
    DiskTier tier = make_tier(tmp.sub("cache"));  // created on demand
    EXPECT_EQ(tier.get(key), nullptr);
    tier.put(key, std::make_shared<const Entry>(kernel("shared object bytes")));
  }
  DiskTier again = make_tier(tmp.sub("cache"));
  auto hit = again.get(key);
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(*hit, kernel("shared object bytes"));
  const TierStats s = again.stats();
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(s.bytes, fs::file_size(again.entry_path(key)));
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 0u);
  EXPECT_TRUE(temp_files(again.dir()).empty());
  // Entries are code: the directory is private to the user.
  EXPECT_EQ(fs::status(again.dir()).permissions() & fs::perms::all, fs::perms::owner_all);
}

TEST(CacheDiskTierTest, FlippedByteIsDiscardedCountedAndRebuilt) {
  TempDir tmp;
  DiskTier tier = make_tier(tmp.path());
  const Key key = make_key({"flip"});
  int builds = 0;
  auto build = [&] { ++builds; return kernel(std::string(4096, 'x')); };
  tier.get_or_create(key, build);
  ASSERT_EQ(builds, 1);

  std::string bytes = read_file(tier.entry_path(key));
  bytes[bytes.size() / 2] ^= 0x01;
  write_file(tier.entry_path(key), bytes);

  EXPECT_EQ(tier.get(key), nullptr);  // never handed out
  EXPECT_FALSE(fs::exists(tier.entry_path(key)));
  EXPECT_EQ(tier.stats().corrupt_discarded, 1u);

  write_file(tier.entry_path(key), bytes);  // corrupt again, then get_or_create
  auto rebuilt = tier.get_or_create(key, build);
  EXPECT_EQ(builds, 2);
  EXPECT_EQ(*rebuilt, kernel(std::string(4096, 'x')));
  EXPECT_EQ(tier.stats().corrupt_discarded, 2u);
  ASSERT_NE(tier.get(key), nullptr);
}

TEST(CacheDiskTierTest, WriterKilledMidWriteIsAMissAndTempFilesAreIgnoredThenCleaned) {
  TempDir tmp;
  DiskTier tier = make_tier(tmp.path());
  const Key key = make_key({"torn"});
  const std::string full = [&] {
    const auto v = encode_entry(key, kernel("complete kernel"));
    return std::string(v.begin(), v.end());
  }();
  // A killed writer leaves its temp file (here even complete: not yet renamed
  // means not published) and, on filesystems without atomic rename, a
  // truncated final file.
  const std::string temp = tmp.sub(".tmp." + key.hex() + ".99999.0");
  write_file(temp, full);
  write_file(tier.entry_path(key), full.substr(0, full.size() / 2));

  EXPECT_EQ(tier.get(key), nullptr);
  EXPECT_EQ(tier.stats().corrupt_discarded, 1u);
  EXPECT_EQ(tier.stats().entries, 0u);  // the temp file is not an entry

  int builds = 0;
  auto entry = tier.get_or_create(key, [&] { ++builds; return kernel("rebuilt"); });
  EXPECT_EQ(builds, 1);
  EXPECT_EQ(*entry, kernel("rebuilt"));
  EXPECT_TRUE(temp_files(tmp.path()).empty());  // the dead writer's leftovers are gone
  EXPECT_EQ(*tier.get(key), kernel("rebuilt"));
}

TEST(CacheDiskTierTest, TempFileOfALiveWriterIsNotCleaned) {
  TempDir tmp;
  DiskTier tier = make_tier(tmp.path());
  const std::string temp = tmp.sub(".tmp.live");
  write_file(temp, "in progress");
  const int fd = ::open(temp.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);  // what a live writer holds
  tier.trim();
  EXPECT_TRUE(fs::exists(temp));
  ::close(fd);
  tier.trim();
  EXPECT_FALSE(fs::exists(temp));
}

TEST(CacheDiskTierTest, ConcurrentProcessesBuildOnce) {
  TempDir tmp;
  const std::string cache_dir = tmp.sub("cache");
  const std::string counter = tmp.sub("builds.log");
  const Key key = make_key({"shared kernel"});
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  std::vector<pid_t> children;
  for (int i = 0; i < 4; ++i) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Child: wait for the start signal so all four race, then _exit (never
      // return into the test runner).
      ::close(go[1]);
      char c;
      while (::read(go[0], &c, 1) < 0 && errno == EINTR) {}
      int code = 0;
      try {
        DiskTier tier = make_tier(cache_dir);
        auto entry = tier.get_or_create(key, [&] {
          const int fd = ::open(counter.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
          if (fd < 0 || ::write(fd, "build\n", 6) != 6) ::_exit(4);
          ::close(fd);
          std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a slow compile
          return kernel("compiled once");
        });
        code = *entry == kernel("compiled once") ? 0 : 2;
      } catch (...) {
        code = 3;
      }
      ::_exit(code);
    }
    children.push_back(pid);
  }
  ::close(go[0]);
  ::close(go[1]);  // EOF on the pipe releases every child at once
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
  EXPECT_EQ(read_file(counter), "build\n");
}

TEST(CacheDiskTierTest, ConcurrentThreadsBuildOnce) {
  TempDir tmp;
  DiskTier tier = make_tier(tmp.path());
  const Key key = make_key({"threads"});
  std::atomic<int> builds{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&] {
      auto entry = tier.get_or_create(key, [&] {
        ++builds;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return kernel("one");
      });
      EXPECT_EQ(*entry, kernel("one"));
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(builds.load(), 1);
  EXPECT_EQ(tier.stats().misses, 1u);
  EXPECT_EQ(tier.stats().hits, 3u);
}

TEST(CacheDiskTierTest, BuildFailureStoresNothingAndReleasesTheLock) {
  TempDir tmp;
  DiskTier tier = make_tier(tmp.path());
  const Key key = make_key({"fails"});
  EXPECT_THROW(tier.get_or_create(key, []() -> Entry { throw std::logic_error("compiler crashed"); }),
               std::logic_error);
  EXPECT_FALSE(fs::exists(tier.entry_path(key)));
  auto entry = tier.get_or_create(key, [] { return kernel("second try"); });  // would hang if locked
  EXPECT_EQ(*entry, kernel("second try"));
}

TEST(CacheDiskTierTest, EvictionKeepsTheBoundAndDropsTheLeastRecentlyUsed) {
  TempDir tmp;
  const Key a = make_key({"a"}), b = make_key({"b"}), c = make_key({"c"}), d = make_key({"d"});
  const Entry body = kernel(std::string(1000, 'z'));
  const std::uint64_t file_size = encode_entry(a, body).size();
  const std::uint64_t bound = 3 * file_size + file_size / 2;  // room for three
  DiskTier tier = make_tier(tmp.path(), bound);
  auto put = [&](const Key& k) { tier.put(k, std::make_shared<const Entry>(body)); };
  put(a);
  put(b);
  put(c);
  EXPECT_EQ(tier.stats().evictions, 0u);
  ASSERT_NE(tier.get(a), nullptr);  // a becomes the most recently used; b the least
  put(d);
  EXPECT_FALSE(fs::exists(tier.entry_path(b)));
  EXPECT_TRUE(fs::exists(tier.entry_path(a)));
  EXPECT_TRUE(fs::exists(tier.entry_path(c)));
  EXPECT_TRUE(fs::exists(tier.entry_path(d)));
  const TierStats s = tier.stats();
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_EQ(s.entries, 3u);
  EXPECT_LE(s.bytes, bound);
}

TEST(CacheDiskTierTest, RemoveAndClear) {
  TempDir tmp;
  DiskTier tier = make_tier(tmp.path());
  const Key a = make_key({"a"}), b = make_key({"b"});
  tier.get_or_create(a, [] { return kernel("a"); });  // also leaves a.lock behind
  tier.put(b, std::make_shared<const Entry>(kernel("b")));
  write_file(tmp.sub("unrelated.txt"), "not ours");
  EXPECT_TRUE(tier.remove(b));
  EXPECT_FALSE(tier.remove(b));
  tier.clear();
  EXPECT_EQ(tier.get(a), nullptr);
  EXPECT_EQ(tier.stats().entries, 0u);
  EXPECT_EQ(tier.stats().bytes, 0u);
  EXPECT_FALSE(fs::exists(tier.lock_path(a)));
  EXPECT_TRUE(fs::exists(tmp.sub("unrelated.txt")));  // only cache files are touched
}

TEST(CacheDiskTierTest, OptionsFromEnvironment) {
  TempDir tmp;
  {
    ScopedEnv dir("VTPU_CACHE_DIR", tmp.sub("env"));
    ScopedEnv max("VTPU_CACHE_MAX_BYTES", "16MiB");
    const auto options = DiskTier::Options::from_env();
    EXPECT_EQ(options.dir, tmp.sub("env"));
    EXPECT_EQ(options.max_bytes, 16u << 20);
  }
  {
    ScopedEnv dir("VTPU_CACHE_DIR", std::nullopt);
    ScopedEnv home("HOME", tmp.path());
    ScopedEnv max("VTPU_CACHE_MAX_BYTES", std::nullopt);
    const auto options = DiskTier::Options::from_env();
    EXPECT_EQ(options.dir, tmp.path() + "/.cache/vtpu");
    EXPECT_EQ(options.max_bytes, DiskTier::kDefaultMaxBytes);
  }
  {
    ScopedEnv max("VTPU_CACHE_MAX_BYTES", "lots");
    try {
      DiskTier::Options::from_env();
      ADD_FAILURE() << "malformed size accepted";
    } catch (const runtime::Error& e) {
      EXPECT_EQ(e.kind(), runtime::ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("VTPU_CACHE_MAX_BYTES"), std::string::npos);
    }
  }
}

TEST(CacheDiskTierTest, UnusableDirectoryThrowsRuntimeError) {
  TempDir tmp;
  write_file(tmp.sub("file"), "x");
  for (const std::string dir : {tmp.sub("file"), tmp.sub("file/below")}) {
    try {
      make_tier(dir);
      ADD_FAILURE() << "accepted " << dir;
    } catch (const runtime::Error& e) {
      EXPECT_EQ(e.kind(), runtime::ErrorKind::kRuntime);
      EXPECT_NE(std::string(e.what()).find(tmp.sub("file")), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace vtpu::cache
