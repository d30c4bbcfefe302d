// TierManagerImpl: the storage engine behind the TierManager interface.
// Internal to storage/ (leveldb's DB / DBImpl split): engines and the daemon
// see only storage/tier_manager.h.
#ifndef EVOKE_STORAGE_TIER_MANAGER_IMPL_H_
#define EVOKE_STORAGE_TIER_MANAGER_IMPL_H_

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "storage/engine_core.h"
#include "storage/spiller.h"
#include "storage/remote/uploader.h"
#include "storage/tier_manager.h"

namespace evoke {

// One item of a Save, from reservation to commit.
struct SavePlan {
  BlockId id;
  FingerprintDigest digest;
  bool fresh = false;    // New bytes (a new id, or a breadcrumb revived).
  bool revived = false;  // Fresh bytes for a breadcrumb.
  uint64_t existing_gen = 0;
  uint64_t existing_checksum = 0;
  IndexEntry* entry = nullptr;  // Fresh: the placeholder.
  ArenaReservation ram;         // Fresh: where the bytes go.
  uint64_t checksum = 0;        // Of the bytes received.
  std::optional<v1::Summary> summary;
};

class TierManagerImpl final : public TierManager {
 public:
  TierManagerImpl(const TierManagerOptions& options, std::unique_ptr<PinnedArena> arena,
                  std::unique_ptr<Tier> disk)
      : core_(options, std::move(arena), std::move(disk)), spiller_(&core_) {
    if (options.remote != nullptr) uploader_ = std::make_unique<Uploader>(&core_, options.remote);
  }
  ~TierManagerImpl() override {
    if (uploader_ != nullptr) uploader_->Stop();
    spiller_.Stop();
  }

  absl::Status Rebuild();
  // ValidateRecord checks a record read at start as a Save would check it.
  absl::Status ValidateRecord(const BlockId& id, const v1::BlockMeta& meta) const;
  void Start() {
    spiller_.Start();
    if (uploader_ != nullptr) uploader_->Start();
  }

  absl::StatusOr<std::vector<SavedBlock>> Save(absl::Span<const SaveItem> items,
                                               SaveSource& source, bool durable,
                                               absl::Time deadline, PinOwner owner) override;
  absl::Status Load(absl::Span<const BlockId> ids, const v1::LayoutFingerprint& fingerprint,
                    LoadSink& sink, std::vector<v1::BlockMeta>* metas,
                    std::vector<LoadedInfo>* infos, const NamespaceScope* scope) override;
  std::vector<BlockLocation> Lookup(absl::Span<const BlockId> ids,
                                    const NamespaceScope* scope) override;
  std::vector<BlockLocation> LookupFleet(absl::Span<const BlockId> ids, absl::string_view ns,
                                         absl::string_view trust_group,
                                         const NamespaceScope* scope) override;
  bool WaitForRemoteIdle(absl::Duration timeout) override {
    return uploader_ == nullptr || uploader_->WaitForIdle(timeout);
  }
  absl::Status Delete(absl::Span<const BlockId> ids, const NamespaceScope* scope) override;
  absl::StatusOr<uint32_t> DropSession(absl::string_view ns,
                                       absl::string_view session_id) override;
  absl::Status Pin(absl::Span<const BlockId> ids, PinOwner owner,
                   absl::Time deadline, const NamespaceScope* scope) override;
  absl::Status Unpin(absl::Span<const BlockId> ids, PinOwner owner,
                     const NamespaceScope* scope) override;
  uint64_t ReleaseOwner(PinOwner owner) override;
  absl::StatusOr<size_t> KeepSession(absl::string_view ns, absl::string_view session_id,
                                     absl::Duration keep) override;
  absl::StatusOr<std::vector<BlockLocation>> Acquire(absl::Span<const BlockId> ids,
                                                     PinOwner owner, bool all,
                                                     const NamespaceScope* scope) override;
  absl::StatusOr<PrefetchResult> Prefetch(absl::Span<const BlockId> ids,
                                          const v1::LayoutFingerprint* fingerprint,
                                          absl::Time deadline,
                                          const NamespaceScope* scope) override;
  absl::Status SetRetention(absl::Span<const BlockId> ids, RetentionClass c, absl::Duration ttl,
                            const NamespaceScope* scope) override;
  absl::StatusOr<BlockInfo> Describe(const BlockId& id, const NamespaceScope* scope) override;
  std::vector<BlockInfo> List(const ListFilter& filter, const BlockId* after, size_t limit,
                              bool* more) override;
  TierStats Stats() override;
  NamespaceUsage Usage(absl::string_view ns) override {
    absl::MutexLock lock(core_.mu());
    return core_.Usage(ns);
  }
  absl::StatusOr<VerifyReport> Verify(absl::Span<const BlockId> ids,
                                      const NamespaceScope* scope) override;
  absl::StatusOr<FlushResult> Flush(bool evict) override;
  absl::Status Shutdown() override;
  bool WaitForSpillerIdle(absl::Duration timeout) override {
    return spiller_.WaitForIdle(timeout);
  }
  void VisitMetas(absl::Span<const BlockId> ids,
                  absl::FunctionRef<void(size_t, const v1::BlockMeta&)> visit) override {
    absl::ReaderMutexLock lock(core_.mu());
    for (size_t i = 0; i < ids.size(); ++i) {
      // Find, not FindVisible: a breadcrumb being re-saved keeps the meta
      // the observer was last told of until its save commits.
      if (const IndexEntry* e = core_.Find(ids[i]); e != nullptr) visit(i, e->meta);
    }
  }

 private:
  // Save, in three phases.
  // EnforceQuotas refuses a Save past the metadata budget or a namespace's
  // quota, counting what concurrent Saves have reserved, and reserves this
  // Save's share in `hold` (EngineCore::ChargeQuotas). Over a tier-1 quota it first
  // makes room from the namespace's own blocks: clean ones leave tier 1,
  // dirty ones are written back first.
  absl::Status EnforceQuotas(absl::Span<const SaveItem> items,
                             absl::Span<const SavePlan> plans, bool durable,
                             absl::Time deadline, QuotaLedger::Hold* hold);
  // WriteBackOf writes up to `want` bytes of `ns`'s coldest dirty blocks to
  // tier 2 and evicts them from tier 1.
  absl::Status WriteBackOf(const std::string& ns, uint64_t want);
  absl::Status ReserveForSave(absl::Span<const SaveItem> items, absl::Time deadline,
                              std::vector<SavePlan>* plans);
  absl::Status CopyIn(absl::Span<const SaveItem> items, SaveSource& source,
                      std::vector<SavePlan>* plans);
  absl::Status CommitSave(absl::Span<const SaveItem> items, PinOwner owner,
                          absl::Status failure, std::vector<SavePlan>* plans,
                          std::vector<SavedBlock>* results, std::vector<size_t>* pin_later,
                          QuotaLedger::Hold* hold);
  absl::Status WriteDurably(std::vector<SavePlan>& plans, std::vector<SavedBlock>* results);

  // Tier 3. RemoteMisses returns the indexes of `ids` this host holds no
  // bytes of, when tier 3 may have them (the fingerprint's namespace is in
  // scope); empty without a tier 3.
  std::vector<size_t> RemoteMisses(absl::Span<const BlockId> ids,
                                   const v1::LayoutFingerprint& fingerprint,
                                   const NamespaceScope* scope);
  // FetchRemote fetches `which` of `ids` from tier 3, verifies each (record
  // as at start, fingerprint, checksum) and stores it in tier 1 as a Save
  // would, in rounds whose payloads fit the staging budget; an object over
  // --max-block-bytes is never read (storage/remote_fetch.cc). Errors name
  // the item (its index in `ids`).
  absl::Status FetchRemote(absl::Span<const BlockId> ids, absl::Span<const size_t> which,
                           const v1::LayoutFingerprint& fingerprint);
  // FetchRemoteBatch is FetchRemote for blocks read in one round trip.
  absl::Status FetchRemoteBatch(absl::Span<const BlockId> ids, absl::Span<const size_t> which,
                                const v1::LayoutFingerprint& fingerprint);
  // SaveFetched checks block ids[i]'s fetched remote record (identity,
  // namespace, this host's limits, layout) and saves its payload into tier
  // 1; the item error otherwise (a copy that is bad for every host is
  // removed from tier 3).
  absl::Status SaveFetched(absl::Span<const BlockId> ids, size_t i, const std::string& ns,
                           const FingerprintDigest& expected,
                           const v1::LayoutFingerprint& fingerprint,
                           const storage::SpillRecord& record,
                           absl::Span<const absl::string_view> payload, uint64_t bytes);
  // DropRemoteCopy removes a tier-3 object that failed verification.
  void DropRemoteCopy(absl::string_view ns, const BlockId& id, const absl::Status& why);
  absl::Status LoadLocal(absl::Span<const BlockId> ids, const v1::LayoutFingerprint& fingerprint,
                         LoadSink& sink, std::vector<v1::BlockMeta>* metas,
                         std::vector<LoadedInfo>* infos, const NamespaceScope* scope);
  // EarlyRead: a block of a Load read from tier 2 before its turn.
  struct EarlyRead {
    bool issued = false;    // Read (status is its outcome).
    bool consumed = false;  // The delivery loop took it.
    absl::Status status;
    std::optional<ArenaReservation> promote;  // Its promotion's room in tier 1.
  };
  // ReadAhead reads the blocks of `plan` that come from tier 2 into a
  // destination known before delivery (`dests[i]`, the sink's, or the
  // promotion's room in tier 1), disk_reads_in_flight at once; `early` gets
  // one entry per block, or stays empty when fewer than two qualify.
  void ReadAhead(absl::Span<const BlockId> ids, absl::Span<const EngineCore::ReadHold> plan,
                 absl::Span<uint8_t* const> dests, std::vector<EarlyRead>* early);
  // CopyAhead copies the blocks of `plan` held in tier 1 into the sink's
  // host destinations (`dests`), several at once across the copy pool, and
  // leaves the checksum of each copy in `copied` (one entry per block;
  // empty when fewer than two blocks, or under 256 KiB in all, qualify).
  void CopyAhead(absl::Span<const EngineCore::ReadHold> plan, absl::Span<uint8_t* const> dests,
                 std::vector<std::optional<uint64_t>>* copied);

  // RemoveBlocks deletes those of `ids` that still exist from every tier and
  // returns how many.
  absl::StatusOr<uint32_t> RemoveBlocks(absl::Span<const BlockId> ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.disk_mu());
  // FindFor is FindVisible for a caller limited to `scope`: another
  // namespace's block is not there.
  IndexEntry* FindFor(const BlockId& id, const NamespaceScope* scope) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu());
  absl::Status PromoteForPin(const BlockId& id, PinOwner owner, absl::Time deadline);
  // Prefetch's steps (storage/tier_prefetch.cc). PrefetchRemote fetches
  // `absent` of `ids` from tier 3 (when it may hold them) and marks them
  // prefetched. PromoteSpilled reads spilled blocks into tier 1, a few at a
  // time, waiting for room until `deadline`.
  struct PrefetchWant {
    BlockId id;
    uint64_t gen = 0, checksum = 0, bytes = 0;
  };
  void PrefetchRemote(absl::Span<const BlockId> ids, absl::Span<const size_t> absent,
                      const v1::LayoutFingerprint* fingerprint, const NamespaceScope* scope,
                      PrefetchResult* result);
  void PromoteSpilled(absl::Span<const PrefetchWant> wants, absl::Time deadline,
                      PrefetchResult* result);
  // Unpinned wakes saves and the spiller when `e` became evictable.
  // (An unpinned block only in tier 2 may put the spill budget over.)
  void Unpinned(const IndexEntry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu()) {
    if (e->pins != 0) return;
    if (e->in_ram()) core_.NotifyRoom();
    spiller_.Wake();
  }
  absl::Status CheckFits(uint64_t size) const {
    if (size <= core_.host().capacity_bytes()) return absl::OkStatus();
    return WithLimit(absl::ResourceExhaustedError(absl::StrCat(
                         "payload of ", FormatByteSize(size), " is larger than tier 1 (",
                         FormatByteSize(core_.host().capacity_bytes()), ")")),
                     StorageLimit::kTier1Capacity);
  }
  absl::Status CheckOpen() const {
    if (shut_down_.load()) return absl::UnavailableError("evoked is shutting down");
    return absl::OkStatus();
  }
  BlockObserver* observer() const { return core_.options().observer; }

  EngineCore core_;
  Spiller spiller_;
  std::unique_ptr<Uploader> uploader_;  // With a tier 3.
  std::atomic<bool> shut_down_{false};
};

}  // namespace evoke

#endif  // EVOKE_STORAGE_TIER_MANAGER_IMPL_H_
