#include "storage/engine_core.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "storage/tier_types.h"

namespace evoke {

EngineCore::EngineCore(const TierManagerOptions& opts, std::unique_ptr<PinnedArena> arena,
                       std::unique_ptr<Tier> disk_tier)
    : options_(opts),
      clock_(opts.clock != nullptr ? opts.clock : Clock::Real()),
      host_(std::move(arena), [this] { room_cv_.SignalAll(); }),
      disk_(std::move(disk_tier)),
      copier_(opts.copy_threads),
      disk_readers_(std::max(0, opts.disk_reads_in_flight - 1)),
      staging_(opts.staging_bytes),
      high_bytes_(static_cast<uint64_t>(opts.high_watermark * host_.capacity_bytes())),
      low_bytes_(static_cast<uint64_t>(opts.low_watermark * host_.capacity_bytes())),
      start_(clock_->Now()) {}

storage::SpillRecord EngineCore::RecordOf(const IndexEntry& e) {
  storage::SpillRecord record;
  *record.mutable_meta() = e.meta;
  record.set_last_access_unix_ms(e.last_access_ms);
  return record;
}

void EngineCore::LogTierError(const absl::Status& s) {
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  int64_t last = last_tier_error_log_s_.load();
  if (now - last >= 10 && last_tier_error_log_s_.compare_exchange_strong(last, now)) {
    EVOKE_LOG_ERROR(disk_->name(), " write failed (tier 1 cannot drain; saves will wait, "
                    "then fail with RESOURCE_EXHAUSTED): ", s.ToString());
  }
}

absl::Status EngineCore::ReadFromDisk(const BlockId& id, uint64_t checksum,
                                      uint64_t payload_bytes, uint8_t* dest, uint8_t* promote) {
  return disk_->Read(
      id, [&](const storage::SpillRecord& record, absl::string_view payload) -> absl::Status {
        if (record.meta().checksum() != checksum ||
            record.meta().payload_bytes() != payload_bytes) {
          // The copy belongs to another version of this id (deleted and
          // saved again while we read).
          return absl::NotFoundError(
              absl::StrCat(BlockName(id), " changed while being read; retry"));
        }
        if (payload.size() != payload_bytes) {
          return absl::DataLossError(absl::StrCat(BlockName(id), ": disk payload is ",
                                                  payload.size(), " bytes, expected ",
                                                  payload_bytes));
        }
        const uint64_t got = copier_.CopyHashingSource(dest, payload.data(), payload.size());
        if (got != checksum) {
          return absl::DataLossError(absl::StrCat(BlockName(id),
                                                  ": disk copy fails its checksum (stored ",
                                                  absl::Hex(checksum), ", read ", absl::Hex(got),
                                                  ")"));
        }
        if (promote != nullptr && promote != dest) {
          std::memcpy(promote, payload.data(), payload.size());
        }
        return absl::OkStatus();
      });
}

void EngineCore::ReadManyFromDisk(absl::Span<DiskRead> reads) {
  disk_readers_.ParallelFor(reads.size(), [this, reads](size_t i) {
    DiskRead& r = reads[i];
    r.status = ReadFromDisk(r.id, r.checksum, r.payload_bytes, r.dest, r.promote);
  });
}

void EngineCore::QuarantineDisk(const BlockId& id, uint64_t gen) {
  storage::SpillRecord record;
  bool in_ram = false;
  {
    absl::MutexLock lock(&mu_);
    const IndexEntry* e = index_.FindGen(id, gen);
    if (e == nullptr || !e->on_disk()) return;
    record = EngineCore::RecordOf(*e);
    in_ram = e->ram_readable();
  }
  absl::Status s;
  if (in_ram) {
    const BlockId ids[] = {id};
    s = disk_->Delete(ids);
  } else {
    const TierWrite w[] = {TierWrite{id, &record, {}}};
    s = disk_->DropPayloads(w);
  }
  absl::MutexLock lock(&mu_);
  IndexEntry* e = index_.FindGen(id, gen);
  if (!s.ok() || e == nullptr || !e->on_disk()) return;
  index_.MarkOffDisk(e, /*record_kept=*/!in_ram);
}

IndexEntry* EngineCore::CommitPromotion(const BlockId& id, uint64_t gen, ArenaReservation ram,
                                        bool hold) {
  absl::MutexLock lock(&mu_);
  IndexEntry* e = index_.FindGen(id, gen);
  if (e == nullptr) return nullptr;  // Frees `ram`.
  if (e->state != BlockState::kSpilled) {
    // Another Load promoted the same generation (the same verified bytes)
    // meanwhile: share its copy; `ram` is freed.
    if (!hold || !e->ram_readable()) return nullptr;
    index_.AddReader(e);
    return e;
  }
  index_.AttachRam(e, std::move(ram));
  ++counters_.promotions;
  if (!hold) return nullptr;
  index_.AddReader(e);
  return e;
}

EngineCore::PrefetchCommit EngineCore::CommitPrefetch(const BlockId& id, uint64_t gen,
                                                      ArenaReservation ram) {
  absl::MutexLock lock(&mu_);
  IndexEntry* e = index_.FindGen(id, gen);
  if (e == nullptr) return PrefetchCommit::kGone;  // Frees `ram`.
  if (e->state != BlockState::kSpilled) {
    if (!e->in_ram()) return PrefetchCommit::kGone;
    HoldPrefetched(e, /*brought=*/false);
    return PrefetchCommit::kInTier1;
  }
  index_.AttachRam(e, std::move(ram));
  HoldPrefetched(e, /*brought=*/true);
  ++counters_.promotions;
  return PrefetchCommit::kPromoted;
}

// ------------------------------------------------------------ room

absl::Status EngineCore::CanMakeRoom(uint64_t total) const {
  const uint64_t capacity = host_.capacity_bytes();
  const uint64_t used = host_.used_bytes();
  const uint64_t could_free = index_.evictable_bytes() + host_.pending_bytes();
  if (total > capacity) {
    return WithLimit(absl::ResourceExhaustedError(absl::StrCat(
                         "a batch of ", FormatByteSize(total), " cannot fit in tier 1 (",
                         FormatByteSize(capacity), "); save it in smaller batches")),
                     StorageLimit::kTier1Capacity);
  }
  if ((capacity - used) + could_free < total || could_free == 0) {
    return WithLimit(
        absl::ResourceExhaustedError(absl::StrCat(
            "tier 1 cannot make room for ", FormatByteSize(total), ": ",
            FormatByteSize(capacity - used), " free, ", FormatByteSize(could_free),
            " evictable, ", index_.pinned_blocks(), " pinned blocks (capacity ",
            FormatByteSize(capacity), ")")),
        StorageLimit::kTier1Capacity);
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------ reads

EngineCore::ReadHold EngineCore::HoldForRead(IndexEntry* e) {
  ReadHold hold{e->gen, e->checksum, e->payload_bytes, e->on_disk(), nullptr};
  if (e->ram_readable()) {
    index_.AddReader(e);
    hold.ram = e;
  }
  return hold;
}

std::optional<EngineCore::ReadHold> EngineCore::HoldVisible(const BlockId& id) {
  absl::MutexLock lock(&mu_);
  IndexEntry* e = index_.FindVisible(id);
  if (e == nullptr) return std::nullopt;
  return HoldForRead(e);
}

std::optional<EngineCore::ReadHold> EngineCore::HoldGen(const BlockId& id, uint64_t gen,
                                                        storage::SpillRecord* record) {
  IndexEntry* e = index_.FindGen(id, gen);
  if (e == nullptr || !e->bytes_available()) return std::nullopt;
  *record = RecordOf(*e);
  return HoldForRead(e);
}

void EngineCore::ReleaseReader(IndexEntry* e, bool corrupt) {
  absl::MutexLock lock(&mu_);
  if (corrupt) {
    ++counters_.checksum_failures;
    index_.Quarantine(e);
  }
  index_.ReleaseReader(e);
}

void EngineCore::ReleaseReaders(absl::Span<IndexEntry* const> held) {
  absl::MutexLock lock(&mu_);
  for (IndexEntry* e : held) index_.ReleaseReader(e);
}

void EngineCore::QuarantineRam(IndexEntry* e) {
  absl::MutexLock lock(&mu_);
  ++counters_.checksum_failures;
  index_.Quarantine(e);
}

void EngineCore::DropCorruptDiskCopy(const BlockId& id, uint64_t gen) {
  CountChecksumFailure();
  absl::MutexLock disk(&disk_mu_);
  QuarantineDisk(id, gen);
}

void EngineCore::CountChecksumFailure() {
  absl::MutexLock lock(&mu_);
  ++counters_.checksum_failures;
}

void EngineCore::CountMiss() {
  absl::MutexLock lock(&mu_);
  ++counters_.misses;
}

// ------------------------------------------------------------ tier 1

uint64_t EngineCore::Evict(IndexEntry* e) {
  const uint64_t freed = e->ram.length();
  index_.DetachRam(e).Release();
  ++counters_.evictions;
  return freed;
}

uint64_t EngineCore::EvictWritten(absl::Span<IndexEntry* const> entries) {
  absl::MutexLock lock(&mu_);
  uint64_t freed = 0;
  for (IndexEntry* e : entries) {
    if (e->state == BlockState::kClean && e->readers == 0 && e->pins == 0) freed += Evict(e);
  }
  return freed;
}

uint64_t EngineCore::EvictAllClean() {
  absl::MutexLock lock(&mu_);
  std::vector<IndexEntry*> clean;
  for (IndexEntry* e : index_.ram_lru()) {
    if (e->state == BlockState::kClean && e->readers == 0) clean.push_back(e);
  }
  for (IndexEntry* e : clean) Evict(e);
  return clean.size();
}

uint64_t EngineCore::PickSpillVictims(uint64_t wanted_total, uint64_t wanted_range,
                                      std::vector<IndexEntry*>* victims) {
  const uint64_t capacity = host_.capacity_bytes();
  const uint64_t target =
      std::min(low_bytes_, wanted_total > capacity ? 0 : capacity - wanted_total);
  uint64_t freed = 0;
  uint64_t batch = 0;
  uint64_t pending_free = 0;  // Extents of chosen dirty victims.
  auto done = [&] {
    const uint64_t used = host_.used_bytes() - pending_free;
    return used <= target && (wanted_range == 0 || host_.largest_free_bytes() >= wanted_range);
  };
  // Walk from the cold end. Clean blocks leave at once (their bytes are on
  // disk); dirty ones are collected into one write batch. Blocks of kept
  // sessions (KeepSession) are passed over, and taken in a second walk only
  // when the first could not free enough.
  // Once the victims chosen so far are written and evicted: they free an
  // extent as large as their largest.
  uint64_t largest_pending = 0;
  auto enough_once_written = [&] {
    return host_.used_bytes() - pending_free <= target &&
           (wanted_range == 0 || host_.largest_free_bytes() >= wanted_range ||
            largest_pending >= wanted_range);
  };
  const int64_t now_ms = NowMs();
  bool skipped_busy = false;  // Blocks in use now (being written out, read): soon evictable.
  // Keeps protect at most this much of tier 1 (the coldest kept blocks
  // first); kept blocks past it are taken as any other.
  const uint64_t kept_cap =
      static_cast<uint64_t>(options_.kept_tier1_fraction * static_cast<double>(capacity));
  uint64_t protected_bytes = 0;
  absl::flat_hash_set<const IndexEntry*> passed_over;  // By the first walk, for their keep.
  // Returns false when the batch filled up before the walk's end. With
  // `low_only`, takes only blocks of class kLow (a first walk, when any
  // block has that class).
  index_.ForgetEndedRetention(now_ms);
  const bool low_walked = index_.retained(RetentionClass::kLow) > 0;
  auto walk = [&](bool take_kept, bool low_only = false) {
    const std::list<IndexEntry*>& lru = index_.ram_lru();
    auto it = lru.end();
    while (it != lru.begin() && !done()) {
      auto cur = std::prev(it);
      IndexEntry* e = *cur;
      // The low walk takes only kLow blocks; the others pass over them (the
      // low walk took them, or they are in use).
      if (low_only ? (e->readers > 0 || !e->low(now_ms)) : (low_walked && e->low(now_ms))) {
        it = cur;
        continue;
      }
      // Kept sessions and blocks prefetched but not read yet are protected
      // alike; only keeps count as overrides (an unread prefetch that goes
      // is counted as prefetch_unused).
      bool kept = e->held_warm(now_ms);
      const bool session_kept = e->kept(now_ms);
      bool over_cap = false;
      if (!take_kept && kept && e->readers == 0) {
        if (protected_bytes + e->ram.length() <= kept_cap) {
          protected_bytes += e->ram.length();
          passed_over.insert(e);
        } else {
          kept = false;  // Past the cap: no protection (counted if taken).
          over_cap = true;
        }
      }
      // The second walk takes only what the first passed over for its keep.
      if (e->readers > 0 || (take_kept ? !passed_over.contains(e) : kept)) {
        skipped_busy |= e->readers > 0 && !kept;
        it = cur;
        continue;
      }
      if (e->state == BlockState::kClean) {
        counters_.keep_overrides += (take_kept || over_cap) && session_kept;
        freed += Evict(e);  // Erases `cur`; `it` stays valid.
        continue;
      }
      if (!victims->empty() && batch + e->payload_bytes > options_.spill_batch_bytes) {
        return false;
      }
      counters_.keep_overrides += (take_kept || over_cap) && session_kept;
      victims->push_back(e);
      batch += e->payload_bytes;
      pending_free += e->ram.length();
      largest_pending = std::max<uint64_t>(largest_pending, e->ram.length());
      it = cur;
    }
    return true;
  };
  // Blocks of class kLow first; kept blocks only once everything else was
  // taken and it is not enough (not when the first walk only filled its
  // batch, or passed over blocks in use: those go next).
  if (low_walked && !walk(/*take_kept=*/false, /*low_only=*/true)) {
    return freed;  // The batch is full.
  }
  if (walk(/*take_kept=*/false) && !passed_over.empty() && !skipped_busy &&
      !enough_once_written()) {
    walk(/*take_kept=*/true);
  }
  return freed;
}

// ------------------------------------------------------------ write-back

std::vector<IndexEntry*> EngineCore::DirtyByAccess() {
  absl::MutexLock lock(&mu_);
  return index_.DirtyByAccess();
}

size_t EngineCore::TakeWriteBatch(absl::Span<IndexEntry* const> entries,
                                  std::vector<IndexEntry*>* batch,
                                  std::vector<storage::SpillRecord>* records,
                                  std::vector<bool>* fresh) {
  absl::MutexLock lock(&mu_);
  uint64_t batch_bytes = 0;
  size_t end = 0;
  while (end < entries.size() &&
         (batch->empty() || batch_bytes + entries[end]->payload_bytes <=
                                options_.spill_batch_bytes)) {
    IndexEntry* e = entries[end++];
    if (e->state != BlockState::kDirty || e->ram_quarantined) continue;
    index_.AddReader(e);
    batch->push_back(e);
    batch_bytes += e->payload_bytes;
  }
  records->reserve(batch->size());
  fresh->reserve(batch->size());
  for (IndexEntry* e : *batch) {
    storage::SpillRecord& r = records->emplace_back();
    r.unsafe_arena_set_allocated_meta(&e->meta);
    r.set_last_access_unix_ms(e->last_access_ms);
    fresh->push_back(!e->record_on_disk);
  }
  return end;
}

void EngineCore::FinishWriteBatch(absl::Span<IndexEntry* const> batch,
                                  const absl::Status& written) {
  absl::MutexLock lock(&mu_);
  for (IndexEntry* e : batch) {
    if (written.ok() && e->state == BlockState::kDirty) {
      index_.MarkOnDisk(e);
      ++counters_.spills;
      counters_.spilled_bytes += e->payload_bytes;
    }
    index_.ReleaseReader(e);
  }
  if (!written.ok()) ++counters_.spill_errors;
}

// ------------------------------------------------------------ spill budget

bool EngineCore::PickBudgetVictims(DiskVictims* out) {
  absl::MutexLock lock(&mu_);
  // Past the spill budget, the coldest payloads go; else past a namespace's
  // tier-2 quota, that namespace's coldest.
  const uint64_t on_disk = index_.disk_payload_bytes();
  uint64_t excess = 0;
  std::optional<std::string> only_ns;
  if (on_disk > options_.spill_bytes) {
    excess = on_disk - options_.spill_bytes;
  } else if (options_.quota) {
    for (const auto& [ns, usage] : index_.usage()) {
      const uint64_t quota = options_.quota(ns).tier2_bytes;
      if (quota > 0 && usage.tier2_bytes > quota) {
        excess = usage.tier2_bytes - quota;
        only_ns = ns;
        break;
      }
    }
  }
  if (excess == 0) return false;
  uint64_t freed = 0;
  size_t visits = 0;
  const std::list<IndexEntry*>& lru = index_.disk_lru();
  // Kept sessions' payloads go last: a second walk, when the first (which
  // passes over them) could not free enough. A namespace's own quota is
  // not bent for its keeps.
  const int64_t now_ms = NowMs();
  // Payloads of class kLow go first of all.
  index_.ForgetEndedRetention(now_ms);
  if (index_.retained(RetentionClass::kLow) > 0) {
    for (auto it = lru.rbegin(); it != lru.rend() && freed < excess &&
                                 out->entries.size() < 4096 && visits++ < (1u << 20);
         ++it) {
      IndexEntry* e = *it;
      if (!e->low(now_ms)) continue;
      if (only_ns && e->meta.fingerprint().namespace_() != *only_ns) continue;
      out->entries.push_back(e);
      freed += e->payload_bytes;
    }
  }
  for (int pass = 0; pass < 2 && freed < excess; ++pass) {
    const bool take_kept = pass == 1 || only_ns.has_value();
    bool skipped_kept = false;
    for (auto it = lru.rbegin(); it != lru.rend() && freed < excess &&
                                 out->entries.size() < 4096 && visits++ < (1u << 20);
         ++it) {
      IndexEntry* e = *it;
      if (only_ns && e->meta.fingerprint().namespace_() != *only_ns) continue;
      const bool kept = e->kept(now_ms);
      if (kept && !take_kept) {
        skipped_kept = true;
        continue;
      }
      if (pass == 1 && !kept) continue;  // Taken, or passed over for good reason, in pass 0.
      if (e->low(now_ms)) continue;      // Taken first.
      counters_.keep_overrides += kept && !only_ns;
      out->entries.push_back(e);
      freed += e->payload_bytes;
    }
    if (!skipped_kept) break;
  }
  if (out->entries.empty()) return false;
  out->records.reserve(out->entries.size());  // `drop` points into it.
  for (IndexEntry* e : out->entries) {
    out->breadcrumb.push_back(!e->in_ram());
    e->dropping = !e->in_ram();
    if (e->in_ram()) {
      out->forget.push_back(e->id);
    } else {
      out->records.push_back(RecordOf(*e));
      out->drop.push_back(TierWrite{e->id, &out->records.back(), {}});
    }
  }
  return true;
}

void EngineCore::FinishBudgetDrop(const DiskVictims& victims, const absl::Status& dropped) {
  absl::MutexLock lock(&mu_);
  for (IndexEntry* e : victims.entries) e->dropping = false;
  if (!dropped.ok()) {
    ++counters_.spill_errors;
    return;
  }
  for (size_t i = 0; i < victims.entries.size(); ++i) {
    IndexEntry* e = victims.entries[i];
    index_.MarkOffDisk(e, /*record_kept=*/victims.breadcrumb[i]);
    if (e->state == BlockState::kBreadcrumb) ++counters_.breadcrumbs;
  }
}

absl::StatusOr<size_t> EngineCore::KeepSession(absl::string_view ns, absl::string_view session,
                                               int64_t until_ms, size_t max_sessions) {
  const int64_t now_ms = NowMs();
  if (until_ms > now_ms && index_.kept_sessions() >= max_sessions) {
    // Ended keeps are forgotten first; a session already kept may renew.
    index_.ForgetEndedKeeps(now_ms);
    if (index_.kept_sessions() >= max_sessions && !index_.IsKept(ns, session, now_ms)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          max_sessions, " sessions are kept already; end a keep (seconds 0) or wait"));
    }
  }
  return index_.KeepSession(ns, session, until_ms, now_ms);
}

// ------------------------------------------------------------ verification

void EngineCore::VerifyTargets(std::vector<BlockId>* ids,
                               std::vector<std::pair<BlockId, std::string>>* invalid) {
  absl::MutexLock lock(&mu_);
  if (ids->empty()) {
    *ids = index_.VisibleIds();
    invalid->assign(invalid_records_.begin(), invalid_records_.end());
    return;
  }
  for (const BlockId& id : *ids) {
    auto it = invalid_records_.find(id);
    if (it != invalid_records_.end()) invalid->emplace_back(it->first, it->second);
  }
}

absl::Status EngineCore::RemoveInvalidRecord(const BlockId& id) {
  absl::MutexLock disk(&disk_mu_);
  const BlockId one[] = {id};
  EVOKE_RETURN_IF_ERROR(disk_->Delete(one));
  absl::MutexLock lock(&mu_);
  invalid_records_.erase(id);
  return absl::OkStatus();
}

// ------------------------------------------------------------ stats

TierStats EngineCore::Stats() {
  TierStats out;
  const PinnedArena::Stats arena = host_.arena_stats();
  out.disk.used_bytes = disk_->UsedBytes();  // I/O: outside the lock.
  out.disk_health = disk_->Health();
  absl::MutexLock lock(&mu_);
  out.host = TierOccupancy{index_.ram_blocks(), index_.ram_payload_bytes(), arena.used_bytes,
                           arena.capacity_bytes};
  out.disk.blocks = index_.disk_blocks();
  out.disk.payload_bytes = index_.disk_payload_bytes();
  out.disk.capacity_bytes = options_.spill_bytes;
  out.breadcrumb_blocks = index_.count(BlockState::kBreadcrumb);
  out.pinned_blocks = index_.pinned_blocks();
  out.pins = index_.pin_count();
  index_.ForgetEndedKeeps(NowMs());  // So that the count is of keeps in force.
  out.kept_sessions = index_.kept_sessions();
  index_.ForgetEndedRetention(NowMs());
  out.low_blocks = index_.retained(RetentionClass::kLow);
  out.high_blocks = index_.retained(RetentionClass::kHigh);
  out.counters = counters_;
  out.counters.prefetch_unused = index_.prefetch_unused();
  out.host_locked = arena.locked;
  out.host_lock_error = arena.lock_error;
  out.host_prefaulted_bytes = arena.prefaulted_bytes;
  out.host_prefault_error = arena.prefault_error;
  out.host_largest_free_bytes = arena.largest_free_bytes;
  out.high_watermark = options_.high_watermark;
  out.low_watermark = options_.low_watermark;
  out.uptime = clock_->Now() - start_;
  out.metadata_bytes = index_.metadata_bytes();
  out.metadata_budget_bytes = options_.metadata_bytes;
  // Bounded: a daemon with a million namespaces answers Stat with a sample.
  constexpr size_t kMaxStatNamespaces = 4096;
  for (const auto& [ns, usage] : index_.usage()) {
    if (out.namespaces.size() == kMaxStatNamespaces) break;
    out.namespaces.emplace_back(ns, usage);
  }
  return out;
}

// ------------------------------------------------------------ start-up

absl::Status EngineCore::Rebuild(
    const std::function<absl::Status(const BlockId&, const v1::BlockMeta&)>& validate) {
  std::vector<std::string> skipped;
  BlockObserver* const observer = options_.observer;
  absl::MutexLock lock(&mu_);
  // Tier 2 is only read, before any other thread starts: no disk_mu.
  EVOKE_RETURN_IF_ERROR(disk_->ForEachRecord(
      // Runs on this thread, within the scan, under `mu`.
      [&](const BlockId& id, storage::SpillRecord& record)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
        if (absl::Status valid = validate(id, record.meta()); !valid.ok()) {
          if (invalid_records_.size() < 20) {
            EVOKE_LOG_ERROR("record ", id.ToHex(), " is invalid and is not served: ",
                            valid.message());
          }
          invalid_records_.emplace(id, std::string(valid.message()));
          ++counters_.invalid_records;
          return absl::OkStatus();
        }
        IndexEntry* e = index_.AddRecovered(id, std::move(*record.mutable_meta()),
                                            record.payload_present(),
                                            record.last_access_unix_ms());
        if (observer != nullptr) observer->Added(id, e->meta);
        return absl::OkStatus();
      },
      &skipped));
  index_.FinishLoading();
  index_.set_events(options_.events);
  counters_.checksum_failures += skipped.size();
  if (!invalid_records_.empty()) {
    EVOKE_LOG_ERROR(invalid_records_.size(),
                    " records failed validation and are kept out of the index (Stat: "
                    "invalid_records; evokectl verify or delete removes them)");
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------ the TierManager's steps

uint64_t EngineCore::EvictCleanOf(absl::string_view ns, uint64_t want) {
  // A bounded walk from the cold end: a Save never scans all of tier 1.
  constexpr size_t kMaxVisits = 1 << 16;
  uint64_t freed = 0;
  size_t visits = 0;
  const std::list<IndexEntry*>& lru = index_.ram_lru();
  auto it = lru.end();
  while (it != lru.begin() && freed < want && visits++ < kMaxVisits) {
    auto cur = std::prev(it);
    IndexEntry* e = *cur;
    if (e->state != BlockState::kClean || e->readers > 0 ||
        e->meta.fingerprint().namespace_() != ns) {
      it = cur;
      continue;
    }
    freed += e->payload_bytes;
    Evict(e);  // Erases `cur`; `it` stays valid.
  }
  if (freed > 0) NotifyRoom();
  return freed;
}

std::vector<IndexEntry*> EngineCore::DirtyOf(absl::string_view ns, uint64_t want) {
  constexpr size_t kMaxVisits = 1 << 16;
  std::vector<IndexEntry*> victims;
  absl::MutexLock lock(&mu_);
  uint64_t chosen = 0;
  size_t visits = 0;
  const std::list<IndexEntry*>& lru = index_.ram_lru();
  for (auto it = lru.rbegin(); it != lru.rend() && chosen < want && visits++ < kMaxVisits;
       ++it) {
    IndexEntry* e = *it;
    if (e->state != BlockState::kDirty || e->meta.fingerprint().namespace_() != ns) continue;
    victims.push_back(e);
    chosen += e->payload_bytes;
  }
  return victims;
}

void EngineCore::CommitWrite(IndexEntry* e, v1::BlockMeta meta, const FingerprintDigest& digest,
                             ArenaReservation ram, std::optional<PinOwner> pin, int64_t now_ms) {
  const uint64_t payload_bytes = meta.payload_bytes();
  const uint64_t checksum = meta.checksum();
  index_.ReplaceMetaForWrite(e, std::move(meta));
  e->fp_digest = digest;
  e->payload_bytes = payload_bytes;
  e->checksum = checksum;
  if (pin) index_.AddPin(e, *pin);
  index_.CommitWrite(e, std::move(ram), now_ms);
  ++counters_.saves;
}

void EngineCore::AttachForPin(IndexEntry* e, ArenaReservation ram, PinOwner owner) {
  index_.AttachRam(e, std::move(ram));
  index_.AddPin(e, owner);
  index_.Touch(e, NowMs());
  ++counters_.promotions;
}

void EngineCore::FinishLoad(absl::Span<IndexEntry* const> held, uint64_t hits_tier1,
                            uint64_t hits_tier2, uint64_t loaded) {
  absl::MutexLock lock(&mu_);
  for (IndexEntry* e : held) index_.ReleaseReader(e);
  counters_.hits_tier1 += hits_tier1;
  counters_.hits_tier2 += hits_tier2;
  counters_.loads += loaded;
}

}  // namespace evoke
