// BlockIndex: every block the engine knows, with one lifecycle state each,
// the LRU lists, sessions, namespaces, pins and their owners.
#ifndef EVOKE_STORAGE_BLOCK_INDEX_H_
#define EVOKE_STORAGE_BLOCK_INDEX_H_

#include <array>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "common/fingerprint.h"
#include "common/hash128.h"
#include "evoke/v1/block.pb.h"
#include "storage/block_events.h"
#include "storage/host_tier.h"
#include "storage/tier_types.h"

namespace evoke {

// The lifecycle of one block's bytes (docs/ARCHITECTURE.md draws it):
//
//   kWriting     a Save in flight: a placeholder, invisible to readers.
//   kDirty       tier 1 only: lost on a crash (unless Flush/durable save).
//   kClean       tier 1 and tier 2: leaving tier 1 costs nothing.
//   kSpilled     tier 2 only: a Load reads it back (and promotes it).
//   kBreadcrumb  metadata only: the payload was dropped past the spill
//                budget or failed verification; Recover still finds it.
//   kRemoved     deleted while readers still held its tier-1 bytes; out of
//                the index, freed when the last reader lets go.
enum class BlockState : uint8_t {
  kWriting,
  kDirty,
  kClean,
  kSpilled,
  kBreadcrumb,
  kRemoved,
};
inline constexpr int kBlockStates = 6;
absl::string_view BlockStateName(BlockState state);

// One block. Fields are read by the engine; every change of state, pins,
// readers or LRU position goes through BlockIndex, which keeps the lists and
// the occupancy counts in step.
struct IndexEntry {
  BlockId id;
  uint64_t gen = 0;  // Unique per entry object: detects replacement.
  v1::BlockMeta meta;
  FingerprintDigest fp_digest;
  uint64_t payload_bytes = 0;
  uint64_t meta_bytes = 0;  // MetadataBytes(meta), while indexed.
  uint64_t checksum = 0;

  BlockState state = BlockState::kWriting;
  ArenaReservation ram;          // Tier-1 bytes, in kDirty and kClean.
  bool record_on_disk = false;   // A record (payload or breadcrumb) in tier 2.
  bool ram_quarantined = false;  // Tier-1 copy failed; dropped at 0 readers.
  // Its tier-2 payload is being dropped by the spill budget (between
  // EngineCore::PickBudgetVictims and FinishBudgetDrop): not to be held.
  bool dropping = false;
  uint32_t readers = 0;          // In-flight users of the tier-1 bytes.
  uint32_t pins = 0;             // Sum over pin_owners.
  absl::flat_hash_map<PinOwner, uint32_t> pin_owners;
  int64_t last_access_ms = 0;
  uint64_t access_tick = 0;  // Orders accesses; finer than last_access_ms.
  // Until when its session is kept (KeepSession): evicted from either tier
  // only when nothing else can go. 0: not kept.
  int64_t keep_until_ms = 0;
  // Its own retention class (SetRetention) and until when (INT64_MAX: no
  // end); kNormal: none.
  RetentionClass retention = RetentionClass::kNormal;
  int64_t retention_until_ms = 0;
  // Its tier-1 copy came from a Prefetch and no Load has read it yet.
  bool prefetched = false;
  // A Prefetch asked for it and no Load has read it since: until then the
  // spiller passes it over as it does kept blocks (0: not).
  int64_t prefetch_until_ms = 0;

  bool in_ram() const { return state == BlockState::kDirty || state == BlockState::kClean; }
  bool on_disk() const {
    return state == BlockState::kClean || state == BlockState::kSpilled;
  }
  bool bytes_available() const { return in_ram() || on_disk(); }
  // Kept: its session is kept, or its own class is kHigh, now.
  bool kept(int64_t now_ms) const {
    return keep_until_ms > now_ms ||
           (retention == RetentionClass::kHigh && retention_until_ms > now_ms);
  }
  // Low: its own class is kLow now (evicted before any other).
  // (A kept session's blocks are kept whatever their own class.)
  bool low(int64_t now_ms) const {
    return retention == RetentionClass::kLow && retention_until_ms > now_ms &&
           keep_until_ms <= now_ms;
  }
  // Kept, or prefetched and not read yet: tier 1's spiller takes it last.
  bool held_warm(int64_t now_ms) const { return kept(now_ms) || prefetch_until_ms > now_ms; }
  // Readable tier-1 bytes: held and not quarantined.
  bool ram_readable() const { return in_ram() && !ram_quarantined; }
  BlockLocation location() const;

 private:
  friend class BlockIndex;
  bool indexed = false;  // In the namespace and session indexes.
  bool in_ram_lru = false;
  std::list<IndexEntry*>::iterator ram_lru_it;
  bool in_disk_lru = false;
  std::list<IndexEntry*>::iterator disk_lru_it;
};

// BlockIndex owns the entries. It has no lock, no thread and no I/O: the
// engine calls it under its own mutex. Lists:
//   ram LRU   unpinned entries with tier-1 bytes (the spiller's victims);
//   disk LRU  entries with a payload in tier 2 (the spill budget's victims),
//             except pinned ones with no tier-1 copy (held by Acquire);
// front = most recently used. Secondary indexes by namespace and by session
// serve List and DropSession without scanning every block.
class BlockIndex {
 public:
  BlockIndex() = default;
  BlockIndex(const BlockIndex&) = delete;
  BlockIndex& operator=(const BlockIndex&) = delete;

  // --- lookup ---
  IndexEntry* Find(const BlockId& id) const;
  // FindVisible skips placeholders of in-flight saves.
  IndexEntry* FindVisible(const BlockId& id) const;
  // FindGen finds `id` only if it is still the same entry object.
  IndexEntry* FindGen(const BlockId& id, uint64_t gen) const;
  size_t size() const { return entries_.size(); }

  // --- saves ---
  // BeginWrite makes a placeholder for `id` (kWriting): a new entry, or an
  // existing breadcrumb being revived (`*revived` set).
  IndexEntry* BeginWrite(const BlockId& id, bool* revived);
  // AbortWrite undoes BeginWrite: a revived breadcrumb goes back, a new
  // entry leaves the index.
  void AbortWrite(IndexEntry* e, bool revived);
  // CommitWrite makes a placeholder kDirty with `ram` (committed) as its
  // tier-1 copy; meta, checksum and sizes must be set first. A revived
  // breadcrumb keeps its tier-2 record.
  void CommitWrite(IndexEntry* e, ArenaReservation ram, int64_t now_ms);
  // ReplaceMetaForWrite sets a placeholder's metadata (re-indexing a revived
  // breadcrumb under its new namespace and session).
  void ReplaceMetaForWrite(IndexEntry* e, v1::BlockMeta meta);
  // Load adds an entry read from tier 2 at start: kSpilled or kBreadcrumb.
  // Call FinishLoading once all are in, to order the disk LRU by access.
  IndexEntry* AddRecovered(const BlockId& id, v1::BlockMeta meta, bool payload_present,
                           int64_t last_access_ms);
  void FinishLoading();

  // --- tier transitions ---
  // AttachRam gives an entry without tier-1 bytes a copy read back from
  // tier 2 (promotion): kSpilled -> kClean, kBreadcrumb -> kDirty (its
  // payload was dropped while being read).
  void AttachRam(IndexEntry* e, ArenaReservation ram);
  // DetachRam takes an entry's tier-1 copy (kDirty -> kBreadcrumb, kClean ->
  // kSpilled). The caller releases the returned reservation.
  ArenaReservation DetachRam(IndexEntry* e);
  // MarkOnDisk: its payload is now in tier 2 (kDirty -> kClean).
  void MarkOnDisk(IndexEntry* e);
  // MarkOffDisk: its tier-2 payload is gone (kClean -> kDirty, kSpilled ->
  // kBreadcrumb); `record_kept` says whether a record remains.
  void MarkOffDisk(IndexEntry* e, bool record_kept);
  // Quarantine marks a bad tier-1 copy: dropped now, or when its last
  // reader lets go.
  void Quarantine(IndexEntry* e);
  // Remove takes an entry out of the index (and every list); if readers
  // hold its tier-1 bytes it waits in a graveyard as kRemoved.
  void Remove(IndexEntry* e);

  // --- readers, pins, access ---
  void AddReader(IndexEntry* e) { ++e->readers; }
  void ReleaseReader(IndexEntry* e);
  void AddPin(IndexEntry* e, PinOwner owner);
  // RemovePin returns false when `owner` holds no pin on `e`.
  bool RemovePin(IndexEntry* e, PinOwner owner);
  uint32_t PinsOf(const IndexEntry& e, PinOwner owner) const;
  // ReleaseOwner drops every pin of `owner`; returns how many.
  uint64_t ReleaseOwner(PinOwner owner);
  void Touch(IndexEntry* e, int64_t now_ms);

  // --- session keeps ---
  // KeepSession keeps (ns, session)'s session blocks, those indexed now and
  // those saved later, until `until_ms` (0 or past: no longer kept), and
  // returns how many it has now. Keeps that ran out stay in the table (and
  // in kept_sessions) until ForgetEndedKeeps (a full table, Stats).
  size_t KeepSession(absl::string_view ns, absl::string_view session, int64_t until_ms,
                     int64_t now_ms);
  size_t kept_sessions() const { return session_keeps_.size(); }
  bool IsKept(absl::string_view ns, absl::string_view session, int64_t now_ms) const;
  void ForgetEndedKeeps(int64_t now_ms);

  // SetRetention gives `e` class `c` until `until_ms` (kNormal: none).
  void SetRetention(IndexEntry* e, RetentionClass c, int64_t until_ms);
  // ForgetEndedRetention drops the classes whose time is over (recording
  // an EXPIRED event for each, when events are on); then retained(c)
  // counts the blocks of class c in force.
  void ForgetEndedRetention(int64_t now_ms);
  size_t retained(RetentionClass c) const { return retained_[RetainedIndex(c)].size(); }

  // --- walks ---
  // Coldest unpinned tier-1 entries, coldest first (the spiller).
  const std::list<IndexEntry*>& ram_lru() const { return ram_lru_; }
  const std::list<IndexEntry*>& disk_lru() const { return disk_lru_; }
  // SessionIds returns the ids of (ns, session)'s session blocks.
  std::vector<BlockId> SessionIds(absl::string_view ns, absl::string_view session) const;
  // ListPage appends up to `limit` visible entries with id > `after` (or from
  // the start) that pass `filter`, in id order, visiting at most
  // `max_visits` entries. Returns where to resume, or nullopt when the walk
  // reached the end. Uses the namespace or session index when the filter
  // names one, so a selective filter never walks the whole index.
  std::optional<BlockId> ListPage(const ListFilter& filter, const BlockId* after,
                                  size_t limit, size_t max_visits,
                                  std::vector<BlockInfo>* out) const;
  static BlockInfo Info(const IndexEntry& e);
  // VisibleIds returns every id but in-flight placeholders (Verify all).
  std::vector<BlockId> VisibleIds() const;
  // DirtyByAccess returns every kDirty entry, coldest first (Flush).
  std::vector<IndexEntry*> DirtyByAccess() const;

  // --- occupancy ---
  uint64_t count(BlockState s) const { return count_[static_cast<int>(s)]; }
  uint64_t payload_bytes(BlockState s) const { return bytes_[static_cast<int>(s)]; }
  uint64_t ram_blocks() const { return count(BlockState::kDirty) + count(BlockState::kClean); }
  uint64_t ram_payload_bytes() const {
    return payload_bytes(BlockState::kDirty) + payload_bytes(BlockState::kClean);
  }
  uint64_t disk_blocks() const { return count(BlockState::kClean) + count(BlockState::kSpilled); }
  uint64_t disk_payload_bytes() const {
    return payload_bytes(BlockState::kClean) + payload_bytes(BlockState::kSpilled);
  }
  // Reserved tier-1 bytes the spiller could free (extents in the ram LRU).
  uint64_t evictable_bytes() const { return evictable_bytes_; }
  // set_events: from now on every change of a block's tiers is recorded in
  // `events` (may be null: none). Set once the index is loaded.
  void set_events(BlockEventLog* events) { events_ = events; }
  // Prefetched tier-1 copies that left tier 1 before any Load read them.
  uint64_t prefetch_unused() const { return prefetch_unused_; }
  uint64_t pinned_blocks() const { return pinned_blocks_; }
  // Accounted metadata bytes of every visible block (MetadataBytes).
  uint64_t metadata_bytes() const { return metadata_bytes_; }
  // What `ns` holds now (zeros when nothing).
  NamespaceUsage Usage(absl::string_view ns) const;
  const absl::flat_hash_map<std::string, NamespaceUsage>& usage() const { return usage_; }
  uint64_t pin_count() const { return pin_count_; }

 private:
  void SetState(IndexEntry* e, BlockState to);
  // Relink puts `e` on exactly the lists its state and pins call for.
  void Relink(IndexEntry* e);
  void IndexSecondary(IndexEntry& e);
  void UnindexSecondary(IndexEntry& e);
  // Charge adds (sign +1) or removes (-1) e's bytes in its namespace.
  void Charge(const IndexEntry& e, int sign);

  absl::btree_map<BlockId, std::unique_ptr<IndexEntry>> entries_;
  absl::flat_hash_map<IndexEntry*, std::unique_ptr<IndexEntry>> graveyard_;
  // namespace -> ids; (namespace, session) -> ids of its session blocks.
  absl::flat_hash_map<std::string, absl::btree_set<BlockId>> by_namespace_;
  absl::flat_hash_map<std::string, absl::btree_set<BlockId>> by_session_;
  // Kept sessions (SessionKey) and until when.
  absl::flat_hash_map<std::string, int64_t> session_keeps_;
  // Blocks of class kLow [0] and kHigh [1], by the end of their class.
  absl::btree_set<std::pair<int64_t, IndexEntry*>> retained_[2];
  static int RetainedIndex(RetentionClass c) { return c == RetentionClass::kLow ? 0 : 1; }
  // session id -> namespaces that have it (List by session alone).
  absl::flat_hash_map<std::string, absl::flat_hash_map<std::string, uint64_t>>
      session_namespaces_;
  absl::flat_hash_map<PinOwner, absl::flat_hash_map<BlockId, uint32_t>> owner_pins_;
  std::list<IndexEntry*> ram_lru_;
  std::list<IndexEntry*> disk_lru_;
  std::array<uint64_t, kBlockStates> count_{};
  std::array<uint64_t, kBlockStates> bytes_{};
  uint64_t evictable_bytes_ = 0;
  uint64_t prefetch_unused_ = 0;
  BlockEventLog* events_ = nullptr;
  void NoteEvent(const IndexEntry& e, BlockState from, BlockState to);
  // Per namespace, over indexed (visible) entries; kept by IndexSecondary,
  // UnindexSecondary and SetState.
  absl::flat_hash_map<std::string, NamespaceUsage> usage_;
  uint64_t metadata_bytes_ = 0;
  uint64_t pinned_blocks_ = 0;
  uint64_t pin_count_ = 0;
  std::vector<IndexEntry*> loading_;  // AddRecovered payload holders.
  uint64_t next_gen_ = 1;
  uint64_t access_clock_ = 0;
};

}  // namespace evoke

#endif  // EVOKE_STORAGE_BLOCK_INDEX_H_
