// CompileCache over memory + disk: read-through with promotion, write-back,
// per-tier hit counts, a warm directory serving a new instance (no builds),
// corrupt entries rebuilt, cache-only mode, build failures, clear().
#include "vtpu/cache/compile_cache.h"

#include <gtest/gtest.h>

#include "scoped_env.h"
#include "temp_dir.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>

#include "vtpu/cache/disk_tier.h"
#include "vtpu/cache/memory_tier.h"
#include "vtpu/runtime/error.h"

namespace vtpu::cache {
namespace {

namespace fs = std::filesystem;

using vtpu::testing::TempDir;

using vtpu::testing::ScopedEnv;

// A fresh process's view of a cache directory: new memory tier, same disk.
std::unique_ptr<CompileCache> open_cache(const std::string& dir, bool cache_only = false) {
  std::vector<std::shared_ptr<CacheTier>> tiers = {
      std::make_shared<MemoryTier>(),
      std::make_shared<DiskTier>(DiskTier::Options{dir, DiskTier::kDefaultMaxBytes})};
  return std::make_unique<CompileCache>(std::move(tiers), cache_only);
}

const TierStats& tier_stats(const CacheStats& s, const std::string& name) {
  for (const auto& [n, t] : s.tiers)
    if (n == name) return t;
  throw std::logic_error("no tier " + name);
}

TEST(CompileCacheTest, BuildsOnceThenHitsMemory) {
  TempDir tmp;
  auto cache = open_cache(tmp.path());
  const Key key = make_key({"add f32", "x86_64", "g++"});
  int builds = 0;
  auto build = [&] { ++builds; return Entry::from_string("so", {{"symbol", "add"}}); };
  auto first = cache->get_or_create(key, build);
  auto second = cache->get_or_create(key, build);
  EXPECT_EQ(builds, 1);
  EXPECT_EQ(first.get(), second.get());  // served from the memory tier
  const CacheStats s = cache->stats();
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.builds, 1u);
  EXPECT_EQ(s.hits_in("memory"), 1u);
  EXPECT_EQ(s.hits_in("disk"), 0u);
  EXPECT_EQ(tier_stats(s, "disk").entries, 1u);  // written back to disk too
}

TEST(CompileCacheTest, WarmDirectoryServesANewInstanceWithoutBuilding) {
  TempDir tmp;
  const Key key = make_key({"warm"});
  open_cache(tmp.path())->put(key, Entry::from_string("kernel"));

  auto cache = open_cache(tmp.path());
  auto entry = cache->get_or_create(key, []() -> Entry { throw std::logic_error("must not build"); });
  EXPECT_EQ(*entry, Entry::from_string("kernel"));
  ASSERT_NE(cache->get(key), nullptr);  // promoted: now a memory hit
  const CacheStats s = cache->stats();
  EXPECT_EQ(s.builds, 0u);
  EXPECT_EQ(s.misses, 0u);
  EXPECT_EQ(s.hits_in("disk"), 1u);
  EXPECT_EQ(s.hits_in("memory"), 1u);
}

TEST(CompileCacheTest, CorruptDiskEntryIsRebuiltNotLoaded) {
  TempDir tmp;
  const Key key = make_key({"corrupt"});
  auto disk = std::make_shared<DiskTier>(DiskTier::Options{tmp.path(), DiskTier::kDefaultMaxBytes});
  disk->put(key, std::make_shared<const Entry>(Entry::from_string(std::string(512, 'k'))));
  {
    std::fstream f(disk->entry_path(key), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(300);
    f.put('!');
  }
  auto cache = open_cache(tmp.path());
  auto entry = cache->get_or_create(key, [] { return Entry::from_string("fresh"); });
  EXPECT_EQ(*entry, Entry::from_string("fresh"));
  const CacheStats s = cache->stats();
  EXPECT_EQ(s.builds, 1u);
  EXPECT_EQ(tier_stats(s, "disk").corrupt_discarded, 1u);
  EXPECT_EQ(*open_cache(tmp.path())->get(key), Entry::from_string("fresh"));
}

TEST(CompileCacheTest, CacheOnlyMissThrowsNamingTheKeyAndHitsStillServe) {
  TempDir tmp;
  const Key present = make_key({"present"}), absent = make_key({"absent"});
  open_cache(tmp.path())->put(present, Entry::from_string("ok"));
  auto cache = open_cache(tmp.path(), /*cache_only=*/true);
  EXPECT_EQ(*cache->get_or_create(present, [] { return Entry::from_string("no"); }),
            Entry::from_string("ok"));
  bool built = false;
  try {
    cache->get_or_create(absent, [&] { built = true; return Entry{}; });
    ADD_FAILURE() << "cache-only miss did not throw";
  } catch (const runtime::Error& e) {
    EXPECT_EQ(e.kind(), runtime::ErrorKind::kRuntime);
    EXPECT_NE(std::string(e.what()).find(absent.hex()), std::string::npos) << e.what();
  }
  EXPECT_FALSE(built);
  EXPECT_EQ(cache->get(absent), nullptr);  // get() is a probe, it does not throw
  EXPECT_EQ(cache->stats().builds, 0u);
}

TEST(CompileCacheTest, BuildFailurePropagatesIsCountedAndStoresNothing) {
  TempDir tmp;
  auto cache = open_cache(tmp.path());
  const Key key = make_key({"bad kernel"});
  EXPECT_THROW(cache->get_or_create(key, []() -> Entry { throw std::runtime_error("cc1plus died"); }),
               std::runtime_error);
  const CacheStats s = cache->stats();
  EXPECT_EQ(s.builds, 1u);
  EXPECT_EQ(s.build_failures, 1u);
  EXPECT_EQ(cache->get(key), nullptr);
}

TEST(CompileCacheTest, ClearEmptiesEveryTier) {
  TempDir tmp;
  auto cache = open_cache(tmp.path());
  const Key key = make_key({"k"});
  cache->get_or_create(key, [] { return Entry::from_string("x"); });
  cache->clear();
  EXPECT_EQ(cache->get(key), nullptr);
  for (const auto& [name, t] : cache->stats().tiers) {
    EXPECT_EQ(t.entries, 0u) << name;
    EXPECT_EQ(t.bytes, 0u) << name;
  }
  EXPECT_EQ(open_cache(tmp.path())->get(key), nullptr);
}

TEST(CompileCacheTest, FromEnvironment) {
  TempDir tmp;
  ScopedEnv dir("VTPU_CACHE_DIR", tmp.path());
  {
    ScopedEnv only("VTPU_CACHE_ONLY", std::nullopt);
    auto cache = CompileCache::from_env();
    EXPECT_FALSE(cache->cache_only());
    ASSERT_EQ(cache->tiers().size(), 2u);
    EXPECT_EQ(cache->tiers()[0]->name(), "memory");
    EXPECT_EQ(cache->tiers()[1]->name(), "disk");
  }
  {
    ScopedEnv only("VTPU_CACHE_ONLY", "1");
    auto cache = CompileCache::from_env();
    EXPECT_TRUE(cache->cache_only());
    EXPECT_THROW(cache->get_or_create(make_key({"x"}), [] { return Entry{}; }), runtime::Error);
  }
  {
    ScopedEnv only("VTPU_CACHE_ONLY", "maybe");
    try {
      CompileCache::from_env();
      ADD_FAILURE() << "bad VTPU_CACHE_ONLY accepted";
    } catch (const runtime::Error& e) {
      EXPECT_EQ(e.kind(), runtime::ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("maybe"), std::string::npos);
    }
  }
}

TEST(CompileCacheTest, RejectsBadTierLists) {
  EXPECT_THROW(CompileCache({}), runtime::Error);
  EXPECT_THROW(CompileCache({std::make_shared<MemoryTier>(), std::make_shared<MemoryTier>()}),
               runtime::Error);
  EXPECT_THROW(CompileCache({nullptr}), runtime::Error);
}

}  // namespace
}  // namespace vtpu::cache
