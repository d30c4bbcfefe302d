// Where blocks should be: TierManagerImpl::Prefetch brings blocks into tier
// 1 ahead of their Loads, from tier 2 (read and verified into tier 1, a few
// reads in flight) and from tier 3 (fetched as a Load would); best effort,
// it reports what it did with each block and never fails a block it could
// not bring. SetRetention sets the class that orders their eviction.
#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/tier_manager_impl.h"

namespace evoke {

absl::StatusOr<PrefetchResult> TierManagerImpl::Prefetch(absl::Span<const BlockId> ids,
                                                         const v1::LayoutFingerprint* fingerprint,
                                                         absl::Time deadline,
                                                         const NamespaceScope* scope) {
  EVOKE_RETURN_IF_ERROR(CheckOpen());
  PrefetchResult result;
  std::vector<size_t> absent;
  std::vector<PrefetchWant> wants;
  {
    absl::MutexLock lock(core_.mu());
    for (size_t i = 0; i < ids.size(); ++i) {
      IndexEntry* e = FindFor(ids[i], scope);
      if (e == nullptr || !e->bytes_available()) {
        absent.push_back(i);
      } else if (e->in_ram()) {
        core_.HoldPrefetched(e, /*brought=*/false);
        ++result.in_tier1;
      } else {
        wants.push_back({ids[i], e->gen, e->checksum, e->payload_bytes});
      }
    }
  }
  PromoteSpilled(wants, deadline, &result);
  PrefetchRemote(ids, absent, fingerprint, scope, &result);
  return result;
}

void TierManagerImpl::PromoteSpilled(absl::Span<const PrefetchWant> wants, absl::Time deadline,
                                     PrefetchResult* result) {
  // One call brings at most the low watermark's worth: more would push out
  // what it brought first.
  const uint64_t cap = static_cast<uint64_t>(static_cast<double>(core_.host().capacity_bytes()) *
                                             core_.options().low_watermark);
  const size_t in_flight = static_cast<size_t>(std::max(1, core_.options().disk_reads_in_flight));
  uint64_t brought = 0;
  size_t next = 0;
  while (next < wants.size()) {
    // A batch: room for each (below the high watermark, or made by the
    // spiller until the deadline), then its reads at once.
    std::vector<EngineCore::DiskRead> reads;
    std::vector<ArenaReservation> rooms;
    std::vector<const PrefetchWant*> which;
    bool out_of_room = false;
    while (next < wants.size() && reads.size() < in_flight) {
      const PrefetchWant& w = wants[next];
      if (brought + w.bytes > cap || w.bytes > core_.host().capacity_bytes()) {
        out_of_room = true;
        break;
      }
      std::optional<ArenaReservation> room =
          core_.host().ReserveBelow(w.bytes, core_.high_bytes());
      if (!room && reads.empty()) {
        // Nothing in flight: wait for the spiller to make room.
        absl::MutexLock lock(core_.mu());
        while (!room) {
          const uint64_t rounded = core_.host().RoundedSize(w.bytes);
          if (!spiller_.WaitForRoom(rounded, rounded, deadline).ok()) break;
          room = core_.host().Reserve(w.bytes);
        }
      }
      if (!room) {
        out_of_room = reads.empty();
        break;  // Read what this batch has; the next batch waits.
      }
      EngineCore::DiskRead& d = reads.emplace_back();
      d.id = w.id;
      d.checksum = w.checksum;
      d.payload_bytes = w.bytes;
      d.dest = room->data();
      rooms.push_back(*std::move(room));
      which.push_back(&w);
      brought += w.bytes;
      ++next;
    }
    // Reads reserved before the batch ran out of room are still made.
    if (reads.empty()) break;
    core_.ReadManyFromDisk(absl::MakeSpan(reads));
    for (size_t k = 0; k < reads.size(); ++k) {
      const absl::Status& s = reads[k].status;
      if (s.ok()) {
        // A block promoted by a Load meanwhile is in tier 1 (our room is
        // freed); one deleted or replaced is missing.
        switch (core_.CommitPrefetch(which[k]->id, which[k]->gen, std::move(rooms[k]))) {
          case EngineCore::PrefetchCommit::kPromoted: ++result->promoted; break;
          case EngineCore::PrefetchCommit::kInTier1: ++result->in_tier1; break;
          case EngineCore::PrefetchCommit::kGone: ++result->missing; break;
        }
        continue;
      }
      rooms[k].Release();
      if (s.code() == absl::StatusCode::kDataLoss) {
        core_.DropCorruptDiskCopy(which[k]->id, which[k]->gen);
      }
      if (s.code() == absl::StatusCode::kNotFound) {
        ++result->missing;
      } else {
        ++result->failed;
      }
    }
    if (out_of_room) break;
  }
  result->no_room += static_cast<uint32_t>(wants.size() - next);
}

void TierManagerImpl::PrefetchRemote(absl::Span<const BlockId> ids,
                                     absl::Span<const size_t> absent,
                                     const v1::LayoutFingerprint* fingerprint,
                                     const NamespaceScope* scope, PrefetchResult* result) {
  if (absent.empty()) return;
  if (fingerprint == nullptr || core_.options().remote == nullptr) {
    result->missing += static_cast<uint32_t>(absent.size());
    return;
  }
  // FetchRemote is all-or-nothing past the first block it cannot have: that
  // one is set aside and the rest asked again (those fetched stay fetched).
  std::vector<BlockId> rest;
  for (size_t i : absent) rest.push_back(ids[i]);
  std::vector<BlockId> fetched_ids;
  uint32_t set_aside = 0;  // Counted as missing or failed below.
  while (!rest.empty()) {
    // Those held now (fetched by an earlier round, or saved meanwhile) are
    // done; the others (RemoteMisses' indexes, in order) are asked for.
    const std::vector<size_t> remote = RemoteMisses(rest, *fingerprint, scope);
    std::vector<BlockId> asked;
    for (size_t i = 0, k = 0; i < rest.size(); ++i) {
      if (k < remote.size() && remote[k] == i) {
        asked.push_back(rest[i]);
        ++k;
      } else {
        fetched_ids.push_back(rest[i]);
      }
    }
    rest = std::move(asked);
    if (rest.empty()) break;
    std::vector<size_t> all(rest.size());
    std::iota(all.begin(), all.end(), size_t{0});
    const absl::Status s = FetchRemote(rest, all, *fingerprint);
    if (s.ok()) {
      fetched_ids.insert(fetched_ids.end(), rest.begin(), rest.end());
      break;
    }
    const std::optional<ItemRef> item = ErrorItem(s);
    if (!item || item->index >= rest.size()) {
      result->failed += static_cast<uint32_t>(rest.size());  // Tier 3 down, say.
      set_aside += static_cast<uint32_t>(rest.size());
      break;
    }
    if (s.code() == absl::StatusCode::kNotFound) {
      ++result->missing;
    } else {
      ++result->failed;
    }
    ++set_aside;
    rest.erase(rest.begin() + static_cast<std::ptrdiff_t>(item->index));
  }
  // Those now held: marked as a Prefetch's own promotions are.
  uint32_t n = 0;
  {
    absl::MutexLock lock(core_.mu());
    for (const BlockId& id : fetched_ids) {
      IndexEntry* e = FindFor(id, scope);
      if (e == nullptr || !e->in_ram()) continue;
      core_.HoldPrefetched(e, /*brought=*/true);
      ++n;
    }
  }
  result->fetched += n;
  // The rest: not in tier 3 for this caller, or gone again meanwhile.
  result->missing += static_cast<uint32_t>(absent.size()) - std::min<uint32_t>(
                         static_cast<uint32_t>(absent.size()), n + set_aside);
}

absl::Status TierManagerImpl::SetRetention(absl::Span<const BlockId> ids, RetentionClass c,
                                           absl::Duration ttl, const NamespaceScope* scope) {
  EVOKE_RETURN_IF_ERROR(CheckOpen());
  {
    absl::MutexLock lock(core_.mu());
    for (size_t i = 0; i < ids.size(); ++i) {
      if (FindFor(ids[i], scope) == nullptr) {
        return ItemError(absl::StatusCode::kNotFound, i, ItemPart::kId,
                         absl::StrCat(BlockName(ids[i]), " not found"));
      }
    }
    const int64_t until_ms = ttl > absl::ZeroDuration()
                                 ? core_.NowMs() + absl::ToInt64Milliseconds(ttl)
                                 : std::numeric_limits<int64_t>::max();
    for (const BlockId& id : ids) core_.SetRetention(core_.FindVisible(id), c, until_ms);
  }
  spiller_.Wake();  // A block now kLow may be what the spiller waits for.
  return absl::OkStatus();
}

}  // namespace evoke
