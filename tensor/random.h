// tensor/random.h: seeded, counter-based random numbers for randn.
//
// Example:
//   Generator gen(/*seed=*/42);
//   Tensor a = randn({3, 4}, gen);   // draws 0..11 of stream 42
//   Tensor b = randn({3, 4}, gen);   // draws 12..23: different values, same every run
//
// Draw number i of a seed is a pure function of (seed, i) (a splitmix64 hash, then
// Box-Muller), not of a sequential state. So a kernel can compute every element in
// parallel and in any order, host and CUDA kernels give the same numbers, and the
// values do not depend on the device or the thread count. Not cryptographic.
//
// Thread-safety: a Generator is a plain value with no locking; use one per thread, or
// guard it.
#pragma once

#include <cmath>
#include <cstdint>

namespace devmem {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}

  uint64_t seed() const { return seed_; }
  // The counter of the next draw.
  uint64_t offset() const { return offset_; }
  // Reserves `n` draws; returns the counter of the first.
  uint64_t Advance(uint64_t n) {
    const uint64_t first = offset_;
    offset_ += n;
    return first;
  }

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// splitmix64's finalizer: a bijection on 64 bits with good avalanche.
constexpr uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// 64 random bits for (seed, counter).
constexpr uint64_t RandomBits(uint64_t seed, uint64_t counter) {
  return Mix64(Mix64(seed) + (counter + 1) * 0x9e3779b97f4a7c15ULL);
}

// Uniform in [0, 1), 53 bits.
inline double UniformAt(uint64_t seed, uint64_t counter) {
  return static_cast<double>(RandomBits(seed, counter) >> 11) * 0x1.0p-53;
}

// Standard normal: Box-Muller on two independent uniforms derived from the counter
// (u1 in (0, 1], so the log is finite).
inline double NormalAt(uint64_t seed, uint64_t counter) {
  const uint64_t bits1 = RandomBits(seed, 2 * counter);
  const uint64_t bits2 = RandomBits(seed, 2 * counter + 1);
  const double u1 = static_cast<double>((bits1 >> 11) + 1) * 0x1.0p-53;
  const double u2 = static_cast<double>(bits2 >> 11) * 0x1.0p-53;
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

}  // namespace devmem
