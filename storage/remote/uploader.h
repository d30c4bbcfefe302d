// Uploader: write-behind of new blocks to tier 3 (the shared object store).
#ifndef EVOKE_STORAGE_REMOTE_UPLOADER_H_
#define EVOKE_STORAGE_REMOTE_UPLOADER_H_

#include <cstdint>
#include <deque>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/token_bucket.h"
#include "storage/engine_core.h"
#include "storage/remote/remote_tier.h"

namespace evoke {

// The Uploader owns one thread. Saves queue their new blocks (Enqueue, under
// the index lock: a push, nothing more); the thread takes up to
// remote_batch_blocks at a time, copies each one's bytes out of tier 1 (or
// reads its tier-2 copy), checks the copy against the block's checksum, and
// writes the batch to tier 3 with every write in flight at once. Nothing
// here is on a Save's acknowledgement path.
//
// Bounds: the queue holds at most remote_queue_bytes of payloads; past it
// new blocks are refused (dropped and counted), so that the heads of the
// chains already queued still go first. While tier 3 is down
// (breaker open) the thread waits and keeps what failed at the front of the
// queue; a block that changed or left the index meanwhile is skipped. A
// full pool (or one past its budget) drops what it refuses, counted.
// A budget (remote_write_bytes_per_s, a token bucket with bursts of
// remote_write_burst_bytes) paces the batches, so that write-behind takes
// no more of the disk, the memory bandwidth and the CPU (its copies and
// checksums cost per byte) than the operator gives it; queued blocks wait
// (and past the queue's bound, new ones are dropped).
// Queued blocks are not persisted: a restart forgets them (their local
// copies stay; a later Save of the same prefix on any host writes them).
class Uploader {
 public:
  Uploader(EngineCore* core, RemoteTier* remote);
  ~Uploader() { Stop(); }
  Uploader(const Uploader&) = delete;
  Uploader& operator=(const Uploader&) = delete;

  void Start();
  // Stop ends the thread; what is still queued is dropped (and counted).
  void Stop();

  // Enqueue queues a committed block for write-behind.
  void Enqueue(const IndexEntry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu());
  // EnqueueRemoval queues the removal of a deleted session block's remote
  // copy. Removals run on the same thread after any write of that block in
  // flight, so a copy being written is removed after it lands. Past
  // kMaxRemovals queued, they are dropped (counted; expiry removes them).
  void EnqueueRemoval(absl::string_view ns, const BlockId& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu());
  static constexpr size_t kMaxRemovals = 1 << 16;

  // WaitForIdle blocks until the queue is empty and nothing is in flight,
  // or `timeout` passes (false).
  bool WaitForIdle(absl::Duration timeout);

  // Fill adds the queue's figures to `stats`.
  void Fill(RemoteStats* stats) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu());

 private:
  struct Item {
    BlockId id;
    uint64_t gen = 0;
    uint64_t bytes = 0;
  };
  void Loop();
  // Round writes one batch taken from the queue (mu released inside).
  void Round() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu());
  // RemoveRound removes one batch of queued removals (mu released inside).
  void RemoveRound() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu());

  EngineCore* const core_;
  RemoteTier* const remote_;
  absl::CondVar cv_;       // Work queued, or stopping.
  absl::CondVar idle_cv_;  // The queue emptied and nothing is in flight.
  bool stop_ ABSL_GUARDED_BY(core_->mu()) = false;
  std::deque<Item> queue_ ABSL_GUARDED_BY(core_->mu());
  uint64_t queue_bytes_ ABSL_GUARDED_BY(core_->mu()) = 0;
  TokenBucket budget_ ABSL_GUARDED_BY(core_->mu());
  uint64_t paced_ ABSL_GUARDED_BY(core_->mu()) = 0;  // Waits for the budget.
  uint64_t inflight_ ABSL_GUARDED_BY(core_->mu()) = 0;
  uint64_t dropped_ ABSL_GUARDED_BY(core_->mu()) = 0;
  struct Removal {
    std::string ns;
    BlockId id;
  };
  std::deque<Removal> removals_ ABSL_GUARDED_BY(core_->mu());
  uint64_t removals_dropped_ ABSL_GUARDED_BY(core_->mu()) = 0;
  std::thread thread_;
};

}  // namespace evoke

#endif  // EVOKE_STORAGE_REMOTE_UPLOADER_H_
