// The in-process tier: hits share the stored object, LRU eviction under the
// byte bound, remove/clear, and concurrent use from several threads.
#include "vtpu/cache/memory_tier.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "vtpu/runtime/error.h"

namespace vtpu::cache {
namespace {

std::shared_ptr<const Entry> blob(std::size_t n, char fill = 'k') {
  return std::make_shared<const Entry>(Entry::from_string(std::string(n, fill)));
}

TEST(CacheMemoryTierTest, PutGetRoundTripAndHitSharesTheObject) {
  MemoryTier tier;
  const Key key = make_key({"k"});
  EXPECT_EQ(tier.get(key), nullptr);
  auto entry = std::make_shared<const Entry>(Entry::from_string("so", {{"symbol", "f"}}));
  tier.put(key, entry);
  auto hit = tier.get(key);
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit.get(), entry.get());  // no copy on a hit
  EXPECT_EQ(hit->metadata.at("symbol"), "f");
  const TierStats s = tier.stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(s.bytes, entry->footprint());
}

TEST(CacheMemoryTierTest, ReplacingAKeyKeepsAccountingExact) {
  MemoryTier tier;
  const Key key = make_key({"k"});
  tier.put(key, blob(100));
  tier.put(key, blob(30));
  EXPECT_EQ(tier.stats().entries, 1u);
  EXPECT_EQ(tier.stats().bytes, 30u);
}

TEST(CacheMemoryTierTest, EvictsLeastRecentlyUsedUnderTheBound) {
  MemoryTier tier(/*max_bytes=*/300);
  const Key a = make_key({"a"}), b = make_key({"b"}), c = make_key({"c"}), d = make_key({"d"});
  tier.put(a, blob(100));
  tier.put(b, blob(100));
  tier.put(c, blob(100));
  ASSERT_NE(tier.get(a), nullptr);  // a is now the most recent; b the least
  tier.put(d, blob(100));
  EXPECT_EQ(tier.get(b), nullptr);
  EXPECT_NE(tier.get(a), nullptr);
  EXPECT_NE(tier.get(c), nullptr);
  EXPECT_NE(tier.get(d), nullptr);
  EXPECT_EQ(tier.stats().evictions, 1u);
  EXPECT_LE(tier.stats().bytes, 300u);

  tier.put(make_key({"huge"}), blob(1000));  // larger than the bound: not kept
  EXPECT_EQ(tier.get(make_key({"huge"})), nullptr);
  EXPECT_LE(tier.stats().bytes, 300u);
}

TEST(CacheMemoryTierTest, RemoveAndClear) {
  MemoryTier tier;
  const Key a = make_key({"a"}), b = make_key({"b"});
  tier.put(a, blob(10));
  tier.put(b, blob(10));
  EXPECT_TRUE(tier.remove(a));
  EXPECT_FALSE(tier.remove(a));
  tier.clear();
  EXPECT_EQ(tier.get(b), nullptr);
  EXPECT_EQ(tier.stats().entries, 0u);
  EXPECT_EQ(tier.stats().bytes, 0u);
}

TEST(CacheMemoryTierTest, NullEntryIsRejected) {
  MemoryTier tier;
  EXPECT_THROW(tier.put(make_key({"a"}), nullptr), runtime::Error);
}

TEST(CacheMemoryTierTest, ConcurrentThreadsAgree) {
  MemoryTier tier(/*max_bytes=*/64 * 8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&tier, t] {
      for (int i = 0; i < 2000; ++i) {
        const Key key = make_key({std::to_string(i % 16)});
        if (auto hit = tier.get(key)) {
          EXPECT_EQ(hit->data.size(), 64u);
        } else {
          tier.put(key, blob(64, static_cast<char>('a' + t)));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  const TierStats s = tier.stats();
  EXPECT_LE(s.bytes, 64u * 8);
  EXPECT_EQ(s.hits + s.misses, 4u * 2000);
}

}  // namespace
}  // namespace vtpu::cache
