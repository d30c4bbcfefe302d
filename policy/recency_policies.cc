// recency and streaming_llm: evict the oldest blocks first (by first_token);
// streaming_llm keeps the attention sinks (blocks starting before
// sink_tokens).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "policy/policies_internal.h"
#include "policy/policy.h"

namespace evoke::policy::internal {
namespace {

class RecencyPolicy final : public Policy {
 public:
  RecencyPolicy(const PolicyParams& params, bool sinks)
      : info_{sinks ? "streaming_llm" : "recency", false, false},
        sink_tokens_(sinks ? params.sink_tokens : 0) {}

  const PolicyInfo& info() const override { return info_; }

  absl::StatusOr<std::vector<BlockHandle>> ChooseEvictions(const CacheView& view,
                                                           uint64_t incoming_tokens) override {
    if (HeldTokens(view) + incoming_tokens <= view.budget_tokens) return std::vector<BlockHandle>();
    order_.clear();
    for (uint32_t i = 0; i < view.resident.size(); ++i) {
      if (view.resident[i].first_token >= sink_tokens_) order_.push_back(i);
    }
    std::sort(order_.begin(), order_.end(), [&](uint32_t a, uint32_t b) {
      return view.resident[a].first_token < view.resident[b].first_token;
    });
    return EvictInOrder(view, incoming_tokens, order_, info_.name);
  }

  absl::StatusOr<std::vector<Candidate>> ChooseRecoveries(const CacheView&, const RecoveryQuery&,
                                                          RecoverySource&) override {
    return std::vector<Candidate>();
  }

 private:
  PolicyInfo info_;
  uint64_t sink_tokens_;
  std::vector<uint32_t> order_;  // Scratch.
};

}  // namespace

std::unique_ptr<Policy> NewRecencyPolicy(const PolicyParams& params, bool sinks) {
  return std::make_unique<RecencyPolicy>(params, sinks);
}

}  // namespace evoke::policy::internal
