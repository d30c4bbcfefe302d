#include "storage/engine_core.h"

#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace evoke {

EngineCore::EngineCore(const TierManagerOptions& opts, std::unique_ptr<PinnedArena> arena,
                       std::unique_ptr<Tier> disk_tier)
    : options(opts),
      clock(opts.clock != nullptr ? opts.clock : Clock::Real()),
      host(std::move(arena), [this] { room_cv.SignalAll(); }),
      disk(std::move(disk_tier)),
      copier(opts.copy_threads),
      staging(opts.staging_bytes),
      high_bytes(static_cast<uint64_t>(opts.high_watermark * host.capacity_bytes())),
      low_bytes(static_cast<uint64_t>(opts.low_watermark * host.capacity_bytes())),
      start(clock->Now()) {}

storage::SpillRecord EngineCore::RecordOf(const IndexEntry& e) {
  storage::SpillRecord record;
  *record.mutable_meta() = e.meta;
  record.set_last_access_unix_ms(e.last_access_ms);
  return record;
}

void EngineCore::LogTierError(const absl::Status& s) {
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  int64_t last = last_tier_error_log_s.load();
  if (now - last >= 10 && last_tier_error_log_s.compare_exchange_strong(last, now)) {
    EVOKE_LOG_ERROR(disk->name(), " write failed (tier 1 cannot drain; saves will wait, "
                    "then fail with RESOURCE_EXHAUSTED): ", s.ToString());
  }
}

absl::Status EngineCore::ReadFromDisk(const BlockId& id, uint64_t checksum,
                                           uint64_t payload_bytes, uint8_t* dest,
                                           uint8_t* promote) {
  return disk->Read(
      id, [&](const storage::SpillRecord& record, absl::string_view payload) -> absl::Status {
        if (record.meta().checksum() != checksum ||
            record.meta().payload_bytes() != payload_bytes) {
          // The copy belongs to another version of this id (deleted and
          // saved again while we read).
          return absl::NotFoundError(absl::StrCat(BlockName(id), " changed while being read; retry"));
        }
        if (payload.size() != payload_bytes) {
          return absl::DataLossError(absl::StrCat(BlockName(id), ": disk payload is ",
                                                  payload.size(), " bytes, expected ",
                                                  payload_bytes));
        }
        const uint64_t got = copier.CopyHashingSource(dest, payload.data(), payload.size());
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

void EngineCore::QuarantineDisk(const BlockId& id, uint64_t gen) {
  storage::SpillRecord record;
  bool in_ram = false;
  {
    absl::MutexLock lock(&mu);
    const IndexEntry* e = index.FindGen(id, gen);
    if (e == nullptr || !e->on_disk()) return;
    record = EngineCore::RecordOf(*e);
    in_ram = e->ram_readable();
  }
  absl::Status s;
  if (in_ram) {
    const BlockId ids[] = {id};
    s = disk->Delete(ids);
  } else {
    const TierWrite w[] = {TierWrite{id, &record, {}}};
    s = disk->DropPayloads(w);
  }
  absl::MutexLock lock(&mu);
  IndexEntry* e = index.FindGen(id, gen);
  if (!s.ok() || e == nullptr || !e->on_disk()) return;
  index.MarkOffDisk(e, /*record_kept=*/!in_ram);
}

IndexEntry* EngineCore::CommitPromotion(const BlockId& id, uint64_t gen,
                                             ArenaReservation ram, bool hold) {
  absl::MutexLock lock(&mu);
  IndexEntry* e = index.FindGen(id, gen);
  if (e == nullptr) return nullptr;  // Frees `ram`.
  if (e->state != BlockState::kSpilled) {
    // Another Load promoted the same generation (the same verified bytes)
    // meanwhile: share its copy; `ram` is freed.
    if (!hold || !e->ram_readable()) return nullptr;
    index.AddReader(e);
    return e;
  }
  index.AttachRam(e, std::move(ram));
  ++counters.promotions;
  if (!hold) return nullptr;
  index.AddReader(e);
  return e;
}

TierStats EngineCore::Stats() {
  TierStats out;
  const PinnedArena::Stats arena = host.arena_stats();
  out.disk.used_bytes = disk->UsedBytes();  // I/O: outside the lock.
  out.disk_health = disk->Health();
  absl::MutexLock lock(&mu);
  out.host = TierOccupancy{index.ram_blocks(), index.ram_payload_bytes(), arena.used_bytes,
                           arena.capacity_bytes};
  out.disk.blocks = index.disk_blocks();
  out.disk.payload_bytes = index.disk_payload_bytes();
  out.disk.capacity_bytes = options.spill_bytes;
  out.breadcrumb_blocks = index.count(BlockState::kBreadcrumb);
  out.pinned_blocks = index.pinned_blocks();
  out.pins = index.pin_count();
  out.counters = counters;
  out.host_locked = arena.locked;
  out.host_lock_error = arena.lock_error;
  out.host_prefaulted_bytes = arena.prefaulted_bytes;
  out.host_prefault_error = arena.prefault_error;
  out.host_largest_free_bytes = arena.largest_free_bytes;
  out.high_watermark = options.high_watermark;
  out.low_watermark = options.low_watermark;
  out.uptime = clock->Now() - start;
  out.metadata_bytes = index.metadata_bytes();
  out.metadata_budget_bytes = options.metadata_bytes;
  // Bounded: a daemon with a million namespaces answers Stat with a sample.
  constexpr size_t kMaxStatNamespaces = 4096;
  for (const auto& [ns, usage] : index.usage()) {
    if (out.namespaces.size() == kMaxStatNamespaces) break;
    out.namespaces.emplace_back(ns, usage);
  }
  return out;
}

}  // namespace evoke
