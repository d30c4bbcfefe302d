#include "storage/block_events.h"

#include <algorithm>

namespace evoke {

BlockEventLog::BlockEventLog(size_t capacity, uint64_t epoch)
    : epoch_(epoch), ring_(std::max<size_t>(capacity, 1)) {}

void BlockEventLog::Record(BlockEventKind kind, const BlockId& id, const v1::BlockMeta& meta,
                           BlockLocation tier, BlockLocation location) {
  if (!enabled()) return;
  const int64_t now_us = absl::ToUnixMicros(absl::Now());
  absl::MutexLock lock(&mu_);
  // Slots are reused: their strings keep their capacity, so a warm ring
  // records without allocating.
  BlockEvent& e = ring_[next_ % ring_.size()];
  e.seq = next_++;
  e.kind = kind;
  e.id = id;
  e.tier = tier;
  e.location = location;
  e.block_kind = meta.kind();
  e.unix_us = now_us;
  e.ns.assign(meta.fingerprint().namespace_());
  e.trust_group.assign(meta.fingerprint().trust_group());
}

uint64_t BlockEventLog::next_seq() const {
  absl::MutexLock lock(&mu_);
  return next_;
}

uint64_t BlockEventLog::Read(uint64_t from, size_t max, std::vector<BlockEvent>* out,
                             uint64_t* lost) const {
  out->clear();
  *lost = 0;
  absl::MutexLock lock(&mu_);
  const uint64_t oldest = next_ > ring_.size() ? next_ - ring_.size() : 1;
  if (from < oldest) {
    *lost = oldest - from;
    from = oldest;
  }
  const uint64_t end = std::min<uint64_t>(next_, from + max);
  for (uint64_t s = from; s < end; ++s) out->push_back(ring_[s % ring_.size()]);
  return std::max(from, end);
}

bool BlockEventLog::WaitForNew(uint64_t from, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto ready = [this, from]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return next_ > from; };
  return mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
}

}  // namespace evoke
