// Deterministic random numbers: the same seed gives the same stream on every
// machine (no std::distribution, whose output is implementation-defined).
#pragma once
#include <cmath>
#include <cstdint>

namespace myriad {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { Seed(seed); }
  void Seed(uint64_t seed) {
    // splitmix64 expands the seed into the xoshiro256** state.
    for (auto& s : s_) {
      seed += 0x9e3779b97f4a7c15ULL;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      s = z ^ (z >> 31);
    }
  }
  uint64_t NextU64() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 24 random bits (exactly representable in float).
  float Uniform() { return static_cast<float>(NextU64() >> 40) * (1.0f / 16777216.0f); }
  // Uniform integer in [0, n).
  uint64_t Below(uint64_t n) { return n ? NextU64() % n : 0; }
  // Standard normal via Box-Muller.
  float Normal() {
    double u1 = (static_cast<double>(NextU64() >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = static_cast<double>(NextU64() >> 11) * (1.0 / 9007199254740992.0);
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  const uint64_t* state() const { return s_; }
  void set_state(const uint64_t st[4]) {
    for (int i = 0; i < 4; ++i) s_[i] = st[i];
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace myriad
