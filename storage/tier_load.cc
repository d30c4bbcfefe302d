// TierManagerImpl::Load: serves blocks from tier 1 or tier 2 into a sink,
// each payload verified against its checksum as it is read (the engine's own
// copy, never the sink's memory); blocks only tier 3 may hold are fetched
// first (remote_fetch.cc). The rest of the engine is in tier_manager.cc.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/failpoint.h"
#include "common/fingerprint.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "storage/tier_manager_impl.h"

namespace evoke {

absl::Status TierManagerImpl::Load(absl::Span<const BlockId> ids,
                                   const v1::LayoutFingerprint& fingerprint, LoadSink& sink,
                                   std::vector<v1::BlockMeta>* metas,
                                   std::vector<LoadedInfo>* infos,
                                   const NamespaceScope* scope) {
  EVOKE_RETURN_IF_ERROR(CheckOpen());
  // Blocks only tier 3 may hold are fetched into tier 1 first; the Load
  // then serves them like any other tier-1 block.
  const std::vector<size_t> remote = RemoteMisses(ids, fingerprint, scope);
  if (!remote.empty()) EVOKE_RETURN_IF_ERROR(FetchRemote(ids, remote, fingerprint));
  EVOKE_RETURN_IF_ERROR(LoadLocal(ids, fingerprint, sink, metas, infos, scope));
  for (size_t i : remote) (*infos)[i].served_from = BlockLocation::kRemote;
  return absl::OkStatus();
}

absl::Status TierManagerImpl::LoadLocal(absl::Span<const BlockId> ids,
                                        const v1::LayoutFingerprint& fingerprint,
                                        LoadSink& sink, std::vector<v1::BlockMeta>* metas,
                                        std::vector<LoadedInfo>* infos,
                                        const NamespaceScope* scope) {
  const FingerprintDigest expected = DigestFingerprint(fingerprint);
  const size_t n = ids.size();
  std::vector<EngineCore::ReadHold> plan(n);
  // Entries whose tier-1 bytes we hold a reader on, released at the end
  // (after sink.Finish(), since Deliver's bytes must stay valid until then).
  std::vector<IndexEntry*> held;
  metas->assign(n, v1::BlockMeta());
  infos->assign(n, LoadedInfo());
  {
    absl::MutexLock lock(core_.mu());
    for (size_t i = 0; i < n; ++i) {
      const IndexEntry* e = FindFor(ids[i], scope);
      if (e == nullptr || !e->bytes_available()) {
        core_.CountMissLocked();
        return ItemError(absl::StatusCode::kNotFound, i, ItemPart::kId,
                         e == nullptr ? absl::StrCat(BlockName(ids[i]), " not found")
                                      : absl::StrCat(BlockName(ids[i]),
                                                     " has no bytes (breadcrumb: its payload was "
                                                     "dropped past the spill budget or failed "
                                                     "verification); re-prefill this span"));
      }
      if (e->fp_digest != expected) {
        return ItemError(absl::StatusCode::kFailedPrecondition, i, ItemPart::kFingerprint,
                         absl::StrCat(BlockName(ids[i]), " was saved with another layout: ",
                                      FingerprintMismatch(e->meta.fingerprint(), fingerprint)));
      }
    }
    const int64_t now_ms = core_.NowMs();
    for (size_t i = 0; i < n; ++i) {
      IndexEntry* e = core_.FindVisible(ids[i]);
      plan[i] = core_.HoldForRead(e);
      if (plan[i].ram != nullptr) held.push_back(e);
      core_.NoteLoaded(e, plan[i].ram != nullptr);
      core_.Touch(e, now_ms);
      (*metas)[i] = e->meta;
      if (scope != nullptr && !scope->SeesTokensOf(e->meta)) (*metas)[i].clear_tokens();
    }
  }

  absl::Status failure = sink.Prepare(*metas);
  // Blocks read from tier 2 into a destination known now are read first,
  // several at once; the loop below delivers in order.
  // Where each block goes in host memory (null: through Deliver).
  std::vector<uint8_t*> dests(n, nullptr);
  if (failure.ok()) {
    for (size_t i = 0; i < n; ++i) dests[i] = sink.HostDestination(i);
  }
  std::vector<EarlyRead> early;
  if (failure.ok()) ReadAhead(ids, plan, dests, &early);
  // Tier-1 blocks bound for the sink's memory are copied (and hashed) first,
  // several at once across the copy pool; the loop checks and delivers.
  std::vector<std::optional<uint64_t>> copied;
  if (failure.ok()) CopyAhead(plan, dests, &copied);
  // Deliver-path copies of disk reads, under the staging budget; they live
  // until Finish, or until the sink drains.
  StagingBudget::Buffers staging(&core_.staging());
  std::optional<absl::Time> staging_deadline;  // Set at the first staged block.
  uint64_t hits1 = 0, hits2 = 0;
  std::optional<PhaseTimer> copying(std::in_place, Phase::kCopy);
  for (size_t i = 0; i < n && failure.ok(); ++i) {
    const EngineCore::ReadHold& p = plan[i];
    const uint64_t size = p.payload_bytes;
    uint8_t* dest = dests[i];
    if (p.ram != nullptr) {
      const uint8_t* bytes = p.ram->ram.data();
      const bool sink_verifies = dest == nullptr && sink.VerifiesDeliveries();
      const uint64_t got =
          sink_verifies                       ? p.checksum
          : !copied.empty() && copied[i]      ? *copied[i]
          : dest != nullptr                   ? core_.copier().CopyHashingSource(dest, bytes, size)
                                              : core_.copier().Checksum(bytes, size);
      if (got == p.checksum) {
        failure = dest == nullptr ? sink.Deliver(i, bytes, size, p.checksum)
                                  : sink.AfterHostCopy(i, dest, size);
        (*infos)[i].served_from = BlockLocation::kHost;
        ++hits1;
        continue;
      }
      core_.QuarantineRam(p.ram);
      if (!p.on_disk) {
        failure = ItemError(absl::StatusCode::kDataLoss, i, ItemPart::kId,
                            absl::StrCat(BlockName(ids[i]),
                                         " failed its checksum in tier 1 and has no other copy"));
        break;
      }
    }
    // From tier 2: into the destination, or (Deliver path) into a promotion
    // reservation or a staging buffer that lives until Finish.
    // A block whose tier-1 copy just failed is still in tier 1 (we hold a
    // reader): read it through a staging buffer, not a promotion.
    std::optional<ArenaReservation> promote;
    uint8_t* target = dest;
    absl::Status s;
    if (!early.empty() && early[i].issued) {
      EarlyRead& r = early[i];
      r.consumed = true;
      promote = std::move(r.promote);
      if (target == nullptr) target = promote->data();
      s = r.status;
    } else {
      if (p.ram == nullptr) promote = core_.host().ReserveBelow(size, core_.high_bytes());
      if (target == nullptr) {
        if (promote) {
          target = promote->data();
        } else {
          if (!staging_deadline) {
            staging_deadline = absl::Now() + core_.options().max_wait_for_room;
          }
          absl::StatusOr<uint8_t*> buffer =
              staging.Take(size, *staging_deadline, [&sink] { return sink.Drain(); });
          if (!buffer.ok()) {
            failure = WithItem(buffer.status(), i, ItemPart::kId);
            break;
          }
          target = *buffer;
        }
      }
      s = core_.ReadFromDisk(ids[i], p.checksum, size, target,
                             promote ? promote->data() : nullptr);
    }
    if (!s.ok()) {
      promote.reset();
      if (s.code() == absl::StatusCode::kDataLoss) {
        core_.DropCorruptDiskCopy(ids[i], p.gen);
      } else if (s.code() == absl::StatusCode::kNotFound) {
        core_.CountMiss();
      }
      failure = WithItem(s, i, ItemPart::kId);
      break;
    }
    ++hits2;
    (*infos)[i].served_from = BlockLocation::kDisk;
    if (promote) {
      // Hold the promoted copy when the sink reads it at Finish.
      IndexEntry* e = core_.CommitPromotion(ids[i], p.gen, std::move(*promote), dest == nullptr);
      if (e != nullptr) {
        held.push_back(e);
        target = e->ram.data();  // Ours, or another Load's promotion of the same bytes.
      } else if (dest == nullptr) {
        // The block changed meanwhile and the reservation was freed.
        failure = ItemError(absl::StatusCode::kAborted, i, ItemPart::kId,
                            absl::StrCat(BlockName(ids[i]), " changed during the load; retry"));
        break;
      }
    }
    failure = dest == nullptr ? sink.Deliver(i, target, size, p.checksum)
                              : sink.AfterHostCopy(i, dest, size);
  }
  // Reads ahead that the loop did not reach (it stopped at a failure): a
  // copy found corrupt is dropped all the same.
  for (size_t i = 0; i < early.size(); ++i) {
    if (early[i].issued && !early[i].consumed &&
        early[i].status.code() == absl::StatusCode::kDataLoss) {
      core_.DropCorruptDiskCopy(ids[i], plan[i].gen);
    }
  }
  if (failure.ok()) failure = sink.Finish();
  copying.reset();
  if (failure.code() == absl::StatusCode::kDataLoss && sink.VerifiesDeliveries()) {
    PhaseTimer checking(Phase::kChecksum);
    // A delivery failed its check where it landed: find the tier-1 copies
    // that are bad (if any) and drop them.
    for (const EngineCore::ReadHold& p : plan) {
      if (p.ram != nullptr &&
          core_.copier().Checksum(p.ram->ram.data(), p.payload_bytes) != p.checksum) {
        core_.QuarantineRam(p.ram);
      }
    }
  }
  core_.FinishLoad(held, hits1, hits2, failure.ok() ? n : 0);
  return failure;
}

void TierManagerImpl::ReadAhead(absl::Span<const BlockId> ids,
                                absl::Span<const EngineCore::ReadHold> plan,
                                absl::Span<uint8_t* const> dests,
                                std::vector<EarlyRead>* early) {
  // Only worth it with two reads or more, and with more than one in flight.
  if (core_.options().disk_reads_in_flight <= 1) return;
  size_t from_disk = 0;
  for (const EngineCore::ReadHold& p : plan) from_disk += p.ram == nullptr ? 1 : 0;
  if (from_disk < 2) return;
  early->resize(ids.size());
  std::vector<EngineCore::DiskRead> reads;
  std::vector<size_t> which;
  reads.reserve(from_disk);
  which.reserve(from_disk);
  for (size_t i = 0; i < ids.size(); ++i) {
    const EngineCore::ReadHold& p = plan[i];
    if (p.ram != nullptr) continue;
    EarlyRead& r = (*early)[i];
    uint8_t* dest = dests[i];
    // As the loop would: the promotion's room in tier 1 (below the high
    // watermark), and the destination when the sink has one.
    r.promote = core_.host().ReserveBelow(p.payload_bytes, core_.high_bytes());
    if (dest == nullptr && !r.promote) continue;  // Staged by the loop, in turn.
    EngineCore::DiskRead& d = reads.emplace_back();
    d.id = ids[i];
    d.checksum = p.checksum;
    d.payload_bytes = p.payload_bytes;
    d.dest = dest != nullptr ? dest : r.promote->data();
    d.promote = r.promote ? r.promote->data() : nullptr;
    which.push_back(i);
  }
  if (reads.size() < 2) {
    early->clear();  // Releases the reservations: the loop reads in turn.
    return;
  }
  core_.ReadManyFromDisk(absl::MakeSpan(reads));
  for (size_t k = 0; k < reads.size(); ++k) {
    EarlyRead& r = (*early)[which[k]];
    r.issued = true;
    r.status = std::move(reads[k].status);
  }
}

void TierManagerImpl::CopyAhead(absl::Span<const EngineCore::ReadHold> plan,
                                absl::Span<uint8_t* const> dests,
                                std::vector<std::optional<uint64_t>>* copied) {
  // Below this, waking the pool costs more than it saves.
  constexpr uint64_t kMinBytes = 256 << 10;
  std::vector<size_t> which;
  uint64_t bytes = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (plan[i].ram == nullptr || dests[i] == nullptr) continue;
    which.push_back(i);
    bytes += plan[i].payload_bytes;
  }
  if (which.size() < 2 || bytes < kMinBytes) return;
  copied->resize(plan.size());
  // A block over 2 MiB is split across the pool again by its own copy.
  core_.copier().ParallelFor(which.size(), [&](size_t k) {
    const size_t i = which[k];
    (*copied)[i] =
        core_.copier().CopyHashingSource(dests[i], plan[i].ram->ram.data(), plan[i].payload_bytes);
  });
}

}  // namespace evoke
