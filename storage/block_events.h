// BlockEventLog: what happened to blocks, in order, for watchers (a
// cache-aware router, an operator): stored, spilled, demoted, promoted,
// evicted, removed. The engine records an event at each change of a block's
// tiers; the log keeps the last `capacity` of them in a ring, numbered from
// 1, and readers catch up from any sequence number it still holds. A reader
// that falls further behind than the ring loses the oldest events, and is
// told how many (Read's `lost`). Sequence numbers start again with each
// process: `epoch` tells runs apart (resume tokens carry it).
#ifndef EVOKE_STORAGE_BLOCK_EVENTS_H_
#define EVOKE_STORAGE_BLOCK_EVENTS_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/hash128.h"
#include "evoke/v1/block.pb.h"
#include "storage/tier_types.h"

namespace evoke {

enum class BlockEventKind : uint8_t {
  kStored = 1,    // Saved into tier 1 (or revived from a breadcrumb).
  kSpilled = 2,   // Written to tier 2; still in tier 1.
  kDemoted = 3,   // Left tier 1; still in tier 2.
  kPromoted = 4,  // Read back from tier 2 into tier 1.
  kEvicted = 5,   // A copy was dropped (tier: which); the block may be a breadcrumb now.
  kRemoved = 6,   // Deleted from every tier.
  kExpired = 7,   // Its retention class's ttl ran out: it competes by recency again.
};

struct BlockEvent {
  uint64_t seq = 0;
  BlockEventKind kind = BlockEventKind::kStored;
  BlockId id;
  // The tier the event is about (a spill's is tier 2; an eviction's the
  // tier the copy left), and where the block's bytes are after it
  // (kBreadcrumb: nowhere on this host; after kRemoved, kBreadcrumb too).
  BlockLocation tier = BlockLocation::kHost;
  BlockLocation location = BlockLocation::kHost;
  v1::BlockKind block_kind = v1::BLOCK_KIND_UNSPECIFIED;
  int64_t unix_us = 0;
  std::string ns;
  std::string trust_group;
};

class BlockEventLog {
 public:
  // `capacity` events are kept (at least 1); `epoch` names this run.
  BlockEventLog(size_t capacity, uint64_t epoch);
  BlockEventLog(const BlockEventLog&) = delete;
  BlockEventLog& operator=(const BlockEventLog&) = delete;

  // Enable starts recording (before it, Record does nothing: a daemon that
  // no one ever watched pays nothing). Idempotent.
  void Enable() { enabled_.store(true, std::memory_order_release); }
  bool enabled() const { return enabled_.load(std::memory_order_acquire); }

  // Record appends one event (its seq assigned here). Quick: called with
  // the engine's index lock held.
  void Record(BlockEventKind kind, const BlockId& id, const v1::BlockMeta& meta,
              BlockLocation tier, BlockLocation location);

  uint64_t epoch() const { return epoch_; }
  // The seq the next event will get.
  uint64_t next_seq() const ABSL_LOCKS_EXCLUDED(mu_);

  // Read copies up to `max` events from seq `from` on into `out` (cleared)
  // and returns the seq to read from next. `lost` gets how many events
  // from `from` on the ring no longer holds (skipped).
  uint64_t Read(uint64_t from, size_t max, std::vector<BlockEvent>* out, uint64_t* lost) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // WaitForNew blocks until an event with seq >= `from` exists or
  // `timeout` passes; returns whether one does.
  bool WaitForNew(uint64_t from, absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const uint64_t epoch_;
  std::atomic<bool> enabled_{false};
  mutable absl::Mutex mu_;
  std::vector<BlockEvent> ring_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace evoke

#endif  // EVOKE_STORAGE_BLOCK_EVENTS_H_
