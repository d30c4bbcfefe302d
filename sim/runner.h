// evoke-sim's runner: one policy over one simulated session.
//
// Scopes (docs/simulator.md): recovery-less policies run one cache per
// (layer, KV head) where they select per head (h2o, snapkv), one per layer
// otherwise (recency, streaming_llm), each with its layer's budget;
// recovering policies (infllm, evoke) run one cache for all layers and heads
// (as llama.cpp keeps it) with the mean budget, against a real evoked: every
// evicted block is saved as a canonical f16 session block through shared
// memory, ranked by evoked's Recover on pre-RoPE mean keys (the recovery
// query aligned with its fact as RunConfig::query_alignment says), and loaded back
// re-anchored at the tail; each recovered K is checked against a direct
// RoPE at its new position and each V byte for byte (a mismatch fails the
// run with INTERNAL). Policies that read attention (h2o, snapkv) observe
// exact per-token filler attention (sim/filler_attention.h) on every
// filler_sample_every-th step and exact reference attention on every
// reference token.
#ifndef EVOKE_SIM_RUNNER_H_
#define EVOKE_SIM_RUNNER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/rope.h"
#include "evoke/client.h"
#include "policy/policy.h"
#include "sim/model.h"

namespace evoke::sim {

struct RunConfig {
  std::string policy;                   // A policy::PolicyNames() name.
  std::vector<uint32_t> layer_budgets;  // Tokens per layer (n_layers entries).
  policy::PolicyParams policy_params;   // block_tokens and sink_tokens are the model's.
  // Alignment of recovery queries with their fact (Session::EventQuery);
  // unset: SimParams::query_alignment.
  std::optional<double> query_alignment;
};

// What one probe saw (for the probe log and the far-needle measurement).
struct ProbeRecord {
  int32_t fact = -1;
  // Share of the fact's key tokens resident in the retrieval layers' caches
  // (over every retrieval layer and KV head), and their mean distance from
  // the probe's position (0 when none is resident).
  double resident = 0;
  double distance = 0;
  double mass = 0;  // Mean fact mass over the retrieval layers.
  uint32_t layers = 0;  // Retrieval layers that retrieved.
  bool passed = false;
};

struct RunResult {
  uint32_t probes = 0;
  uint32_t passes = 0;
  std::vector<bool> probe_passed;
  std::vector<double> probe_mass;  // Mean fact mass over retrieval layers, per probe.
  std::vector<ProbeRecord> probe_records;
  double rate() const { return probes == 0 ? 0 : static_cast<double>(passes) / probes; }
  // Summed over scopes.
  uint64_t blocks_saved = 0;
  uint64_t blocks_recovered = 0;
  uint64_t blocks_verified = 0;  // Recovered blocks whose K and V were checked.
  uint64_t bytes_moved = 0;
  uint64_t recovery_failures = 0;
  uint64_t decode_steps = 0;
  double engine_seconds = 0;  // Time in BlockEngine + Recover.
  uint64_t budget_raised_layers = 0;  // Layers whose budget was raised to the minimum.
};

// Where recovering policies keep their blocks: a connected client (with a
// lease, or RunSession opens one), the namespace and a session id unique to
// this run. RunSession drops the session from evoked when it succeeds.
struct EvokedLink {
  Client* client = nullptr;
  std::string session_id;
};

// IsRecovering: infllm and evoke.
bool IsRecovering(const std::string& policy);

// RunSession runs `config` over `session`. Recovering policies need `link`
// (INVALID_ARGUMENT without). Errors: INVALID_ARGUMENT for an unknown policy
// or a layer_budgets of the wrong length; INTERNAL when a recovered block
// fails the K/V check; the daemon's errors for a failed save.
absl::StatusOr<RunResult> RunSession(const Session& session, const RunConfig& config,
                                     const EvokedLink* link);

// CanonicalPayload writes tokens [first_token, first_token + n) of `session`
// as a canonical-v1 f16 payload whose K is rotated at positions
// first_position + i; `out` gets PayloadBytes(n) bytes.
uint64_t PayloadBytes(const SimParams& params, uint32_t n_tokens);
void CanonicalPayload(const Session& session, const RopePlan& plan, uint64_t first_token,
                      uint32_t n_tokens, int64_t first_position, uint8_t* out);

// CheckRecoveredBlock checks a loaded payload of tokens [first_token,
// first_token + n) that should sit at new_first_position: each K element
// within the f16 tolerance of RoPE(pre-RoPE key, new position) computed
// directly (|error| <= 4e-3 * (norm of its rotation pair) + 1e-3), each V
// byte as written. INTERNAL naming the first mismatch (token, layer, head,
// dim); INVALID_ARGUMENT for a payload of the wrong size.
absl::Status CheckRecoveredBlock(const Session& session, const RopePlan& plan,
                                 uint64_t first_token, uint32_t n_tokens,
                                 int64_t new_first_position, absl::Span<const uint8_t> payload);

}  // namespace evoke::sim

#endif  // EVOKE_SIM_RUNNER_H_
