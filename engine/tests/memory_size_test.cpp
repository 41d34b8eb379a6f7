// Memory-size parsing and the default device capacity (VTPU_MEMORY_LIMIT).
#include "vtpu/runtime/memory_size.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "vtpu/runtime/error.h"

namespace vtpu::runtime {
namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t GiB = std::size_t{1} << 30;

TEST(MemorySizeTest, ParsesUnitsAndWhitespace) {
  EXPECT_EQ(parse_memory_size("8GiB"), 8 * GiB);
  EXPECT_EQ(parse_memory_size("512MB"), 512'000'000u);
  EXPECT_EQ(parse_memory_size("1024"), 1024u);
  EXPECT_EQ(parse_memory_size("1.5 KiB"), 1536u);
  EXPECT_EQ(parse_memory_size(" 2 gib "), 2 * GiB);
  EXPECT_EQ(parse_memory_size("64B"), 64u);
  EXPECT_EQ(parse_memory_size("3k"), 3000u);
  EXPECT_EQ(parse_memory_size("4MiB"), 4 * KiB * KiB);
  EXPECT_EQ(parse_memory_size("1TiB"), std::size_t{1} << 40);
}

TEST(MemorySizeTest, MalformedTextThrowsInvalidArgument) {
  for (const std::string text : {"abc", "12XB", "", "   ", "-1", "GiB", "1.2.3GiB", "."}) {
    try {
      parse_memory_size(text);
      ADD_FAILURE() << "'" << text << "' should be rejected";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << text;
      // The message names the offending text so the user can find it.
      EXPECT_NE(std::string(e.what()).find("'" + text + "'"), std::string::npos) << e.what();
    }
  }
}

// Sets VTPU_MEMORY_LIMIT for one test and restores the previous value.
class ScopedLimit {
 public:
  explicit ScopedLimit(const char* value) {
    if (const char* old = std::getenv("VTPU_MEMORY_LIMIT")) old_ = old;
    if (value) {
      setenv("VTPU_MEMORY_LIMIT", value, 1);
    } else {
      unsetenv("VTPU_MEMORY_LIMIT");
    }
  }
  ~ScopedLimit() {
    if (old_) {
      setenv("VTPU_MEMORY_LIMIT", old_->c_str(), 1);
    } else {
      unsetenv("VTPU_MEMORY_LIMIT");
    }
  }

 private:
  std::optional<std::string> old_;
};

TEST(MemorySizeTest, DefaultCapacityHonoursEnvironment) {
  {
    ScopedLimit limit("3GiB");
    EXPECT_EQ(default_device_capacity(), 3 * GiB);
    EXPECT_EQ(default_device_capacity(0.1), 3 * GiB);  // the variable wins
  }
  {
    ScopedLimit limit("lots");
    EXPECT_THROW(default_device_capacity(), Error);
  }
}

TEST(MemorySizeTest, DefaultCapacityIsAFractionOfPhysicalMemory) {
  ScopedLimit limit(nullptr);
  const std::size_t physical = physical_memory_bytes();
  ASSERT_GT(physical, 0u);
  const std::size_t capacity = default_device_capacity();
  EXPECT_GT(capacity, 0u);
  EXPECT_LE(capacity, physical);
  EXPECT_LT(default_device_capacity(0.5), capacity);
}

TEST(MemorySizeTest, EmptyVariableFallsBackToPhysicalMemory) {
  ScopedLimit limit("");
  EXPECT_GT(default_device_capacity(), 0u);
  EXPECT_LE(default_device_capacity(), physical_memory_bytes());
}

}  // namespace
}  // namespace vtpu::runtime
