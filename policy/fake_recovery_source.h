// FakeRecoverySource: an in-memory RecoverySource for tests and the policy
// benchmark. Stored blocks carry a summary (n_kv_heads x head_dim floats) or
// a fixed score; Rank scores them with ScoreSummary (or the fixed score),
// skips resident ones, honours k and min_score, best first (ties: smaller
// handle first). SetError makes every Rank fail with a status.
#ifndef EVOKE_POLICY_FAKE_RECOVERY_SOURCE_H_
#define EVOKE_POLICY_FAKE_RECOVERY_SOURCE_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "policy/policy.h"

namespace evoke::policy {

class FakeRecoverySource final : public RecoverySource {
 public:
  void AddWithSummary(BlockHandle handle, uint32_t n_tokens, std::vector<float> summary) {
    blocks_[handle] = Block{n_tokens, std::move(summary), std::nullopt, false};
  }
  void AddWithScore(BlockHandle handle, uint32_t n_tokens, float score) {
    blocks_[handle] = Block{n_tokens, {}, score, false};
  }
  void SetResident(BlockHandle handle, bool resident) {
    if (auto it = blocks_.find(handle); it != blocks_.end()) it->second.resident = resident;
  }
  void SetError(absl::Status status) { error_ = std::move(status); }

  int calls() const { return calls_; }
  std::optional<float> last_min_score() const { return last_min_score_; }
  uint32_t last_k() const { return last_k_; }

  absl::StatusOr<std::vector<Candidate>> Rank(const RecoveryQuery& query, uint32_t k,
                                              std::optional<float> min_score) override {
    ++calls_;
    last_min_score_ = min_score;
    last_k_ = k;
    if (!error_.ok()) return error_;
    std::vector<Candidate> out;
    for (const auto& [handle, b] : blocks_) {
      if (b.resident) continue;
      std::optional<float> s = b.score.has_value() ? b.score : ScoreSummary(query, b.summary);
      if (!s.has_value()) continue;
      if (min_score.has_value() && *s < *min_score) continue;
      out.push_back(Candidate{handle, *s, b.n_tokens});
    }
    std::sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
      return a.score != b.score ? a.score > b.score : a.handle < b.handle;
    });
    if (out.size() > k) out.resize(k);
    return out;
  }

 private:
  struct Block {
    uint32_t n_tokens;
    std::vector<float> summary;
    std::optional<float> score;
    bool resident;
  };
  absl::flat_hash_map<BlockHandle, Block> blocks_;
  absl::Status error_;
  int calls_ = 0;
  std::optional<float> last_min_score_;
  uint32_t last_k_ = 0;
};

}  // namespace evoke::policy

#endif  // EVOKE_POLICY_FAKE_RECOVERY_SOURCE_H_
