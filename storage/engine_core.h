// EngineCore: the state the TierManager, its Spiller, the Verifier and the
// Uploader share, behind the operations they perform on it. Internal to
// storage/.
#ifndef EVOKE_STORAGE_ENGINE_CORE_H_
#define EVOKE_STORAGE_ENGINE_CORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
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
#include "common/fingerprint.h"
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
// TierManagerImpl, the owner, goes through the same operations: lookups
// and the steps of its Save, Pin, Load and Delete paths, each under the
// lock its annotation names.
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

  // ExpireRetention ends the retention classes whose ttl is over (an
  // EXPIRED event each, when someone watches); the spiller calls it at
  // least every second, and eviction passes before they choose.
  void ExpireRetention() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    index_.ForgetEndedRetention(NowMs());
  }

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

  // CommitPrefetch is CommitPromotion for a Prefetch: the block becomes the
  // most recently used, marked prefetched (kPromoted). Otherwise `ram` is
  // freed: kInTier1 when a Load promoted the same generation meanwhile (it
  // is held as a prefetched block would be), kGone when it changed.
  enum class PrefetchCommit { kPromoted, kInTier1, kGone };
  PrefetchCommit CommitPrefetch(const BlockId& id, uint64_t gen, ArenaReservation ram)
      ABSL_LOCKS_EXCLUDED(mu_);
  // NoteLoaded: a Load read `e` (from tier 1 when `tier1`); the first Load
  // of a prefetched copy counts as a prefetch hit.
  void NoteLoaded(IndexEntry* e, bool tier1) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    e->prefetch_until_ms = 0;
    if (!e->prefetched) return;
    e->prefetched = false;
    if (tier1) ++counters_.prefetch_hits;
  }
  // HoldPrefetched protects `e`, in tier 1, from the spiller until a Load
  // reads it or options().prefetch_hold passes (as a keep would, within
  // kept_tier1_fraction); `brought` marks its copy as the Prefetch's own
  // (counted in `prefetched`).
  void HoldPrefetched(IndexEntry* e, bool brought) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t now_ms = NowMs();
    index_.Touch(e, now_ms);
    e->prefetch_until_ms = now_ms + absl::ToInt64Milliseconds(options_.prefetch_hold);
    e->prefetched |= brought;
    counters_.prefetched += brought;
  }
  void SetRetention(IndexEntry* e, RetentionClass c, int64_t until_ms)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    index_.SetRetention(e, c, until_ms);
  }

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

  // --- start-up ---
  // Rebuild fills the index from tier 2's records, before any other thread
  // runs: a record that `validate` refuses is kept out (counted, listed in
  // invalid records), the others are indexed and shown to the observer.
  absl::Status Rebuild(
      const std::function<absl::Status(const BlockId&, const v1::BlockMeta&)>& validate)
      ABSL_LOCKS_EXCLUDED(mu_);

  // --- lookups (the TierManager's calls) ---
  IndexEntry* Find(const BlockId& id) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return index_.Find(id);
  }
  // FindVisible: not a save's placeholder.
  IndexEntry* FindVisible(const BlockId& id) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return index_.FindVisible(id);
  }
  // FindGen: only while it is still entry `gen`.
  IndexEntry* FindGen(const BlockId& id, uint64_t gen) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return index_.FindGen(id, gen);
  }
  // IsInvalidRecord: a record that failed validation at start (on disk, not
  // in the index).
  bool IsInvalidRecord(const BlockId& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return invalid_records_.contains(id);
  }
  std::vector<BlockId> SessionIds(absl::string_view ns, absl::string_view session) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return index_.SessionIds(ns, session);
  }
  // KeepSession: BlockIndex::KeepSession; at most max_sessions kept at once
  // (RESOURCE_EXHAUSTED for one more).
  absl::StatusOr<size_t> KeepSession(absl::string_view ns, absl::string_view session,
                                     int64_t until_ms, size_t max_sessions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  NamespaceUsage Usage(absl::string_view ns) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return index_.Usage(ns);
  }
  // ListPage: BlockIndex::ListPage.
  std::optional<BlockId> ListPage(const ListFilter& filter, const BlockId* after, size_t limit,
                                  size_t max_visits, std::vector<BlockInfo>* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return index_.ListPage(filter, after, limit, max_visits, out);
  }

  // --- a Save's admission: quotas and the metadata budget ---
  // MetadataInUse: accounted metadata bytes, stored and reserved.
  uint64_t MetadataInUse() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return index_.metadata_bytes() + quotas_.pending_metadata();
  }
  // PendingQuota: what Saves between their check and their commit reserved
  // of `ns`'s quotas.
  QuotaNeed PendingQuota(absl::string_view ns) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return quotas_.Pending(ns);
  }
  QuotaLedger::Hold ChargeQuotas(const absl::flat_hash_map<std::string, QuotaNeed>& needs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return quotas_.Charge(needs);
  }
  // SettleQuotas ends a reservation that did not commit and wakes the Saves
  // waiting for it.
  void SettleQuotas(QuotaLedger::Hold* hold) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    quotas_.Settle(hold);
    writes_cv_.SignalAll();
  }
  // EvictCleanOf drops up to `want` bytes of `ns`'s clean, unread, unpinned
  // tier-1 copies, coldest first (a bounded walk); returns the bytes freed.
  uint64_t EvictCleanOf(absl::string_view ns, uint64_t want) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DirtyOf returns up to `want` bytes of `ns`'s coldest dirty entries (a
  // bounded walk); they stay valid while disk_mu is held.
  std::vector<IndexEntry*> DirtyOf(absl::string_view ns, uint64_t want)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(disk_mu_) ABSL_LOCKS_EXCLUDED(mu_);

  // --- a Save's placeholders and commit ---
  // AwaitWrites waits (releasing mu) until a save in flight ends, or
  // `deadline`; true when the deadline passed.
  bool AwaitWrites(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return writes_cv_.WaitWithDeadline(&mu_, deadline);
  }
  IndexEntry* BeginWrite(const BlockId& id, bool* revived) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return index_.BeginWrite(id, revived);
  }
  // EndWrites: the reservations of a Save's commit settle (its blocks are in
  // the index's usage, or never will be) and the saves waiting for it wake.
  void EndWrites(QuotaLedger::Hold* hold) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    quotas_.SettleCommitted(hold);
    writes_cv_.SignalAll();
  }
  void AbortWrite(IndexEntry* e, bool revived) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    index_.AbortWrite(e, revived);
  }
  // CommitWrite makes placeholder `e` a block: `meta` (complete: checksum,
  // sizes), its layout digest, `ram` as its tier-1 copy, pinned by `pin`
  // when set; counted as a save.
  void CommitWrite(IndexEntry* e, v1::BlockMeta meta, const FingerprintDigest& digest,
                   ArenaReservation ram, std::optional<PinOwner> pin, int64_t now_ms)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deduplicated: a Save of a block already stored, counted and touched.
  void Deduplicated(IndexEntry* e, int64_t now_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    index_.Touch(e, now_ms);
    ++counters_.dedups;
  }

  // --- pins and access ---
  void Touch(IndexEntry* e, int64_t now_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    index_.Touch(e, now_ms);
  }
  void AddPin(IndexEntry* e, PinOwner owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    index_.AddPin(e, owner);
  }
  void RemovePin(IndexEntry* e, PinOwner owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    index_.RemovePin(e, owner);
  }
  uint32_t PinsOf(const IndexEntry& e, PinOwner owner) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return index_.PinsOf(e, owner);
  }
  uint64_t ReleaseOwner(PinOwner owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return index_.ReleaseOwner(owner);
  }
  // AttachForPin makes `ram` (filled from tier 2) the tier-1 copy of `e`,
  // pinned by `owner`; counted as a promotion.
  void AttachForPin(IndexEntry* e, ArenaReservation ram, PinOwner owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountChecksumFailureLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++counters_.checksum_failures;
  }

  // --- a Load's bookkeeping ---
  // CountMissLocked: a Load of a block no tier holds.
  void CountMissLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ++counters_.misses; }
  // FinishLoad lets go of the readers a Load held and counts its hits (and
  // the Load, when it succeeded).
  void FinishLoad(absl::Span<IndexEntry* const> held, uint64_t hits_tier1, uint64_t hits_tier2,
                  uint64_t loaded) ABSL_LOCKS_EXCLUDED(mu_);

  // --- removal ---
  // Remove takes `e` out of the index (counted as a delete).
  void Remove(IndexEntry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    index_.Remove(e);
    ++counters_.deletes;
  }
  // ForgetInvalidRecord: a record that failed validation at start was
  // deleted from tier 2 (counted as a delete); false when there was none.
  bool ForgetInvalidRecord(const BlockId& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (invalid_records_.erase(id) == 0) return false;
    ++counters_.deletes;
    return true;
  }

  // For tests that drive a Spiller without a TierManager (spiller_test.cc):
  // they make entries as a Save would.
  BlockIndex& index_for_testing() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return index_; }

 private:
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
