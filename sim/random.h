// evoke-sim's random numbers: deterministic streams that give the same
// numbers with every standard library (the distributions are written here,
// not taken from <random>), so that a seed means the same session anywhere.
#ifndef EVOKE_SIM_RANDOM_H_
#define EVOKE_SIM_RANDOM_H_

#include <cstdint>
#include <random>

#include "absl/types/span.h"

namespace evoke::sim {

// SplitMix64's finalizer: a well-mixed 64-bit hash of x.
uint64_t SplitMix(uint64_t x);

// StreamSeed names an independent stream of one session: `seed` (the
// user's), `key` (what the session is: task and variant) and `stream` (what
// the numbers are for: keys, directions, layout, one query, ...).
uint64_t StreamSeed(uint64_t seed, uint64_t key, uint64_t stream);

// Normal and uniform draws over std::mt19937_64 (Box-Muller).
class Normal {
 public:
  explicit Normal(uint64_t seed) : rng_(seed) {}
  float Next();
  void Fill(absl::Span<float> out, float stddev);
  // Uniform in [0, 1) (53 bits); does not disturb the normal pair.
  double Uniform();
  // Uniform integer in [lo, hi] (hi >= lo).
  uint64_t UniformInt(uint64_t lo, uint64_t hi);

 private:
  std::mt19937_64 rng_;
  bool have_ = false;
  float spare_ = 0;
};

// RandomUnitOrthogonal writes into `out` a random unit vector orthogonal to
// the unit vector `u` (same size), drawn from `rng`.
void RandomUnitOrthogonal(Normal& rng, absl::Span<const float> u, absl::Span<float> out);

}  // namespace evoke::sim

#endif  // EVOKE_SIM_RANDOM_H_
