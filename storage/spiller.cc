#include "storage/spiller.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/byte_size.h"
#include "common/failpoint.h"
#include "common/log.h"
#include "storage/tier_types.h"

namespace evoke {

Spiller::Spiller(EngineCore* core) : core_(core) {}

void Spiller::Start() { thread_ = std::thread([this] { Loop(); }); }

void Spiller::Stop() {
  {
    absl::MutexLock lock(core_->mu());
    stop_ = true;
    spill_cv_.SignalAll();
    core_->NotifyRoom();
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status Spiller::WaitForRoom(uint64_t total, uint64_t largest, absl::Time deadline) {
  if (stop_) return absl::UnavailableError("evoked is shutting down");
  if (absl::Status possible = core_->CanMakeRoom(total); !possible.ok()) return possible;
  const absl::Time now = absl::Now();
  if (now >= deadline) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tier 1 is full: no room for ", FormatByteSize(total),
        " before the deadline; the spiller could not free space in time",
        core_->HasSpillErrors() ? " (spill store errors: see logs)" : ""));
  }
  ++waiters_;
  wanted_total_ += total;
  wanted_largest_ = std::max(wanted_largest_, largest);
  spill_cv_.Signal();
  // Bytes may return to the arena without `mu` held (a reservation released
  // outside the lock): wake at least every 100 ms to look again.
  core_->AwaitRoom(std::min(deadline, now + absl::Milliseconds(100)));
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
    begin += core_->TakeWriteBatch(absl::MakeConstSpan(entries).subspan(begin), &batch,
                                   &records, &fresh);
    if (batch.empty()) continue;
    uint64_t batch_bytes = 0;
    std::vector<TierWrite> writes;
    writes.reserve(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      IndexEntry* e = batch[i];
      writes.push_back(TierWrite{
          e->id, &records[i],
          absl::string_view(reinterpret_cast<const char*>(e->ram.data()), e->payload_bytes),
          fresh[i]});
      batch_bytes += e->payload_bytes;
    }
    EVOKE_FAILPOINT("spill.before_put");
    absl::Status s = core_->disk()->Put(writes, sync);
    if (s.ok()) EVOKE_FAILPOINT("spill.after_put");
    if (!s.ok()) core_->LogTierError(s);
    core_->FinishWriteBatch(batch, s);
    if (!s.ok()) return s;
    *blocks += batch.size();
    *bytes += batch_bytes;
    EVOKE_FAILPOINT("spill.after_mark");
  }
  return absl::OkStatus();
}

void Spiller::EnforceBudget() {
  for (;;) {
    EngineCore::DiskVictims victims;
    if (!core_->PickBudgetVictims(&victims)) return;
    absl::Status s =
        victims.drop.empty() ? absl::OkStatus() : core_->disk()->DropPayloads(victims.drop);
    if (s.ok() && !victims.forget.empty()) s = core_->disk()->Delete(victims.forget);
    if (!s.ok()) core_->LogTierError(s);
    core_->FinishBudgetDrop(victims, s);
    if (!s.ok()) return;
  }
}

void Spiller::Loop() {
  bool progressed = true;
  for (;;) {
    {
      absl::MutexLock lock(core_->mu());
      for (;;) {
        if (stop_) return;
        core_->ExpireRetention();
        const uint64_t used = core_->host().used_bytes();
        if (used > core_->high_bytes()) active_ = true;
        if (active_ && used <= core_->low_bytes() && waiters_ == 0) active_ = false;
        if ((active_ || waiters_ > 0) && progressed) break;
        // Without progress (every candidate busy, or the disk failing), poll
        // instead of spinning.
        busy_ = false;
        spill_cv_.WaitWithTimeout(core_->mu(), progressed ? absl::Seconds(1)
                                                          : absl::Milliseconds(50));
        progressed = true;
      }
      busy_ = true;
    }
    progressed = Round();
  }
}

bool Spiller::Round() {
  absl::MutexLock disk(core_->disk_mu());
  std::vector<IndexEntry*> victims;
  uint64_t freed = 0;
  {
    // Target: under the low watermark and, for waiting saves, enough free
    // bytes for all of them and one free range for the largest (the range
    // only while saves wait).
    absl::MutexLock lock(core_->mu());
    freed = core_->PickSpillVictims(wanted_total_, waiters_ > 0 ? wanted_largest_ : 0, &victims);
  }
  if (victims.empty()) return freed > 0;
  uint64_t blocks = 0, bytes = 0;
  absl::Status s = WriteBack(victims, /*sync=*/false, &blocks, &bytes);
  freed += core_->EvictWritten(victims);
  EnforceBudget();
  return s.ok() && freed > 0;
}

absl::StatusOr<FlushResult> Spiller::Flush(bool evict, bool compact) {
  FlushResult out;
  absl::MutexLock disk(core_->disk_mu());
  std::vector<IndexEntry*> dirty = core_->DirtyByAccess();
  absl::Status s = WriteBack(dirty, /*sync=*/true, &out.blocks_written, &out.bytes_written);
  if (s.ok()) EVOKE_FAILPOINT("flush.after_writeback");
  if (!s.ok()) return s;
  if (evict) {
    // Before enforcing the spill budget, so that the budget drops the coldest
    // payloads rather than disk copies of blocks that are leaving tier 1.
    out.blocks_evicted = core_->EvictAllClean();
  }
  EnforceBudget();
  s = compact ? core_->disk()->Persist() : core_->disk()->Sync();
  if (s.ok()) EVOKE_FAILPOINT("flush.after_persist");
  if (!s.ok()) return s;
  return out;
}

bool Spiller::WaitForIdle(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    {
      absl::MutexLock lock(core_->mu());
      if (!busy_ && !active_ && waiters_ == 0 &&
          core_->host().used_bytes() <= core_->high_bytes()) {
        return true;
      }
    }
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

}  // namespace evoke
