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
    return EvictPastSinks(
        view, incoming_tokens, sink_tokens_,
        [](const ResidentBlock& x, const ResidentBlock& y) { return x.first_token < y.first_token; },
        info_.name, &order_);
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
