// infllm and evoke: the policies that bring evicted blocks back.
//
// infllm keeps the sinks and evicts the oldest blocks (its local window is
// whatever the budget leaves after sinks and the top-K blocks). At each
// recovery point it ranks the stored blocks (source->Rank, k = infllm_topk),
// merges them with the resident recovered blocks scored on their summaries
// (ScoreSummary; a recovered block without a summary cannot stay in the set)
// and keeps the best infllm_topk as its current top-K set; it returns the
// members not resident yet. Eviction takes first the recovered blocks that
// left the top-K set (earliest loaded first), then the oldest non-sink blocks
// outside the set, and the set itself (weakest first) only as a last resort.
//
// evoke keeps the sinks and evicts by the time a block last entered the
// cache (recovered blocks count as new from the moment they return): the
// order is the cache position (first_position), which grows as tokens and
// recovered blocks land at the tail; ties by first_token. At a recovery point
// the resident gate asks for candidates scoring at least the weakest
// resident non-sink block (ScoreSummary over the blocks that have a summary;
// no gate when none has one), then returns up to evoke_topk of them, worst
// first so that the best lands nearest the tail.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "policy/policies_internal.h"
#include "policy/policy.h"

namespace evoke::policy::internal {
namespace {

class InfLLMPolicy final : public Policy {
 public:
  explicit InfLLMPolicy(const PolicyParams& params)
      : info_{"infllm", true, false}, sink_tokens_(params.sink_tokens), topk_(params.infllm_topk) {}

  const PolicyInfo& info() const override { return info_; }

  absl::StatusOr<std::vector<BlockHandle>> ChooseEvictions(const CacheView& view,
                                                           uint64_t incoming_tokens) override {
    if (Fits(view, incoming_tokens)) return std::vector<BlockHandle>();
    std::vector<uint32_t> left_set, old, in_set;
    for (uint32_t i = 0; i < view.resident.size(); ++i) {
      const ResidentBlock& b = view.resident[i];
      if (b.first_token < sink_tokens_) continue;
      if (rank_.contains(b.handle)) {
        in_set.push_back(i);
      } else if (b.recovered) {
        left_set.push_back(i);
      } else {
        old.push_back(i);
      }
    }
    std::sort(left_set.begin(), left_set.end(), [&](uint32_t a, uint32_t b) {
      return EarlierPosition(view.resident[a], view.resident[b]);
    });
    std::sort(old.begin(), old.end(), [&](uint32_t a, uint32_t b) {
      return view.resident[a].first_token < view.resident[b].first_token;
    });
    // The set's weakest (largest rank) first.
    std::sort(in_set.begin(), in_set.end(), [&](uint32_t a, uint32_t b) {
      return rank_.at(view.resident[a].handle) > rank_.at(view.resident[b].handle);
    });
    std::vector<uint32_t> order;
    order.reserve(view.resident.size());
    order.insert(order.end(), left_set.begin(), left_set.end());
    order.insert(order.end(), old.begin(), old.end());
    order.insert(order.end(), in_set.begin(), in_set.end());
    return EvictInOrder(view, incoming_tokens, order, info_.name);
  }

  absl::StatusOr<std::vector<Candidate>> ChooseRecoveries(const CacheView& view,
                                                          const RecoveryQuery& query,
                                                          RecoverySource& source) override {
    absl::StatusOr<std::vector<Candidate>> ranked = source.Rank(query, topk_, std::nullopt);
    if (!ranked.ok()) return ranked.status();
    struct Member {
      Candidate c;
      bool resident;
    };
    std::vector<Member> pool;
    absl::flat_hash_set<BlockHandle> seen;
    SummaryScorer scorer(query);
    for (const ResidentBlock& b : view.resident) {
      if (!b.recovered || b.first_token < sink_tokens_) continue;
      std::optional<float> s = scorer.Score(b.summary);
      if (!s.has_value()) continue;
      pool.push_back({{b.handle, *s, b.n_tokens}, true});
      seen.insert(b.handle);
    }
    for (const Candidate& c : *ranked) {
      if (seen.insert(c.handle).second) pool.push_back({c, false});
    }
    std::stable_sort(pool.begin(), pool.end(),
                     [](const Member& a, const Member& b) { return a.c.score > b.c.score; });
    if (pool.size() > topk_) pool.resize(topk_);
    rank_.clear();
    std::vector<Candidate> out;
    for (uint32_t r = 0; r < pool.size(); ++r) {
      rank_[pool[r].c.handle] = r;
      if (!pool[r].resident) out.push_back(pool[r].c);
    }
    SortRecoveriesAscending(&out);
    return out;
  }

 private:
  PolicyInfo info_;
  uint64_t sink_tokens_;
  uint32_t topk_;
  // The current top-K set: handle -> rank (0 = best).
  absl::flat_hash_map<BlockHandle, uint32_t> rank_;
};

class EvokePolicy final : public Policy {
 public:
  explicit EvokePolicy(const PolicyParams& params)
      : info_{"evoke", true, false},
        sink_tokens_(params.sink_tokens),
        topk_(params.evoke_topk),
        gate_(params.evoke_resident_gate) {}

  const PolicyInfo& info() const override { return info_; }

  absl::StatusOr<std::vector<BlockHandle>> ChooseEvictions(const CacheView& view,
                                                           uint64_t incoming_tokens) override {
    return EvictPastSinks(view, incoming_tokens, sink_tokens_, EarlierPosition, info_.name,
                          &order_);
  }

  absl::StatusOr<std::vector<Candidate>> ChooseRecoveries(const CacheView& view,
                                                          const RecoveryQuery& query,
                                                          RecoverySource& source) override {
    std::optional<float> min_score;
    if (gate_) {
      SummaryScorer scorer(query);
      for (const ResidentBlock& b : view.resident) {
        if (b.first_token < sink_tokens_ || b.summary.empty()) continue;
        std::optional<float> s = scorer.Score(b.summary);
        if (s.has_value() && (!min_score.has_value() || *s < *min_score)) min_score = s;
      }
    }
    absl::StatusOr<std::vector<Candidate>> ranked = source.Rank(query, topk_, min_score);
    if (!ranked.ok()) return ranked.status();
    std::vector<Candidate> out;
    for (const Candidate& c : *ranked) {
      if (min_score.has_value() && c.score < *min_score) continue;  // A source that ignored it.
      out.push_back(c);
      if (out.size() == topk_) break;
    }
    SortRecoveriesAscending(&out);
    return out;
  }

 private:
  PolicyInfo info_;
  uint64_t sink_tokens_;
  uint32_t topk_;
  bool gate_;
  std::vector<uint32_t> order_;  // Scratch.
};

}  // namespace

std::unique_ptr<Policy> NewInfLLMPolicy(const PolicyParams& params) {
  return std::make_unique<InfLLMPolicy>(params);
}

std::unique_ptr<Policy> NewEvokePolicy(const PolicyParams& params) {
  return std::make_unique<EvokePolicy>(params);
}

}  // namespace evoke::policy::internal
