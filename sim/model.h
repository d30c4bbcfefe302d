// evoke-sim's model: a synthetic, attention-level stand-in for a language
// model's KV cache over a long session. THERE IS NO LANGUAGE MODEL: tokens
// are random key vectors, "facts" are spans whose keys share a hidden
// direction, and a probe is a query along that direction. The simulator only
// asks where softmax attention goes (docs/simulator.md has every formula).
//
//   SimParams    every parameter of the model, with its fixed default;
//   TaskScript   the events of one session of a task (tokens, recovery
//                points, probes), built by MakeScript;
//   Session      one seeded session: the pre-RoPE keys of every token and
//                the fact directions, shared
//                read-only by every policy run on it (so that policies are
//                compared on identical sessions).
#ifndef EVOKE_SIM_MODEL_H_
#define EVOKE_SIM_MODEL_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/rope.h"
#include "evoke/v1/block.pb.h"

namespace evoke::sim {

// Every parameter of the model. The defaults are THE simulator: they were
// fixed (docs/simulator.md) before any policy comparison was run, and are
// never tuned toward a result.
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
  // fact f adds alpha_l * u_{l,h,f} (u a random unit vector per layer, head
  // and fact), alpha_l = alpha_retrieval in retrieval layers, alpha_other
  // elsewhere.
  double key_noise = 1.0;
  std::vector<uint32_t> retrieval_layers = {3, 5, 6};
  double alpha_retrieval = 14.0;
  double alpha_other = 2.0;
  uint32_t fact_tokens = 16;  // Tokens per fact span.

  // Probe and reference queries (pre-RoPE): query_norm * u_{l,h,f} plus
  // N(0, query_noise^2) per component.
  double query_norm = 8.0;
  double query_noise = 0.5;
  // Filler queries: N(0, filler_query_noise^2) per component, and a
  // recency bias of -recency_per_1k_tokens * distance / 1000 on the logit.
  double filler_query_noise = 1.0;
  double recency_per_1k_tokens = 1.0;

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
  uint32_t reference_every = 3;    // Agentic: every n-th turn references the fact.

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

enum class Task { kNiah, kMultifact, kAgentic };
std::string TaskName(Task task);
absl::StatusOr<Task> ParseTask(absl::string_view name);
std::vector<Task> AllTasks();

// NIAH depths (fraction of the session before the needle).
inline constexpr double kNiahDepths[] = {0.05, 0.25, 0.50, 0.75, 0.95};
inline constexpr uint32_t kNiahVariants = 5;

// One event of a session script.
struct Event {
  enum class Kind {
    kFiller,     // `count` filler tokens.
    kFact,       // `count` tokens of fact `fact`.
    kReference,  // `count` filler tokens whose queries look for `fact`.
    kRecovery,   // A recovery point with a query for `fact` (-1: noise).
    kProbe,      // Does the model retrieve `fact` now?
  };
  Kind kind = Kind::kFiller;
  uint32_t count = 0;
  int32_t fact = -1;
};

struct TaskScript {
  Task task = Task::kMultifact;
  uint32_t variant = 0;  // NIAH: the depth index; 0 otherwise.
  std::vector<Event> events;
  uint32_t n_facts = 0;     // Fact ids used: 0..n_facts-1.
  uint32_t n_tokens = 0;    // Tokens of the session.
  uint32_t n_probes = 0;
};

// Variants of a task per seed (NIAH: one session per depth).
uint32_t TaskVariants(Task task);

// MakeScript builds the script of `task` (see docs/simulator.md):
//   niah       filler with a turn boundary (noise recovery point) every
//              turn_tokens, one needle at depth kNiahDepths[variant], then a
//              recovery point and a probe for it;
//   multifact  128 filler tokens, 5 facts (each followed by 64 filler
//              tokens), filler, then per fact: recovery point, probe,
//              answer_tokens filler;
//   agentic    128 filler tokens, the fact, then turns of turn_tokens:
//              every reference_every-th turn references the fact (recovery
//              point, probe, reference tokens), the others are distractor
//              turns that each state a new distractor fact and start with a
//              recovery point for the previous distractor; a final probe.
TaskScript MakeScript(Task task, uint32_t variant, const SimParams& params);

// A deterministic normal generator over std::mt19937_64 (Box-Muller written
// here, so that a seed gives the same numbers with every standard library).
class Normal {
 public:
  explicit Normal(uint64_t seed) : rng_(seed) {}
  float Next();
  void Fill(absl::Span<float> out, float stddev);

 private:
  std::mt19937_64 rng_;
  bool have_ = false;
  float spare_ = 0;
};

// One seeded session of a script. Read-only after construction; shared by
// every policy run on it.
class Session {
 public:
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
  // Unit direction u_{l,h,f}: head_dim floats.
  absl::Span<const float> Direction(uint32_t layer, uint32_t head, uint32_t fact) const;
  // ProbeQuery returns the pre-RoPE query of probe/reference/recovery event
  // `index` (the running count of such queries in the script) for `fact`
  // (-1: noise only): [layer][query_head][head_dim].
  std::vector<float> EventQuery(uint32_t index, int32_t fact) const;

 private:
  SimParams params_;
  TaskScript script_;
  uint64_t seed_;
  std::vector<float> keys_;
  std::vector<int32_t> fact_of_;
  std::vector<float> directions_;  // [fact][layer][head][dim]
};

}  // namespace evoke::sim

#endif  // EVOKE_SIM_MODEL_H_
