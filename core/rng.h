// Deterministic random numbers for data order, augmentation, init and dropout.
// Rng is xoshiro256** seeded through splitmix64; its whole state is four words, so a checkpoint
// that stores state() resumes the exact same stream. normal() draws two uniforms per call and keeps
// no spare value, which is what makes state() complete.
// hash_u32/hash_uniform are stateless counter-based hashes marked FT_HD, so a CPU reference and a
// CUDA kernel compute the same dropout mask from (seed, element index).
// Thread safety: an Rng must not be shared between threads without a lock; the hash functions are
// pure and safe anywhere.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace ft {

// splitmix64 finaliser: a bijective 64-bit mix with full avalanche.
FT_HD uint64_t mix_u64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Mixes the seed first so that (seed, counter) and (seed + 1, counter - 1) are unrelated.
FT_HD uint32_t hash_u32(uint64_t seed, uint64_t counter) {
  return static_cast<uint32_t>(mix_u64(mix_u64(seed) ^ counter) >> 32);
}

// Uniform in [0, 1): the top 24 bits fill a float mantissa exactly, so 1.0f is never returned.
FT_HD float hash_uniform(uint64_t seed, uint64_t counter) {
  return static_cast<float>(hash_u32(seed, counter) >> 8) * (1.0f / 16777216.0f);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t x = seed;
    for (auto& word : state_) {
      word = mix_u64(x);
      x += 0x9E3779B97F4A7C15ull;
    }
  }

  uint64_t next_u64() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // Unbiased integer in [0, n) by rejection (Lemire's multiply-shift). REQUIRES: n > 0.
  uint32_t below(uint32_t n) {
    uint64_t product = static_cast<uint64_t>(static_cast<uint32_t>(next_u64() >> 32)) * n;
    uint32_t low = static_cast<uint32_t>(product);
    if (low < n) {
      const uint32_t threshold = static_cast<uint32_t>(-n) % n;
      while (low < threshold) {
        product = static_cast<uint64_t>(static_cast<uint32_t>(next_u64() >> 32)) * n;
        low = static_cast<uint32_t>(product);
      }
    }
    return static_cast<uint32_t>(product >> 32);
  }

  // Unbiased integer in [0, n) for ranges past 2^32 (large text shards). REQUIRES: n > 0.
  uint64_t below_u64(uint64_t n) {
    if (n <= 0xFFFFFFFFull) return below(static_cast<uint32_t>(n));
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;  // values >= limit would bias the modulo
    uint64_t x = next_u64();
    while (x >= limit) x = next_u64();
    return x % n;
  }

  // Uniform in [0, 1) with 24 random bits.
  float uniform() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }

  // Standard normal by Box-Muller; both uniforms are consumed every call (no cached spare).
  float normal() {
    // u1 in (0, 1] keeps log() finite.
    const double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    const double u2 = static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0);
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

  std::array<uint64_t, 4> state() const { return state_; }
  // An all-zero state is the one fixed point of xoshiro; it cannot come from state(), so it is
  // replaced by a seeded state instead of silently producing zeros forever.
  void set_state(const std::array<uint64_t, 4>& state) {
    state_ = state;
    if ((state_[0] | state_[1] | state_[2] | state_[3]) == 0) *this = Rng(0);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::array<uint64_t, 4> state_{};
};

}  // namespace ft
