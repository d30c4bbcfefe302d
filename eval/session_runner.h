// evoke::eval::RunSession: one generated session (eval/tasks.h) through a
// llama.cpp model under a KV budget and a policy, graded by exact match.
//
// The engine reads the session token by token (LlamaPolicySession: the
// policy evicts blocks to evoked and, if it recovers, brings blocks back
// re-anchored at the tail). At each probe the prompt is the session up to
// the answer; the engine then decodes greedily, as many tokens as the
// answer has, and each generated token enters the cache as an engine's own
// output would. The session then goes on with its own tokens.
//
// Recovery uses only what the engine has. A recovering policy runs its
// periodic recovery points (each block, with the last token's pre-RoPE
// query of the summary layer, captured by llama.cpp's eval callback), and
// one more at the end of each prompt: before the prompt's last token is
// decoded, LlamaPolicySession::RecoverAtPromptEnd takes the query of the
// token before it, rolls the tokens since the last block boundary back,
// brings blocks, and decodes those tokens again; then the last prompt
// token is decoded. So every token whose logits the answer comes from is
// evaluated after the splice. No part of the task (where the fact is, what
// it says) reaches the engine.
//
// "full" is the model with the whole session in its cache (no policy, no
// evoked): the quality reference.
#ifndef EVOKE_EVAL_SESSION_RUNNER_H_
#define EVOKE_EVAL_SESSION_RUNNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "eval/tasks.h"
#include "evoke/client.h"
#include "llama.h"
#include "policy/policy.h"

namespace evoke::eval {

inline constexpr char kFullPolicy[] = "full";

struct RunOptions {
  std::string policy = kFullPolicy;  // "full" or one of policy::PolicyNames().
  policy::PolicyParams params;       // block_tokens etc.
  uint64_t budget_tokens = 0;        // Required unless "full".
  uint32_t summary_layer = 0;        // evoked's --summary-layer.
  int threads = 1;                   // llama.cpp threads.
  std::string ns = "eval";           // evoke namespace of the blocks.
  std::string session_id;            // Required unless "full": unique per run.
  uint32_t prefetch = 0;             // SessionOptions::prefetch (preloading).
};

// Where the block holding an answer's fact stood when the prompt ended, for
// recovering policies: resident, or its rank among evoked's Recover
// candidates for the engine's query (1 = first).
struct ProbeResult {
  bool pass = false;
  std::vector<int32_t> generated;
  // -1: the fact was resident; 0: evicted and not among the first
  // kRankDepth candidates (or Recover failed); k >= 1: its rank.
  int32_t fact_rank = -1;
};
inline constexpr uint32_t kRankDepth = 64;

struct SessionResult {
  std::vector<ProbeResult> probes;
  uint32_t passes = 0;
  uint64_t blocks_saved = 0;
  uint64_t blocks_recovered = 0;
  uint64_t recovery_failures = 0;
  uint64_t recovery_points = 0;
  uint64_t max_cells = 0;
  uint64_t steps = 0;  // Tokens decoded (session tokens and generated ones).
  double seconds = 0;
  // Recovery's stall: time spent bringing blocks back, and where evoked
  // served them from; blocks sent to Prefetch (preloading).
  double bring_seconds = 0;
  uint64_t brought_tier1 = 0, brought_tier2 = 0, prefetched = 0;
};

// RunSession runs `session` on `model`. `client` (connected to an evoked
// whose --summary-layer is options.summary_layer) may be null for "full".
// Errors: INVALID_ARGUMENT for bad options (unknown policy, a budget below
// what the policy protects: the message names budget_tokens); INTERNAL when
// llama.cpp fails; the session's errors (RESOURCE_EXHAUSTED when the policy
// cannot make room). An unreachable evoked is not an error: evictions go
// on unsaved and recoveries fail, counted in recovery_failures.
absl::StatusOr<SessionResult> RunSession(llama_model* model, Client* client,
                                         const Session& session, const RunOptions& options);

}  // namespace evoke::eval

#endif  // EVOKE_EVAL_SESSION_RUNNER_H_
