// Spiller: keeps tier 1 under its watermarks by writing cold blocks to tier
// 2, and tier 2 under its budget by turning the coldest into breadcrumbs.
#ifndef EVOKE_STORAGE_SPILLER_H_
#define EVOKE_STORAGE_SPILLER_H_

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "storage/engine_core.h"
#include "storage/tier_types.h"

namespace evoke {

// The Spiller owns one thread. It wakes when tier 1 passes its high
// watermark or a save waits for room, and walks the ram LRU from the cold
// end: clean blocks leave tier 1 at once, dirty ones are written to tier 2
// in batches (spill_batch_bytes) and then leave. It stops at the low
// watermark, or once every waiting save has room (in total, and one free
// range for the largest block). After each round it enforces the spill
// budget. A failing tier 2 (full, down) is counted, logged every 10 s, and
// retried every 50 ms; saves then wait and fail with RESOURCE_EXHAUSTED.
class Spiller {
 public:
  explicit Spiller(EngineCore* core);
  ~Spiller() { Stop(); }
  Spiller(const Spiller&) = delete;
  Spiller& operator=(const Spiller&) = delete;

  void Start();
  // Stop ends the thread and fails every WaitForRoom. Idempotent.
  void Stop();

  // Wake tells the spiller there may be work (tier 1 passed its high
  // watermark, a block became evictable).
  void Wake() { spill_cv_.Signal(); }

  // WaitForRoom blocks (releasing mu) until the spiller frees something or
  // `deadline` passes; the caller then retries its reservation. Fails at
  // once when waiting cannot help: `total` exceeds tier 1, pinned blocks
  // fill it, or the deadline passed. Errors: RESOURCE_EXHAUSTED (with the
  // tier-1 capacity limit attached), UNAVAILABLE (stopping).
  absl::Status WaitForRoom(uint64_t total, uint64_t largest, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu());

  // WriteBack writes the tier-1 bytes of dirty `entries` to tier 2 in
  // batches; each written entry becomes clean. Entries that changed
  // meanwhile are skipped. Stops at the first failing batch.
  absl::Status WriteBack(const std::vector<IndexEntry*>& entries, bool sync,
                         uint64_t* blocks, uint64_t* bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->disk_mu());

  // EnforceBudget drops the coldest tier-2 payloads past spill_bytes:
  // blocks only in tier 2 become breadcrumbs, blocks also in tier 1 lose
  // their disk copy.
  void EnforceBudget() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->disk_mu());

  // Flush writes every dirty block to tier 2 (coldest first, so that the
  // disk LRU keeps access order) and makes it durable; with `evict`, clean
  // unpinned blocks then leave tier 1. Errors: the tier's.
  // With `compact` false, tier 2 is only made durable (Tier::Sync), not
  // compacted: the shutdown's flush leaves that to the next start.
  absl::StatusOr<FlushResult> Flush(bool evict, bool compact = true);

  // WaitForIdle blocks until tier 1 is under its high watermark and nothing
  // is queued, or `timeout` passes (false). For tests and the demo.
  bool WaitForIdle(absl::Duration timeout);

 private:
  void Loop();
  // Round frees one batch; returns whether it made progress.
  bool Round();

  EngineCore* const core_;
  absl::CondVar spill_cv_;
  bool stop_ ABSL_GUARDED_BY(core_->mu()) = false;
  bool active_ ABSL_GUARDED_BY(core_->mu()) = false;  // Between high and low.
  bool busy_ ABSL_GUARDED_BY(core_->mu()) = false;
  int waiters_ ABSL_GUARDED_BY(core_->mu()) = 0;
  uint64_t wanted_total_ ABSL_GUARDED_BY(core_->mu()) = 0;
  uint64_t wanted_largest_ ABSL_GUARDED_BY(core_->mu()) = 0;
  std::thread thread_;
};

}  // namespace evoke

#endif  // EVOKE_STORAGE_SPILLER_H_
