// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"):
// a counter-based generator. A (seed, offset) pair fully determines the
// values, so random results do not depend on mode, fusion or thread timing.
#pragma once

#include <array>
#include <cstdint>

namespace vtpu::runtime {

// One Philox block: 4 x 32-bit outputs for a 128-bit counter and 64-bit key.
std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter,
                                           std::array<std::uint32_t, 2> key);

// The device's generator state. Each random op takes `advance(n)` to reserve
// n counter values; the op's stream of numbers starts at the returned offset.
class PhiloxState {
 public:
  explicit PhiloxState(std::uint64_t seed = 67280421310721ull) : seed_(seed) {}
  void set_seed(std::uint64_t seed) { seed_ = seed; offset_ = 0; }
  std::uint64_t seed() const { return seed_; }
  std::uint64_t offset() const { return offset_; }
  void set_offset(std::uint64_t offset) { offset_ = offset; }
  std::uint64_t advance(std::uint64_t increment) {
    const std::uint64_t start = offset_;
    offset_ += increment;
    return start;
  }
  // A 64-bit value derived from (seed, offset): used to seed per-op kernels.
  static std::uint64_t derive(std::uint64_t seed, std::uint64_t offset);

 private:
  std::uint64_t seed_;
  std::uint64_t offset_ = 0;
};

}  // namespace vtpu::runtime
