#include "storage/block_index.h"

#include <algorithm>
#include <cassert>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace evoke {
namespace {

std::string SessionKey(absl::string_view ns, absl::string_view session) {
  return absl::StrCat(ns.size(), ":", ns, session);
}

bool HasBytesTracked(BlockState s) {
  return s == BlockState::kDirty || s == BlockState::kClean || s == BlockState::kSpilled ||
         s == BlockState::kBreadcrumb;
}

}  // namespace

absl::string_view BlockStateName(BlockState state) {
  switch (state) {
    case BlockState::kWriting:
      return "writing";
    case BlockState::kDirty:
      return "dirty";
    case BlockState::kClean:
      return "clean";
    case BlockState::kSpilled:
      return "spilled";
    case BlockState::kBreadcrumb:
      return "breadcrumb";
    case BlockState::kRemoved:
      return "removed";
  }
  return "unknown";
}

BlockLocation IndexEntry::location() const {
  if (in_ram()) return BlockLocation::kHost;
  if (on_disk()) return BlockLocation::kDisk;
  return BlockLocation::kBreadcrumb;
}

// ------------------------------------------------------------ lookup

IndexEntry* BlockIndex::Find(const BlockId& id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.get();
}

IndexEntry* BlockIndex::FindVisible(const BlockId& id) const {
  IndexEntry* e = Find(id);
  return (e == nullptr || e->state == BlockState::kWriting) ? nullptr : e;
}

IndexEntry* BlockIndex::FindGen(const BlockId& id, uint64_t gen) const {
  IndexEntry* e = Find(id);
  return (e != nullptr && e->gen == gen) ? e : nullptr;
}

// ------------------------------------------------------------ state

void BlockIndex::Charge(const IndexEntry& e, int sign) {
  NamespaceUsage& u = usage_[e.meta.fingerprint().namespace_()];
  auto add = [sign](uint64_t& field, uint64_t n) {
    field = sign > 0 ? field + n : field - n;
  };
  add(u.blocks, 1);
  add(u.metadata_bytes, e.meta_bytes);
  add(metadata_bytes_, e.meta_bytes);
  if (e.in_ram()) add(u.tier1_bytes, e.payload_bytes);
  if (e.on_disk()) add(u.tier2_bytes, e.payload_bytes);
  if (u.blocks == 0) usage_.erase(e.meta.fingerprint().namespace_());
}

NamespaceUsage BlockIndex::Usage(absl::string_view ns) const {
  auto it = usage_.find(ns);
  return it == usage_.end() ? NamespaceUsage() : it->second;
}

void BlockIndex::SetState(IndexEntry* e, BlockState to) {
  if (events_ != nullptr && events_->enabled()) NoteEvent(*e, e->state, to);
  if (e->indexed) Charge(*e, -1);
  const int from = static_cast<int>(e->state);
  --count_[from];
  if (HasBytesTracked(e->state)) bytes_[from] -= e->payload_bytes;
  e->state = to;
  ++count_[static_cast<int>(to)];
  if (HasBytesTracked(to)) bytes_[static_cast<int>(to)] += e->payload_bytes;
  if (e->indexed) Charge(*e, +1);
  Relink(e);
}

namespace {

BlockLocation LocationIn(BlockState s) {
  switch (s) {
    case BlockState::kDirty:
    case BlockState::kClean:
      return BlockLocation::kHost;
    case BlockState::kSpilled:
      return BlockLocation::kDisk;
    default:
      return BlockLocation::kBreadcrumb;
  }
}

}  // namespace

void BlockIndex::NoteEvent(const IndexEntry& e, BlockState from, BlockState to) {
  using S = BlockState;
  using K = BlockEventKind;
  // A save begun (of a new block, or reviving a breadcrumb) tells nothing
  // until it commits; one undone tells nothing at all.
  if (from == to || to == S::kWriting ||
      (from == S::kWriting && (to == S::kRemoved || to == S::kBreadcrumb))) {
    return;
  }
  K kind;
  BlockLocation tier = LocationIn(to);
  if (to == S::kRemoved) {
    kind = K::kRemoved;
    tier = LocationIn(from);
  } else if (from == S::kWriting || from == S::kBreadcrumb) {
    kind = K::kStored;
  } else if (from == S::kDirty && to == S::kClean) {
    kind = K::kSpilled;
    tier = BlockLocation::kDisk;
  } else if (from == S::kClean && to == S::kSpilled) {
    kind = K::kDemoted;
    tier = BlockLocation::kHost;
  } else if (from == S::kSpilled && to == S::kClean) {
    kind = K::kPromoted;
  } else if (from == S::kClean && to == S::kDirty) {
    kind = K::kEvicted;  // Its tier-2 copy went; tier 1 still holds it.
    tier = BlockLocation::kDisk;
  } else if (to == S::kBreadcrumb) {
    kind = K::kEvicted;
    tier = LocationIn(from);
  } else {
    return;
  }
  events_->Record(kind, e.id, e.meta, tier, LocationIn(to));
}

void BlockIndex::Relink(IndexEntry* e) {
  const bool want_ram = e->in_ram() && e->pins == 0;
  if (want_ram != e->in_ram_lru) {
    if (want_ram) {
      ram_lru_.push_front(e);
      e->ram_lru_it = ram_lru_.begin();
      evictable_bytes_ += e->ram.length();
    } else {
      ram_lru_.erase(e->ram_lru_it);
      evictable_bytes_ -= e->ram.length();
    }
    e->in_ram_lru = want_ram;
  }
  // A pinned block with no tier-1 copy (held by Acquire) is no victim of
  // the spill budget: its tier-2 payload is all it has.
  const bool want_disk = e->on_disk() && (e->in_ram() || e->pins == 0);
  if (want_disk != e->in_disk_lru) {
    if (want_disk) {
      disk_lru_.push_front(e);
      e->disk_lru_it = disk_lru_.begin();
    } else {
      disk_lru_.erase(e->disk_lru_it);
    }
    e->in_disk_lru = want_disk;
  }
}

void BlockIndex::IndexSecondary(IndexEntry& e) {
  e.indexed = true;
  e.meta_bytes = MetadataBytes(e.meta);
  Charge(e, +1);
  const std::string& ns = e.meta.fingerprint().namespace_();
  // Hinted at the end: a start adds ids in ascending order, and a wrong
  // hint costs only the search it would have made anyway.
  absl::btree_set<BlockId>& in_ns = by_namespace_[ns];
  in_ns.insert(in_ns.end(), e.id);
  if (!e.meta.session_id().empty()) {
    std::string key = SessionKey(ns, e.meta.session_id());
    if (!session_keeps_.empty()) {
      auto keep = session_keeps_.find(key);
      e.keep_until_ms = keep == session_keeps_.end() ? 0 : keep->second;
    }
    absl::btree_set<BlockId>& in_session = by_session_[std::move(key)];
    in_session.insert(in_session.end(), e.id);
    ++session_namespaces_[e.meta.session_id()][ns];
  }
}

void BlockIndex::UnindexSecondary(IndexEntry& e) {
  if (!e.indexed) return;
  Charge(e, -1);
  e.indexed = false;
  const std::string& ns = e.meta.fingerprint().namespace_();
  if (auto it = by_namespace_.find(ns); it != by_namespace_.end()) {
    it->second.erase(e.id);
    if (it->second.empty()) by_namespace_.erase(it);
  }
  if (e.meta.session_id().empty()) return;
  if (auto it = by_session_.find(SessionKey(ns, e.meta.session_id()));
      it != by_session_.end()) {
    it->second.erase(e.id);
    if (it->second.empty()) by_session_.erase(it);
  }
  if (auto it = session_namespaces_.find(e.meta.session_id());
      it != session_namespaces_.end()) {
    auto n = it->second.find(ns);
    if (n != it->second.end() && --n->second == 0) it->second.erase(n);
    if (it->second.empty()) session_namespaces_.erase(it);
  }
}

// ------------------------------------------------------------ saves

IndexEntry* BlockIndex::BeginWrite(const BlockId& id, bool* revived) {
  IndexEntry* e = Find(id);
  if (e != nullptr) {
    assert(e->state == BlockState::kBreadcrumb);
    *revived = true;
    // A new generation: operations that looked the breadcrumb up before
    // (a promotion reading tier 2) must not mistake the placeholder for it.
    e->gen = next_gen_++;
    SetState(e, BlockState::kWriting);
    return e;
  }
  *revived = false;
  auto fresh = std::make_unique<IndexEntry>();
  fresh->id = id;
  fresh->gen = next_gen_++;
  fresh->state = BlockState::kWriting;
  ++count_[static_cast<int>(BlockState::kWriting)];
  e = fresh.get();
  entries_.emplace(id, std::move(fresh));
  return e;
}

void BlockIndex::AbortWrite(IndexEntry* e, bool revived) {
  assert(e->state == BlockState::kWriting);
  if (revived) {
    SetState(e, BlockState::kBreadcrumb);
    return;
  }
  --count_[static_cast<int>(BlockState::kWriting)];
  entries_.erase(e->id);
}

void BlockIndex::CommitWrite(IndexEntry* e, ArenaReservation ram, int64_t now_ms) {
  assert(e->state == BlockState::kWriting);
  ram.Commit();
  e->ram = std::move(ram);
  e->ram_quarantined = false;
  e->last_access_ms = now_ms;
  e->access_tick = ++access_clock_;
  SetState(e, BlockState::kDirty);
  IndexSecondary(*e);
}

void BlockIndex::ReplaceMetaForWrite(IndexEntry* e, v1::BlockMeta meta) {
  assert(e->state == BlockState::kWriting);
  UnindexSecondary(*e);  // A revived breadcrumb was indexed.
  e->meta = std::move(meta);
}

IndexEntry* BlockIndex::AddRecovered(const BlockId& id, v1::BlockMeta meta,
                                     bool payload_present, int64_t last_access_ms) {
  auto fresh = std::make_unique<IndexEntry>();
  IndexEntry* e = fresh.get();
  e->id = id;
  e->gen = next_gen_++;
  e->meta = std::move(meta);
  e->fp_digest = DigestFingerprint(e->meta.fingerprint());
  e->payload_bytes = e->meta.payload_bytes();
  e->checksum = e->meta.checksum();
  e->record_on_disk = true;
  e->last_access_ms = last_access_ms;
  // In its final state at once (spilled, or a breadcrumb); FinishLoading
  // links the payload holders into the disk LRU in access order.
  e->state = payload_present ? BlockState::kSpilled : BlockState::kBreadcrumb;
  ++count_[static_cast<int>(e->state)];
  bytes_[static_cast<int>(e->state)] += e->payload_bytes;
  if (payload_present) loading_.push_back(e);
  entries_.emplace(id, std::move(fresh));
  IndexSecondary(*e);
  return e;
}

void BlockIndex::FinishLoading() {
  // Oldest first, so that each push_front leaves the hottest at the front;
  // ties in load (id) order. Sorted by value, not through the pointers.
  std::vector<std::pair<int64_t, uint32_t>> order(loading_.size());
  for (size_t i = 0; i < loading_.size(); ++i) {
    order[i] = {loading_[i]->last_access_ms, static_cast<uint32_t>(i)};
  }
  std::sort(order.begin(), order.end());
  for (const auto& [ms, i] : order) {
    IndexEntry* e = loading_[i];
    e->access_tick = ++access_clock_;
    Relink(e);
  }
  loading_.clear();
  loading_.shrink_to_fit();
}

// ------------------------------------------------------------ tiers

void BlockIndex::AttachRam(IndexEntry* e, ArenaReservation ram) {
  assert(e->state == BlockState::kSpilled || e->state == BlockState::kBreadcrumb);
  ram.Commit();
  e->ram = std::move(ram);
  e->ram_quarantined = false;
  SetState(e, e->state == BlockState::kSpilled ? BlockState::kClean : BlockState::kDirty);
}

ArenaReservation BlockIndex::DetachRam(IndexEntry* e) {
  assert(e->in_ram());
  if (e->prefetched) {
    e->prefetched = false;
    ++prefetch_unused_;
  }
  SetState(e, e->state == BlockState::kClean ? BlockState::kSpilled
                                             : BlockState::kBreadcrumb);
  e->ram_quarantined = false;
  return std::move(e->ram);
}

void BlockIndex::MarkOnDisk(IndexEntry* e) {
  assert(e->state == BlockState::kDirty);
  e->record_on_disk = true;
  SetState(e, BlockState::kClean);
}

void BlockIndex::MarkOffDisk(IndexEntry* e, bool record_kept) {
  e->record_on_disk = record_kept;
  if (e->state == BlockState::kClean) {
    SetState(e, BlockState::kDirty);
  } else if (e->state == BlockState::kSpilled) {
    SetState(e, BlockState::kBreadcrumb);
  }
}

void BlockIndex::Quarantine(IndexEntry* e) {
  if (!e->in_ram()) return;
  if (e->readers == 0) {
    DetachRam(e).Release();
  } else {
    e->ram_quarantined = true;
  }
}

void BlockIndex::Remove(IndexEntry* e) {
  assert(e->state != BlockState::kWriting && e->state != BlockState::kRemoved);
  UnindexSecondary(*e);
  if (e->pins > 0) {
    --pinned_blocks_;
    pin_count_ -= e->pins;
    e->pins = 0;
  }
  for (const auto& [owner, count] : e->pin_owners) {
    auto owned = owner_pins_.find(owner);
    if (owned == owner_pins_.end()) continue;
    owned->second.erase(e->id);
    if (owned->second.empty()) owner_pins_.erase(owned);
  }
  e->pin_owners.clear();
  SetRetention(e, RetentionClass::kNormal, 0);
  SetState(e, BlockState::kRemoved);
  auto node = entries_.extract(e->id);
  if (e->readers > 0) {
    // The last reader frees the bytes (ReleaseReader).
    graveyard_.emplace(e, std::move(node.mapped()));
    return;
  }
  --count_[static_cast<int>(BlockState::kRemoved)];
  // `node` goes out of scope: the entry and its reservation are freed.
}

// ------------------------------------------------------------ readers, pins

void BlockIndex::ReleaseReader(IndexEntry* e) {
  assert(e->readers > 0);
  if (--e->readers > 0) return;
  if (e->state == BlockState::kRemoved) {
    --count_[static_cast<int>(BlockState::kRemoved)];
    graveyard_.erase(e);
    return;
  }
  if (e->ram_quarantined && e->in_ram()) DetachRam(e).Release();
}

void BlockIndex::AddPin(IndexEntry* e, PinOwner owner) {
  ++e->pin_owners[owner];
  ++owner_pins_[owner][e->id];
  ++pin_count_;
  if (e->pins++ == 0) {
    ++pinned_blocks_;
    Relink(e);
  }
}

bool BlockIndex::RemovePin(IndexEntry* e, PinOwner owner) {
  auto it = e->pin_owners.find(owner);
  if (it == e->pin_owners.end()) return false;
  if (--it->second == 0) e->pin_owners.erase(it);
  if (auto owned = owner_pins_.find(owner); owned != owner_pins_.end()) {
    auto pin = owned->second.find(e->id);
    if (pin != owned->second.end() && --pin->second == 0) owned->second.erase(pin);
    if (owned->second.empty()) owner_pins_.erase(owned);
  }
  --pin_count_;
  if (--e->pins == 0) {
    --pinned_blocks_;
    Relink(e);
  }
  return true;
}

uint32_t BlockIndex::PinsOf(const IndexEntry& e, PinOwner owner) const {
  auto it = e.pin_owners.find(owner);
  return it == e.pin_owners.end() ? 0 : it->second;
}

uint64_t BlockIndex::ReleaseOwner(PinOwner owner) {
  auto it = owner_pins_.find(owner);
  if (it == owner_pins_.end()) return 0;
  const absl::flat_hash_map<BlockId, uint32_t> pins = it->second;
  uint64_t released = 0;
  for (const auto& [id, count] : pins) {
    // Find, not FindVisible: a pinned breadcrumb being saved again keeps
    // its pins, and they end with the lease like any other.
    IndexEntry* e = Find(id);
    if (e == nullptr) continue;
    for (uint32_t k = 0; k < count && RemovePin(e, owner); ++k) ++released;
  }
  owner_pins_.erase(owner);
  return released;
}

void BlockIndex::Touch(IndexEntry* e, int64_t now_ms) {
  e->last_access_ms = now_ms;
  e->access_tick = ++access_clock_;
  if (e->in_ram_lru) ram_lru_.splice(ram_lru_.begin(), ram_lru_, e->ram_lru_it);
  if (e->in_disk_lru) disk_lru_.splice(disk_lru_.begin(), disk_lru_, e->disk_lru_it);
}

// ------------------------------------------------------------ walks

BlockInfo BlockIndex::Info(const IndexEntry& e) {
  BlockInfo info;
  info.meta = e.meta;
  info.location = e.location();
  info.bytes_available = e.bytes_available();
  info.on_disk = e.on_disk();
  info.pin_count = e.pins;
  info.last_access_unix_ms = e.last_access_ms;
  return info;
}

void BlockIndex::SetRetention(IndexEntry* e, RetentionClass c, int64_t until_ms) {
  if (e->retention != RetentionClass::kNormal) {
    retained_[RetainedIndex(e->retention)].erase({e->retention_until_ms, e});
  }
  e->retention = c;
  e->retention_until_ms = c == RetentionClass::kNormal ? 0 : until_ms;
  if (c != RetentionClass::kNormal) retained_[RetainedIndex(c)].insert({e->retention_until_ms, e});
}

void BlockIndex::ForgetEndedRetention(int64_t now_ms) {
  for (auto& set : retained_) {
    while (!set.empty() && set.begin()->first <= now_ms) {
      IndexEntry* e = set.begin()->second;
      set.erase(set.begin());
      e->retention = RetentionClass::kNormal;
      e->retention_until_ms = 0;
      if (events_ != nullptr && events_->enabled()) {
        events_->Record(BlockEventKind::kExpired, e->id, e->meta, e->location(), e->location());
      }
    }
  }
}

void BlockIndex::ForgetEndedKeeps(int64_t now_ms) {
  for (auto it = session_keeps_.begin(); it != session_keeps_.end();) {
    if (it->second <= now_ms) {
      session_keeps_.erase(it++);
    } else {
      ++it;
    }
  }
}

size_t BlockIndex::KeepSession(absl::string_view ns, absl::string_view session,
                               int64_t until_ms, int64_t now_ms) {
  std::string key = SessionKey(ns, session);
  if (until_ms > now_ms) {
    session_keeps_[key] = until_ms;
  } else {
    session_keeps_.erase(key);
    until_ms = 0;
  }
  auto it = by_session_.find(key);
  if (it == by_session_.end()) return 0;
  for (const BlockId& id : it->second) {
    if (IndexEntry* e = Find(id); e != nullptr) e->keep_until_ms = until_ms;
  }
  return it->second.size();
}

bool BlockIndex::IsKept(absl::string_view ns, absl::string_view session, int64_t now_ms) const {
  auto it = session_keeps_.find(SessionKey(ns, session));
  return it != session_keeps_.end() && it->second > now_ms;
}

std::vector<BlockId> BlockIndex::SessionIds(absl::string_view ns,
                                            absl::string_view session) const {
  std::vector<BlockId> ids;
  auto it = by_session_.find(SessionKey(ns, session));
  if (it == by_session_.end()) return ids;
  for (const BlockId& id : it->second) {
    const IndexEntry* e = FindVisible(id);
    if (e != nullptr && e->meta.kind() == v1::BLOCK_KIND_SESSION) ids.push_back(id);
  }
  return ids;
}

namespace {

bool Matches(const IndexEntry& e, const ListFilter& filter) {
  if (e.state == BlockState::kWriting) return false;
  if (!filter.ns.empty() && e.meta.fingerprint().namespace_() != filter.ns) return false;
  if (!filter.session_id.empty() && e.meta.session_id() != filter.session_id) return false;
  if (filter.location && e.location() != *filter.location) return false;
  if (filter.scope != nullptr && !filter.scope->SeesBlock(e.meta.fingerprint())) return false;
  return true;
}

// Walks `ids` (sorted) from after `after`.
template <typename Set>
typename Set::const_iterator StartOf(const Set& ids, const BlockId* after) {
  return after == nullptr ? ids.begin() : ids.upper_bound(*after);
}

}  // namespace

std::optional<BlockId> BlockIndex::ListPage(const ListFilter& filter, const BlockId* after,
                                            size_t limit, size_t max_visits,
                                            std::vector<BlockInfo>* out) const {
  size_t visits = 0, found = 0;
  std::optional<BlockId> last;
  // Visit returns false to stop the walk.
  auto visit = [&](const BlockId& id, const IndexEntry* e) {
    last = id;
    ++visits;
    if (e != nullptr && Matches(*e, filter)) {
      out->push_back(Info(*e));
      ++found;
    }
    return found < limit && visits < max_visits;
  };
  if (limit == 0) return std::nullopt;
  if (!filter.session_id.empty()) {
    // The session's ids in every namespace that has it (usually one),
    // merged in id order.
    absl::btree_set<BlockId> ids;
    auto nss = session_namespaces_.find(filter.session_id);
    if (nss != session_namespaces_.end()) {
      for (const auto& [ns, count] : nss->second) {
        if (!filter.ns.empty() && ns != filter.ns) continue;
        auto set = by_session_.find(SessionKey(ns, filter.session_id));
        if (set == by_session_.end()) continue;
        size_t taken = 0;
        for (auto it = StartOf(set->second, after);
             it != set->second.end() && taken < max_visits; ++it, ++taken) {
          ids.insert(*it);
        }
      }
    }
    for (const BlockId& id : ids) {
      if (!visit(id, Find(id))) return last;
    }
    return std::nullopt;
  }
  if (!filter.ns.empty()) {
    auto set = by_namespace_.find(filter.ns);
    if (set == by_namespace_.end()) return std::nullopt;
    for (auto it = StartOf(set->second, after); it != set->second.end(); ++it) {
      if (!visit(*it, Find(*it))) return last;
    }
    return std::nullopt;
  }
  for (auto it = StartOf(entries_, after); it != entries_.end(); ++it) {
    if (!visit(it->first, it->second.get())) return last;
  }
  return std::nullopt;
}

std::vector<BlockId> BlockIndex::VisibleIds() const {
  std::vector<BlockId> ids;
  ids.reserve(entries_.size());
  for (const auto& [id, e] : entries_) {
    if (e->state != BlockState::kWriting) ids.push_back(id);
  }
  return ids;
}

std::vector<IndexEntry*> BlockIndex::DirtyByAccess() const {
  std::vector<IndexEntry*> dirty;
  dirty.reserve(count(BlockState::kDirty));
  for (const auto& [id, e] : entries_) {
    if (e->state == BlockState::kDirty && !e->ram_quarantined) dirty.push_back(e.get());
  }
  std::sort(dirty.begin(), dirty.end(), [](const IndexEntry* a, const IndexEntry* b) {
    return a->access_tick < b->access_tick;
  });
  return dirty;
}

}  // namespace evoke
