// h2o and snapkv: keep the most recent blocks (a share of the budget, whole
// blocks, at least one), evict the rest by the attention they received,
// least first (ties: older first). H2O scores by cumulative attention since
// the block entered the cache, SnapKV by the pooled mass of the observation
// window (AttentionStats::Cumulative / Window). Neither keeps sinks (as
// published): a sink block that draws attention is kept as a heavy hitter.
// Without attention statistics every score is 0 and both evict by recency.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "policy/attention_stats.h"
#include "policy/policies_internal.h"
#include "policy/policy.h"

namespace evoke::policy::internal {
namespace {

class HeavyHitterPolicy final : public Policy {
 public:
  HeavyHitterPolicy(const char* name, bool window, double recent_share, uint32_t block_tokens)
      : info_{name, false, true},
        window_(window),
        recent_share_(recent_share),
        block_tokens_(block_tokens) {}

  const PolicyInfo& info() const override { return info_; }

  absl::StatusOr<std::vector<BlockHandle>> ChooseEvictions(const CacheView& view,
                                                           uint64_t incoming_tokens) override {
    if (Fits(view, incoming_tokens)) return std::vector<BlockHandle>();
    const size_t n = view.resident.size();
    // Newest first; the first `guard` are protected.
    order_.resize(n);
    for (uint32_t i = 0; i < n; ++i) order_[i] = i;
    std::sort(order_.begin(), order_.end(), [&](uint32_t a, uint32_t b) {
      return view.resident[a].first_token > view.resident[b].first_token;
    });
    const size_t guard = static_cast<size_t>(
        std::min<uint64_t>(n, RecentGuardBlocks(recent_share_, view.budget_tokens, block_tokens_)));
    scored_.clear();
    for (size_t j = guard; j < n; ++j) {
      const ResidentBlock& b = view.resident[order_[j]];
      double score = 0;
      if (view.attention != nullptr) {
        score = window_ ? view.attention->Window(b.handle, view.layer, view.head)
                        : view.attention->Cumulative(b.handle, view.layer, view.head);
      }
      scored_.push_back({score, b.first_token, order_[j]});
    }
    std::sort(scored_.begin(), scored_.end(), [](const Scored& a, const Scored& b) {
      if (a.score != b.score) return a.score < b.score;
      return a.first_token < b.first_token;
    });
    order_.clear();
    for (const Scored& s : scored_) order_.push_back(s.index);
    return EvictInOrder(view, incoming_tokens, order_, info_.name);
  }

  absl::StatusOr<std::vector<Candidate>> ChooseRecoveries(const CacheView&, const RecoveryQuery&,
                                                          RecoverySource&) override {
    return std::vector<Candidate>();
  }

 private:
  struct Scored {
    double score;
    uint64_t first_token;
    uint32_t index;
  };
  PolicyInfo info_;
  bool window_;
  double recent_share_;
  uint32_t block_tokens_;
  std::vector<uint32_t> order_;  // Scratch.
  std::vector<Scored> scored_;   // Scratch.
};

}  // namespace

std::unique_ptr<Policy> NewH2OPolicy(const PolicyParams& params) {
  return std::make_unique<HeavyHitterPolicy>("h2o", /*window=*/false, params.h2o_recent_share,
                                             params.block_tokens);
}

std::unique_ptr<Policy> NewSnapKVPolicy(const PolicyParams& params) {
  return std::make_unique<HeavyHitterPolicy>("snapkv", /*window=*/true,
                                             params.snapkv_recent_share, params.block_tokens);
}

}  // namespace evoke::policy::internal
