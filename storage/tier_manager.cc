#include "storage/tier_manager.h"

#include <algorithm>
#include <cstring>
#include <list>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/byte_size.h"
#include "common/checksum.h"
#include "common/fingerprint.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/copy_pool.h"
#include "storage/spill_record.pb.h"

namespace evoke {
namespace {

int64_t NowUnixMs() { return absl::ToUnixMillis(absl::Now()); }

// One block in the index. Guarded by TierManager::Impl::mu_.
//
// State machine of the bytes:
//   writing            placeholder of an in-flight Save; invisible to readers.
//   ram && !on_disk    tier 1 only ("dirty"): lost on a crash.
//   ram && on_disk     tier 1 with a disk copy ("clean"): eviction is free.
//   !ram && on_disk    tier 2.
//   !ram && !on_disk   breadcrumb: metadata only.
struct Entry {
  BlockId id;
  uint64_t gen = 0;  // Unique per Entry object, to detect replacement.
  v1::BlockMeta meta;
  FingerprintDigest fp_digest;
  uint64_t payload_bytes = 0;
  uint64_t checksum = 0;
  bool writing = false;
  std::optional<Extent> ram;
  bool on_disk = false;         // Payload in the spill store.
  bool record_on_disk = false;  // A record (payload or breadcrumb) on disk.
  uint32_t pins = 0;             // Sum over pin_owners.
  absl::flat_hash_map<PinOwner, uint32_t> pin_owners;
  uint32_t readers = 0;         // In-flight users of the tier-1 bytes.
  bool ram_corrupt = false;     // Drop the tier-1 copy when readers reach 0.
  bool removed = false;         // Deleted while readers > 0.
  int64_t last_access_ms = 0;
  uint64_t access_tick = 0;  // Orders accesses; finer than last_access_ms.
  bool in_ram_lru = false;
  std::list<Entry*>::iterator ram_lru_it;
  bool in_disk_lru = false;
  std::list<Entry*>::iterator disk_lru_it;

  bool bytes_available() const { return ram.has_value() || on_disk; }
};

std::string SessionKey(absl::string_view ns, absl::string_view session) {
  return absl::StrCat(ns.size(), ":", ns, session);
}

v1::Tier TierOf(const Entry& e) {
  if (e.ram) return v1::TIER_PINNED_HOST;
  if (e.on_disk) return v1::TIER_SPILL;
  return v1::TIER_BREADCRUMB;
}

}  // namespace

class TierManager::Impl {
 public:
  Impl(const TierManagerOptions& options, std::unique_ptr<PinnedArena> arena,
       std::unique_ptr<Tier> spill)
      : options_(options),
        arena_(std::move(arena)),
        spill_(std::move(spill)),
        copier_(options.copy_threads),
        high_bytes_(static_cast<uint64_t>(options.high_watermark *
                                          arena_->capacity_bytes())),
        low_bytes_(static_cast<uint64_t>(options.low_watermark *
                                         arena_->capacity_bytes())),
        start_(absl::Now()) {}

  ~Impl() { StopSpiller(); }

  absl::Status Rebuild();
  void StartSpiller() { spiller_ = std::thread([this] { SpillerLoop(); }); }
  void StopSpiller();

  absl::StatusOr<std::vector<v1::SaveResult>> Save(
      absl::Span<const SaveItem> items, SaveSource& source, bool durable,
      absl::Time deadline, PinOwner owner);
  absl::Status Load(absl::Span<const BlockId> ids,
                    const v1::LayoutFingerprint& fingerprint, LoadSink& sink,
                    std::vector<v1::BlockMeta>* metas,
                    std::vector<LoadedInfo>* infos);
  std::vector<v1::Tier> Lookup(absl::Span<const BlockId> ids);
  absl::Status Delete(absl::Span<const BlockId> ids);
  absl::StatusOr<uint32_t> DropSession(absl::string_view ns,
                                       absl::string_view session_id);
  absl::Status Pin(absl::Span<const BlockId> ids, PinOwner owner,
                   absl::Time deadline);
  absl::Status Unpin(absl::Span<const BlockId> ids, PinOwner owner);
  uint64_t ReleaseOwner(PinOwner owner);
  absl::StatusOr<v1::BlockInfo> Describe(const BlockId& id);
  std::vector<v1::BlockInfo> List(const ListFilter& filter, const BlockId& after,
                                  bool has_after, size_t limit, bool* more);
  void Stats(v1::StatResponse* out);
  absl::StatusOr<v1::VerifyResponse> Verify(absl::Span<const BlockId> ids);
  absl::StatusOr<v1::FlushResponse> Flush(bool evict);
  absl::Status Shutdown();
  bool WaitForSpillerIdle(absl::Duration timeout);

 private:
  struct Counters {
    uint64_t saves = 0, dedups = 0, loads = 0, hits_tier1 = 0, hits_tier2 = 0,
             misses = 0, spills = 0, spilled_bytes = 0, evictions = 0,
             promotions = 0, breadcrumbs = 0, checksum_failures = 0, deletes = 0,
             spill_errors = 0;
  };

  // --- index helpers (mu_ held) ---
  Entry* FindLocked(const BlockId& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = index_.find(id);
    return it == index_.end() ? nullptr : it->second.get();
  }
  // FindVisibleLocked skips placeholders of in-flight saves.
  Entry* FindVisibleLocked(const BlockId& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Entry* e = FindLocked(id);
    return (e == nullptr || e->writing) ? nullptr : e;
  }
  Entry* FindGenLocked(const BlockId& id, uint64_t gen)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Entry* e = FindLocked(id);
    return (e != nullptr && e->gen == gen) ? e : nullptr;
  }
  void Touch(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetRam(Entry* e, const Extent& extent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ClearRam(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetOnDisk(Entry* e, bool on_disk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddPin(Entry* e, PinOwner owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemovePin(Entry* e, PinOwner owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseReader(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QuarantineRamLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::BlockInfo InfoLocked(const Entry& e) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  storage::SpillRecord RecordLocked(const Entry& e) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- room in tier 1 (mu_ held) ---
  // TryAllocateAll reserves one extent per size, all or none.
  bool TryAllocateAll(absl::Span<const uint64_t> sizes, std::vector<Extent>* out);
  // WaitForRoom blocks (releasing mu_) until the spiller frees something, or
  // fails when waiting cannot help or the deadline passed.
  absl::Status WaitForRoom(uint64_t total, uint64_t largest, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckFits(uint64_t size) const;

  // --- disk (disk_mu_ held) ---
  absl::Status WriteDirty(std::vector<Entry*> entries, bool sync,
                          uint64_t* blocks, uint64_t* bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(disk_mu_);
  void EnforceSpillBudget() ABSL_EXCLUSIVE_LOCKS_REQUIRED(disk_mu_);
  void QuarantineDisk(const BlockId& id, uint64_t gen)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(disk_mu_);
  // ReadFromDisk reads a block from the spill store, copies it to `dest`
  // (hashing the private RocksDB copy, never `dest`) and, when `promote` is
  // set, also into that tier-1 extent. DATA_LOSS when the checksum fails.
  absl::Status ReadFromDisk(const BlockId& id, uint64_t checksum,
                            uint64_t payload_bytes, uint8_t* dest,
                            uint8_t* promote = nullptr);
  // ReservePromotion reserves tier-1 room for a promotion when it fits under
  // the high watermark (a read must never cause a spill storm).
  std::optional<Extent> ReservePromotion(uint64_t n);
  // CommitPromotion makes `extent` (filled) the block's tier-1 copy, or frees
  // it when the block changed meanwhile. With `hold`, returns the entry with
  // a reader held (nullptr when not committed).
  Entry* CommitPromotion(const BlockId& id, uint64_t gen, const Extent& extent,
                         bool hold);
  absl::Status PromoteForPin(const BlockId& id, PinOwner owner, absl::Time deadline);

  // --- spiller ---
  bool SpillNeededLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SpillerLoop();
  // SpillRound evicts one batch; returns whether it made progress.
  bool SpillRound();

  // LogSpillError logs a failed spill-store write, at most once every 10 s
  // (a full disk fails every round).
  void LogSpillError(const absl::Status& s) {
    const int64_t now = absl::ToUnixSeconds(absl::Now());
    int64_t last = last_spill_error_log_s_.load();
    if (now - last >= 10 && last_spill_error_log_s_.compare_exchange_strong(last, now)) {
      EVOKE_LOG_ERROR("spill store write failed (tier 1 cannot drain; saves will "
                      "wait, then fail with RESOURCE_EXHAUSTED): ", s.ToString());
    }
  }

  absl::Status CheckOpen() const {
    if (shut_down_.load()) {
      return absl::UnavailableError("evoked is shutting down");
    }
    return absl::OkStatus();
  }

  const TierManagerOptions options_;
  const std::unique_ptr<PinnedArena> arena_;
  const std::unique_ptr<Tier> spill_;
  CopyPool copier_;
  const uint64_t high_bytes_;
  const uint64_t low_bytes_;
  const absl::Time start_;
  std::atomic<bool> shut_down_{false};
  std::atomic<int64_t> last_spill_error_log_s_{0};

  // Lock order: disk_mu_ before mu_. disk_mu_ serializes every mutation of
  // the spill store; while it is held, no entry leaves the index.
  absl::Mutex disk_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  absl::CondVar room_cv_;    // Tier-1 bytes were freed or became evictable.
  absl::CondVar spill_cv_;   // The spiller may have work.
  absl::CondVar writes_cv_;  // An in-flight save finished.

  absl::btree_map<BlockId, std::unique_ptr<Entry>> index_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Entry*, std::unique_ptr<Entry>> graveyard_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::flat_hash_set<BlockId>> sessions_
      ABSL_GUARDED_BY(mu_);
  std::list<Entry*> ram_lru_ ABSL_GUARDED_BY(mu_);   // Unpinned tier-1 blocks; front = hottest.
  std::list<Entry*> disk_lru_ ABSL_GUARDED_BY(mu_);  // Payloads on disk; front = hottest.
  uint64_t next_gen_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t access_clock_ ABSL_GUARDED_BY(mu_) = 0;

  // Occupancy, maintained by the transitions above.
  uint64_t ram_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t ram_payload_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t evictable_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // Extents in ram_lru_.
  uint64_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;    // Extents of placeholders.
  uint64_t disk_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t disk_payload_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t breadcrumb_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pinned_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  // Blocks each owner pins, with counts.
  absl::flat_hash_map<PinOwner, absl::flat_hash_map<BlockId, uint32_t>> owner_pins_
      ABSL_GUARDED_BY(mu_);
  Counters counters_ ABSL_GUARDED_BY(mu_);

  // Spiller state.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool spill_active_ ABSL_GUARDED_BY(mu_) = false;  // Between high and low.
  bool spiller_busy_ ABSL_GUARDED_BY(mu_) = false;
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t wanted_total_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t wanted_largest_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread spiller_;
};

// ------------------------------------------------------------ transitions

void TierManager::Impl::Touch(Entry* e) {
  e->last_access_ms = NowUnixMs();
  e->access_tick = ++access_clock_;
  if (e->in_ram_lru) ram_lru_.splice(ram_lru_.begin(), ram_lru_, e->ram_lru_it);
  if (e->in_disk_lru) {
    disk_lru_.splice(disk_lru_.begin(), disk_lru_, e->disk_lru_it);
  }
}

void TierManager::Impl::SetRam(Entry* e, const Extent& extent) {
  const bool was_breadcrumb = !e->bytes_available() && !e->writing;
  e->ram = extent;
  ++ram_blocks_;
  ram_payload_bytes_ += e->payload_bytes;
  if (was_breadcrumb) --breadcrumb_blocks_;
  if (e->pins == 0) {
    ram_lru_.push_front(e);
    e->ram_lru_it = ram_lru_.begin();
    e->in_ram_lru = true;
    evictable_bytes_ += extent.length;
  }
}

void TierManager::Impl::ClearRam(Entry* e) {
  if (!e->ram) return;
  if (e->in_ram_lru) {
    ram_lru_.erase(e->ram_lru_it);
    e->in_ram_lru = false;
    evictable_bytes_ -= e->ram->length;
  }
  arena_->Free(*e->ram);
  e->ram.reset();
  e->ram_corrupt = false;
  --ram_blocks_;
  ram_payload_bytes_ -= e->payload_bytes;
  if (!e->on_disk && !e->removed) ++breadcrumb_blocks_;
  room_cv_.SignalAll();
}

void TierManager::Impl::SetOnDisk(Entry* e, bool on_disk) {
  if (e->on_disk == on_disk) return;
  e->on_disk = on_disk;
  if (on_disk) {
    ++disk_blocks_;
    disk_payload_bytes_ += e->payload_bytes;
    disk_lru_.push_front(e);
    e->disk_lru_it = disk_lru_.begin();
    e->in_disk_lru = true;
    if (!e->ram && !e->writing) --breadcrumb_blocks_;
  } else {
    --disk_blocks_;
    disk_payload_bytes_ -= e->payload_bytes;
    if (e->in_disk_lru) {
      disk_lru_.erase(e->disk_lru_it);
      e->in_disk_lru = false;
    }
    if (!e->ram && !e->removed) ++breadcrumb_blocks_;
  }
}

void TierManager::Impl::AddPin(Entry* e, PinOwner owner) {
  ++e->pin_owners[owner];
  ++owner_pins_[owner][e->id];
  if (e->pins++ == 0) {
    ++pinned_blocks_;
    if (e->in_ram_lru) {
      ram_lru_.erase(e->ram_lru_it);
      e->in_ram_lru = false;
      evictable_bytes_ -= e->ram->length;
    }
  }
}

void TierManager::Impl::RemovePin(Entry* e, PinOwner owner) {
  auto it = e->pin_owners.find(owner);
  if (it == e->pin_owners.end()) return;
  if (--it->second == 0) e->pin_owners.erase(it);
  auto owned = owner_pins_.find(owner);
  if (owned != owner_pins_.end()) {
    auto pin = owned->second.find(e->id);
    if (pin != owned->second.end() && --pin->second == 0) owned->second.erase(pin);
    if (owned->second.empty()) owner_pins_.erase(owned);
  }
  if (--e->pins == 0) {
    --pinned_blocks_;
    if (e->ram && !e->removed) {
      ram_lru_.push_front(e);
      e->ram_lru_it = ram_lru_.begin();
      e->in_ram_lru = true;
      evictable_bytes_ += e->ram->length;
      room_cv_.SignalAll();
      spill_cv_.Signal();
    }
  }
}

void TierManager::Impl::ReleaseReader(Entry* e) {
  if (--e->readers > 0) return;
  if (e->removed) {
    if (e->ram) {
      arena_->Free(*e->ram);
      e->ram.reset();
      room_cv_.SignalAll();
    }
    graveyard_.erase(e);
    return;
  }
  if (e->ram_corrupt) ClearRam(e);
}

void TierManager::Impl::RemoveLocked(Entry* e) {
  if (e->meta.kind() == v1::BLOCK_KIND_SESSION) {
    auto it = sessions_.find(
        SessionKey(e->meta.fingerprint().namespace_(), e->meta.session_id()));
    if (it != sessions_.end()) {
      it->second.erase(e->id);
      if (it->second.empty()) sessions_.erase(it);
    }
  }
  if (e->pins > 0) {
    --pinned_blocks_;
    e->pins = 0;
  }
  for (const auto& [owner, count] : e->pin_owners) {
    auto owned = owner_pins_.find(owner);
    if (owned == owner_pins_.end()) continue;
    owned->second.erase(e->id);
    if (owned->second.empty()) owner_pins_.erase(owned);
  }
  e->pin_owners.clear();
  if (options_.observer != nullptr) options_.observer->Removed(e->id, e->meta);
  const bool was_breadcrumb = !e->bytes_available();
  e->removed = true;
  SetOnDisk(e, false);
  if (was_breadcrumb) --breadcrumb_blocks_;
  auto node = index_.extract(e->id);
  if (e->ram) {
    if (e->in_ram_lru) {
      ram_lru_.erase(e->ram_lru_it);
      e->in_ram_lru = false;
      evictable_bytes_ -= e->ram->length;
    }
    --ram_blocks_;
    ram_payload_bytes_ -= e->payload_bytes;
    if (e->readers == 0) {
      arena_->Free(*e->ram);
      e->ram.reset();
      room_cv_.SignalAll();
    } else {
      // The last reader frees the bytes (ReleaseReader).
      graveyard_.emplace(e, std::move(node.mapped()));
    }
  }
  ++counters_.deletes;
}

void TierManager::Impl::QuarantineRamLocked(Entry* e) {
  if (!e->ram) return;
  if (e->readers == 0) {
    ClearRam(e);
  } else {
    e->ram_corrupt = true;
  }
}

v1::BlockInfo TierManager::Impl::InfoLocked(const Entry& e) const {
  v1::BlockInfo info;
  *info.mutable_meta() = e.meta;
  info.set_tier(TierOf(e));
  info.set_bytes_available(e.bytes_available());
  info.set_on_disk(e.on_disk);
  info.set_pin_count(e.pins);
  info.set_last_access_unix_ms(e.last_access_ms);
  return info;
}

storage::SpillRecord TierManager::Impl::RecordLocked(const Entry& e) const {
  storage::SpillRecord record;
  *record.mutable_meta() = e.meta;
  record.set_last_access_unix_ms(e.last_access_ms);
  return record;
}

// ------------------------------------------------------------ room

absl::Status TierManager::Impl::CheckFits(uint64_t size) const {
  if (size > arena_->capacity_bytes()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "payload of ", FormatByteSize(size), " is larger than tier 1 (",
        FormatByteSize(arena_->capacity_bytes()), ", --pinned-bytes)"));
  }
  return absl::OkStatus();
}

bool TierManager::Impl::TryAllocateAll(absl::Span<const uint64_t> sizes,
                                       std::vector<Extent>* out) {
  out->clear();
  for (uint64_t size : sizes) {
    absl::StatusOr<Extent> extent = arena_->Allocate(size);
    if (!extent.ok()) {
      for (const Extent& e : *out) arena_->Free(e);
      out->clear();
      return false;
    }
    out->push_back(*extent);
  }
  return true;
}

absl::Status TierManager::Impl::WaitForRoom(uint64_t total, uint64_t largest,
                                            absl::Time deadline) {
  if (stop_) return absl::UnavailableError("evoked is shutting down");
  const uint64_t capacity = arena_->capacity_bytes();
  const uint64_t used = arena_->UsedBytes();
  const uint64_t could_free = evictable_bytes_ + pending_bytes_;
  if (total > capacity) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a batch of ", FormatByteSize(total), " cannot fit in tier 1 (",
        FormatByteSize(capacity), ", --pinned-bytes); save it in smaller batches"));
  }
  if ((capacity - used) + could_free < total || could_free == 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tier 1 cannot make room for ", FormatByteSize(total), ": ",
        FormatByteSize(capacity - used), " free, ", FormatByteSize(could_free),
        " evictable, ", pinned_blocks_, " pinned blocks (capacity ",
        FormatByteSize(capacity), ")"));
  }
  if (absl::Now() >= deadline) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tier 1 is full: no room for ", FormatByteSize(total),
        " before the deadline; the spiller could not free space in time",
        counters_.spill_errors > 0 ? " (spill store errors: see logs)" : ""));
  }
  ++waiters_;
  wanted_total_ += total;
  wanted_largest_ = std::max(wanted_largest_, largest);
  spill_cv_.Signal();
  room_cv_.WaitWithDeadline(&mu_, deadline);
  --waiters_;
  wanted_total_ -= total;
  if (waiters_ == 0) wanted_largest_ = 0;
  return absl::OkStatus();
}

// ------------------------------------------------------------ rebuild

absl::Status TierManager::Impl::Rebuild() {
  std::vector<std::string> skipped;
  std::vector<std::pair<int64_t, Entry*>> by_access;
  absl::MutexLock lock(&mu_);
  absl::Status s = spill_->ForEachRecord(
      [&](const BlockId& id, storage::SpillRecord record) -> absl::Status {
            auto e = std::make_unique<Entry>();
            e->id = id;
            e->gen = next_gen_++;
            e->meta = std::move(*record.mutable_meta());
            e->fp_digest = DigestFingerprint(e->meta.fingerprint());
            e->payload_bytes = e->meta.payload_bytes();
            e->checksum = e->meta.checksum();
            e->record_on_disk = true;
            e->last_access_ms = record.last_access_unix_ms();
            Entry* raw = e.get();
            index_.emplace(id, std::move(e));
            if (raw->meta.kind() == v1::BLOCK_KIND_SESSION) {
              sessions_[SessionKey(raw->meta.fingerprint().namespace_(),
                                   raw->meta.session_id())]
                  .insert(id);
            }
            if (options_.observer != nullptr) options_.observer->Added(id, raw->meta);
            if (record.payload_present()) {
              by_access.emplace_back(raw->last_access_ms, raw);
            } else {
              ++breadcrumb_blocks_;
            }
            return absl::OkStatus();
          },
      &skipped);
  EVOKE_RETURN_IF_ERROR(s);
  // Oldest first, so that each push_front leaves the hottest at the front.
  std::stable_sort(by_access.begin(), by_access.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [ms, e] : by_access) {
    e->access_tick = ++access_clock_;
    e->on_disk = true;
    ++disk_blocks_;
    disk_payload_bytes_ += e->payload_bytes;
    disk_lru_.push_front(e);
    e->disk_lru_it = disk_lru_.begin();
    e->in_disk_lru = true;
  }
  counters_.checksum_failures += skipped.size();
  return absl::OkStatus();
}

// ------------------------------------------------------------ Save

absl::StatusOr<std::vector<v1::SaveResult>> TierManager::Impl::Save(
    absl::Span<const SaveItem> items, SaveSource& source, bool durable,
    absl::Time deadline, PinOwner owner) {
  EVOKE_RETURN_IF_ERROR(CheckOpen());
  deadline = std::min(deadline, absl::Now() + options_.max_wait_for_room);
  const size_t n = items.size();
  std::vector<BlockId> ids(n);
  std::vector<FingerprintDigest> digests(n);
  for (size_t i = 0; i < n; ++i) {
    EVOKE_ASSIGN_OR_RETURN(ids[i], BlockId::FromBytes(items[i].meta->id()));
    digests[i] = DigestFingerprint(items[i].meta->fingerprint());
    EVOKE_RETURN_IF_ERROR(CheckFits(items[i].size));
  }

  // Phase 1 (locked): classify each id, reserve tier-1 room for new blocks
  // (one contiguous range when possible, so copies coalesce), and insert
  // placeholders so that concurrent saves of an id serialize.
  struct Plan {
    bool fresh = false;
    uint64_t existing_gen = 0;
    uint64_t existing_checksum = 0;
    Entry* entry = nullptr;  // Fresh: the placeholder.
    Extent extent;
    bool revived = false;  // Fresh bytes for a breadcrumb.
  };
  std::vector<Plan> plan(n);
  {
    absl::MutexLock lock(&mu_);
    for (;;) {
      bool in_flight = false;
      std::vector<uint64_t> sizes;
      uint64_t total = 0, largest = 0;
      for (size_t i = 0; i < n; ++i) {
        plan[i] = Plan();
        Entry* e = FindLocked(ids[i]);
        if (e != nullptr && e->writing) {
          in_flight = true;
          break;
        }
        if (e != nullptr && e->bytes_available()) {
          plan[i].existing_gen = e->gen;
          plan[i].existing_checksum = e->checksum;
        } else {
          plan[i].fresh = true;
          plan[i].revived = e != nullptr;
          sizes.push_back(items[i].size);
          const uint64_t rounded = arena_->RoundedSize(items[i].size);
          total += rounded;
          largest = std::max(largest, rounded);
        }
      }
      if (in_flight) {
        if (writes_cv_.WaitWithDeadline(&mu_, deadline)) {
          return absl::UnavailableError(
              "another save of the same block is still in progress; retry");
        }
        continue;
      }
      std::vector<Extent> extents;
      bool reserved = sizes.empty();
      if (!reserved && sizes.size() > 1) {
        absl::StatusOr<std::vector<Extent>> run = arena_->AllocateContiguous(sizes);
        if (run.ok()) {
          extents = std::move(run).value();
          reserved = true;
        }
      }
      if (!reserved) reserved = TryAllocateAll(sizes, &extents);
      if (reserved) {
        size_t k = 0;
        for (size_t i = 0; i < n; ++i) {
          if (!plan[i].fresh) continue;
          plan[i].extent = extents[k++];
          pending_bytes_ += plan[i].extent.length;
          Entry* e = FindLocked(ids[i]);
          if (e == nullptr) {
            auto fresh = std::make_unique<Entry>();
            fresh->id = ids[i];
            fresh->gen = next_gen_++;
            e = fresh.get();
            index_.emplace(ids[i], std::move(fresh));
          } else {
            --breadcrumb_blocks_;  // Revived breadcrumb: hidden while writing.
          }
          e->writing = true;
          plan[i].entry = e;
        }
        if (arena_->UsedBytes() > high_bytes_) spill_cv_.Signal();
        break;
      }
      EVOKE_RETURN_IF_ERROR(WaitForRoom(total, largest, deadline));
    }
  }

  // Phase 2 (unlocked): copy into tier 1 and checksum our own copy, so that
  // what is stored is exactly what was verified. Host sources are copied
  // here; the others are fetched in one batch.
  absl::Status failure;
  std::vector<uint64_t> checksums(n);
  std::vector<size_t> fetch_items;
  std::vector<uint8_t*> fetch_dsts;
  std::vector<std::string> scratch;  // Existing ids whose bytes must be fetched.
  scratch.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const absl::string_view host = source.HostBytes(i);
    if (!host.empty() && host.size() != items[i].size) {
      failure = absl::InternalError("source size differs from the item size");
      break;
    }
    if (plan[i].fresh) {
      uint8_t* dest = arena_->Data(plan[i].extent);
      if (!host.empty()) {
        checksums[i] = copier_.CopyHashingDestination(dest, host.data(), host.size());
      } else {
        fetch_items.push_back(i);
        fetch_dsts.push_back(dest);
      }
    } else if (!host.empty()) {
      checksums[i] = PayloadChecksum(host.data(), host.size());
    } else {
      scratch.emplace_back(items[i].size, '\0');
      fetch_items.push_back(i);
      fetch_dsts.push_back(reinterpret_cast<uint8_t*>(scratch.back().data()));
    }
  }
  if (failure.ok() && !fetch_items.empty()) {
    std::vector<std::optional<uint64_t>> fetched(fetch_items.size());
    failure = source.Fetch(fetch_items, fetch_dsts, absl::MakeSpan(fetched));
    if (failure.ok()) {
      for (size_t k = 0; k < fetch_items.size(); ++k) {
        checksums[fetch_items[k]] =
            fetched[k] ? *fetched[k]
                       : copier_.Checksum(fetch_dsts[k], items[fetch_items[k]].size);
      }
    }
  }
  std::vector<std::optional<v1::Summary>> extra(n);
  if (failure.ok() && options_.summarize) {
    // Summaries of fresh blocks, one task each across the copy pool (a mean
    // over 16 MiB of K is milliseconds).
    std::vector<size_t> fresh;
    for (size_t i = 0; i < n; ++i) {
      if (plan[i].fresh) fresh.push_back(i);
    }
    const absl::Time start = absl::Now();
    copier_.ParallelFor(fresh.size(), [&](size_t k) {
      const size_t i = fresh[k];
      extra[i] = options_.summarize(*items[i].meta, arena_->Data(plan[i].extent),
                                    items[i].size);
    });
    EVOKE_LOG_DEBUG("save: summaries of ", fresh.size(), " blocks in ",
                    absl::FormatDuration(absl::Now() - start));
  }
  for (size_t i = 0; i < n && failure.ok(); ++i) {
    const v1::BlockMeta& meta = *items[i].meta;
    if (meta.has_checksum() && meta.checksum() != checksums[i]) {
      failure = absl::DataLossError(absl::StrCat(
          "blocks[", i, "].meta.checksum: ", absl::Hex(meta.checksum()),
          " does not match the payload received (xxh3 ", absl::Hex(checksums[i]),
          ")"));
    }
  }

  // Phase 3 (locked): commit or roll back.
  std::vector<v1::SaveResult> results(n);
  std::vector<BlockId> pin_later;
  std::vector<std::pair<BlockId, uint64_t>> written;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < n && failure.ok(); ++i) {
      if (plan[i].fresh) continue;
      Entry* e = FindGenLocked(ids[i], plan[i].existing_gen);
      if (e == nullptr || !e->bytes_available()) {
        failure = absl::AbortedError(absl::StrCat(
            "blocks[", i, "].meta.id: block ", ids[i].ToHex(),
            " was deleted or dropped during the save; retry"));
      } else if (plan[i].existing_checksum != checksums[i] &&
                 items[i].meta->kind() == v1::BLOCK_KIND_SESSION) {
        failure = absl::AlreadyExistsError(absl::StrCat(
            "blocks[", i, "].meta.id: session block ", ids[i].ToHex(),
            " is already stored with different content; Delete it first"));
      }
    }
    if (!failure.ok()) {
      for (size_t i = 0; i < n; ++i) {
        if (!plan[i].fresh || plan[i].entry == nullptr) continue;
        Entry* e = plan[i].entry;
        arena_->Free(plan[i].extent);
        pending_bytes_ -= plan[i].extent.length;
        e->writing = false;
        if (plan[i].revived) {
          ++breadcrumb_blocks_;
        } else {
          index_.erase(ids[i]);
        }
      }
      room_cv_.SignalAll();
      writes_cv_.SignalAll();
      return failure;
    }
    const int64_t now_ms = NowUnixMs();
    for (size_t i = 0; i < n; ++i) {
      v1::SaveResult& r = results[i];
      r.set_id(ids[i].ToBytes());
      if (plan[i].fresh) {
        Entry* e = plan[i].entry;
        e->meta = *items[i].meta;
        if (extra[i]) *e->meta.add_summaries() = std::move(*extra[i]);
        e->meta.set_payload_bytes(items[i].size);
        e->meta.set_checksum(checksums[i]);
        if (!plan[i].revived) e->meta.set_created_unix_ms(now_ms);
        e->fp_digest = digests[i];
        e->payload_bytes = items[i].size;
        e->checksum = checksums[i];
        e->last_access_ms = now_ms;
        e->access_tick = ++access_clock_;
        pending_bytes_ -= plan[i].extent.length;
        if (items[i].pin) AddPin(e, owner);
        SetRam(e, plan[i].extent);  // While `writing`: not a breadcrumb revival.
        e->writing = false;
        if (e->meta.kind() == v1::BLOCK_KIND_SESSION) {
          sessions_[SessionKey(e->meta.fingerprint().namespace_(),
                               e->meta.session_id())]
              .insert(e->id);
        }
        if (options_.observer != nullptr) options_.observer->Added(e->id, e->meta);
        ++counters_.saves;
        r.set_checksum(checksums[i]);
        r.set_tier(v1::TIER_PINNED_HOST);
        written.emplace_back(ids[i], e->gen);
      } else {
        Entry* e = FindGenLocked(ids[i], plan[i].existing_gen);
        Touch(e);
        ++counters_.dedups;
        r.set_deduplicated(true);
        r.set_checksum(e->checksum);
        r.set_tier(TierOf(*e));
        if (items[i].pin) {
          if (e->ram) {
            AddPin(e, owner);
          } else {
            pin_later.push_back(ids[i]);
          }
        }
        written.emplace_back(ids[i], e->gen);
      }
    }
    writes_cv_.SignalAll();
    room_cv_.SignalAll();
  }

  if (!pin_later.empty()) {
    EVOKE_RETURN_IF_ERROR(Pin(pin_later, owner, deadline));
  }
  if (durable) {
    absl::MutexLock disk(&disk_mu_);
    std::vector<Entry*> dirty;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, gen] : written) {
        Entry* e = FindGenLocked(id, gen);
        if (e != nullptr && e->ram && !e->on_disk) dirty.push_back(e);
      }
    }
    uint64_t blocks = 0, bytes = 0;
    absl::Status s = WriteDirty(std::move(dirty), /*sync=*/true, &blocks, &bytes);
    if (!s.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "blocks are in tier 1 but the durable write failed: ", s.message()));
    }
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < n; ++i) {
      Entry* e = FindLocked(ids[i]);
      if (e != nullptr && e->on_disk && !e->ram) {
        results[i].set_tier(v1::TIER_SPILL);
      }
    }
  }
  return results;
}

// ------------------------------------------------------------ disk writes

absl::Status TierManager::Impl::WriteDirty(std::vector<Entry*> entries, bool sync,
                                           uint64_t* blocks, uint64_t* bytes) {
  // Entries cannot leave the index while disk_mu_ is held; readers keep
  // their tier-1 bytes in place while RocksDB copies them.
  size_t begin = 0;
  while (begin < entries.size()) {
    std::vector<SpillWrite> writes;
    std::vector<storage::SpillRecord> records;
    std::vector<Entry*> batch;
    uint64_t batch_bytes = 0;
    {
      absl::MutexLock lock(&mu_);
      size_t end = begin;
      while (end < entries.size() &&
             (batch.empty() ||
              batch_bytes + entries[end]->payload_bytes <=
                  options_.spill_batch_bytes)) {
        Entry* e = entries[end++];
        if (!e->ram || e->on_disk || e->removed) continue;
        ++e->readers;
        batch.push_back(e);
        batch_bytes += e->payload_bytes;
      }
      begin = end;
      records.reserve(batch.size());
      for (Entry* e : batch) records.push_back(RecordLocked(*e));
    }
    if (batch.empty()) continue;
    writes.reserve(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      Entry* e = batch[i];
      writes.push_back(SpillWrite{
          e->id, &records[i],
          absl::string_view(reinterpret_cast<const char*>(arena_->Data(*e->ram)),
                            e->payload_bytes)});
    }
    absl::Status s = spill_->Put(writes, sync);
    if (!s.ok()) LogSpillError(s);
    absl::MutexLock lock(&mu_);
    for (Entry* e : batch) {
      if (s.ok() && !e->removed) {
        e->record_on_disk = true;
        SetOnDisk(e, true);
        ++counters_.spills;
        counters_.spilled_bytes += e->payload_bytes;
      }
      ReleaseReader(e);
    }
    if (!s.ok()) {
      ++counters_.spill_errors;
      return s;
    }
    *blocks += batch.size();
    *bytes += batch_bytes;
  }
  return absl::OkStatus();
}

void TierManager::Impl::EnforceSpillBudget() {
  for (;;) {
    std::vector<Entry*> chosen;
    std::vector<storage::SpillRecord> records;
    std::vector<SpillWrite> breadcrumbs;
    std::vector<BlockId> forget;  // Disk copies of blocks also in tier 1.
    {
      absl::MutexLock lock(&mu_);
      if (disk_payload_bytes_ <= options_.spill_bytes) return;
      const uint64_t excess = disk_payload_bytes_ - options_.spill_bytes;
      uint64_t freed = 0;
      for (auto it = disk_lru_.rbegin();
           it != disk_lru_.rend() && freed < excess && chosen.size() < 4096; ++it) {
        chosen.push_back(*it);
        freed += (*it)->payload_bytes;
      }
      records.reserve(chosen.size());  // SpillWrite points into it.
      for (Entry* e : chosen) {
        if (e->ram) {
          forget.push_back(e->id);
        } else {
          records.push_back(RecordLocked(*e));
          breadcrumbs.push_back(SpillWrite{e->id, &records.back(), {}});
        }
      }
    }
    absl::Status s = breadcrumbs.empty() ? absl::OkStatus()
                                         : spill_->DropPayloads(breadcrumbs);
    if (s.ok() && !forget.empty()) s = spill_->Delete(forget);
    if (!s.ok()) LogSpillError(s);
    absl::MutexLock lock(&mu_);
    if (!s.ok()) {
      ++counters_.spill_errors;
      return;
    }
    for (Entry* e : chosen) {
      if (e->ram) {
        e->record_on_disk = false;
      } else {
        ++counters_.breadcrumbs;
      }
      SetOnDisk(e, false);
    }
  }
}

void TierManager::Impl::QuarantineDisk(const BlockId& id, uint64_t gen) {
  storage::SpillRecord record;
  bool in_ram = false;
  {
    absl::MutexLock lock(&mu_);
    Entry* e = FindGenLocked(id, gen);
    if (e == nullptr || !e->on_disk) return;
    record = RecordLocked(*e);
    in_ram = e->ram.has_value() && !e->ram_corrupt;
  }
  absl::Status s;
  if (in_ram) {
    const BlockId ids[] = {id};
    s = spill_->Delete(ids);
  } else {
    const SpillWrite w[] = {SpillWrite{id, &record, {}}};
    s = spill_->DropPayloads(w);
  }
  absl::MutexLock lock(&mu_);
  Entry* e = FindGenLocked(id, gen);
  if (!s.ok() || e == nullptr) return;
  if (in_ram) e->record_on_disk = false;
  SetOnDisk(e, false);
}

absl::Status TierManager::Impl::ReadFromDisk(const BlockId& id, uint64_t checksum,
                                             uint64_t payload_bytes,
                                             uint8_t* dest, uint8_t* promote) {
  return spill_->Read(
      id, [&](const storage::SpillRecord& record,
              absl::string_view payload) -> absl::Status {
        if (record.meta().checksum() != checksum ||
            record.meta().payload_bytes() != payload_bytes) {
          // The disk copy belongs to another version of this id (deleted and
          // saved again while we read).
          return absl::NotFoundError(absl::StrCat(
              "block ", id.ToHex(), " changed while being read; retry"));
        }
        if (payload.size() != payload_bytes) {
          return absl::DataLossError(absl::StrCat(
              "block ", id.ToHex(), ": disk payload is ", payload.size(),
              " bytes, expected ", payload_bytes));
        }
        const uint64_t got = copier_.CopyHashingSource(dest, payload.data(), payload.size());
        if (got != checksum) {
          return absl::DataLossError(absl::StrCat(
              "block ", id.ToHex(), ": disk copy fails its checksum (stored ",
              absl::Hex(checksum), ", read ", absl::Hex(got), ")"));
        }
        if (promote != nullptr && promote != dest) {
          std::memcpy(promote, payload.data(), payload.size());
        }
        return absl::OkStatus();
      });
}

std::optional<Extent> TierManager::Impl::ReservePromotion(uint64_t n) {
  absl::MutexLock lock(&mu_);
  if (arena_->UsedBytes() + arena_->RoundedSize(n) > high_bytes_) return std::nullopt;
  absl::StatusOr<Extent> got = arena_->Allocate(n);
  if (!got.ok()) return std::nullopt;
  pending_bytes_ += got->length;
  return *got;
}

Entry* TierManager::Impl::CommitPromotion(const BlockId& id, uint64_t gen,
                                          const Extent& extent, bool hold) {
  absl::MutexLock lock(&mu_);
  pending_bytes_ -= extent.length;
  Entry* e = FindGenLocked(id, gen);
  if (e == nullptr || e->ram || e->removed || !e->on_disk) {
    arena_->Free(extent);
    room_cv_.SignalAll();
    return nullptr;
  }
  SetRam(e, extent);
  ++counters_.promotions;
  if (!hold) return nullptr;
  ++e->readers;
  return e;
}

absl::Status TierManager::Impl::PromoteForPin(const BlockId& id, PinOwner owner,
                                              absl::Time deadline) {
  uint64_t gen, checksum, bytes;
  Extent extent;
  {
    absl::MutexLock lock(&mu_);
    for (;;) {
      Entry* e = FindVisibleLocked(id);
      if (e == nullptr || !e->bytes_available()) {
        return absl::NotFoundError(
            absl::StrCat("block ", id.ToHex(), " disappeared before it was pinned"));
      }
      if (e->ram) {
        AddPin(e, owner);
        Touch(e);
        return absl::OkStatus();
      }
      gen = e->gen;
      checksum = e->checksum;
      bytes = e->payload_bytes;
      EVOKE_RETURN_IF_ERROR(CheckFits(bytes));
      std::vector<Extent> got;
      const uint64_t sizes[] = {bytes};
      if (TryAllocateAll(sizes, &got)) {
        extent = got[0];
        pending_bytes_ += extent.length;
        break;
      }
      const uint64_t rounded = arena_->RoundedSize(bytes);
      EVOKE_RETURN_IF_ERROR(WaitForRoom(rounded, rounded, deadline));
    }
  }
  absl::Status s = ReadFromDisk(id, checksum, bytes, arena_->Data(extent));
  absl::MutexLock lock(&mu_);
  pending_bytes_ -= extent.length;
  Entry* e = FindGenLocked(id, gen);
  if (!s.ok() || e == nullptr || e->ram) {
    arena_->Free(extent);
    room_cv_.SignalAll();
    if (s.code() == absl::StatusCode::kDataLoss) ++counters_.checksum_failures;
    if (!s.ok()) return s;
    if (e == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("block ", id.ToHex(), " was deleted while being pinned"));
    }
    AddPin(e, owner);
    return absl::OkStatus();
  }
  SetRam(e, extent);
  AddPin(e, owner);
  Touch(e);
  ++counters_.promotions;
  return absl::OkStatus();
}

// ------------------------------------------------------------ Load

absl::Status TierManager::Impl::Load(absl::Span<const BlockId> ids,
                                     const v1::LayoutFingerprint& fingerprint,
                                     LoadSink& sink,
                                     std::vector<v1::BlockMeta>* metas,
                                     std::vector<LoadedInfo>* infos) {
  EVOKE_RETURN_IF_ERROR(CheckOpen());
  const FingerprintDigest expected = DigestFingerprint(fingerprint);
  const size_t n = ids.size();
  struct Plan {
    uint64_t gen = 0;
    uint64_t checksum = 0;
    uint64_t bytes = 0;
    bool on_disk = false;
  };
  std::vector<Plan> plan(n);
  // Entries whose tier-1 bytes we hold a reader on, released at the end
  // (after sink.Finish(), since Deliver's bytes must stay valid until then).
  std::vector<Entry*> held;
  metas->assign(n, v1::BlockMeta());
  infos->assign(n, LoadedInfo());
  std::vector<Entry*> ram(n, nullptr);
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < n; ++i) {
      Entry* e = FindVisibleLocked(ids[i]);
      if (e == nullptr) {
        ++counters_.misses;
        return absl::NotFoundError(
            absl::StrCat("ids[", i, "]: block ", ids[i].ToHex(), " not found"));
      }
      if (!e->bytes_available()) {
        ++counters_.misses;
        return absl::NotFoundError(absl::StrCat(
            "ids[", i, "]: block ", ids[i].ToHex(),
            " has no bytes (breadcrumb: its payload was dropped past the spill "
            "budget or failed verification); re-prefill this span"));
      }
      if (e->fp_digest != expected) {
        return absl::FailedPreconditionError(absl::StrCat(
            "fingerprint: block ", ids[i].ToHex(), " (ids[", i,
            "]) was saved with another layout: ",
            FingerprintMismatch(e->meta.fingerprint(), fingerprint)));
      }
    }
    for (size_t i = 0; i < n; ++i) {
      Entry* e = FindVisibleLocked(ids[i]);
      plan[i].gen = e->gen;
      plan[i].checksum = e->checksum;
      plan[i].bytes = e->payload_bytes;
      plan[i].on_disk = e->on_disk;
      if (e->ram && !e->ram_corrupt) {
        ++e->readers;
        ram[i] = e;
        held.push_back(e);
      }
      Touch(e);
      (*metas)[i] = e->meta;
    }
  }
  auto release = [&]() {
    absl::MutexLock lock(&mu_);
    for (Entry* e : held) ReleaseReader(e);
    held.clear();
  };

  absl::Status failure = sink.Prepare(*metas);
  std::vector<std::string> staging;  // Deliver-path copies of disk reads.
  staging.reserve(n);
  uint64_t hits1 = 0, hits2 = 0;
  for (size_t i = 0; i < n && failure.ok(); ++i) {
    uint8_t* dest = sink.HostDestination(i);
    bool served = false;
    if (ram[i] != nullptr) {
      const uint8_t* bytes = arena_->Data(*ram[i]->ram);
      const bool sink_verifies = dest == nullptr && sink.VerifiesDeliveries();
      const uint64_t got = sink_verifies ? plan[i].checksum
                           : dest != nullptr
                               ? copier_.CopyHashingSource(dest, bytes, plan[i].bytes)
                               : copier_.Checksum(bytes, plan[i].bytes);
      if (got == plan[i].checksum) {
        failure = dest == nullptr
                      ? sink.Deliver(i, bytes, plan[i].bytes, plan[i].checksum)
                      : sink.AfterHostCopy(i, dest, plan[i].bytes);
        served = true;
        (*infos)[i].served_from = v1::TIER_PINNED_HOST;
        ++hits1;
      } else {
        absl::MutexLock lock(&mu_);
        ++counters_.checksum_failures;
        QuarantineRamLocked(ram[i]);
        if (!plan[i].on_disk) {
          failure = absl::DataLossError(absl::StrCat(
              "ids[", i, "]: block ", ids[i].ToHex(),
              " failed its checksum in tier 1 and has no other copy"));
        }
      }
    }
    if (served || !failure.ok()) continue;
    // From disk: into the destination, or (Deliver path) into a promotion
    // extent or a staging buffer that lives until Finish.
    std::optional<Extent> promote = ReservePromotion(plan[i].bytes);
    uint8_t* target = dest;
    if (target == nullptr) {
      if (promote) {
        target = arena_->Data(*promote);
      } else {
        staging.emplace_back(plan[i].bytes, '\0');
        target = reinterpret_cast<uint8_t*>(staging.back().data());
      }
    }
    absl::Status s = ReadFromDisk(ids[i], plan[i].checksum, plan[i].bytes, target,
                                  promote ? arena_->Data(*promote) : nullptr);
    if (!s.ok()) {
      if (promote) {
        absl::MutexLock lock(&mu_);
        pending_bytes_ -= promote->length;
        arena_->Free(*promote);
        room_cv_.SignalAll();
      }
      if (s.code() == absl::StatusCode::kDataLoss) {
        {
          absl::MutexLock lock(&mu_);
          ++counters_.checksum_failures;
        }
        absl::MutexLock disk(&disk_mu_);
        QuarantineDisk(ids[i], plan[i].gen);
      } else if (s.code() == absl::StatusCode::kNotFound) {
        absl::MutexLock lock(&mu_);
        ++counters_.misses;
      }
      failure = absl::Status(s.code(), absl::StrCat("ids[", i, "]: ", s.message()));
      break;
    }
    ++hits2;
    (*infos)[i].served_from = v1::TIER_SPILL;
    if (promote) {
      // Hold the promoted copy when the sink reads it at Finish.
      Entry* e = CommitPromotion(ids[i], plan[i].gen, *promote, dest == nullptr);
      if (e != nullptr) {
        held.push_back(e);
      } else if (dest == nullptr) {
        // The block changed meanwhile and the extent was freed: deliver from
        // a staging copy instead.
        failure = absl::AbortedError(absl::StrCat(
            "ids[", i, "]: block ", ids[i].ToHex(), " changed during the load; retry"));
        break;
      }
    }
    failure = dest == nullptr ? sink.Deliver(i, target, plan[i].bytes, plan[i].checksum)
                              : sink.AfterHostCopy(i, dest, plan[i].bytes);
  }
  if (failure.ok()) failure = sink.Finish();
  if (failure.code() == absl::StatusCode::kDataLoss && sink.VerifiesDeliveries()) {
    // A delivery failed its check where it landed: find the tier-1 copies
    // that are bad (if any) and drop them.
    for (size_t j = 0; j < n; ++j) {
      if (ram[j] == nullptr) continue;
      if (copier_.Checksum(arena_->Data(*ram[j]->ram), plan[j].bytes) != plan[j].checksum) {
        absl::MutexLock lock(&mu_);
        ++counters_.checksum_failures;
        QuarantineRamLocked(ram[j]);
      }
    }
  }
  release();
  absl::MutexLock lock(&mu_);
  counters_.hits_tier1 += hits1;
  counters_.hits_tier2 += hits2;
  if (failure.ok()) counters_.loads += n;
  return failure;
}

// ------------------------------------------------------------ small rpcs

std::vector<v1::Tier> TierManager::Impl::Lookup(absl::Span<const BlockId> ids) {
  std::vector<v1::Tier> tiers;
  absl::MutexLock lock(&mu_);
  for (const BlockId& id : ids) {
    Entry* e = FindVisibleLocked(id);
    if (e == nullptr || !e->bytes_available()) break;
    tiers.push_back(TierOf(*e));
  }
  return tiers;
}

absl::Status TierManager::Impl::Delete(absl::Span<const BlockId> ids) {
  EVOKE_RETURN_IF_ERROR(CheckOpen());
  absl::MutexLock disk(&disk_mu_);
  std::vector<BlockId> on_disk;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < ids.size(); ++i) {
      Entry* e = FindVisibleLocked(ids[i]);
      if (e == nullptr) {
        return absl::NotFoundError(absl::StrCat(
            "ids[", i, "]: block ", ids[i].ToHex(), " not found; nothing deleted"));
      }
      if (e->record_on_disk) on_disk.push_back(ids[i]);
    }
  }
  // Disk first: if it fails, the index is unchanged and nothing resurrects
  // after a restart.
  if (!on_disk.empty()) EVOKE_RETURN_IF_ERROR(spill_->Delete(on_disk));
  absl::MutexLock lock(&mu_);
  for (const BlockId& id : ids) {
    Entry* e = FindVisibleLocked(id);
    if (e != nullptr) RemoveLocked(e);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> TierManager::Impl::DropSession(
    absl::string_view ns, absl::string_view session_id) {
  EVOKE_RETURN_IF_ERROR(CheckOpen());
  std::vector<BlockId> ids;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(SessionKey(ns, session_id));
    if (it == sessions_.end()) return 0;
    ids.assign(it->second.begin(), it->second.end());
  }
  absl::MutexLock disk(&disk_mu_);
  std::vector<BlockId> on_disk;
  {
    absl::MutexLock lock(&mu_);
    std::vector<BlockId> present;
    for (const BlockId& id : ids) {
      Entry* e = FindVisibleLocked(id);
      if (e == nullptr) continue;
      present.push_back(id);
      if (e->record_on_disk) on_disk.push_back(id);
    }
    ids = std::move(present);
  }
  if (!on_disk.empty()) EVOKE_RETURN_IF_ERROR(spill_->Delete(on_disk));
  absl::MutexLock lock(&mu_);
  uint32_t n = 0;
  for (const BlockId& id : ids) {
    Entry* e = FindVisibleLocked(id);
    if (e == nullptr) continue;
    RemoveLocked(e);
    ++n;
  }
  return n;
}

absl::Status TierManager::Impl::Pin(absl::Span<const BlockId> ids, PinOwner owner,
                                    absl::Time deadline) {
  EVOKE_RETURN_IF_ERROR(CheckOpen());
  std::vector<BlockId> to_promote;
  std::vector<std::pair<BlockId, uint64_t>> pinned;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < ids.size(); ++i) {
      Entry* e = FindVisibleLocked(ids[i]);
      if (e == nullptr || !e->bytes_available()) {
        return absl::NotFoundError(absl::StrCat(
            "ids[", i, "]: block ", ids[i].ToHex(),
            e == nullptr ? " not found" : " has no bytes (breadcrumb)"));
      }
    }
    for (const BlockId& id : ids) {
      Entry* e = FindVisibleLocked(id);
      if (e->ram) {
        AddPin(e, owner);
        Touch(e);
        pinned.emplace_back(id, e->gen);
      } else {
        to_promote.push_back(id);
      }
    }
  }
  for (size_t i = 0; i < to_promote.size(); ++i) {
    absl::Status s = PromoteForPin(to_promote[i], owner, deadline);
    if (!s.ok()) {
      // Undo, so that Pin stays all-or-nothing.
      absl::MutexLock lock(&mu_);
      for (const auto& [id, gen] : pinned) {
        Entry* e = FindGenLocked(id, gen);
        if (e != nullptr) RemovePin(e, owner);
      }
      for (size_t j = 0; j < i; ++j) {
        Entry* e = FindVisibleLocked(to_promote[j]);
        if (e != nullptr) RemovePin(e, owner);
      }
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status TierManager::Impl::Unpin(absl::Span<const BlockId> ids, PinOwner owner) {
  EVOKE_RETURN_IF_ERROR(CheckOpen());
  absl::MutexLock lock(&mu_);
  absl::flat_hash_map<BlockId, uint32_t> asked;
  for (size_t i = 0; i < ids.size(); ++i) {
    Entry* e = FindVisibleLocked(ids[i]);
    if (e == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("ids[", i, "]: block ", ids[i].ToHex(), " not found"));
    }
    auto held = e->pin_owners.find(owner);
    if (++asked[ids[i]] > (held == e->pin_owners.end() ? 0 : held->second)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ids[", i, "]: block ", ids[i].ToHex(), " is not pinned by this lease"));
    }
  }
  for (const BlockId& id : ids) RemovePin(FindVisibleLocked(id), owner);
  return absl::OkStatus();
}

uint64_t TierManager::Impl::ReleaseOwner(PinOwner owner) {
  absl::MutexLock lock(&mu_);
  auto it = owner_pins_.find(owner);
  if (it == owner_pins_.end()) return 0;
  const absl::flat_hash_map<BlockId, uint32_t> pins = it->second;
  uint64_t released = 0;
  for (const auto& [id, count] : pins) {
    Entry* e = FindVisibleLocked(id);
    if (e == nullptr) continue;
    for (uint32_t k = 0; k < count; ++k) {
      RemovePin(e, owner);
      ++released;
    }
  }
  owner_pins_.erase(owner);
  return released;
}

absl::StatusOr<v1::BlockInfo> TierManager::Impl::Describe(const BlockId& id) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindVisibleLocked(id);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrCat("id: block ", id.ToHex(), " not found"));
  }
  return InfoLocked(*e);
}

std::vector<v1::BlockInfo> TierManager::Impl::List(const ListFilter& filter,
                                                   const BlockId& after,
                                                   bool has_after, size_t limit,
                                                   bool* more) {
  std::vector<v1::BlockInfo> out;
  *more = false;
  absl::MutexLock lock(&mu_);
  auto it = has_after ? index_.upper_bound(after) : index_.begin();
  for (; it != index_.end(); ++it) {
    const Entry& e = *it->second;
    if (e.writing) continue;
    if (!filter.ns.empty() && e.meta.fingerprint().namespace_() != filter.ns) {
      continue;
    }
    if (!filter.session_id.empty() && e.meta.session_id() != filter.session_id) {
      continue;
    }
    if (filter.tier != v1::TIER_UNSPECIFIED && TierOf(e) != filter.tier) continue;
    if (out.size() == limit) {
      *more = true;
      break;
    }
    out.push_back(InfoLocked(e));
  }
  return out;
}

void TierManager::Impl::Stats(v1::StatResponse* out) {
  const PinnedArena::Stats arena = arena_->GetStats();
  absl::MutexLock lock(&mu_);
  v1::TierStat* pinned = out->mutable_pinned();
  pinned->set_blocks(ram_blocks_);
  pinned->set_payload_bytes(ram_payload_bytes_);
  pinned->set_used_bytes(arena.used_bytes);
  pinned->set_capacity_bytes(arena.capacity_bytes);
  v1::TierStat* spill = out->mutable_spill();
  spill->set_blocks(disk_blocks_);
  spill->set_payload_bytes(disk_payload_bytes_);
  spill->set_used_bytes(spill_->UsedBytes());
  spill->set_capacity_bytes(options_.spill_bytes);
  out->set_breadcrumb_blocks(breadcrumb_blocks_);
  out->set_pinned_blocks(pinned_blocks_);
  uint64_t pins = 0;
  for (const auto& [owner, blocks] : owner_pins_) {
    for (const auto& [id, count] : blocks) pins += count;
  }
  out->mutable_leases()->set_lease_pins(pins);
  v1::Counters* c = out->mutable_counters();
  c->set_saves(counters_.saves);
  c->set_dedups(counters_.dedups);
  c->set_loads(counters_.loads);
  c->set_hits_tier1(counters_.hits_tier1);
  c->set_hits_tier2(counters_.hits_tier2);
  c->set_misses(counters_.misses);
  c->set_spills(counters_.spills);
  c->set_spilled_bytes(counters_.spilled_bytes);
  c->set_evictions(counters_.evictions);
  c->set_promotions(counters_.promotions);
  c->set_breadcrumbs(counters_.breadcrumbs);
  c->set_checksum_failures(counters_.checksum_failures);
  c->set_deletes(counters_.deletes);
  c->set_spill_errors(counters_.spill_errors);
  out->set_pinned_memory_locked(arena.locked);
  out->set_pinned_memory_lock_error(arena.lock_error);
  out->set_pinned_largest_free_bytes(arena.largest_free_bytes);
  out->set_high_watermark(options_.high_watermark);
  out->set_low_watermark(options_.low_watermark);
  out->set_uptime_seconds(
      static_cast<uint64_t>(absl::ToInt64Seconds(absl::Now() - start_)));
}

absl::StatusOr<v1::VerifyResponse> TierManager::Impl::Verify(
    absl::Span<const BlockId> requested) {
  EVOKE_RETURN_IF_ERROR(CheckOpen());
  v1::VerifyResponse out;
  std::vector<BlockId> ids(requested.begin(), requested.end());
  if (ids.empty()) {
    absl::MutexLock lock(&mu_);
    ids.reserve(index_.size());
    for (const auto& [id, e] : index_) {
      if (!e->writing) ids.push_back(id);
    }
  }
  std::string scratch;
  for (const BlockId& id : ids) {
    Entry* reader = nullptr;
    uint64_t gen = 0, checksum = 0, bytes = 0;
    bool on_disk = false;
    {
      absl::MutexLock lock(&mu_);
      Entry* e = FindVisibleLocked(id);
      if (e == nullptr) {
        out.set_missing(out.missing() + 1);
        continue;
      }
      gen = e->gen;
      checksum = e->checksum;
      bytes = e->payload_bytes;
      on_disk = e->on_disk;
      if (e->ram && !e->ram_corrupt) {
        ++e->readers;
        reader = e;
      }
    }
    out.set_blocks_checked(out.blocks_checked() + 1);
    if (reader != nullptr) {
      const uint64_t got = PayloadChecksum(arena_->Data(*reader->ram), bytes);
      absl::MutexLock lock(&mu_);
      out.set_copies_checked(out.copies_checked() + 1);
      if (got == checksum) {
        out.set_copies_ok(out.copies_ok() + 1);
      } else {
        ++counters_.checksum_failures;
        v1::CorruptCopy* bad = out.add_corrupt();
        bad->set_id(id.ToBytes());
        bad->set_tier(v1::TIER_PINNED_HOST);
        bad->set_detail(absl::StrCat("tier-1 copy hashes to ", absl::Hex(got),
                                     ", stored ", absl::Hex(checksum)));
        QuarantineRamLocked(reader);
      }
      ReleaseReader(reader);
    }
    if (on_disk) {
      scratch.resize(bytes);
      absl::Status s = ReadFromDisk(id, checksum, bytes,
                                    reinterpret_cast<uint8_t*>(scratch.data()));
      if (s.code() == absl::StatusCode::kNotFound) continue;  // Changed meanwhile.
      if (s.code() == absl::StatusCode::kUnavailable) return s;
      out.set_copies_checked(out.copies_checked() + 1);
      if (s.ok()) {
        out.set_copies_ok(out.copies_ok() + 1);
      } else {
        {
          absl::MutexLock lock(&mu_);
          ++counters_.checksum_failures;
        }
        v1::CorruptCopy* bad = out.add_corrupt();
        bad->set_id(id.ToBytes());
        bad->set_tier(v1::TIER_SPILL);
        bad->set_detail(std::string(s.message()));
        absl::MutexLock disk(&disk_mu_);
        QuarantineDisk(id, gen);
      }
    }
  }
  return out;
}

absl::StatusOr<v1::FlushResponse> TierManager::Impl::Flush(bool evict) {
  v1::FlushResponse out;
  absl::MutexLock disk(&disk_mu_);
  std::vector<Entry*> dirty;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, e] : index_) {
      if (e->ram && !e->on_disk && !e->writing) dirty.push_back(e.get());
    }
    // Coldest first, so that the disk LRU keeps access order.
    std::sort(dirty.begin(), dirty.end(), [](const Entry* a, const Entry* b) {
      return a->access_tick < b->access_tick;
    });
  }
  uint64_t blocks = 0, bytes = 0;
  absl::Status s = WriteDirty(std::move(dirty), /*sync=*/true, &blocks, &bytes);
  out.set_blocks_written(blocks);
  out.set_bytes_written(bytes);
  EVOKE_RETURN_IF_ERROR(s);
  if (evict) {
    // Before enforcing the spill budget, so that the budget drops the coldest
    // payloads rather than disk copies of blocks that are leaving tier 1.
    absl::MutexLock lock(&mu_);
    std::vector<Entry*> clean;
    for (Entry* e : ram_lru_) {
      if (e->on_disk && e->readers == 0) clean.push_back(e);
    }
    for (Entry* e : clean) {
      ClearRam(e);
      ++counters_.evictions;
    }
    out.set_blocks_evicted(clean.size());
  }
  EnforceSpillBudget();
  EVOKE_RETURN_IF_ERROR(spill_->Persist());
  return out;
}

absl::Status TierManager::Impl::Shutdown() {
  if (shut_down_.exchange(true)) {
    return absl::UnavailableError("already shut down");
  }
  StopSpiller();
  absl::StatusOr<v1::FlushResponse> flushed = Flush(/*evict=*/false);
  return flushed.status();
}

// ------------------------------------------------------------ spiller

bool TierManager::Impl::SpillNeededLocked() const {
  return spill_active_ || waiters_ > 0;
}

void TierManager::Impl::StopSpiller() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    spill_cv_.SignalAll();
    room_cv_.SignalAll();
  }
  if (spiller_.joinable()) spiller_.join();
}

void TierManager::Impl::SpillerLoop() {
  bool progressed = true;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      for (;;) {
        if (stop_) return;
        const uint64_t used = arena_->UsedBytes();
        if (used > high_bytes_) spill_active_ = true;
        if (spill_active_ && used <= low_bytes_ && waiters_ == 0) {
          spill_active_ = false;
        }
        if (SpillNeededLocked() && progressed) break;
        // Without progress (every candidate busy, or the disk failing), poll
        // instead of spinning.
        spiller_busy_ = false;
        spill_cv_.WaitWithTimeout(&mu_, progressed ? absl::Seconds(1)
                                                   : absl::Milliseconds(50));
        progressed = true;
      }
      spiller_busy_ = true;
    }
    progressed = SpillRound();
  }
}

bool TierManager::Impl::SpillRound() {
  absl::MutexLock disk(&disk_mu_);
  std::vector<Entry*> victims;
  uint64_t freed = 0;
  {
    absl::MutexLock lock(&mu_);
    const uint64_t capacity = arena_->capacity_bytes();
    // Target: under the low watermark and, for waiting saves, enough free
    // bytes for all of them and one free range for the largest.
    const uint64_t target = std::min(
        low_bytes_, wanted_total_ > capacity ? 0 : capacity - wanted_total_);
    uint64_t batch = 0;
    uint64_t pending_free = 0;  // Extents of chosen dirty victims.
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      const uint64_t used = arena_->UsedBytes() - pending_free;
      const bool need_range =
          waiters_ > 0 && arena_->LargestFreeBytes() < wanted_largest_;
      return used <= target && !need_range;
    };
    // Walk from the cold end. Clean blocks leave at once (their bytes are on
    // disk); dirty ones are collected into one write batch.
    auto it = ram_lru_.end();
    while (it != ram_lru_.begin() && !done()) {
      auto cur = std::prev(it);
      Entry* e = *cur;
      if (e->readers > 0) {
        it = cur;
        continue;
      }
      if (e->on_disk) {
        freed += e->ram->length;
        ClearRam(e);  // Erases `cur`; `it` stays valid.
        ++counters_.evictions;
        continue;
      }
      if (!victims.empty() && batch + e->payload_bytes > options_.spill_batch_bytes) {
        break;
      }
      victims.push_back(e);
      batch += e->payload_bytes;
      pending_free += e->ram->length;
      it = cur;
    }
  }
  if (victims.empty()) return freed > 0;
  uint64_t blocks = 0, bytes = 0;
  absl::Status s = WriteDirty(victims, /*sync=*/false, &blocks, &bytes);
  {
    absl::MutexLock lock(&mu_);
    for (Entry* e : victims) {
      if (e->ram && e->on_disk && e->readers == 0 && e->pins == 0 && !e->removed) {
        freed += e->ram->length;
        ClearRam(e);
        ++counters_.evictions;
      }
    }
  }
  EnforceSpillBudget();
  return s.ok() && freed > 0;
}

bool TierManager::Impl::WaitForSpillerIdle(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (!spiller_busy_ && !spill_active_ && waiters_ == 0 &&
          arena_->UsedBytes() <= high_bytes_) {
        return true;
      }
    }
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

// ------------------------------------------------------------ TierManager

absl::StatusOr<std::unique_ptr<TierManager>> TierManager::Open(
    const TierManagerOptions& options, std::unique_ptr<PinnedArena> arena,
    std::unique_ptr<Tier> spill) {
  if (!(options.low_watermark > 0 && options.low_watermark < options.high_watermark &&
        options.high_watermark <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "watermarks: need 0 < low (", options.low_watermark, ") < high (",
        options.high_watermark, ") <= 1"));
  }
  if (arena == nullptr || spill == nullptr) {
    return absl::InvalidArgumentError("arena and spill store are required");
  }
  auto impl = std::make_unique<Impl>(options, std::move(arena), std::move(spill));
  EVOKE_RETURN_IF_ERROR(impl->Rebuild());
  impl->StartSpiller();
  return std::unique_ptr<TierManager>(new TierManager(std::move(impl)));
}

TierManager::TierManager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TierManager::~TierManager() = default;

absl::StatusOr<std::vector<v1::SaveResult>> TierManager::Save(
    absl::Span<const SaveItem> items, SaveSource& source, bool durable,
    absl::Time deadline, PinOwner owner) {
  return impl_->Save(items, source, durable, deadline, owner);
}
absl::Status TierManager::Load(absl::Span<const BlockId> ids,
                               const v1::LayoutFingerprint& fingerprint,
                               LoadSink& sink, std::vector<v1::BlockMeta>* metas,
                               std::vector<LoadedInfo>* infos) {
  return impl_->Load(ids, fingerprint, sink, metas, infos);
}
std::vector<v1::Tier> TierManager::Lookup(absl::Span<const BlockId> ids) {
  return impl_->Lookup(ids);
}
absl::Status TierManager::Delete(absl::Span<const BlockId> ids) {
  return impl_->Delete(ids);
}
absl::StatusOr<uint32_t> TierManager::DropSession(absl::string_view ns,
                                                  absl::string_view session_id) {
  return impl_->DropSession(ns, session_id);
}
absl::Status TierManager::Pin(absl::Span<const BlockId> ids, PinOwner owner,
                              absl::Time deadline) {
  return impl_->Pin(ids, owner, deadline);
}
absl::Status TierManager::Unpin(absl::Span<const BlockId> ids, PinOwner owner) {
  return impl_->Unpin(ids, owner);
}
uint64_t TierManager::ReleaseOwner(PinOwner owner) { return impl_->ReleaseOwner(owner); }
absl::StatusOr<v1::BlockInfo> TierManager::Describe(const BlockId& id) {
  return impl_->Describe(id);
}
std::vector<v1::BlockInfo> TierManager::List(const ListFilter& filter,
                                             const BlockId& after, bool has_after,
                                             size_t limit, bool* more) {
  return impl_->List(filter, after, has_after, limit, more);
}
void TierManager::Stats(v1::StatResponse* out) { impl_->Stats(out); }
absl::StatusOr<v1::VerifyResponse> TierManager::Verify(
    absl::Span<const BlockId> ids) {
  return impl_->Verify(ids);
}
absl::StatusOr<v1::FlushResponse> TierManager::Flush(bool evict) {
  return impl_->Flush(evict);
}
absl::Status TierManager::Shutdown() { return impl_->Shutdown(); }
bool TierManager::WaitForSpillerIdle(absl::Duration timeout) {
  return impl_->WaitForSpillerIdle(timeout);
}

}  // namespace evoke
