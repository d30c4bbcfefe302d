// TierManagerImpl: orchestrates Save, Pin, Verify and Flush (Load is in
// tier_load.cc, its tier-3 part in remote_fetch.cc) over the
// BlockIndex (what is where), the HostTier (tier-1 reservations), the lower
// Tier (tier 2) and the Spiller (room and budgets). Every payload is hashed
// (xxHash3-64) by the engine itself on its own copy, at Save and on every
// read from either tier: a mismatch is DATA_LOSS, counted, never served, and
// the bad copy is dropped.
#include "storage/tier_manager.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/checksum.h"
#include "common/failpoint.h"
#include "common/fingerprint.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "storage/tier_manager_impl.h"
#include "storage/verifier.h"

namespace evoke {
namespace {

// The List walk gives the lock up after this many entries, so that a
// filtered listing of a large index never stalls saves.
constexpr size_t kListVisitsPerLock = 4096;

}  // namespace

// ------------------------------------------------------------ Open

absl::StatusOr<std::unique_ptr<TierManager>> TierManager::Open(
    const TierManagerOptions& options, std::unique_ptr<PinnedArena> arena,
    std::unique_ptr<Tier> spill) {
  if (!(options.low_watermark > 0 && options.low_watermark < options.high_watermark &&
        options.high_watermark <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("watermarks: need 0 < low (",
                                                   options.low_watermark, ") < high (",
                                                   options.high_watermark, ") <= 1"));
  }
  if (arena == nullptr || spill == nullptr) {
    return absl::InvalidArgumentError("arena and spill store are required");
  }
  auto impl = std::make_unique<TierManagerImpl>(options, std::move(arena), std::move(spill));
  EVOKE_RETURN_IF_ERROR(impl->Rebuild());
  impl->Start();
  return impl;
}

absl::Status TierManagerImpl::Rebuild() {
  return core_.Rebuild([this](const BlockId& id, const v1::BlockMeta& meta) {
    return ValidateRecord(id, meta);
  });
}

absl::Status TierManagerImpl::ValidateRecord(const BlockId& id, const v1::BlockMeta& meta) const {
  if (meta.id() != id.ToBytes()) {
    return absl::DataLossError("meta.id: differs from the record's key");
  }
  if (!meta.has_checksum()) return absl::DataLossError("meta.checksum: is missing");
  return ValidateStoredBlock(meta, meta.payload_bytes(), core_.options().limits, "record");
}

// ------------------------------------------------------------ Save

absl::StatusOr<std::vector<SavedBlock>> TierManagerImpl::Save(absl::Span<const SaveItem> items,
                                                              SaveSource& source, bool durable,
                                                              absl::Time deadline,
                                                              PinOwner owner) {
  EVOKE_RETURN_IF_ERROR(CheckOpen());
  deadline = std::min(deadline, absl::Now() + core_.options().max_wait_for_room);
  std::vector<SavePlan> plans(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    absl::StatusOr<BlockId> id = BlockId::FromBytes(items[i].meta->id());
    if (!id.ok()) return WithItem(id.status(), i, ItemPart::kId);
    plans[i].id = *id;
    plans[i].digest = DigestFingerprint(items[i].meta->fingerprint());
    EVOKE_RETURN_IF_ERROR(WithItem(CheckFits(items[i].size), i, ItemPart::kBlock));
  }
  QuotaLedger::Hold hold;
  EVOKE_RETURN_IF_ERROR(EnforceQuotas(items, plans, durable, deadline, &hold));
  // Whatever path the Save leaves by, its reservation is settled (CommitSave
  // settles all but the durable tier-2 part).
  absl::Cleanup settle = [this, &hold] {
    if (hold.empty()) return;
    absl::MutexLock lock(core_.mu());
    core_.SettleQuotas(&hold);  // Wakes Saves waiting for reserved tier-1 room.
  };
  EVOKE_RETURN_IF_ERROR(ReserveForSave(items, deadline, &plans));
  absl::Status copied = CopyIn(items, source, &plans);
  if (copied.ok()) EVOKE_FAILPOINT("save.copied");
  std::vector<SavedBlock> results;
  std::vector<size_t> pin_later;  // Items deduplicated against spilled blocks.
  EVOKE_RETURN_IF_ERROR(
      CommitSave(items, owner, std::move(copied), &plans, &results, &pin_later, &hold));
  if (!pin_later.empty()) {
    std::vector<BlockId> ids;
    for (size_t i : pin_later) ids.push_back(plans[i].id);
    absl::Status pinned = Pin(ids, owner, deadline, nullptr);
    if (const std::optional<ItemRef> item = ErrorItem(pinned); item && item->index < ids.size()) {
      pinned = WithItem(pinned, pin_later[item->index], ItemPart::kId);  // The Save's index.
    }
    EVOKE_RETURN_IF_ERROR(pinned);
  }
  if (durable) EVOKE_RETURN_IF_ERROR(WriteDurably(plans, &results));
  EVOKE_FAILPOINT("save.before_ack");
  return results;
}

absl::Status TierManagerImpl::ReserveForSave(absl::Span<const SaveItem> items,
                                             absl::Time deadline,
                                             std::vector<SavePlan>* plans) {
  absl::MutexLock lock(core_.mu());
  for (;;) {
    bool in_flight = false;
    std::vector<uint64_t> sizes;
    uint64_t total = 0, largest = 0;
    for (size_t i = 0; i < items.size() && !in_flight; ++i) {
      SavePlan& p = (*plans)[i];
      const IndexEntry* e = core_.Find(p.id);
      in_flight = e != nullptr && e->state == BlockState::kWriting;
      if (e != nullptr && !in_flight &&
          e->meta.fingerprint().namespace_() != items[i].meta->fingerprint().namespace_()) {
        // Ids hash the namespace in, so only a collision of the 128-bit id
        // lands here; deduplicating (or reviving a breadcrumb) across
        // namespaces would hand one tenant's bytes to another.
        return ItemError(absl::StatusCode::kAlreadyExists, i, ItemPart::kId,
                         absl::StrCat(BlockName(p.id),
                                      " collides with a block of another namespace "
                                      "(a 128-bit id collision); not stored"));
      }
      p.fresh = e == nullptr || !e->bytes_available();
      if (!p.fresh) {
        p.existing_gen = e->gen;
        p.existing_checksum = e->checksum;
        continue;
      }
      sizes.push_back(items[i].size);
      const uint64_t rounded = core_.host().RoundedSize(items[i].size);
      total += rounded;
      largest = std::max(largest, rounded);
    }
    if (in_flight) {
      if (core_.AwaitWrites(deadline)) {
        return absl::UnavailableError(
            "another save of the same block is still in progress; retry");
      }
      continue;
    }
    std::vector<ArenaReservation> reserved;
    if (core_.host().ReserveAll(sizes, &reserved)) {
      size_t k = 0;
      for (SavePlan& p : *plans) {
        if (!p.fresh) continue;
        p.ram = std::move(reserved[k++]);
        p.entry = core_.BeginWrite(p.id, &p.revived);
      }
      if (core_.host().used_bytes() > core_.high_bytes()) spiller_.Wake();
      return absl::OkStatus();
    }
    EVOKE_RETURN_IF_ERROR(spiller_.WaitForRoom(total, largest, deadline));
  }
}

// Phase 2 (unlocked): copy into tier 1 and hash the engine's own copy, so
// that what is stored is exactly what was verified. Host sources are copied
// here; the others are fetched in one batch (e.g. coalesced device copies).
absl::Status TierManagerImpl::CopyIn(absl::Span<const SaveItem> items, SaveSource& source,
                                     std::vector<SavePlan>* plans) {
  std::vector<size_t> fetch_items;
  std::vector<uint8_t*> fetch_dsts;
  std::vector<std::string> scratch;  // Existing ids whose bytes must be fetched.
  scratch.reserve(items.size());
  std::optional<PhaseTimer> copying(std::in_place, Phase::kCopy);
  // Host payloads (whole or in pieces): copied and hashed below, several
  // items at once across the copy pool when there are enough bytes.
  struct HostCopy {
    size_t item;
    absl::Span<const absl::string_view> pieces;
    absl::string_view bytes;
  };
  std::vector<HostCopy> host_copies;
  uint64_t host_bytes = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    SavePlan& p = (*plans)[i];
    if (const absl::Span<const absl::string_view> pieces = source.HostPieces(i);
        !pieces.empty()) {
      if (PiecesSize(pieces) != items[i].size) {
        return absl::InternalError("source size differs from the item size");
      }
      host_copies.push_back({i, pieces, {}});
      host_bytes += items[i].size;
      continue;
    }
    const absl::string_view host = source.HostBytes(i);
    if (!host.empty() && host.size() != items[i].size) {
      return absl::InternalError("source size differs from the item size");
    }
    if (!host.empty()) {
      host_copies.push_back({i, {}, host});
      host_bytes += items[i].size;
      continue;
    }
    // An id already stored has no reservation: its bytes are fetched into
    // scratch, only to be compared.
    uint8_t* dest = nullptr;
    if (p.fresh) {
      dest = p.ram.data();
    } else {
      scratch.emplace_back(items[i].size, '\0');
      dest = reinterpret_cast<uint8_t*>(scratch.back().data());
    }
    fetch_items.push_back(i);
    fetch_dsts.push_back(dest);
  }
  auto copy_host = [&](size_t k) {
    const HostCopy& c = host_copies[k];
    SavePlan& p = (*plans)[c.item];
    if (!c.pieces.empty()) {
      p.checksum = p.fresh ? core_.copier().CopyHashingDestination(p.ram.data(), c.pieces)
                           : PiecesChecksum(c.pieces);
    } else {
      p.checksum = p.fresh ? core_.copier().CopyHashingDestination(p.ram.data(), c.bytes.data(),
                                                                   c.bytes.size())
                           : PayloadChecksum(c.bytes.data(), c.bytes.size());
    }
  };
  // Below 256 KiB in all, waking the pool costs more than it saves; a
  // payload over 2 MiB is split across the pool again by its own copy.
  if (host_copies.size() >= 2 && host_bytes >= (256u << 10)) {
    core_.copier().ParallelFor(host_copies.size(), copy_host);
  } else {
    for (size_t k = 0; k < host_copies.size(); ++k) copy_host(k);
  }
  if (!fetch_items.empty()) {
    std::vector<std::optional<uint64_t>> fetched(fetch_items.size());
    EVOKE_RETURN_IF_ERROR(source.Fetch(fetch_items, fetch_dsts, absl::MakeSpan(fetched)));
    for (size_t k = 0; k < fetch_items.size(); ++k) {
      const size_t i = fetch_items[k];
      (*plans)[i].checksum =
          fetched[k] ? *fetched[k] : core_.copier().Checksum(fetch_dsts[k], items[i].size);
    }
  }
  copying.reset();
  if (core_.options().summarize) {
    PhaseTimer summarizing(Phase::kSummary);
    // Summaries of fresh blocks, one task each across the copy pool (a mean
    // over 16 MiB of K is milliseconds).
    std::vector<size_t> fresh;
    for (size_t i = 0; i < items.size(); ++i) {
      if ((*plans)[i].fresh) fresh.push_back(i);
    }
    core_.copier().ParallelFor(fresh.size(), [&](size_t k) {
      SavePlan& p = (*plans)[fresh[k]];
      p.summary =
          core_.options().summarize(*items[fresh[k]].meta, p.ram.data(), items[fresh[k]].size);
    });
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const v1::BlockMeta& meta = *items[i].meta;
    if (meta.has_checksum() && meta.checksum() != (*plans)[i].checksum) {
      return ItemError(absl::StatusCode::kDataLoss, i, ItemPart::kChecksum,
                       absl::StrCat(absl::Hex(meta.checksum()),
                                    " does not match the payload received (xxh3 ",
                                    absl::Hex((*plans)[i].checksum), ")"));
    }
  }
  return absl::OkStatus();
}

// Phase 3 (locked): commit every item, or roll every placeholder back.
absl::Status TierManagerImpl::CommitSave(absl::Span<const SaveItem> items, PinOwner owner,
                                         absl::Status failure, std::vector<SavePlan>* plans,
                                         std::vector<SavedBlock>* results,
                                         std::vector<size_t>* pin_later,
                                         QuotaLedger::Hold* hold) {
  absl::MutexLock lock(core_.mu());
  // Committed blocks are in the index's usage from here on, aborted ones
  // never will be: either way the reservation of tier 1 and metadata ends
  // with this critical section (tier 2 when the blocks are on disk).
  for (size_t i = 0; i < items.size() && failure.ok(); ++i) {
    const SavePlan& p = (*plans)[i];
    if (p.fresh) continue;
    const IndexEntry* e = core_.FindGen(p.id, p.existing_gen);
    if (e == nullptr || !e->bytes_available()) {
      failure = ItemError(absl::StatusCode::kAborted, i, ItemPart::kId,
                          absl::StrCat(BlockName(p.id),
                                       " was deleted or dropped during the save; retry"));
    } else if (p.existing_checksum != p.checksum &&
               items[i].meta->kind() == v1::BLOCK_KIND_SESSION) {
      failure = ItemError(absl::StatusCode::kAlreadyExists, i, ItemPart::kId,
                          absl::StrCat("session ", BlockName(p.id),
                                       " is already stored with different content; "
                                       "Delete it first"));
    }
  }
  core_.EndWrites(hold);
  if (!failure.ok()) {
    for (SavePlan& p : *plans) {
      if (p.entry == nullptr) continue;
      p.ram.Release();
      core_.AbortWrite(p.entry, p.revived);
    }
    return failure;
  }
  const int64_t now_ms = core_.NowMs();
  results->resize(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    SavePlan& p = (*plans)[i];
    SavedBlock& r = (*results)[i];
    r.id = p.id;
    if (p.fresh) {
      IndexEntry* e = p.entry;
      v1::BlockMeta meta = *items[i].meta;
      if (p.summary) *meta.add_summaries() = std::move(*p.summary);
      meta.set_writer(items[i].writer);
      meta.set_payload_bytes(items[i].size);
      meta.set_checksum(p.checksum);
      if (!p.revived) meta.set_created_unix_ms(now_ms);
      core_.CommitWrite(e, std::move(meta), p.digest, std::move(p.ram),
                        items[i].pin ? std::optional<PinOwner>(owner) : std::nullopt, now_ms);
      if (observer() != nullptr) observer()->Added(e->id, e->meta);
      if (uploader_ != nullptr && !items[i].from_remote &&
          (items[i].meta->kind() != v1::BLOCK_KIND_SESSION || core_.options().remote_sessions)) {
        uploader_->Enqueue(*e);
      }
      r.checksum = p.checksum;
      r.location = BlockLocation::kHost;
      p.existing_gen = e->gen;
      continue;
    }
    IndexEntry* e = core_.FindGen(p.id, p.existing_gen);
    core_.Deduplicated(e, now_ms);
    r.deduplicated = true;
    r.checksum = e->checksum;
    r.location = e->location();
    if (items[i].pin) {
      if (e->in_ram()) {
        core_.AddPin(e, owner);
      } else {
        pin_later->push_back(i);
      }
    }
  }
  core_.NotifyRoom();
  return absl::OkStatus();
}

absl::Status TierManagerImpl::WriteDurably(std::vector<SavePlan>& plans,
                                           std::vector<SavedBlock>* results) {
  absl::MutexLock disk(core_.disk_mu());
  std::vector<IndexEntry*> dirty;
  bool written_by_others = false;  // On disk already, maybe without an fsync.
  {
    absl::MutexLock lock(core_.mu());
    for (const SavePlan& p : plans) {
      IndexEntry* e = core_.FindGen(p.id, p.existing_gen);
      if (e == nullptr) continue;
      if (e->state == BlockState::kDirty) dirty.push_back(e);
      written_by_others |= e->on_disk();
    }
  }
  uint64_t blocks = 0, bytes = 0;
  absl::Status s = spiller_.WriteBack(dirty, /*sync=*/true, &blocks, &bytes);
  // The spiller may have written some of these blocks without an fsync
  // between the commit and now; make them durable too.
  if (s.ok() && written_by_others) s = core_.disk()->Persist();
  if (s.ok()) EVOKE_FAILPOINT("save.durable.synced");
  if (!s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("blocks are in tier 1 but the durable write failed: ", s.message()));
  }
  absl::MutexLock lock(core_.mu());
  for (size_t i = 0; i < plans.size(); ++i) {
    const IndexEntry* e = core_.FindGen(plans[i].id, plans[i].existing_gen);
    if (e != nullptr && e->state == BlockState::kDirty) {
      // Write-back skipped it: its tier-1 copy failed verification meanwhile.
      return ItemError(absl::StatusCode::kDataLoss, i, ItemPart::kBlock,
                       absl::StrCat(BlockName(plans[i].id),
                                    " failed its checksum in tier 1 before it reached disk"));
    }
    if (e != nullptr && e->state == BlockState::kSpilled) {
      (*results)[i].location = BlockLocation::kDisk;
    }
  }
  return absl::OkStatus();
}

absl::Status TierManagerImpl::PromoteForPin(const BlockId& id, PinOwner owner,
                                            absl::Time deadline) {
  uint64_t gen, checksum, bytes;
  std::optional<ArenaReservation> ram;
  {
    absl::MutexLock lock(core_.mu());
    for (;;) {
      IndexEntry* e = core_.FindVisible(id);
      if (e == nullptr || !e->bytes_available()) {
        return absl::NotFoundError(
            absl::StrCat(BlockName(id), " disappeared before it was pinned"));
      }
      if (e->in_ram()) {
        core_.AddPin(e, owner);
        core_.Touch(e, core_.NowMs());
        return absl::OkStatus();
      }
      gen = e->gen;
      checksum = e->checksum;
      bytes = e->payload_bytes;
      EVOKE_RETURN_IF_ERROR(CheckFits(bytes));
      ram = core_.host().Reserve(bytes);
      if (ram) break;
      const uint64_t rounded = core_.host().RoundedSize(bytes);
      EVOKE_RETURN_IF_ERROR(spiller_.WaitForRoom(rounded, rounded, deadline));
    }
  }
  absl::Status s = core_.ReadFromDisk(id, checksum, bytes, ram->data());
  absl::MutexLock lock(core_.mu());
  IndexEntry* e = core_.FindGen(id, gen);
  const bool attachable = e != nullptr && (e->state == BlockState::kSpilled ||
                                           e->state == BlockState::kBreadcrumb);
  if (!s.ok() || !attachable) {
    ram->Release();
    if (s.code() == absl::StatusCode::kDataLoss) core_.CountChecksumFailureLocked();
    if (!s.ok()) return s;
    if (e == nullptr) {
      return absl::NotFoundError(absl::StrCat(BlockName(id), " was deleted while being pinned"));
    }
    if (!e->in_ram()) {
      return absl::AbortedError(absl::StrCat(BlockName(id), " changed while being pinned; retry"));
    }
    core_.AddPin(e, owner);  // Promoted by someone else meanwhile.
    return absl::OkStatus();
  }
  core_.AttachForPin(e, std::move(*ram), owner);
  return absl::OkStatus();
}

// ------------------------------------------------------------ small calls

IndexEntry* TierManagerImpl::FindFor(const BlockId& id, const NamespaceScope* scope) const {
  IndexEntry* e = core_.FindVisible(id);
  if (e == nullptr || scope == nullptr || scope->SeesBlock(e->meta.fingerprint())) {
    return e;
  }
  return nullptr;
}

std::vector<BlockLocation> TierManagerImpl::Lookup(absl::Span<const BlockId> ids,
                                                   const NamespaceScope* scope) {
  std::vector<BlockLocation> found;
  absl::MutexLock lock(core_.mu());
  for (const BlockId& id : ids) {
    const IndexEntry* e = FindFor(id, scope);
    if (e == nullptr || !e->bytes_available()) break;
    found.push_back(e->location());
  }
  return found;
}

std::vector<BlockLocation> TierManagerImpl::LookupFleet(absl::Span<const BlockId> ids,
                                                        absl::string_view ns,
                                                        absl::string_view trust_group,
                                                        const NamespaceScope* scope) {
  std::vector<BlockLocation> found = Lookup(ids, scope);
  RemoteTier* remote = core_.options().remote;
  if (remote == nullptr || found.size() == ids.size() || !CheckOpen().ok()) return found;
  v1::LayoutFingerprint where;
  where.set_namespace_(std::string(ns));
  where.set_trust_group(std::string(trust_group));
  if (scope != nullptr && !scope->SeesBlock(where)) return found;
  // The run goes on where this host's ends (a breadcrumb or a block it
  // never saw), with what tier 3 holds for the group.
  absl::StatusOr<size_t> more =
      remote->ProbeRun(RemoteTier::RemoteNamespace(where), ids.subspan(found.size()));
  if (more.ok()) found.insert(found.end(), *more, BlockLocation::kRemote);
  return found;
}

TierStats TierManagerImpl::Stats() {
  TierStats out = core_.Stats();
  if (core_.options().remote != nullptr) {
    RemoteStats r = core_.options().remote->Stats();  // Its own lock, outside mu.
    if (uploader_ != nullptr) {
      absl::MutexLock lock(core_.mu());
      uploader_->Fill(&r);
    }
    out.remote = std::move(r);
  }
  return out;
}

absl::Status TierManagerImpl::Delete(absl::Span<const BlockId> ids,
                                     const NamespaceScope* scope) {
  EVOKE_RETURN_IF_ERROR(CheckOpen());
  absl::MutexLock disk(core_.disk_mu());
  {
    absl::MutexLock lock(core_.mu());
    // Records that failed validation at start have no trusted namespace:
    // only a caller that sees everything may remove them.
    const bool sees_all = scope == nullptr || scope->SeesEveryBlock();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (FindFor(ids[i], scope) == nullptr &&
          !(sees_all && core_.IsInvalidRecord(ids[i]))) {
        return ItemError(absl::StatusCode::kNotFound, i, ItemPart::kId,
                         absl::StrCat(BlockName(ids[i]), " not found; nothing deleted"));
      }
    }
  }
  return RemoveBlocks(ids).status();
}

absl::StatusOr<uint32_t> TierManagerImpl::DropSession(absl::string_view ns,
                                                      absl::string_view session_id) {
  EVOKE_RETURN_IF_ERROR(CheckOpen());
  absl::MutexLock disk(core_.disk_mu());
  std::vector<BlockId> ids;
  {
    absl::MutexLock lock(core_.mu());
    ids = core_.SessionIds(ns, session_id);
  }
  return RemoveBlocks(ids);
}

absl::StatusOr<uint32_t> TierManagerImpl::RemoveBlocks(absl::Span<const BlockId> ids) {
  std::vector<BlockId> on_disk;
  {
    absl::MutexLock lock(core_.mu());
    for (const BlockId& id : ids) {
      const IndexEntry* e = core_.FindVisible(id);
      if ((e != nullptr && e->record_on_disk) || core_.IsInvalidRecord(id)) {
        on_disk.push_back(id);
      }
    }
  }
  // Tier 2 first: if it fails, the index is unchanged and nothing
  // resurrects after a restart.
  EVOKE_FAILPOINT("delete.before_disk");
  if (!on_disk.empty()) EVOKE_RETURN_IF_ERROR(core_.disk()->Delete(on_disk));
  EVOKE_FAILPOINT("delete.after_disk");
  absl::MutexLock lock(core_.mu());
  uint32_t n = 0;
  for (const BlockId& id : ids) {
    if (core_.ForgetInvalidRecord(id)) {
      ++n;
      continue;
    }
    IndexEntry* e = core_.FindVisible(id);
    if (e == nullptr) continue;
    if (observer() != nullptr) observer()->Removed(e->id, e->meta);
    // A deleted session block's remote copy goes too; prefix blocks are
    // shared by content and stay (expiry removes them).
    if (uploader_ != nullptr && core_.options().remote_sessions &&
        e->meta.kind() == v1::BLOCK_KIND_SESSION) {
      uploader_->EnqueueRemoval(RemoteTier::RemoteNamespace(e->meta.fingerprint()), e->id);
    }
    core_.Remove(e);
    ++n;
  }
  EVOKE_FAILPOINT("delete.after_index");
  return n;
}

absl::Status TierManagerImpl::Pin(absl::Span<const BlockId> ids, PinOwner owner,
                                  absl::Time deadline, const NamespaceScope* scope) {
  EVOKE_RETURN_IF_ERROR(CheckOpen());
  std::vector<BlockId> to_promote;
  std::vector<std::pair<BlockId, uint64_t>> pinned;
  {
    absl::MutexLock lock(core_.mu());
    for (size_t i = 0; i < ids.size(); ++i) {
      const IndexEntry* e = FindFor(ids[i], scope);
      if (e == nullptr || !e->bytes_available()) {
        return ItemError(absl::StatusCode::kNotFound, i, ItemPart::kId,
                         absl::StrCat(BlockName(ids[i]), e == nullptr ? " not found"
                                                                 : " has no bytes (breadcrumb)"));
      }
    }
    const int64_t now_ms = core_.NowMs();
    for (const BlockId& id : ids) {
      IndexEntry* e = core_.FindVisible(id);
      if (!e->in_ram()) {
        to_promote.push_back(id);
        continue;
      }
      core_.AddPin(e, owner);
      core_.Touch(e, now_ms);
      pinned.emplace_back(id, e->gen);
    }
  }
  for (size_t i = 0; i < to_promote.size(); ++i) {
    absl::Status s = PromoteForPin(to_promote[i], owner, deadline);
    if (s.ok()) continue;
    // Undo, so that Pin stays all-or-nothing.
    absl::MutexLock lock(core_.mu());
    for (const auto& [id, gen] : pinned) {
      if (IndexEntry* e = core_.FindGen(id, gen); e != nullptr) {
        core_.RemovePin(e, owner);
        Unpinned(e);
      }
    }
    for (size_t j = 0; j < i; ++j) {
      if (IndexEntry* e = core_.FindVisible(to_promote[j]); e != nullptr) {
        core_.RemovePin(e, owner);
        Unpinned(e);
      }
    }
    return s;
  }
  return absl::OkStatus();
}

absl::Status TierManagerImpl::Unpin(absl::Span<const BlockId> ids, PinOwner owner,
                                    const NamespaceScope* scope) {
  EVOKE_RETURN_IF_ERROR(CheckOpen());
  absl::MutexLock lock(core_.mu());
  absl::flat_hash_map<BlockId, uint32_t> asked;
  for (size_t i = 0; i < ids.size(); ++i) {
    const IndexEntry* e = FindFor(ids[i], scope);
    if (e == nullptr) {
      return ItemError(absl::StatusCode::kNotFound, i, ItemPart::kId,
                       absl::StrCat(BlockName(ids[i]), " not found"));
    }
    if (++asked[ids[i]] > core_.PinsOf(*e, owner)) {
      return ItemError(absl::StatusCode::kFailedPrecondition, i, ItemPart::kId,
                       absl::StrCat(BlockName(ids[i]), " is not pinned by this lease"));
    }
  }
  for (const BlockId& id : ids) {
    IndexEntry* e = core_.FindVisible(id);
    core_.RemovePin(e, owner);
    Unpinned(e);
  }
  return absl::OkStatus();
}

uint64_t TierManagerImpl::ReleaseOwner(PinOwner owner) {
  absl::MutexLock lock(core_.mu());
  const uint64_t released = core_.ReleaseOwner(owner);
  if (released > 0) {
    core_.NotifyRoom();
    spiller_.Wake();
  }
  return released;
}

absl::StatusOr<size_t> TierManagerImpl::KeepSession(absl::string_view ns,
                                                    absl::string_view session_id,
                                                    absl::Duration keep) {
  EVOKE_RETURN_IF_ERROR(CheckOpen());
  absl::StatusOr<size_t> n;
  {
    absl::MutexLock lock(core_.mu());
    const int64_t until_ms =
        keep > absl::ZeroDuration() ? core_.NowMs() + absl::ToInt64Milliseconds(keep) : 0;
    n = core_.KeepSession(ns, session_id, until_ms, core_.options().max_kept_sessions);
  }
  // A keep that ended may leave either tier over its mark: look again.
  if (keep <= absl::ZeroDuration()) spiller_.Wake();
  return n;
}

absl::StatusOr<std::vector<BlockLocation>> TierManagerImpl::Acquire(
    absl::Span<const BlockId> ids, PinOwner owner, bool all, const NamespaceScope* scope) {
  EVOKE_RETURN_IF_ERROR(CheckOpen());
  std::vector<BlockLocation> held;
  absl::MutexLock lock(core_.mu());
  std::vector<IndexEntry*> found;
  found.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    IndexEntry* e = FindFor(ids[i], scope);
    // A payload the spill budget is dropping now is as good as gone.
    if (e == nullptr || !e->bytes_available() || (e->dropping && !e->in_ram())) {
      if (!all) break;
      return ItemError(absl::StatusCode::kNotFound, i, ItemPart::kId,
                       absl::StrCat(BlockName(ids[i]), e == nullptr ? " not found"
                                                                 : " has no bytes (breadcrumb)"));
    }
    found.push_back(e);
  }
  const int64_t now_ms = core_.NowMs();
  held.reserve(found.size());
  for (IndexEntry* e : found) {
    core_.AddPin(e, owner);
    core_.Touch(e, now_ms);
    held.push_back(e->location());
  }
  return held;
}

absl::StatusOr<BlockInfo> TierManagerImpl::Describe(const BlockId& id,
                                                    const NamespaceScope* scope) {
  absl::MutexLock lock(core_.mu());
  const IndexEntry* e = FindFor(id, scope);
  if (e == nullptr) {
    return ItemError(absl::StatusCode::kNotFound, 0, ItemPart::kId,
                     absl::StrCat(BlockName(id), " not found"));
  }
  BlockInfo info = BlockIndex::Info(*e);
  if (scope != nullptr && !scope->SeesTokensOf(info.meta)) info.meta.clear_tokens();
  return info;
}

std::vector<BlockInfo> TierManagerImpl::List(const ListFilter& filter, const BlockId* after,
                                             size_t limit, bool* more) {
  // One more than asked, to know whether more follow; the lock is given up
  // between pages of kListVisitsPerLock visited entries.
  limit = std::min<size_t>(limit, 1u << 20);
  std::vector<BlockInfo> out;
  std::optional<BlockId> cursor;
  if (after != nullptr) cursor = *after;
  for (;;) {
    absl::MutexLock lock(core_.mu());
    cursor = core_.ListPage(filter, cursor ? &*cursor : nullptr, limit + 1 - out.size(),
                                   kListVisitsPerLock, &out);
    if (!cursor || out.size() > limit) break;
  }
  *more = out.size() > limit;
  if (*more) out.resize(limit);
  return out;
}

absl::StatusOr<VerifyReport> TierManagerImpl::Verify(absl::Span<const BlockId> ids,
                                                    const NamespaceScope* scope) {
  EVOKE_RETURN_IF_ERROR(CheckOpen());
  if (scope == nullptr || scope->SeesEveryBlock()) return VerifyBlocks(&core_, ids);
  if (ids.empty()) {
    return absl::PermissionDeniedError(
        "ids: verifying every block needs admin rights; name the ids to verify");
  }
  // Another namespace's ids (and records without a trusted namespace) are
  // reported missing, as absent ids are.
  std::vector<BlockId> seen;
  uint64_t hidden = 0;
  {
    absl::MutexLock lock(core_.mu());
    for (const BlockId& id : ids) {
      if (FindFor(id, scope) != nullptr) {
        seen.push_back(id);
      } else {
        ++hidden;
      }
    }
  }
  VerifyReport report;
  if (!seen.empty()) {
    EVOKE_ASSIGN_OR_RETURN(report, VerifyBlocks(&core_, seen));
  }
  report.missing += hidden;
  return report;
}

absl::StatusOr<FlushResult> TierManagerImpl::Flush(bool evict) { return spiller_.Flush(evict); }

absl::Status TierManagerImpl::Shutdown() {
  if (shut_down_.exchange(true)) return absl::UnavailableError("already shut down");
  if (uploader_ != nullptr) uploader_->Stop();
  spiller_.Stop();
  // Durable, not compacted: RocksDB replays its WAL at the next start
  // instead of flushing memtables now (a shutdown has a deadline, a start
  // does not). Then tier 2 is closed: the process may exit without tearing
  // the index and tier 1 down.
  absl::Status s = spiller_.Flush(/*evict=*/false, /*compact=*/false).status();
  absl::MutexLock disk(core_.disk_mu());
  const absl::Status closed = core_.disk()->Close();
  return s.ok() ? closed : s;
}

}  // namespace evoke
