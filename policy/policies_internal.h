// Internal to evoke_policy: the policy implementations behind MakePolicy and
// the eviction helper they share. Not part of the public API.
#ifndef EVOKE_POLICY_POLICIES_INTERNAL_H_
#define EVOKE_POLICY_POLICIES_INTERNAL_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "policy/policy.h"

namespace evoke::policy::internal {

// Tokens the view holds now: pending + every resident block.
uint64_t HeldTokens(const CacheView& view);

// Fits: whether what the view holds plus `incoming_tokens` fits its budget
// (no wrap-around for huge incoming counts).
inline bool Fits(const CacheView& view, uint64_t incoming_tokens) {
  const uint64_t held = HeldTokens(view);
  return held <= view.budget_tokens && incoming_tokens <= view.budget_tokens - held;
}

// EvictInOrder walks `order` (indices into view.resident, most evictable
// first) and takes blocks until pending + incoming + kept tokens fit
// view.budget_tokens. Empty when it fits already. RESOURCE_EXHAUSTED (naming
// `policy` and the protected tokens) when `order` runs out first.
absl::StatusOr<std::vector<BlockHandle>> EvictInOrder(const CacheView& view,
                                                      uint64_t incoming_tokens,
                                                      absl::Span<const uint32_t> order,
                                                      absl::string_view policy);

// EvictPastSinks: when pending + incoming + resident tokens exceed the
// budget, evicts (EvictInOrder) the resident blocks whose first token is at
// or past `sink_tokens`, in the order `before` sorts them (a strict weak
// order on ResidentBlock); `order` is the caller's scratch.
template <typename Before>
absl::StatusOr<std::vector<BlockHandle>> EvictPastSinks(const CacheView& view,
                                                        uint64_t incoming_tokens,
                                                        uint64_t sink_tokens, Before before,
                                                        absl::string_view policy,
                                                        std::vector<uint32_t>* order) {
  if (Fits(view, incoming_tokens)) return std::vector<BlockHandle>();
  order->clear();
  for (uint32_t i = 0; i < view.resident.size(); ++i) {
    if (view.resident[i].first_token >= sink_tokens) order->push_back(i);
  }
  std::sort(order->begin(), order->end(),
            [&](uint32_t a, uint32_t b) { return before(view.resident[a], view.resident[b]); });
  return EvictInOrder(view, incoming_tokens, *order, policy);
}

// Lower positions first, then older tokens: the order in which blocks that
// may have come back at the tail leave.
inline bool EarlierPosition(const ResidentBlock& x, const ResidentBlock& y) {
  return x.first_position != y.first_position ? x.first_position < y.first_position
                                              : x.first_token < y.first_token;
}

// SortRecoveriesAscending orders candidates worst first (best last, nearest
// the tail); ties keep their order.
void SortRecoveriesAscending(std::vector<Candidate>* candidates);

// Blocks of the H2O/SnapKV recent guard: max(1, ceil(share * budget /
// block_tokens)).
uint64_t RecentGuardBlocks(double share, uint64_t budget_tokens, uint32_t block_tokens);

// SummaryScorer scores many summaries against one query, as ScoreSummary
// does, but sums each KV head's group of query vectors once (the mean over a
// group's dot products is the dot product with the group's mean query), so a
// summary costs n_kv_heads x head_dim multiply-adds.
class SummaryScorer {
 public:
  explicit SummaryScorer(const RecoveryQuery& query) : query_(query) {}
  // Score returns nullopt when the shapes do not fit (see ScoreSummary).
  std::optional<float> Score(absl::Span<const float> summary);

 private:
  RecoveryQuery query_;
  uint64_t n_kv_ = 0;            // Shape `mean_` was made for (0: none yet).
  std::vector<float> mean_;      // n_kv x dim: each group's mean query.
};

// Factories (parameters validated by MakePolicy).
std::unique_ptr<Policy> NewRecencyPolicy(const PolicyParams& params, bool sinks);
std::unique_ptr<Policy> NewH2OPolicy(const PolicyParams& params);
std::unique_ptr<Policy> NewSnapKVPolicy(const PolicyParams& params);
std::unique_ptr<Policy> NewInfLLMPolicy(const PolicyParams& params);
std::unique_ptr<Policy> NewEvokePolicy(const PolicyParams& params);

}  // namespace evoke::policy::internal

#endif  // EVOKE_POLICY_POLICIES_INTERNAL_H_
