#include "sim/model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace evoke::sim {
namespace {

// Streams of a session (the layout's is sim/script.cc's, 3).
constexpr uint64_t kDirectionStream = 1;
constexpr uint64_t kKeyStream = 2;
constexpr uint64_t kEventNoiseStream = 0x100;           // + event index
constexpr uint64_t kEventOtherStream = 0x100000000ull;  // + event index
constexpr uint64_t kFillerStream = 0x200000000ull;      // + decode step

void Normalize(float* u, uint32_t d) {
  double norm = 0;
  for (uint32_t i = 0; i < d; ++i) norm += static_cast<double>(u[i]) * u[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(norm));
  for (uint32_t i = 0; i < d; ++i) u[i] *= inv;
}

}  // namespace

uint64_t Session::Key() const {
  return static_cast<uint64_t>(script_.task) << 8 | script_.variant;
}

Session::Session(const SimParams& params, TaskScript script, uint64_t seed)
    : params_(params), script_(std::move(script)), seed_(seed) {
  const SimParams& p = params_;
  const uint32_t tf = p.token_floats();
  const uint32_t d = p.head_dim;
  const size_t per_fact = static_cast<size_t>(p.n_layers) * p.n_kv_heads;
  // Fact directions: random unit vectors; a lure's is c * u + sqrt(1 - c^2)
  // * v with v a random unit vector orthogonal to its fact's u.
  const uint32_t n_facts = std::max(1u, script_.n_facts());
  directions_.resize(n_facts * per_fact * d);
  Normal dir_rng(StreamSeed(seed, Key(), kDirectionStream));
  std::vector<float> v(d);
  for (uint32_t f = 0; f < n_facts; ++f) {
    const FactInfo info = f < script_.n_facts() ? script_.facts[f] : FactInfo();
    for (size_t j = 0; j < per_fact; ++j) {
      float* u = directions_.data() + (f * per_fact + j) * d;
      if (info.lure_of < 0) {
        for (uint32_t i = 0; i < d; ++i) u[i] = dir_rng.Next();
        Normalize(u, d);
        continue;
      }
      const float* of = directions_.data() + (static_cast<size_t>(info.lure_of) * per_fact + j) * d;
      RandomUnitOrthogonal(dir_rng, absl::MakeConstSpan(of, d), absl::MakeSpan(v));
      const double c = info.cosine;
      const double s = std::sqrt(1 - c * c);
      for (uint32_t i = 0; i < d; ++i) u[i] = static_cast<float>(c * of[i] + s * v[i]);
      Normalize(u, d);
    }
  }
  // Keys.
  keys_.resize(static_cast<size_t>(script_.n_tokens) * tf);
  fact_of_.assign(script_.n_tokens, -1);
  uint64_t t = 0;
  for (const Event& e : script_.events) {
    if (e.kind == Event::Kind::kFact) {
      for (uint32_t i = 0; i < e.count; ++i) fact_of_[t + i] = e.fact;
    }
    if (e.kind == Event::Kind::kFiller || e.kind == Event::Kind::kFact ||
        e.kind == Event::Kind::kReference) {
      t += e.count;
    }
  }
  Normal key_rng(StreamSeed(seed, Key(), kKeyStream));
  key_rng.Fill(absl::MakeSpan(keys_), static_cast<float>(p.key_noise));
  for (uint64_t tok = 0; tok < script_.n_tokens; ++tok) {
    const int32_t f = fact_of_[tok];
    if (f < 0) continue;
    for (uint32_t l = 0; l < p.n_layers; ++l) {
      const float a = static_cast<float>(p.Alpha(l));
      for (uint32_t h = 0; h < p.n_kv_heads; ++h) {
        float* k = keys_.data() + tok * tf + (static_cast<size_t>(l) * p.n_kv_heads + h) * d;
        absl::Span<const float> u = Direction(l, h, static_cast<uint32_t>(f));
        for (uint32_t i = 0; i < d; ++i) k[i] += a * u[i];
      }
    }
  }
}

absl::Span<const float> Session::Direction(uint32_t layer, uint32_t head, uint32_t fact) const {
  const SimParams& p = params_;
  const size_t at = ((static_cast<size_t>(fact) * p.n_layers + layer) * p.n_kv_heads + head) *
                    p.head_dim;
  return absl::MakeConstSpan(directions_.data() + at, p.head_dim);
}

std::vector<float> Session::EventQuery(uint32_t index, int32_t fact, double alignment) const {
  const SimParams& p = params_;
  const uint32_t d = p.head_dim;
  std::vector<float> q(static_cast<size_t>(p.n_layers) * p.n_query_heads * d);
  Normal rng(StreamSeed(seed_, Key(), kEventNoiseStream + index));
  rng.Fill(absl::MakeSpan(q), static_cast<float>(fact >= 0 ? p.query_noise
                                                           : p.filler_query_noise));
  if (fact < 0) return q;
  const double a = std::clamp(alignment, 0.0, 1.0);
  const float along = static_cast<float>(p.query_norm * a);
  const float across = static_cast<float>(p.query_norm * std::sqrt(1 - a * a));
  Normal other_rng(StreamSeed(seed_, Key(), kEventOtherStream + index));
  std::vector<float> w(d);
  for (uint32_t l = 0; l < p.n_layers; ++l) {
    for (uint32_t qh = 0; qh < p.n_query_heads; ++qh) {
      absl::Span<const float> u = Direction(l, qh / p.kv_group(), static_cast<uint32_t>(fact));
      RandomUnitOrthogonal(other_rng, u, absl::MakeSpan(w));
      float* out = q.data() + (static_cast<size_t>(l) * p.n_query_heads + qh) * d;
      for (uint32_t i = 0; i < d; ++i) out[i] += along * u[i] + across * w[i];
    }
  }
  return q;
}

std::vector<float> Session::FillerQuery(uint64_t step) const {
  const SimParams& p = params_;
  std::vector<float> q(static_cast<size_t>(p.n_layers) * p.n_query_heads * p.head_dim);
  Normal rng(StreamSeed(seed_, Key(), kFillerStream + step));
  rng.Fill(absl::MakeSpan(q), static_cast<float>(p.filler_query_noise));
  return q;
}

}  // namespace evoke::sim
