#include "policy/evoked_source.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/status_macros.h"

namespace evoke::policy {
namespace {
constexpr uint32_t kMaxK = 1024;  // RecoverRequest.k's limit.
}  // namespace

EvokedRecoverySource::EvokedRecoverySource(Client* client, EvokedSourceOptions options)
    : client_(client), options_(std::move(options)) {}

void EvokedRecoverySource::Register(BlockHandle handle, const BlockId& id, uint32_t n_tokens,
                                    bool resident) {
  Forget(handle);
  if (auto old = handles_.find(id); old != handles_.end()) blocks_.erase(old->second);
  blocks_[handle] = Entry{id, n_tokens, resident};
  handles_[id] = handle;
}

void EvokedRecoverySource::Forget(BlockHandle handle) {
  auto it = blocks_.find(handle);
  if (it == blocks_.end()) return;
  handles_.erase(it->second.id);
  blocks_.erase(it);
}

void EvokedRecoverySource::SetResident(BlockHandle handle, bool resident) {
  auto it = blocks_.find(handle);
  if (it != blocks_.end()) it->second.resident = resident;
}

std::optional<BlockId> EvokedRecoverySource::IdOf(BlockHandle handle) const {
  auto it = blocks_.find(handle);
  if (it == blocks_.end()) return std::nullopt;
  return it->second.id;
}

absl::StatusOr<std::vector<Candidate>> EvokedRecoverySource::Rank(const RecoveryQuery& query,
                                                                  uint32_t k,
                                                                  std::optional<float> min_score) {
  std::vector<Candidate> out;
  if (k == 0) return out;
  v1::RecoverRequest request;
  bool any_stored = false;
  for (const auto& [handle, entry] : blocks_) {
    if (entry.resident) {
      request.add_exclude_ids(entry.id.ToBytes());
    } else {
      any_stored = true;
    }
  }
  if (!any_stored) return out;
  request.mutable_session()->set_namespace_(options_.ns);
  request.mutable_session()->set_session_id(options_.session_id);
  request.set_kind(options_.kind);
  request.set_layer(options_.layer);
  request.mutable_queries()->Add(query.queries.begin(), query.queries.end());
  request.set_n_query_heads(query.n_query_heads);
  const uint32_t want = std::min(k + options_.prefetch, kMaxK);
  request.set_k(want);
  if (min_score.has_value()) request.set_min_score(*min_score);
  request.set_aggregation(v1::AGGREGATION_MEAN);
  request.set_require_bytes(options_.require_bytes);
  EVOKE_ASSIGN_OR_RETURN(v1::RecoverResponse response, client_->Recover(request));
  auto collect = [&](const v1::RecoverResponse& r) {
    out.clear();
    for (const v1::RecoveredBlock& block : r.blocks()) {
      absl::StatusOr<BlockId> id = BlockId::FromBytes(block.id());
      if (!id.ok()) continue;
      auto h = handles_.find(*id);
      if (h == handles_.end()) continue;
      const Entry& entry = blocks_.at(h->second);
      if (entry.resident) continue;
      out.push_back(Candidate{h->second, block.score(), entry.n_tokens});
      if (out.size() == want) break;
    }
  };
  collect(response);
  // Blocks of the session this source never registered (an earlier process
  // of the same session id) can fill the answer: ask once more for as many
  // as evoked returns.
  if (out.size() < k && static_cast<uint32_t>(response.blocks_size()) == request.k() &&
      request.k() < kMaxK) {
    request.set_k(kMaxK);
    EVOKE_ASSIGN_OR_RETURN(response, client_->Recover(request));
    collect(response);
  }
  if (out.size() > k) {
    std::vector<BlockId> next;
    for (size_t i = k; i < out.size(); ++i) next.push_back(blocks_.at(out[i].handle).id);
    out.resize(k);
    if (client_->Prefetch(next).ok()) {
      prefetched_ += next.size();
    } else {
      ++prefetch_failures_;
    }
  }
  return out;
}

}  // namespace evoke::policy
