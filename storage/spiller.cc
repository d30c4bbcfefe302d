#include "storage/spiller.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/failpoint.h"
#include "common/log.h"
#include "storage/tier_types.h"

namespace evoke {

Spiller::Spiller(EngineCore* core) : core_(core) {}

void Spiller::Start() { thread_ = std::thread([this] { Loop(); }); }

void Spiller::Stop() {
  {
    absl::MutexLock lock(&core_->mu);
    stop_ = true;
    spill_cv_.SignalAll();
    core_->room_cv.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status Spiller::WaitForRoom(uint64_t total, uint64_t largest, absl::Time deadline) {
  if (stop_) return absl::UnavailableError("evoked is shutting down");
  const uint64_t capacity = core_->host.capacity_bytes();
  const uint64_t used = core_->host.used_bytes();
  const uint64_t could_free = core_->index.evictable_bytes() + core_->host.pending_bytes();
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
            " evictable, ", core_->index.pinned_blocks(), " pinned blocks (capacity ",
            FormatByteSize(capacity), ")")),
        StorageLimit::kTier1Capacity);
  }
  const absl::Time now = absl::Now();
  if (now >= deadline) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tier 1 is full: no room for ", FormatByteSize(total),
        " before the deadline; the spiller could not free space in time",
        core_->counters.spill_errors > 0 ? " (spill store errors: see logs)" : ""));
  }
  ++waiters_;
  wanted_total_ += total;
  wanted_largest_ = std::max(wanted_largest_, largest);
  spill_cv_.Signal();
  // Bytes may return to the arena without `mu` held (a reservation released
  // outside the lock): wake at least every 100 ms to look again.
  core_->room_cv.WaitWithDeadline(&core_->mu,
                                  std::min(deadline, now + absl::Milliseconds(100)));
  --waiters_;
  wanted_total_ -= total;
  if (waiters_ == 0) wanted_largest_ = 0;
  return absl::OkStatus();
}

absl::Status Spiller::WriteBack(const std::vector<IndexEntry*>& entries, bool sync,
                                uint64_t* blocks, uint64_t* bytes) {
  // Entries cannot leave the index while disk_mu is held; a reader keeps
  // each one's tier-1 bytes in place while the tier copies them.
  size_t begin = 0;
  while (begin < entries.size()) {
    // The records alias each entry's meta instead of copying it (a copy per
    // block was a fifth of a shutdown flush of small blocks): an entry
    // cannot leave the index while disk_mu is held, and a kDirty entry's
    // meta never changes. The aliases are dropped before the records go.
    std::vector<storage::SpillRecord> records;
    struct Unalias {
      std::vector<storage::SpillRecord>* records;
      ~Unalias() {
        for (storage::SpillRecord& r : *records) r.unsafe_arena_release_meta();
      }
    } unalias{&records};
    std::vector<IndexEntry*> batch;
    std::vector<bool> fresh;
    uint64_t batch_bytes = 0;
    {
      absl::MutexLock lock(&core_->mu);
      size_t end = begin;
      while (end < entries.size() &&
             (batch.empty() || batch_bytes + entries[end]->payload_bytes <=
                                   core_->options.spill_batch_bytes)) {
        IndexEntry* e = entries[end++];
        if (e->state != BlockState::kDirty || e->ram_quarantined) continue;
        core_->index.AddReader(e);
        batch.push_back(e);
        batch_bytes += e->payload_bytes;
      }
      begin = end;
      records.reserve(batch.size());
      fresh.reserve(batch.size());
      for (IndexEntry* e : batch) {
        storage::SpillRecord& r = records.emplace_back();
        r.unsafe_arena_set_allocated_meta(&e->meta);
        r.set_last_access_unix_ms(e->last_access_ms);
        fresh.push_back(!e->record_on_disk);
      }
    }
    if (batch.empty()) continue;
    std::vector<TierWrite> writes;
    writes.reserve(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      IndexEntry* e = batch[i];
      writes.push_back(TierWrite{
          e->id, &records[i],
          absl::string_view(reinterpret_cast<const char*>(e->ram.data()), e->payload_bytes),
          fresh[i]});
    }
    EVOKE_FAILPOINT("spill.before_put");
    absl::Status s = core_->disk->Put(writes, sync);
    if (s.ok()) EVOKE_FAILPOINT("spill.after_put");
    if (!s.ok()) core_->LogTierError(s);
    absl::MutexLock lock(&core_->mu);
    for (IndexEntry* e : batch) {
      if (s.ok() && e->state == BlockState::kDirty) {
        core_->index.MarkOnDisk(e);
        ++core_->counters.spills;
        core_->counters.spilled_bytes += e->payload_bytes;
      }
      core_->index.ReleaseReader(e);
    }
    if (!s.ok()) {
      ++core_->counters.spill_errors;
      return s;
    }
    *blocks += batch.size();
    *bytes += batch_bytes;
    EVOKE_FAILPOINT("spill.after_mark");
  }
  return absl::OkStatus();
}

void Spiller::EnforceBudget() {
  for (;;) {
    std::vector<IndexEntry*> chosen;
    std::vector<bool> breadcrumb;  // Per chosen: a breadcrumb record is written.
    std::vector<storage::SpillRecord> records;
    std::vector<TierWrite> writes;
    std::vector<BlockId> forget;  // Disk copies of blocks also in tier 1.
    {
      absl::MutexLock lock(&core_->mu);
      // Past the spill budget, the coldest payloads go; else past a
      // namespace's tier-2 quota, that namespace's coldest.
      const uint64_t on_disk = core_->index.disk_payload_bytes();
      uint64_t excess = 0;
      std::optional<std::string> only_ns;
      if (on_disk > core_->options.spill_bytes) {
        excess = on_disk - core_->options.spill_bytes;
      } else if (core_->options.quota) {
        for (const auto& [ns, usage] : core_->index.usage()) {
          const uint64_t quota = core_->options.quota(ns).tier2_bytes;
          if (quota > 0 && usage.tier2_bytes > quota) {
            excess = usage.tier2_bytes - quota;
            only_ns = ns;
            break;
          }
        }
      }
      if (excess == 0) return;
      uint64_t freed = 0;
      size_t visits = 0;
      const std::list<IndexEntry*>& lru = core_->index.disk_lru();
      for (auto it = lru.rbegin(); it != lru.rend() && freed < excess && chosen.size() < 4096 &&
                                   visits++ < (1u << 20);
           ++it) {
        if (only_ns && (*it)->meta.fingerprint().namespace_() != *only_ns) continue;
        chosen.push_back(*it);
        freed += (*it)->payload_bytes;
      }
      if (chosen.empty()) return;
      records.reserve(chosen.size());  // TierWrite points into it.
      for (IndexEntry* e : chosen) {
        breadcrumb.push_back(!e->in_ram());
        if (e->in_ram()) {
          forget.push_back(e->id);
        } else {
          records.push_back(EngineCore::RecordOf(*e));
          writes.push_back(TierWrite{e->id, &records.back(), {}});
        }
      }
    }
    absl::Status s = writes.empty() ? absl::OkStatus() : core_->disk->DropPayloads(writes);
    if (s.ok() && !forget.empty()) s = core_->disk->Delete(forget);
    if (!s.ok()) core_->LogTierError(s);
    absl::MutexLock lock(&core_->mu);
    if (!s.ok()) {
      ++core_->counters.spill_errors;
      return;
    }
    for (size_t i = 0; i < chosen.size(); ++i) {
      IndexEntry* e = chosen[i];
      core_->index.MarkOffDisk(e, /*record_kept=*/breadcrumb[i]);
      if (e->state == BlockState::kBreadcrumb) ++core_->counters.breadcrumbs;
    }
  }
}

void Spiller::Loop() {
  bool progressed = true;
  for (;;) {
    {
      absl::MutexLock lock(&core_->mu);
      for (;;) {
        if (stop_) return;
        const uint64_t used = core_->host.used_bytes();
        if (used > core_->high_bytes) active_ = true;
        if (active_ && used <= core_->low_bytes && waiters_ == 0) active_ = false;
        if ((active_ || waiters_ > 0) && progressed) break;
        // Without progress (every candidate busy, or the disk failing), poll
        // instead of spinning.
        busy_ = false;
        spill_cv_.WaitWithTimeout(&core_->mu, progressed ? absl::Seconds(1)
                                                         : absl::Milliseconds(50));
        progressed = true;
      }
      busy_ = true;
    }
    progressed = Round();
  }
}

bool Spiller::Round() {
  absl::MutexLock disk(&core_->disk_mu);
  std::vector<IndexEntry*> victims;
  uint64_t freed = 0;
  {
    absl::MutexLock lock(&core_->mu);
    const uint64_t capacity = core_->host.capacity_bytes();
    // Target: under the low watermark and, for waiting saves, enough free
    // bytes for all of them and one free range for the largest.
    const uint64_t target =
        std::min(core_->low_bytes, wanted_total_ > capacity ? 0 : capacity - wanted_total_);
    uint64_t batch = 0;
    uint64_t pending_free = 0;  // Extents of chosen dirty victims.
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu) {
      const uint64_t used = core_->host.used_bytes() - pending_free;
      const bool need_range =
          waiters_ > 0 && core_->host.largest_free_bytes() < wanted_largest_;
      return used <= target && !need_range;
    };
    // Walk from the cold end. Clean blocks leave at once (their bytes are on
    // disk); dirty ones are collected into one write batch.
    const std::list<IndexEntry*>& lru = core_->index.ram_lru();
    auto it = lru.end();
    while (it != lru.begin() && !done()) {
      auto cur = std::prev(it);
      IndexEntry* e = *cur;
      if (e->readers > 0) {
        it = cur;
        continue;
      }
      if (e->state == BlockState::kClean) {
        freed += e->ram.length();
        core_->index.DetachRam(e).Release();  // Erases `cur`; `it` stays valid.
        ++core_->counters.evictions;
        continue;
      }
      if (!victims.empty() && batch + e->payload_bytes > core_->options.spill_batch_bytes) {
        break;
      }
      victims.push_back(e);
      batch += e->payload_bytes;
      pending_free += e->ram.length();
      it = cur;
    }
  }
  if (victims.empty()) return freed > 0;
  uint64_t blocks = 0, bytes = 0;
  absl::Status s = WriteBack(victims, /*sync=*/false, &blocks, &bytes);
  {
    absl::MutexLock lock(&core_->mu);
    for (IndexEntry* e : victims) {
      if (e->state == BlockState::kClean && e->readers == 0 && e->pins == 0) {
        freed += e->ram.length();
        core_->index.DetachRam(e).Release();
        ++core_->counters.evictions;
      }
    }
  }
  EnforceBudget();
  return s.ok() && freed > 0;
}

absl::StatusOr<FlushResult> Spiller::Flush(bool evict, bool compact) {
  FlushResult out;
  absl::MutexLock disk(&core_->disk_mu);
  std::vector<IndexEntry*> dirty;
  {
    absl::MutexLock lock(&core_->mu);
    dirty = core_->index.DirtyByAccess();
  }
  absl::Status s = WriteBack(dirty, /*sync=*/true, &out.blocks_written, &out.bytes_written);
  if (s.ok()) EVOKE_FAILPOINT("flush.after_writeback");
  if (!s.ok()) return s;
  if (evict) {
    // Before enforcing the spill budget, so that the budget drops the coldest
    // payloads rather than disk copies of blocks that are leaving tier 1.
    absl::MutexLock lock(&core_->mu);
    std::vector<IndexEntry*> clean;
    for (IndexEntry* e : core_->index.ram_lru()) {
      if (e->state == BlockState::kClean && e->readers == 0) clean.push_back(e);
    }
    for (IndexEntry* e : clean) {
      core_->index.DetachRam(e).Release();
      ++core_->counters.evictions;
    }
    out.blocks_evicted = clean.size();
  }
  EnforceBudget();
  s = compact ? core_->disk->Persist() : core_->disk->Sync();
  if (s.ok()) EVOKE_FAILPOINT("flush.after_persist");
  if (!s.ok()) return s;
  return out;
}

bool Spiller::WaitForIdle(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    {
      absl::MutexLock lock(&core_->mu);
      if (!busy_ && !active_ && waiters_ == 0 &&
          core_->host.used_bytes() <= core_->high_bytes) {
        return true;
      }
    }
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

}  // namespace evoke
