// The on-disk entry format: round trip, and rejection of every truncation,
// every single flipped byte and an entry stored under another key's name.
#include "vtpu/cache/entry_codec.h"

#include <gtest/gtest.h>

#include <string>

namespace vtpu::cache {
namespace {

Entry sample() {
  return Entry::from_string(std::string("\x7f" "ELF\0\1\2 kernel bytes", 20),
                            {{"symbol", "vtpu_add_f32"}, {"cxx", "g++ -O3"}});
}

TEST(CacheEntryCodecTest, RoundTrips) {
  const Key key = make_key({"roundtrip"});
  const auto bytes = encode_entry(key, sample());
  std::string why;
  auto decoded = decode_entry(bytes, key, &why);
  ASSERT_TRUE(decoded) << why;
  EXPECT_EQ(*decoded, sample());

  const Entry empty;
  auto decoded_empty = decode_entry(encode_entry(key, empty), key);
  ASSERT_TRUE(decoded_empty);
  EXPECT_EQ(*decoded_empty, empty);
}

TEST(CacheEntryCodecTest, RejectsEveryTruncationAndExtension) {
  const Key key = make_key({"truncate"});
  auto bytes = encode_entry(key, sample());
  for (std::size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(decode_entry(std::span(bytes.data(), n), key)) << "prefix of " << n << " bytes";
  bytes.push_back(0);
  EXPECT_FALSE(decode_entry(bytes, key));
}

TEST(CacheEntryCodecTest, RejectsEveryFlippedByte) {
  const Key key = make_key({"flip"});
  const auto bytes = encode_entry(key, sample());
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    auto corrupt = bytes;
    corrupt[i] ^= 0x20;
    std::string why;
    EXPECT_FALSE(decode_entry(corrupt, key, &why)) << "flipped byte " << i;
    EXPECT_FALSE(why.empty());
  }
}

TEST(CacheEntryCodecTest, RejectsAnEntryOfAnotherKey) {
  const auto bytes = encode_entry(make_key({"one"}), sample());
  std::string why;
  EXPECT_FALSE(decode_entry(bytes, make_key({"two"}), &why));
  EXPECT_NE(why.find("another key"), std::string::npos);
}

}  // namespace
}  // namespace vtpu::cache
