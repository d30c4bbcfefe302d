// evoke-sim's model: a synthetic, attention-level stand-in for a language
// model's KV cache over a long session. THERE IS NO LANGUAGE MODEL: tokens
// are random key vectors, "facts" are spans whose keys share a hidden
// direction, and a probe is a query along that direction. The simulator only
// asks where softmax attention goes (docs/simulator.md has every formula).
//
//   SimParams    every parameter of the model (sim/params.h);
//   TaskScript   the events of one session of a task (sim/script.h);
//   Session      one seeded session: the pre-RoPE keys of every token, the
//                fact directions and the queries, shared read-only by every
//                policy run on it (so that policies are compared on
//                identical sessions).
#ifndef EVOKE_SIM_MODEL_H_
#define EVOKE_SIM_MODEL_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "sim/params.h"
#include "sim/random.h"
#include "sim/script.h"

namespace evoke::sim {

class Session {
 public:
  // `params` must be valid; `script` is MakeScript's for the same params.
  Session(const SimParams& params, TaskScript script, uint64_t seed);

  const SimParams& params() const { return params_; }
  const TaskScript& script() const { return script_; }
  uint64_t seed() const { return seed_; }

  // Pre-RoPE keys of token t: [layer][kv_head][head_dim].
  absl::Span<const float> PreKeys(uint64_t token) const {
    return absl::MakeConstSpan(keys_.data() + token * params_.token_floats(),
                               params_.token_floats());
  }
  // Fact of token t, or -1.
  int32_t FactOf(uint64_t token) const { return fact_of_[token]; }
  // Unit direction u_{l,h,f}: head_dim floats. A lure's direction has the
  // cosine of its FactInfo with its fact's, in every layer and head.
  absl::Span<const float> Direction(uint32_t layer, uint32_t head, uint32_t fact) const;

  // EventQuery returns the pre-RoPE query of event `index` (the running
  // count of recovery, probe and reference-token queries in the script) for
  // `fact`, [layer][query_head][head_dim]:
  //   fact >= 0  query_norm * (a * u + sqrt(1 - a^2) * w) + N(0, query_noise^2),
  //              a = `alignment`, w a random unit vector orthogonal to u
  //              (its own stream per event: the same w for every alignment);
  //              probes and references use alignment 1, recovery points the
  //              run's query alignment;
  //   fact < 0   N(0, filler_query_noise^2) per component (noise).
  std::vector<float> EventQuery(uint32_t index, int32_t fact, double alignment = 1.0) const;

  // FillerQuery returns the filler query of decode step `step`,
  // [layer][query_head][head_dim], N(0, filler_query_noise^2) per component
  // (the same for every policy run on the session).
  std::vector<float> FillerQuery(uint64_t step) const;

 private:
  uint64_t Key() const;

  SimParams params_;
  TaskScript script_;
  uint64_t seed_;
  std::vector<float> keys_;
  std::vector<int32_t> fact_of_;
  std::vector<float> directions_;  // [fact][layer][head][dim]
};

}  // namespace evoke::sim

#endif  // EVOKE_SIM_MODEL_H_
