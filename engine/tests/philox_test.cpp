// Philox4x32-10 against the Random123 known-answer vectors, and the
// determinism of the (seed, offset) state built on it.
#include "vtpu/runtime/philox.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <set>

namespace vtpu::runtime {
namespace {

using Block = std::array<std::uint32_t, 4>;

// Random123 kat_vectors, philox4x32 with 10 rounds.
TEST(PhiloxTest, MatchesRandom123KnownAnswers) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (Block{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                          {0xffffffff, 0xffffffff}),
            (Block{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
                          {0xa4093822, 0x299f31d0}),
            (Block{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(PhiloxTest, EveryCounterAndKeyWordMatters) {
  const Block base = philox4x32_10({1, 2, 3, 4}, {5, 6});
  for (int i = 0; i < 4; ++i) {
    Block counter{1, 2, 3, 4};
    counter[i] ^= 1u;
    EXPECT_NE(philox4x32_10(counter, {5, 6}), base) << "counter word " << i;
  }
  EXPECT_NE(philox4x32_10({1, 2, 3, 4}, {4, 6}), base);
  EXPECT_NE(philox4x32_10({1, 2, 3, 4}, {5, 7}), base);
}

TEST(PhiloxStateTest, AdvanceReservesConsecutiveRanges) {
  PhiloxState state(42);
  EXPECT_EQ(state.seed(), 42u);
  EXPECT_EQ(state.offset(), 0u);
  EXPECT_EQ(state.advance(4), 0u);
  EXPECT_EQ(state.advance(8), 4u);
  EXPECT_EQ(state.advance(0), 12u);
  EXPECT_EQ(state.offset(), 12u);

  state.set_offset(100);
  EXPECT_EQ(state.advance(1), 100u);
  EXPECT_EQ(state.offset(), 101u);

  state.set_seed(7);  // a new seed restarts the stream
  EXPECT_EQ(state.seed(), 7u);
  EXPECT_EQ(state.offset(), 0u);
}

TEST(PhiloxStateTest, SameSeedAndOffsetReplayTheSameValues) {
  PhiloxState a(1234), b(1234);
  for (int i = 0; i < 16; ++i) {
    const std::uint64_t oa = a.advance(4);
    const std::uint64_t ob = b.advance(4);
    ASSERT_EQ(oa, ob);
    EXPECT_EQ(PhiloxState::derive(a.seed(), oa), PhiloxState::derive(b.seed(), ob));
  }
}

TEST(PhiloxStateTest, DifferentOffsetsAndSeedsGiveDifferentValues) {
  std::set<std::uint64_t> seen;
  for (std::uint64_t offset = 0; offset < 256; ++offset)
    seen.insert(PhiloxState::derive(99, offset));
  EXPECT_EQ(seen.size(), 256u);

  // Offsets differing only in the high word are distinct too.
  EXPECT_NE(PhiloxState::derive(99, 1), PhiloxState::derive(99, (std::uint64_t{1} << 32) | 1));
  EXPECT_NE(PhiloxState::derive(1, 0), PhiloxState::derive(2, 0));
  EXPECT_NE(PhiloxState::derive(1, 0), PhiloxState::derive(std::uint64_t{1} << 32 | 1, 0));
}

}  // namespace
}  // namespace vtpu::runtime
