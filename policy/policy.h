// evoke::policy: what leaves the engine's KV cache and what comes back.
//
// A Policy looks at a CacheView (the blocks an engine holds, its budget, the
// attention statistics it observed) and answers two questions:
//   ChooseEvictions   which resident blocks leave so that the cache fits its
//                     budget (the engine saves each to evoked first and
//                     removes it only once acknowledged);
//   ChooseRecoveries  which stored blocks come back now (Recover, then a
//                     re-anchored load at the tail of the cache).
// Recency, StreamingLLM, H2O and SnapKV never recover; InfLLM and EVOKE do.
// PyramidKV is a budget schedule (per-layer budgets, policy/layer_budgets.h),
// not a Policy: it is run with a recovery-less policy underneath.
//
// Scope. A view is one cache: all layers and heads together (llama.cpp keeps
// one cache for every layer and head, so selections there are per block), or
// one layer, or one (layer, KV head) where an engine keeps separate caches
// (the simulator). A Policy instance serves one scope of one session and may
// keep state between calls (InfLLM remembers its last top-K): make one per
// scope. Policies are not thread-safe; one decode loop drives each.
//
// The policies (docs/policies.md has the details and the deviations from
// the published methods):
//   recency        oldest blocks (by first_token) first; no sinks.
//   streaming_llm  sinks (blocks with first_token < sink_tokens) kept; the
//                  others oldest first.
//   h2o            the newest blocks kept (h2o_recent_share of the budget,
//                  whole blocks, at least one); the others by cumulative
//                  attention, least first (ties: older first). No sinks, as
//                  published. Without attention statistics: recency behind
//                  the same guard.
//   snapkv         as h2o with the windowed, pooled attention
//                  (AttentionStats::Window) and snapkv_recent_share.
//   infllm         sinks kept; at a recovery point the top infllm_topk of
//                  the stored blocks and the resident recovered ones form
//                  its set, and the stored members come back; eviction takes
//                  recovered blocks that left the set first, then the oldest
//                  others, the set itself last.
//   evoke          sinks kept; the others by the time they last entered the
//                  cache (first_position order: recovered blocks count as
//                  new); recovery gated by the weakest resident non-sink
//                  block's ScoreSummary, up to evoke_topk, ascending.
//
// Decision cost: both calls are linear or n log n in the resident blocks; a
// 128k-token context (2,048 blocks of 64) decides in well under a millisecond
// (bench/policy_bench.cc).
#ifndef EVOKE_POLICY_POLICY_H_
#define EVOKE_POLICY_POLICY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace evoke::policy {

// An engine-local name of a block, unique within one session (the engine
// picks it, e.g. a counter; not a cache position, which changes when the
// block is recovered). A block keeps its handle when it is evicted and
// recovered.
using BlockHandle = uint64_t;

class AttentionStats;  // policy/attention_stats.h

// A block the engine holds.
struct ResidentBlock {
  BlockHandle handle = 0;
  // Index of the block's first token in the session's token stream (0 for
  // the first token ever decoded); ordering and sinks are decided on it.
  uint64_t first_token = 0;
  uint32_t n_tokens = 0;
  // Where its first token sits in the cache now (differs from first_token
  // after compaction or a re-anchored recovery).
  int64_t first_position = 0;
  // Brought back from evoked: a copy is stored already, so evicting it again
  // costs no save.
  bool recovered = false;
  // Pre-RoPE mean keys of the recovery layer, n_kv_heads x head_dim floats
  // (what evoked's SUMMARY_MEAN_KEYS holds for stored blocks); empty when the
  // engine did not compute them. EVOKE scores resident blocks with them.
  absl::Span<const float> summary;
};

// One cache's state at a decision point.
struct CacheView {
  // kAll: every layer (or head) shares this cache.
  static constexpr int32_t kAll = -1;
  int32_t layer = kAll;
  int32_t head = kAll;  // A KV head.
  // Tokens this cache may hold (resident blocks + pending tokens).
  uint64_t budget_tokens = 0;
  // Decoded tokens not yet in a full block: always resident, never chosen.
  uint64_t pending_tokens = 0;
  // Tokens decoded so far in the session (the next token's index).
  uint64_t session_tokens = 0;
  // Resident blocks, any order.
  absl::Span<const ResidentBlock> resident;
  // What the engine observed, or null (policies that need it then fall back
  // to recency and say so in PolicyInfo::needs_attention).
  const AttentionStats* attention = nullptr;
};

// The query the engine is about to decode, for recovery: pre-RoPE query
// vectors of the recovery layer, n_query_heads x head_dim floats.
struct RecoveryQuery {
  absl::Span<const float> queries;
  uint32_t n_query_heads = 0;
};

// A stored block and how well it matches a query.
struct Candidate {
  BlockHandle handle = 0;
  float score = 0;
  uint32_t n_tokens = 0;
};

// Where stored blocks are ranked: evoked's Recover (EvokedRecoverySource,
// policy/evoked_source.h) or a fake in unit tests.
class RecoverySource {
 public:
  virtual ~RecoverySource() = default;
  // Rank returns up to `k` stored blocks of the session that are not
  // resident, best first, each scoring at least `min_score` when set. The
  // score is evoked's: dot product of each query head with the summary of
  // its KV head (grouped-query attention), averaged over query heads.
  // UNAVAILABLE when the daemon is down; other errors as evoked's Recover.
  virtual absl::StatusOr<std::vector<Candidate>> Rank(const RecoveryQuery& query, uint32_t k,
                                                      std::optional<float> min_score) = 0;
};

// ScoreSummary scores one mean-keys summary (n_kv_heads x head_dim) against
// a query exactly as evoked's Recover does with aggregation MEAN: the mean
// over query heads h of dot(q_h, summary[h / (n_query_heads / n_kv_heads)]).
// Returns nullopt when the shapes do not fit (summary empty, sizes not
// multiples, n_query_heads not a multiple of n_kv_heads).
std::optional<float> ScoreSummary(const RecoveryQuery& query, absl::Span<const float> summary);

struct PolicyInfo {
  std::string name;              // "recency", "streaming_llm", "h2o", ...
  bool recovers = false;         // ChooseRecoveries can return blocks.
  bool needs_attention = false;  // Uses CacheView::attention.
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual const PolicyInfo& info() const = 0;

  // ChooseEvictions returns resident blocks to evict so that
  //   pending_tokens + incoming_tokens + tokens of the blocks kept
  // fits view.budget_tokens (incoming: tokens about to enter, e.g. the next
  // decoded token or blocks about to be recovered). Empty when it fits.
  // Never returns the same block twice. RESOURCE_EXHAUSTED when even evicting
  // every evictable block cannot make room (the budget is below what the
  // policy protects: sinks, pending tokens, incoming tokens).
  virtual absl::StatusOr<std::vector<BlockHandle>> ChooseEvictions(const CacheView& view,
                                                                   uint64_t incoming_tokens) = 0;

  // ChooseRecoveries returns stored blocks to bring back now, in the order
  // to load them (the last one lands nearest the tail). Recovery-less
  // policies return an empty list. Errors of `source` come back unchanged:
  // the engine then decodes on without recovery (and counts it).
  virtual absl::StatusOr<std::vector<Candidate>> ChooseRecoveries(const CacheView& view,
                                                                  const RecoveryQuery& query,
                                                                  RecoverySource& source) = 0;
};

// Every parameter of every policy; each policy reads its own. Defaults are
// the published configurations.
struct PolicyParams {
  uint32_t block_tokens = 64;  // Tokens per block (all policies).
  uint32_t sink_tokens = 4;    // StreamingLLM, InfLLM, EVOKE: first tokens kept.
  // H2O: share of the budget kept for the most recent tokens; the rest goes
  // to the blocks with the most cumulative attention.
  double h2o_recent_share = 0.1;
  // SnapKV: queries in the observation window, max-pool kernel (tokens),
  // share of the budget kept for the most recent tokens (tail guard).
  uint32_t snapkv_window = 32;
  uint32_t snapkv_pool_kernel = 5;
  double snapkv_recent_share = 0.05;
  // InfLLM: evicted blocks brought back per decode chunk, representative
  // keys per block (the engine computes REPR_KEYS summaries with it).
  uint32_t infllm_topk = 8;
  uint32_t infllm_repr_tokens = 4;
  // EVOKE: blocks recovered at most per recovery point; the resident gate
  // (a stored block must beat the weakest resident one) is on by default.
  uint32_t evoke_topk = 4;
  bool evoke_resident_gate = true;
};

// PolicyNames lists the names MakePolicy accepts.
std::vector<std::string> PolicyNames();

// ParsePolicyParams applies "key=value,key=value" (keys as in PolicyParams
// without the policy prefix where unambiguous, e.g. "block_tokens=32,
// h2o_recent_share=0.2") to `params`. INVALID_ARGUMENT naming the key for
// an unknown key or a malformed or out-of-range value.
absl::Status ParsePolicyParams(absl::string_view spec, PolicyParams* params);

// MakePolicy creates the policy `name` (one of PolicyNames()).
// INVALID_ARGUMENT for an unknown name (listing the known ones) or
// parameters out of range (block_tokens 0, shares outside [0, 1), ...).
absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(absl::string_view name,
                                                   const PolicyParams& params = {});

// ValidateBudget checks that `budget_tokens` can hold what policy `name`
// protects with `params` plus one block (e.g. StreamingLLM: sinks + one
// block). INVALID_ARGUMENT naming budget_tokens otherwise.
absl::Status ValidateBudget(absl::string_view name, const PolicyParams& params,
                            uint64_t budget_tokens);

// MinBudget returns the smallest budget_tokens that ValidateBudget accepts
// for `name` with `params` (e.g. streaming_llm: sink_tokens + block_tokens;
// h2o: two blocks). Larger budgets are not all accepted when a recent share
// is above 1/3 (the guard rounds up to whole blocks): check them with
// ValidateBudget. INVALID_ARGUMENT as MakePolicy, or when no budget up to
// 2^24 tokens fits.
absl::StatusOr<uint64_t> MinBudget(absl::string_view name, const PolicyParams& params = {});

}  // namespace evoke::policy

#endif  // EVOKE_POLICY_POLICY_H_
