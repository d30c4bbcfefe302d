// evoke-sim's parameters: every number of the synthetic model, with the
// defaults that ARE the simulator (docs/simulator.md lists them with their
// meaning), and the cache layout they imply (fingerprint, RoPE plan).
#ifndef EVOKE_SIM_PARAMS_H_
#define EVOKE_SIM_PARAMS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/rope.h"
#include "evoke/v1/block.pb.h"

namespace evoke::sim {

// Every parameter of the model. The defaults were fixed before any policy
// comparison was run (docs/simulator.md says when each was set) and are never
// tuned toward a result.
struct SimParams {
  // Shape.
  uint32_t n_layers = 8;
  uint32_t n_kv_heads = 4;
  uint32_t n_query_heads = 4;  // n_kv_heads (MHA) or a multiple (GQA).
  uint32_t head_dim = 64;
  // RoPE: NEOX on the first rotary_dim dimensions of each head (partial
  // rotary, as GPT-NeoX and Phi), base 10000. The other dimensions carry
  // position-free content, so that a fact can be retrieved from far away.
  v1::RopeType rope_type = v1::ROPE_NEOX;
  uint32_t rotary_dim = 32;
  double rope_base = 10000.0;

  // Keys (pre-RoPE): every component N(0, key_noise^2); a fact token of
  // fact f adds alpha_l * u_{l,h,f} (u a unit vector per layer, head and
  // fact), alpha_l = alpha_retrieval in retrieval layers, alpha_other
  // elsewhere.
  double key_noise = 1.0;
  std::vector<uint32_t> retrieval_layers = {3, 5, 6};
  double alpha_retrieval = 14.0;
  double alpha_other = 2.0;
  uint32_t fact_tokens = 16;  // Tokens per fact span.

  // Lures: every probed fact gets lures_per_fact spans of other facts whose
  // direction has cosine c ~ U[lure_cos_min, lure_cos_max] with the probed
  // fact's (in every layer and head), placed elsewhere in the session. A
  // lure is never probed; the mass a probe puts on it does not count.
  uint32_t lures_per_fact = 2;
  double lure_cos_min = 0.5;
  double lure_cos_max = 0.8;

  // Probe and reference queries (pre-RoPE): query_norm * u_{l,h,f} plus
  // N(0, query_noise^2) per component (the model attending to the fact).
  double query_norm = 8.0;
  double query_noise = 0.5;
  // Recovery queries (what the engine hands the recovery source): the part
  // of norm query_norm has cosine query_alignment with u_{l,h,f}:
  //   query_norm * (rho * u + sqrt(1 - rho^2) * w) + N(0, query_noise^2),
  // w a random unit vector orthogonal to u, drawn per recovery point, layer
  // and query head. rho = 1 is an oracle; rho = 0 knows nothing of the fact.
  double query_alignment = 0.5;
  // Filler queries: N(0, filler_query_noise^2) per component, and a
  // recency bias of -recency_per_1k_tokens * distance / 1000 on each key
  // token's logit. The softmax is exact, per key token, on every
  // filler_sample_every-th decode step; each such row counts that many
  // times in the attention statistics (steps between are not observed).
  double filler_query_noise = 1.0;
  double recency_per_1k_tokens = 1.0;
  uint32_t filler_sample_every = 8;

  // Answer rule: a retrieval layer retrieves fact f when the softmax mass on
  // f's tokens, averaged over the layer's query heads, is >= pass_threshold;
  // the probe passes when at least min_layers retrieval layers retrieve.
  double pass_threshold = 0.3;
  uint32_t min_layers = 2;

  // The layer whose pre-RoPE mean keys evoked summarizes and whose queries
  // recovery uses (a retrieval layer).
  uint32_t recovery_layer = 5;

  // Session shape.
  uint32_t session_tokens = 6144;  // Tokens of one session.
  uint32_t turn_tokens = 512;      // A turn starts with a recovery point.
  uint32_t answer_tokens = 32;     // Tokens after each probe (question/answer).
  uint32_t reference_tokens = 16;  // Agentic: tokens of a reference turn's query.
  uint32_t reference_every = 3;    // Agentic: a turn references the fact with p = 1/this.
  uint32_t multifact_min_facts = 3;  // Multifact: facts per session, drawn
  uint32_t multifact_max_facts = 7;  // uniformly in [min, max].

  // Cache: 64-token blocks (block 0 is the 4 sink tokens), f16 K and V.
  uint32_t block_tokens = 64;
  uint32_t sink_tokens = 4;

  // Validate: INVALID_ARGUMENT naming the field.
  absl::Status Validate() const;
  // Describe: one "name = value" line per parameter.
  std::string Describe() const;
  bool IsRetrievalLayer(uint32_t layer) const;
  double Alpha(uint32_t layer) const {
    return IsRetrievalLayer(layer) ? alpha_retrieval : alpha_other;
  }
  uint32_t kv_group() const { return n_query_heads / n_kv_heads; }
  // Floats of one token's keys for every layer and KV head.
  uint32_t token_floats() const { return n_layers * n_kv_heads * head_dim; }
};

// The fingerprint of the simulated cache (namespace "evoke-sim", f16 K and
// V, canonical layout, the RoPE above).
v1::LayoutFingerprint SimFingerprint(const SimParams& params);

// RopePlan of SimFingerprint.
absl::StatusOr<RopePlan> SimRopePlan(const SimParams& params);

}  // namespace evoke::sim

#endif  // EVOKE_SIM_PARAMS_H_
