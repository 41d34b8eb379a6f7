// Cache keys: the 128-bit hash (stability, tails, avalanche), make_key's
// unambiguous framing of parts, and Key's hex validation.
#include "vtpu/cache/key.h"

#include <gtest/gtest.h>

#include <bit>
#include <set>
#include <string>

#include "vtpu/cache/hash128.h"
#include "vtpu/runtime/error.h"

namespace vtpu::cache {
namespace {

Hash128 hash_of(const std::string& s, std::uint64_t seed = 0) { return hash128(s.data(), s.size(), seed); }

TEST(CacheHashTest, MatchesTheMurmur3X64_128Construction) {
  // Published MurmurHash3_x64_128 values (seed 0): the empty input hashes to
  // zero, and the pangram's digest bytes are 6c1b07bc7bbc4be3 47939ac4a93c437a
  // (h1 then h2, little-endian) -> lo/hi words below.
  EXPECT_EQ(hash_of(""), (Hash128{.hi = 0, .lo = 0}));
  const Hash128 fox = hash_of("The quick brown fox jumps over the lazy dog");
  EXPECT_EQ(fox.lo, 0xe34bbc7bbc071b6cull);
  EXPECT_EQ(fox.hi, 0x7a433ca9c49a9347ull);
}

TEST(CacheHashTest, IsDeterministicAndDependsOnSeed) {
  EXPECT_EQ(hash_of("kernel"), hash_of("kernel"));
  EXPECT_NE(hash_of("kernel", 0), hash_of("kernel", 1));
}

TEST(CacheHashTest, EveryLengthAndTailByteMatters) {
  // Lengths 0..48 cover empty input, every tail size and several full blocks;
  // zero bytes in particular must not collide with shorter inputs.
  std::set<std::string> seen;
  std::string zeros, ones;
  for (int n = 0; n <= 48; ++n) {
    EXPECT_TRUE(seen.insert(hash_of(zeros).hex()).second) << "zeros, length " << n;
    if (n > 0) EXPECT_TRUE(seen.insert(hash_of(ones).hex()).second) << "ones, length " << n;
    zeros.push_back('\0');
    ones.push_back('\1');
  }
  std::string text(37, 'x');
  const Hash128 base = hash_of(text);
  for (std::size_t i = 0; i < text.size(); ++i) {
    std::string changed = text;
    changed[i] ^= 1;
    EXPECT_NE(hash_of(changed), base) << "byte " << i;
  }
}

TEST(CacheHashTest, OneBitFlipsAboutHalfTheOutput) {
  std::string text = "canonical ir: add(f32[8,16], f32[8,16]) x86_64 avx2 g++-12 -O3";
  const Hash128 a = hash_of(text);
  text[5] ^= 0x04;
  const Hash128 b = hash_of(text);
  const int differing = std::popcount(a.hi ^ b.hi) + std::popcount(a.lo ^ b.lo);
  EXPECT_GT(differing, 32);
  EXPECT_LT(differing, 96);
}

TEST(CacheHashTest, HexIsHighWordFirstLowercasePadded) {
  EXPECT_EQ((Hash128{.hi = 0x0123456789abcdefull, .lo = 0xf}).hex(),
            "0123456789abcdef000000000000000f");
}

TEST(CacheKeyTest, MakeKeyIsStable) {
  // Pinned: changing the framing or the hash invalidates every user's cache.
  EXPECT_EQ(make_key({"ir", "x86_64"}).hex(), "d176abeee1979c2b0531692a9090a587");
  EXPECT_EQ(make_key({}).hex().size(), 32u);
  EXPECT_TRUE(Key::is_valid_hex(make_key({"a"}).hex()));
}

TEST(CacheKeyTest, PartsAreFramedUnambiguously) {
  std::set<std::string> keys = {
      make_key({"ab", "c"}).hex(), make_key({"a", "bc"}).hex(), make_key({"abc"}).hex(),
      make_key({"abc", ""}).hex(), make_key({"", "abc"}).hex(), make_key({}).hex(),
      make_key({""}).hex(),        make_key({"", ""}).hex(),
  };
  EXPECT_EQ(keys.size(), 8u);
  // A part that looks like a length prefix cannot forge a split either.
  const std::string fake_prefix("\x01\0\0\0\0\0\0\0", 8);
  EXPECT_NE(make_key({"a", "b"}), make_key({std::string("a") + fake_prefix + "b"}));
}

TEST(CacheKeyTest, SpanAndInitializerListAgree) {
  const std::string_view parts[] = {"ir", "target", "isa"};
  EXPECT_EQ(make_key(parts), make_key({"ir", "target", "isa"}));
}

TEST(CacheKeyTest, FromHexValidates) {
  const Key key = make_key({"x"});
  EXPECT_EQ(Key::from_hex(key.hex()), key);
  for (const char* bad : {"", "abc", "0123456789ABCDEF0123456789abcdef",
                          "0123456789abcdef0123456789abcdeg", "../../../../etc/passwd0000000000",
                          "0123456789abcdef0123456789abcdef0"}) {
    try {
      Key::from_hex(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const runtime::Error& e) {
      EXPECT_EQ(e.kind(), runtime::ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace vtpu::cache
