#include "policy/session_driver.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace evoke::policy {

SessionDriver::SessionDriver(Policy* policy, BlockEngine* engine, RecoverySource* source,
                             AttentionStats* attention, const DriverOptions& options)
    : policy_(policy), engine_(engine), source_(source), attention_(attention), options_(options) {
  if (options_.block_tokens == 0) options_.block_tokens = 1;
}

uint64_t SessionDriver::resident_tokens() const {
  uint64_t total = pending_;
  for (const ResidentBlock& b : resident_) total += b.n_tokens;
  return total;
}

CacheView SessionDriver::View() const {
  CacheView view;
  view.layer = options_.layer;
  view.head = options_.head;
  view.budget_tokens = options_.budget_tokens;
  view.pending_tokens = pending_;
  view.session_tokens = session_tokens_;
  view.resident = resident_;
  view.attention = attention_;
  return view;
}

absl::Status SessionDriver::MakeRoom(uint64_t incoming) {
  EVOKE_ASSIGN_OR_RETURN(std::vector<BlockHandle> victims,
                         policy_->ChooseEvictions(View(), incoming));
  return EvictBlocks(victims);
}

absl::Status SessionDriver::EvictBlocks(absl::Span<const BlockHandle> victims) {
  for (BlockHandle handle : victims) {
    auto it = std::find_if(resident_.begin(), resident_.end(),
                           [&](const ResidentBlock& b) { return b.handle == handle; });
    if (it == resident_.end()) {
      return absl::InternalError(
          absl::StrCat(policy_->info().name, " chose block ", handle, ", which is not resident"));
    }
    const bool stored = stored_.contains(handle);
    const absl::Time start = absl::Now();
    absl::StatusOr<uint64_t> moved = engine_->Evict(*it, stored);
    stats_.engine_time += absl::Now() - start;
    if (!moved.ok()) return moved.status();
    stats_.bytes_moved += *moved;
    if (stored) {
      ++stats_.blocks_dropped;
    } else {
      ++stats_.blocks_saved;
      stored_[handle] = StoredBlock{it->first_token, it->n_tokens};
    }
    if (attention_ != nullptr) attention_->Forget(handle);
    resident_.erase(it);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<BlockHandle>> SessionDriver::TokenDecoded(int64_t position) {
  if (pending_ == 0) pending_first_position_ = position;
  ++pending_;
  ++session_tokens_;
  const uint64_t sinks = options_.sink_tokens;
  const bool boundary = (sinks > 0 && session_tokens_ == sinks) ||
                        (session_tokens_ > sinks &&
                         (session_tokens_ - sinks) % options_.block_tokens == 0);
  if (!boundary) return std::optional<BlockHandle>();
  ResidentBlock block;
  block.handle = next_handle_++;
  block.first_token = session_tokens_ - pending_;
  block.n_tokens = static_cast<uint32_t>(pending_);
  block.first_position = pending_first_position_;
  resident_.push_back(block);
  pending_ = 0;
  return std::optional<BlockHandle>(block.handle);
}

uint64_t SessionDriver::tokens_to_boundary() const {
  const uint64_t sinks = options_.sink_tokens;
  if (sinks > 0 && session_tokens_ < sinks) return sinks - session_tokens_;
  return options_.block_tokens - (session_tokens_ - sinks) % options_.block_tokens;
}

uint64_t SessionDriver::DropPendingTokens() {
  const uint64_t dropped = pending_;
  session_tokens_ -= pending_;
  pending_ = 0;
  return dropped;
}

void SessionDriver::PositionsShifted(int64_t from, int64_t delta) {
  for (ResidentBlock& b : resident_) {
    if (b.first_position >= from) b.first_position += delta;
  }
  if (pending_ > 0 && pending_first_position_ >= from) pending_first_position_ += delta;
}

absl::Status SessionDriver::SetSummary(BlockHandle block, std::vector<float> summary) {
  auto it = std::find_if(resident_.begin(), resident_.end(),
                         [&](const ResidentBlock& b) { return b.handle == block; });
  if (it == resident_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("block: ", block, " is not resident"));
  }
  std::vector<float>& kept = summaries_[block];
  kept = std::move(summary);
  // The vector's buffer survives rehashing of summaries_ (moves keep it).
  it->summary = kept;
  return absl::OkStatus();
}

void SessionDriver::RecoveryFailed(const absl::Status& status) {
  ++stats_.recovery_failures;
  if (!source_down_) {
    EVOKE_LOG_WARNING("policy ", policy_->info().name,
                      ": recovery failed, decoding on without it until it works again: ",
                      status.ToString());
    source_down_ = true;
  }
}

absl::Status SessionDriver::RecoveryPoint(const RecoveryQuery& query, int64_t* next_position) {
  ++stats_.recovery_points;
  if (source_ == nullptr || !policy_->info().recovers) return absl::OkStatus();
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<Candidate>> chosen =
      policy_->ChooseRecoveries(View(), query, *source_);
  stats_.engine_time += absl::Now() - start;
  if (!chosen.ok()) {
    RecoveryFailed(chosen.status());
    return absl::OkStatus();
  }
  // Keep stored, non-resident candidates, with the books' token counts.
  struct Pick {
    BlockHandle handle;
    StoredBlock stored;
  };
  std::vector<Pick> picks;
  for (const Candidate& c : *chosen) {
    auto it = stored_.find(c.handle);
    if (it == stored_.end()) continue;
    const bool resident = std::any_of(resident_.begin(), resident_.end(),
                                      [&](const ResidentBlock& b) { return b.handle == c.handle; });
    const bool twice = std::any_of(picks.begin(), picks.end(),
                                   [&](const Pick& p) { return p.handle == c.handle; });
    if (resident || twice) continue;
    picks.push_back({c.handle, it->second});
  }
  // Make room, dropping the weakest picks (first) while the policy says
  // they cannot fit. An engine's error while evicting (evoked's
  // RESOURCE_EXHAUSTED for a tier full of pinned blocks among them) is
  // returned as it is.
  size_t first = 0;
  while (first < picks.size()) {
    uint64_t incoming = 0;
    for (size_t i = first; i < picks.size(); ++i) incoming += picks[i].stored.n_tokens;
    absl::StatusOr<std::vector<BlockHandle>> victims = policy_->ChooseEvictions(View(), incoming);
    if (victims.ok()) {
      EVOKE_RETURN_IF_ERROR(EvictBlocks(*victims));
      break;
    }
    if (victims.status().code() != absl::StatusCode::kResourceExhausted) return victims.status();
    ++first;
  }
  for (size_t i = first; i < picks.size(); ++i) {
    const Pick& p = picks[i];
    const absl::Time bring_start = absl::Now();
    absl::StatusOr<uint64_t> moved = engine_->Bring(p.handle, p.stored.n_tokens, *next_position);
    stats_.engine_time += absl::Now() - bring_start;
    if (!moved.ok()) {
      RecoveryFailed(moved.status());
      return absl::OkStatus();
    }
    ResidentBlock block;
    block.handle = p.handle;
    block.first_token = p.stored.first_token;
    block.n_tokens = p.stored.n_tokens;
    block.first_position = *next_position;
    block.recovered = true;
    if (auto s = summaries_.find(p.handle); s != summaries_.end()) block.summary = s->second;
    resident_.push_back(block);
    *next_position += p.stored.n_tokens;
    ++stats_.blocks_recovered;
    stats_.bytes_moved += *moved;
  }
  if (source_down_) {
    EVOKE_LOG_INFO("policy ", policy_->info().name, ": recovery works again");
    source_down_ = false;
  }
  return absl::OkStatus();
}

}  // namespace evoke::policy
