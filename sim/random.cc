#include "sim/random.h"

#include <cmath>
#include <cstdint>

namespace evoke::sim {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t StreamSeed(uint64_t seed, uint64_t key, uint64_t stream) {
  return SplitMix(SplitMix(SplitMix(seed) ^ key) ^ stream);
}

float Normal::Next() {
  if (have_) {
    have_ = false;
    return spare_;
  }
  // One 64-bit draw gives both uniforms (24 bits each), float math.
  const uint64_t bits = rng_();
  const float u1 = (static_cast<float>(bits >> 40) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
  const float u2 = static_cast<float>((bits >> 8) & 0xffffff) * (1.0f / 16777216.0f);
  const float r = std::sqrt(-2.0f * std::log(u1));
  const float a = 6.2831853f * u2;
  spare_ = r * std::sin(a);
  have_ = true;
  return r * std::cos(a);
}

void Normal::Fill(absl::Span<float> out, float stddev) {
  for (float& x : out) x = Next() * stddev;
}

double Normal::Uniform() { return static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0); }

uint64_t Normal::UniformInt(uint64_t lo, uint64_t hi) {
  const uint64_t span = hi - lo + 1;
  if (span == 0) return rng_();  // The whole 64-bit range.
  // Rejection keeps it unbiased.
  const uint64_t limit = ~0ull - (~0ull % span);
  uint64_t x;
  do {
    x = rng_();
  } while (x >= limit);
  return lo + x % span;
}

void RandomUnitOrthogonal(Normal& rng, absl::Span<const float> u, absl::Span<float> out) {
  for (;;) {
    double dot = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = rng.Next();
      dot += static_cast<double>(out[i]) * u[i];
    }
    double norm = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] -= static_cast<float>(dot) * u[i];
      norm += static_cast<double>(out[i]) * out[i];
    }
    if (norm > 1e-12) {
      const float inv = static_cast<float>(1.0 / std::sqrt(norm));
      for (float& x : out) x *= inv;
      return;
    }
  }
}

}  // namespace evoke::sim
