// EngineCore: the state the TierManager, its Spiller, the Verifier and the
// Uploader share, behind the operations they perform on it. Internal to
// storage/.
#ifndef EVOKE_STORAGE_ENGINE_CORE_H_
#define EVOKE_STORAGE_ENGINE_CORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/copy_pool.h"
#include "storage/block_index.h"
#include "storage/host_tier.h"
#include "storage/quota_ledger.h"
#include "storage/spill_record.pb.h"
#include "storage/staging_budget.h"
#include "storage/tier.h"
#include "storage/tier_manager.h"

namespace evoke {

// "block <hex id>", as errors and logs name a block.
inline std::string BlockName(const BlockId& id) { return absl::StrCat("block ", id.ToHex()); }

// Locks: disk_mu before mu. `mu` guards the index and the counters and is
// never held across I/O or a payload copy. `disk_mu` serializes every
// mutation of tier 2 (write-back, the spill budget, deletes); while it is
// held no entry leaves the index, so write-back can read tier-1 bytes
// without `mu`.
//
// The index, the counters, the quota ledger and the records that failed
// validation are private. The Spiller, the verifier and the Uploader reach
// them only through the operations below, each one critical section (or
// one documented sequence of them). They take mu() themselves only where
// state of their own shares it (the Spiller's waiting saves, the Uploader's
// queue), and disk_mu() around a write-back or a spill-budget round. The
// TierManagerImpl, the owner, is a friend: its Save, Pin, Delete, List and
// Rebuild paths are the engine itself and work the index directly, under
// the same locks and annotations.
class EngineCore {
 public:
  EngineCore(const TierManagerOptions& options, std::unique_ptr<PinnedArena> arena,
             std::unique_ptr<Tier> disk);
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  // --- locks ---
  absl::Mutex* disk_mu() ABSL_LOCK_RETURNED(disk_mu_) { return &disk_mu_; }
  absl::Mutex* mu() const ABSL_LOCK_RETURNED(mu_) { return &mu_; }

  // --- configuration and the parts that lock themselves ---
  const TierManagerOptions& options() const { return options_; }
  int64_t NowMs() const { return absl::ToUnixMillis(clock_->Now()); }
  uint64_t high_bytes() const { return high_bytes_; }  // Tier 1 spills past this...
  uint64_t low_bytes() const { return low_bytes_; }    // ...down to this.
  // Tier 1. Thread-safe; tells NotifyRoom's waiters whenever bytes return.
  HostTier& host() { return host_; }
  const HostTier& host() const { return host_; }
  CopyPool& copier() { return copier_; }
  StagingBudget& staging() { return staging_; }  // Heap buffers of Loads outside tier 1.
  // Tier 2, to change it (Put, DropPayloads, Delete, Persist, Sync, Close):
  // disk_mu serializes every mutation. Reads go through ReadFromDisk.
  Tier* disk() ABSL_EXCLUSIVE_LOCKS_REQUIRED(disk_mu_) { return disk_.get(); }

  // RecordOf is the tier-2 record of an entry (payload_present is set by
  // the tier).
  static storage::SpillRecord RecordOf(const IndexEntry& e);
  // LogTierError logs a failed tier-2 write at most once every 10 s (a full
  // disk fails every round).
  void LogTierError(const absl::Status& s);

  // --- room in tier 1 ---
  // NotifyRoom wakes every save waiting in AwaitRoom (tier-1 bytes were
  // freed or became evictable, or the spiller is stopping).
  void NotifyRoom() { room_cv_.SignalAll(); }
  // AwaitRoom waits (releasing mu) for NotifyRoom or `deadline`.
  void AwaitRoom(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    room_cv_.WaitWithDeadline(&mu_, deadline);
  }
  // CanMakeRoom tells whether waiting could ever free `total` bytes of tier
  // 1: RESOURCE_EXHAUSTED (with the tier-1 capacity limit attached) when
  // `total` exceeds tier 1, or when what is free and what the spiller could
  // free (unpinned blocks, saves in flight) cannot cover it.
  absl::Status CanMakeRoom(uint64_t total) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // HasSpillErrors: a tier-2 write or drop has failed since the start.
  bool HasSpillErrors() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return counters_.spill_errors > 0;
  }

  // --- reading a block's bytes ---
  // ReadHold: what a reader of one block's bytes needs, taken in one
  // critical section so that the fields agree.
  struct ReadHold {
    uint64_t gen = 0;
    uint64_t checksum = 0;
    uint64_t payload_bytes = 0;
    bool on_disk = false;
    // The entry, when its tier-1 copy is readable, with a reader held on it:
    // the bytes (ram->ram.data()) stay in place until ReleaseReader(s).
    IndexEntry* ram = nullptr;
  };
  // HoldForRead fills a ReadHold for `e`, an entry in the index.
  ReadHold HoldForRead(IndexEntry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // HoldVisible is HoldForRead for `id`'s entry, unless it is absent or a
  // save's placeholder (nullopt).
  std::optional<ReadHold> HoldVisible(const BlockId& id) ABSL_LOCKS_EXCLUDED(mu_);
  // HoldGen is HoldForRead for `id` while it is still entry `gen` and has
  // bytes in tier 1 or 2, with its tier-2 record in `record`; nullopt (and
  // `record` untouched) when it was deleted, replaced or dropped.
  std::optional<ReadHold> HoldGen(const BlockId& id, uint64_t gen,
                                  storage::SpillRecord* record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ReleaseReader lets go of the reader a ReadHold took. With `corrupt` (its
  // tier-1 copy failed its checksum) the failure is counted and the copy
  // quarantined first, in the same critical section: it drops once no
  // reader is left.
  void ReleaseReader(IndexEntry* e, bool corrupt) ABSL_LOCKS_EXCLUDED(mu_);
  // ReleaseReaders lets go of several, in one critical section.
  void ReleaseReaders(absl::Span<IndexEntry* const> held) ABSL_LOCKS_EXCLUDED(mu_);
  // QuarantineRam counts a tier-1 copy that failed its checksum and
  // quarantines it (it drops when its last reader lets go).
  void QuarantineRam(IndexEntry* e) ABSL_LOCKS_EXCLUDED(mu_);

  // ReadFromDisk reads a block from tier 2 and copies it to `dest`, hashing
  // the tier's private copy (never `dest`, which a client may share), and
  // with `promote` also there. DATA_LOSS when the checksum fails, NOT_FOUND
  // when absent or replaced by another version meanwhile.
  absl::Status ReadFromDisk(const BlockId& id, uint64_t checksum, uint64_t payload_bytes,
                            uint8_t* dest, uint8_t* promote = nullptr);
  // DiskRead: the arguments and the outcome of one ReadFromDisk.
  struct DiskRead {
    BlockId id;
    uint64_t checksum = 0;
    uint64_t payload_bytes = 0;
    uint8_t* dest = nullptr;
    uint8_t* promote = nullptr;
    absl::Status status;
  };
  // ReadManyFromDisk runs ReadFromDisk for each of `reads`, up to
  // options().disk_reads_in_flight at once (this thread and the disk
  // readers), and returns when all have ended.
  void ReadManyFromDisk(absl::Span<DiskRead> reads);
  // DropCorruptDiskCopy counts a tier-2 copy of entry `gen` that failed its
  // checksum (ReadFromDisk's DATA_LOSS) and drops it: the block becomes a
  // breadcrumb, or keeps only its tier-1 copy. Takes disk_mu, then mu.
  void DropCorruptDiskCopy(const BlockId& id, uint64_t gen)
      ABSL_LOCKS_EXCLUDED(disk_mu_, mu_);
  // CommitPromotion makes `ram` (filled from tier 2) the block's tier-1
  // copy, unless the block changed meanwhile (then `ram` is freed). With
  // `hold`, returns the entry with a reader held (else nullptr); when
  // another Load promoted the same generation first, that entry (its
  // tier-1 copy holds the same bytes), and `ram` is freed.
  IndexEntry* CommitPromotion(const BlockId& id, uint64_t gen, ArenaReservation ram,
                              bool hold) ABSL_LOCKS_EXCLUDED(mu_);

  // --- counters ---
  void CountChecksumFailure() ABSL_LOCKS_EXCLUDED(mu_);
  void CountMiss() ABSL_LOCKS_EXCLUDED(mu_);

  // --- leaving tier 1 ---
  // Evict drops the tier-1 copy of `e`, a kClean entry without readers (its
  // bytes are in tier 2; it becomes kSpilled), counted as an eviction.
  // Returns the bytes freed (the extent's length).
  uint64_t Evict(IndexEntry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // EvictWritten evicts those of `entries` (held in the index by disk_mu)
  // that write-back made kClean and nobody reads or pins. Returns the bytes
  // freed.
  uint64_t EvictWritten(absl::Span<IndexEntry* const> entries)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(disk_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // EvictAllClean evicts every unpinned kClean entry without readers;
  // returns how many.
  uint64_t EvictAllClean() ABSL_LOCKS_EXCLUDED(mu_);
  // PickSpillVictims walks tier 1's LRU from the cold end until tier 1,
  // less the extents of the victims chosen, is at or under the low
  // watermark and leaves `wanted_total` bytes free, and (with
  // `wanted_range` > 0) has one free range of `wanted_range` bytes. Blocks
  // being read are passed over; clean ones leave at once (evictions); dirty
  // ones go to `victims`, one spill batch at most, for write-back. Returns
  // the bytes freed.
  uint64_t PickSpillVictims(uint64_t wanted_total, uint64_t wanted_range,
                            std::vector<IndexEntry*>* victims)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(disk_mu_, mu_);

  // --- write-back to tier 2 (disk_mu held throughout) ---
  // DirtyByAccess returns every kDirty entry, coldest first; the pointers
  // stay valid while disk_mu is held.
  std::vector<IndexEntry*> DirtyByAccess() ABSL_EXCLUSIVE_LOCKS_REQUIRED(disk_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);
  // TakeWriteBatch takes entries from the front of `entries` while the batch
  // is empty or the next one fits in spill_batch_bytes, and returns how many
  // it consumed. Each one still kDirty with a readable tier-1 copy is held (a
  // reader keeps its bytes in place while the tier copies them) and
  // appended to `batch`, with its record in `records` and in `fresh`
  // whether tier 2 holds no record of it yet. A record aliases its entry's
  // meta instead of copying it (a kDirty entry's meta never changes, and the
  // entry stays while disk_mu is held): the caller drops the aliases
  // (unsafe_arena_release_meta) before the records go.
  size_t TakeWriteBatch(absl::Span<IndexEntry* const> entries, std::vector<IndexEntry*>* batch,
                        std::vector<storage::SpillRecord>* records, std::vector<bool>* fresh)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(disk_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // FinishWriteBatch ends a batch after its tier-2 write: when `written` is
  // ok, each entry still kDirty becomes kClean and counts as a spill; else
  // the failure counts as a spill error. Every reader is released.
  void FinishWriteBatch(absl::Span<IndexEntry* const> batch, const absl::Status& written)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(disk_mu_) ABSL_LOCKS_EXCLUDED(mu_);

  // --- the spill budget ---
  // Tier-2 payloads chosen to leave tier 2, and what tier 2 is to do.
  struct DiskVictims {
    std::vector<IndexEntry*> entries;
    std::vector<bool> breadcrumb;  // Per entry: only in tier 2; a breadcrumb record stays.
    std::vector<storage::SpillRecord> records;  // Of the breadcrumbs; `drop` points here.
    std::vector<TierWrite> drop;   // Tier::DropPayloads: payloads of the breadcrumbs.
    std::vector<BlockId> forget;   // Tier::Delete: copies of blocks also in tier 1.
  };
  // PickBudgetVictims chooses the coldest tier-2 payloads past the spill
  // budget or, within it, past the first namespace's tier-2 quota found
  // (at most 4096 a call, visiting at most 2^20 entries). Returns false when
  // nothing is over (or nothing could be chosen).
  bool PickBudgetVictims(DiskVictims* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(disk_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);
  // FinishBudgetDrop records what tier 2 did with `victims`: when `dropped`
  // is ok each leaves tier 2 (breadcrumbs counted), else the failure counts
  // as a spill error and the index is unchanged.
  void FinishBudgetDrop(const DiskVictims& victims, const absl::Status& dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(disk_mu_) ABSL_LOCKS_EXCLUDED(mu_);

  // --- verification ---
  // VerifyTargets: with `ids` empty, fills it with every visible id and
  // `invalid` with every record that failed validation at start (and why);
  // else `invalid` gets those of `ids` that failed.
  void VerifyTargets(std::vector<BlockId>* ids,
                     std::vector<std::pair<BlockId, std::string>>* invalid)
      ABSL_LOCKS_EXCLUDED(mu_);
  // RemoveInvalidRecord deletes from tier 2 a record that failed validation
  // at start, then forgets it. Errors: the tier's (the record is kept).
  absl::Status RemoveInvalidRecord(const BlockId& id) ABSL_LOCKS_EXCLUDED(disk_mu_, mu_);

  // Stats reads occupancy and counters (tier 2's size outside `mu`).
  TierStats Stats() ABSL_LOCKS_EXCLUDED(mu_);

  // For tests that drive a Spiller without a TierManager (spiller_test.cc):
  // they make entries as a Save would.
  BlockIndex& index_for_testing() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return index_; }

 private:
  friend class TierManagerImpl;

  // QuarantineDisk drops a tier-2 copy that failed verification (the block
  // becomes a breadcrumb, or keeps only its tier-1 copy).
  void QuarantineDisk(const BlockId& id, uint64_t gen) ABSL_EXCLUSIVE_LOCKS_REQUIRED(disk_mu_);

  const TierManagerOptions options_;
  const Clock* const clock_;
  absl::Mutex disk_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  absl::CondVar room_cv_;    // Tier-1 bytes were freed or became evictable.
  absl::CondVar writes_cv_;  // An in-flight save finished.
  HostTier host_;            // Tells room_cv_ whenever bytes return.
  const std::unique_ptr<Tier> disk_;
  CopyPool copier_;
  CopyPool disk_readers_;  // Runs ReadManyFromDisk's reads, not copies.
  StagingBudget staging_;
  const uint64_t high_bytes_;
  const uint64_t low_bytes_;
  const absl::Time start_;
  std::atomic<int64_t> last_tier_error_log_s_{0};

  BlockIndex index_ ABSL_GUARDED_BY(mu_);
  // Records that failed validation at start, with the reason: on disk, not
  // in the index, never served.
  absl::flat_hash_map<BlockId, std::string> invalid_records_ ABSL_GUARDED_BY(mu_);
  StorageCounters counters_ ABSL_GUARDED_BY(mu_);
  // What Saves between their quota check and their commit have reserved.
  QuotaLedger quotas_ ABSL_GUARDED_BY(mu_);
};

}  // namespace evoke

#endif  // EVOKE_STORAGE_ENGINE_CORE_H_
