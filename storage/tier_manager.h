// TierManager: the storage engine's interface. Save, Load, Pin, Verify and
// Flush over tier 1 (the pinned arena) and the tiers below it.
#ifndef EVOKE_STORAGE_TIER_MANAGER_H_
#define EVOKE_STORAGE_TIER_MANAGER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/hash128.h"
#include "common/block_validation.h"
#include "common/clock.h"
#include "evoke/v1/block.pb.h"
#include "storage/block_events.h"
#include "storage/pinned_arena.h"
#include "storage/remote/remote_tier.h"
#include "storage/tier.h"
#include "storage/tier_types.h"

namespace evoke {

// BlockObserver hears of blocks entering and leaving the index. Called with
// the index lock held: implementations must be quick and must not call the
// TierManager.
class BlockObserver {
 public:
  virtual ~BlockObserver() = default;
  virtual void Added(const BlockId& id, const v1::BlockMeta& meta) = 0;
  virtual void Removed(const BlockId& id, const v1::BlockMeta& meta) = 0;
};

struct TierManagerOptions {
  // Tier 1 starts spilling when its used bytes pass high_watermark *
  // capacity, and spills least recently used blocks until it is under
  // low_watermark * capacity. 0 < low < high <= 1. Defaults: 0.95, 0.80.
  double high_watermark = 0.95;
  double low_watermark = 0.80;
  // Budget of payload bytes kept on disk. Past it, the least recently used
  // payloads are dropped and their metadata kept (breadcrumbs).
  // Default: 16 GiB.
  uint64_t spill_bytes = 16ull << 30;
  // Payload bytes written to the spill store per batch. Default: 64 MiB.
  uint64_t spill_batch_bytes = 64ull << 20;
  // Heap bytes that Loads may hold at once, over every call, for blocks
  // read from tier 2 that land neither in tier 1 (no room) nor in the
  // caller's memory (scatter, CUDA and inline sinks). A call past its share
  // drains its sink first (LoadSink::Drain); one that finds the budget held
  // by others waits up to max_wait_for_room, then is RESOURCE_EXHAUSTED.
  // At least limits.max_block_bytes. Default: 256 MiB.
  uint64_t staging_bytes = 256ull << 20;
  // How long a Save may wait for the spiller to make room in tier 1 before
  // failing with RESOURCE_EXHAUSTED (the call's own deadline also applies).
  // Default: 10 s.
  absl::Duration max_wait_for_room = absl::Seconds(10);
  // Told about every block that enters the index (on save and on restart)
  // and leaves it (on delete); breadcrumbs stay. The daemon feeds its
  // RecoveryIndex from it. May be null. Must outlive the TierManager.
  BlockObserver* observer = nullptr;
  // Where every change of a block's tiers is recorded once the index is
  // loaded (stored, spilled, demoted, promoted, evicted, removed), for
  // WatchBlocks. May be null. Must outlive the TierManager.
  BlockEventLog* events = nullptr;
  // Called for every newly stored block with its verified tier-1 bytes; may
  // return a summary to store with it (the daemon computes MEAN_KEYS for
  // canonical blocks saved without one). Runs outside the index lock.
  std::function<std::optional<v1::Summary>(const v1::BlockMeta& meta,
                                           const uint8_t* payload, uint64_t size)>
      summarize;
  // At most how many metadata bytes `summarize` adds to a block with this
  // meta: Saves are charged it against quotas and the metadata budget at
  // their check, before the summary exists. Unset: 0 (set it with
  // `summarize`, or summaries overrun quotas).
  std::function<uint64_t(const v1::BlockMeta& meta)> summary_bound;
  // Extra threads that copy and checksum payloads larger than 2 MiB in
  // parallel (1 MiB pieces). 0: every copy on the calling thread.
  // Default: 2.
  int copy_threads = 2;
  // Tier-2 reads one Load issues at once for the blocks it reads from disk
  // into a destination known in advance (the sink's host destination, or
  // room in tier 1 for the promotion): several reads in flight keep the
  // device busy. 1: one after another. Default: 4.
  int disk_reads_in_flight = 4;
  // What a stored record may be. At start every record is checked as a Save
  // would be (id, shape, positions, fingerprint, payload size; summaries
  // are checked by the observer that indexes them): one that fails is left
  // on disk, out of the index, counted in invalid_records, and removed by
  // Delete or Verify. The daemon passes its request limits.
  BlockLimits limits;
  // Budget of accounted metadata bytes (MetadataBytes) over every
  // namespace; a Save past it is RESOURCE_EXHAUSTED. 0: none.
  uint64_t metadata_bytes = 0;
  // Each namespace's quotas (NamespaceQuota); unset: none.
  std::function<NamespaceQuota(absl::string_view ns)> quota;
  // Sessions KeepSession may keep at once.
  size_t max_kept_sessions = 65536;
  // The share of tier 1 keeps may protect from the spiller; kept blocks past
  // it (the warmest) are evicted as any other (counted as keep_overrides).
  double kept_tier1_fraction = 0.25;
  // How long a block a Prefetch asked for is passed over by tier 1's
  // spiller (as kept blocks are, within kept_tier1_fraction) while no Load
  // has read it. Default: 2 s.
  absl::Duration prefetch_hold = absl::Seconds(2);
  // Where timestamps come from (last access, uptime). Null: the wall clock.
  const Clock* clock = nullptr;
  // Tier 3 (may be null): an object store that several hosts share. New
  // prefix blocks (and session blocks with remote_sessions) are written to
  // it behind the Save (write-behind: queued, batched, never on the Save's
  // acknowledgement path); a Load of a block this host does not hold looks
  // there. Must outlive the TierManager.
  RemoteTier* remote = nullptr;
  bool remote_sessions = false;
  // Bound of the write-behind queue; past it the newest blocks are refused
  // (dropped, counted), so queued chain heads still go. Default: 256 MiB.
  uint64_t remote_queue_bytes = 256ull << 20;
  // Write-behind budget: payload bytes per second it may copy out and write
  // (0: no limit), with bursts up to remote_write_burst_bytes.
  uint64_t remote_write_bytes_per_s = 0;
  uint64_t remote_write_burst_bytes = 64ull << 20;
  // Blocks written to tier 3 per batch (all in flight at once). Default: 16.
  int remote_batch_blocks = 16;
};

// One block to store. `meta` must have passed ValidateBlockForSave with a
// payload of `size` bytes.
struct SaveItem {
  const v1::BlockMeta* meta = nullptr;
  uint64_t size = 0;
  bool pin = false;
  // Fetched from tier 3: not written back to it.
  bool from_remote = false;
  // Stored as the block's meta.writer (replacing the client's value).
  std::string writer = std::string();
};

// Where a Save's payloads come from.
class SaveSource {
 public:
  virtual ~SaveSource() = default;
  // HostBytes returns item `i`'s payload when it is addressable host memory
  // (inline bytes, a shared-memory region); the TierManager then copies it
  // itself, hashing its own copy (so a source that changes during the copy
  // cannot make it store bytes that differ from their checksum). Empty when
  // the payload must be fetched with Fetch.
  virtual absl::string_view HostBytes(size_t i) = 0;
  // HostPieces returns item `i`'s payload when it is host memory in several
  // pieces, in order (inline bytes left in the buffers a transport received
  // them in), copied and hashed as HostBytes, chunk by chunk across the
  // copy pool. Empty otherwise (HostBytes or Fetch then serve the item).
  virtual absl::Span<const absl::string_view> HostPieces(size_t /*i*/) { return {}; }
  // Fetch copies the payloads of `items` into `dsts` (dsts[k] receives
  // items[k], exactly its size). Called once per Save with every such item,
  // so that an implementation can batch and coalesce (e.g. device copies).
  // It may also fill checksums[k] (PayloadChecksum of the payload, e.g.
  // computed on the GPU before the copy); the TierManager hashes the copy
  // in tier 1 for every entry left empty.
  virtual absl::Status Fetch(absl::Span<const size_t> /*items*/,
                             absl::Span<uint8_t* const> /*dsts*/,
                             absl::Span<std::optional<uint64_t>> /*checksums*/) {
    return absl::InternalError("this source has no Fetch");
  }
};

// A SaveSource over host byte ranges that outlive the Save.
class HostSaveSource final : public SaveSource {
 public:
  explicit HostSaveSource(std::vector<absl::string_view> payloads)
      : payloads_(std::move(payloads)) {}
  absl::string_view HostBytes(size_t i) override { return payloads_[i]; }

 private:
  std::vector<absl::string_view> payloads_;
};

// Where a Load's payloads go.
class LoadSink {
 public:
  virtual ~LoadSink() = default;
  // Prepare sees every block's metadata (payload_bytes set) before any copy;
  // an error (e.g. a destination too small) aborts the Load.
  virtual absl::Status Prepare(absl::Span<const v1::BlockMeta> metas) = 0;
  // HostDestination returns where block `i` goes in host memory (at least
  // its payload_bytes), or nullptr to receive the bytes through Deliver.
  virtual uint8_t* HostDestination(size_t i) = 0;
  // AfterHostCopy runs once block `i`'s verified bytes are in its host
  // destination (e.g. to re-anchor K in place). An error aborts the Load.
  virtual absl::Status AfterHostCopy(size_t /*i*/, uint8_t* /*dest*/, uint64_t /*n*/) {
    return absl::OkStatus();
  }
  // Deliver hands over the bytes of block `i` and their expected checksum;
  // they stay valid until Finish() returns. They are verified first unless
  // the sink VerifiesDeliveries().
  virtual absl::Status Deliver(size_t /*i*/, const uint8_t* /*bytes*/, uint64_t /*n*/,
                               uint64_t /*checksum*/) {
    return absl::InternalError("this sink has no Deliver");
  }
  // VerifiesDeliveries: the sink checks every delivered block against its
  // checksum where it lands (e.g. on the GPU after the copy), so tier-1
  // bytes are not hashed on the host first; Finish then returns DATA_LOSS
  // when one fails, and the TierManager finds and drops the bad tier-1 copy.
  virtual bool VerifiesDeliveries() const { return false; }
  // Drain completes the deliveries made so far, so that their bytes may be
  // freed when it returns (Load calls it before it stages more than its
  // share of the staging budget). Default: nothing to do (the sink is done
  // with the bytes when Deliver returns).
  virtual absl::Status Drain() { return absl::OkStatus(); }
  // Finish completes every delivery (e.g. waits for device copies).
  virtual absl::Status Finish() { return absl::OkStatus(); }
};

// A LoadSink into std::strings (inline responses, tests).
class StringLoadSink final : public LoadSink {
 public:
  absl::Status Prepare(absl::Span<const v1::BlockMeta> metas) override {
    payloads_.resize(metas.size());
    for (size_t i = 0; i < metas.size(); ++i) payloads_[i].resize(metas[i].payload_bytes());
    return absl::OkStatus();
  }
  uint8_t* HostDestination(size_t i) override {
    return reinterpret_cast<uint8_t*>(payloads_[i].data());
  }
  std::vector<std::string>& payloads() { return payloads_; }

 private:
  std::vector<std::string> payloads_;
};

// TierManager owns the block index (id -> metadata, tier, pins, LRU position)
// and both tiers. Saves land in tier 1; a background spiller thread writes
// least recently used blocks to tier 2 once tier 1 passes its high
// watermark, never moving a pinned block; a Load of a spilled block promotes
// it when room allows; past the spill budget payloads become breadcrumbs.
// Every payload is checksummed (xxHash3-64) at Save and verified on every
// read from either tier: a mismatch is DATA_LOSS, counted, never served, and
// the bad copy is dropped.
//
// Durability: a plain Save is acknowledged in tier 1 (lost on a crash, kept
// by Shutdown); a durable Save and everything spilled is in RocksDB (kept on
// a process crash). Open() rebuilds the index from RocksDB.
//
// Thread-safe. Save may block waiting for room (up to max_wait_for_room);
// Load, Pin, Verify and Flush read or write disk; Lookup, Describe, List and
// Stats never touch disk.
// Every call that names blocks by id takes an optional NamespaceScope: the
// blocks of namespaces outside it are treated exactly as absent ids. A scope
// that does not see every namespace cannot Verify everything (give ids).
class TierManager {
 public:
  // Open rebuilds the index from `spill` (tier 2) and starts the spiller.
  // INVALID_ARGUMENT for bad options.
  static absl::StatusOr<std::unique_ptr<TierManager>> Open(
      const TierManagerOptions& options, std::unique_ptr<PinnedArena> arena,
      std::unique_ptr<Tier> spill);
  // Stops the spiller. Does not flush: call Shutdown() for that.
  virtual ~TierManager() = default;

  // Save stores `items` (unique ids, payloads from `source`) all-or-nothing
  // and returns one result per item. An id already stored with the same
  // checksum is deduplicated; a prefix block with another checksum keeps the
  // first copy (deduplicated); a session block with another checksum is
  // ALREADY_EXISTS. Items with `pin` are pinned for `owner`. Blocks of one
  // Save land in one contiguous range of tier 1 when one is free. With
  // `durable`, returns after the blocks are fsync'd to the spill store.
  // Errors name the item (ErrorItem): RESOURCE_EXHAUSTED (a block larger
  // than tier 1, tier 1 full of pinned blocks, or no room by `deadline` /
  // max_wait_for_room; ErrorLimit says when the tier-1 size is the cause),
  // ALREADY_EXISTS, DATA_LOSS (payload does not match meta.checksum),
  // UNAVAILABLE (durable write failed; the blocks stay in tier 1).
  virtual absl::StatusOr<std::vector<SavedBlock>> Save(absl::Span<const SaveItem> items,
                                                       SaveSource& source, bool durable,
                                                       absl::Time deadline,
                                                       PinOwner owner = 0) = 0;

  // Load hands the payloads of `ids` (unique) to `sink`, each verified
  // against its checksum as it is read (a tier-1 copy or a tier-2 read,
  // never the sink's memory), and returns the metadata of each (with
  // payload_bytes and checksum) in `metas`. All-or-nothing: on error,
  // nothing useful reached the sink. A spilled block is promoted to tier 1
  // when there is room under the high watermark.
  // With a tier 3, blocks this host does not hold (or holds as
  // breadcrumbs) are fetched from it in the namespace of `fingerprint`,
  // verified, stored in tier 1 like a Save, and served (kRemote).
  // Errors (naming the item): NOT_FOUND (absent or breadcrumb),
  // FAILED_PRECONDITION (stored fingerprint differs from `fingerprint`),
  // DATA_LOSS (no copy passed verification), UNAVAILABLE (disk, or a block
  // only tier 3 could have while it is unreachable), or the sink's error.
  virtual absl::Status Load(absl::Span<const BlockId> ids,
                            const v1::LayoutFingerprint& fingerprint, LoadSink& sink,
                            std::vector<v1::BlockMeta>* metas,
                            std::vector<LoadedInfo>* infos,
                            const NamespaceScope* scope = nullptr) = 0;

  // Lookup returns where the longest run of leading `ids` whose bytes are
  // held is. Never fails.
  virtual std::vector<BlockLocation> Lookup(absl::Span<const BlockId> ids,
                                            const NamespaceScope* scope = nullptr) = 0;

  // LookupFleet is Lookup, then (with a tier 3, and `ns` and `trust_group`
  // in scope) the run goes on with the ids tier 3 holds for that namespace
  // and group (kRemote), checked in batches. Blocks for I/O; never fails (a
  // tier 3 that cannot answer ends the run and is counted).
  virtual std::vector<BlockLocation> LookupFleet(absl::Span<const BlockId> ids,
                                                 absl::string_view ns,
                                                 absl::string_view trust_group,
                                                 const NamespaceScope* scope = nullptr) = 0;

  // WaitForRemoteIdle blocks until the write-behind queue is empty and no
  // write is in flight, or `timeout` passes (false). For tests, benchmarks
  // and the demo.
  virtual bool WaitForRemoteIdle(absl::Duration timeout) = 0;

  // Delete removes `ids` (unique) from every tier, all-or-nothing.
  // Errors: NOT_FOUND (then nothing is deleted), UNAVAILABLE (disk).
  virtual absl::Status Delete(absl::Span<const BlockId> ids,
                              const NamespaceScope* scope = nullptr) = 0;

  // DropSession deletes every session block of (ns, session_id) and returns
  // how many. Errors: UNAVAILABLE.
  virtual absl::StatusOr<uint32_t> DropSession(absl::string_view ns,
                                               absl::string_view session_id) = 0;

  // Pin adds one pin of `owner` to each of `ids` (unique), promoting
  // spilled blocks to tier 1 first. All-or-nothing.
  // Errors: NOT_FOUND, RESOURCE_EXHAUSTED, DATA_LOSS, UNAVAILABLE.
  virtual absl::Status Pin(absl::Span<const BlockId> ids, PinOwner owner,
                           absl::Time deadline, const NamespaceScope* scope = nullptr) = 0;

  // Unpin removes one pin of `owner` from each of `ids`. All-or-nothing.
  // Errors: NOT_FOUND, FAILED_PRECONDITION (not pinned by `owner`).
  virtual absl::Status Unpin(absl::Span<const BlockId> ids, PinOwner owner,
                             const NamespaceScope* scope = nullptr) = 0;

  // ReleaseOwner removes every pin `owner` holds (its lease ended) and
  // returns how many. Never fails.
  virtual uint64_t ReleaseOwner(PinOwner owner) = 0;

  // Acquire looks up `ids` and adds one pin of `owner` to each block found,
  // under one lock, promoting nothing: the longest run of leading ids whose
  // bytes are held (`all` false; may be empty), or every id (`all` true;
  // NOT_FOUND naming the first missing one, and nothing pinned). A pinned
  // block in tier 1 is never spilled; one only in tier 2 is never dropped
  // to a breadcrumb (BlockIndex keeps it off the disk LRU). Returns where
  // each pinned block was. Release them with ReleaseOwner(owner).
  virtual absl::StatusOr<std::vector<BlockLocation>> Acquire(
      absl::Span<const BlockId> ids, PinOwner owner, bool all,
      const NamespaceScope* scope = nullptr) = 0;

  // KeepSession keeps the session blocks of (ns, session_id), those stored
  // now and those saved while it lasts, for `keep` (zero or less: no longer
  // kept): neither tier evicts them while anything else can go (then they
  // go too, counted in keep_overrides), tier 1 up to kept_tier1_fraction
  // of its size. A namespace's own quotas are not
  // bent. Returns how many blocks the session has now.
  // Errors: RESOURCE_EXHAUSTED (max_kept_sessions kept already), UNAVAILABLE.
  virtual absl::StatusOr<size_t> KeepSession(absl::string_view ns, absl::string_view session_id,
                                             absl::Duration keep) = 0;

  // Prefetch brings `ids` (unique) into tier 1 ahead of the Loads that will
  // want them: blocks only in tier 2 are read (verified) into tier 1, and
  // with `fingerprint` and a tier 3, blocks this host does not hold are
  // fetched from tier 3 in its namespace; all of them, and those in tier 1
  // already, become the most recently used. Best effort, never all-or-
  // nothing: it waits for room until `deadline`, brings at most
  // low_watermark of tier 1 per call, and reports what it did with each
  // block. A Load that then finds a prefetched block in tier 1 counts as a
  // prefetch hit. Errors: UNAVAILABLE (shut down).
  virtual absl::StatusOr<PrefetchResult> Prefetch(absl::Span<const BlockId> ids,
                                                  const v1::LayoutFingerprint* fingerprint,
                                                  absl::Time deadline,
                                                  const NamespaceScope* scope = nullptr) = 0;

  // SetRetention gives `ids` (unique) retention class `c` for `ttl` (zero or
  // less: until changed; kNormal ends a class): the spiller and the spill
  // budget take kLow blocks before any other, and kHigh blocks last, as
  // kept sessions' (within kept_tier1_fraction of tier 1; counted in
  // keep_overrides when taken). Eviction order is class, then recency. A
  // class ends with its ttl, with another SetRetention, or with the block.
  // All-or-nothing. Errors: NOT_FOUND (naming the item), UNAVAILABLE.
  virtual absl::Status SetRetention(absl::Span<const BlockId> ids, RetentionClass c,
                                    absl::Duration ttl,
                                    const NamespaceScope* scope = nullptr) = 0;

  // Describe returns one block's metadata and state. Errors: NOT_FOUND.
  virtual absl::StatusOr<BlockInfo> Describe(const BlockId& id,
                                             const NamespaceScope* scope = nullptr) = 0;

  // List returns up to `limit` blocks with id > `after` (when given) that
  // pass `filter`, in id order, and whether more may follow. Walks the
  // namespace or session index when the filter names one, and releases the
  // index lock every few thousand entries it visits.
  virtual std::vector<BlockInfo> List(const ListFilter& filter, const BlockId* after,
                                      size_t limit, bool* more) = 0;

  // Stats returns occupancy and counters.
  virtual TierStats Stats() = 0;

  // Usage reports what namespace `ns` holds now.
  virtual NamespaceUsage Usage(absl::string_view ns) = 0;

  // Verify re-reads `ids` (all blocks when empty) from every tier holding
  // them and checks checksums; corrupt copies are dropped and counted.
  virtual absl::StatusOr<VerifyReport> Verify(absl::Span<const BlockId> ids,
                                              const NamespaceScope* scope = nullptr) = 0;

  // Flush writes every tier-1 block without a disk copy to the spill store
  // and fsyncs; with `evict`, unpinned blocks then leave tier 1.
  // Errors: UNAVAILABLE, RESOURCE_EXHAUSTED (disk full).
  virtual absl::StatusOr<FlushResult> Flush(bool evict) = 0;

  // Shutdown stops the spiller, flushes tier 1 to disk (pinned blocks
  // included) so that a restart loses nothing, and closes tier 2 (calls
  // that need it fail UNAVAILABLE from then on; the process may exit
  // without destroying the TierManager). Later calls fail with UNAVAILABLE.
  // Returns the flush's error, if any.
  virtual absl::Status Shutdown() = 0;

  // WaitForSpillerIdle blocks until tier 1 is under its high watermark and the
  // spiller has nothing queued, or `timeout` passes (returns false). For
  // tests and the demo.
  virtual bool WaitForSpillerIdle(absl::Duration timeout) = 0;

  // VisitMetas calls `visit(i, meta)` for each of `ids` (index i) that is in
  // the index (breadcrumbs included), with the index lock held shared for
  // the whole batch: `visit` must be quick and must not call the
  // TierManager. Read-only, never touches disk. The daemon's RecoveryIndex
  // reads the summaries' exact values through it, instead of keeping a copy.
  virtual void VisitMetas(absl::Span<const BlockId> ids,
                          absl::FunctionRef<void(size_t, const v1::BlockMeta&)> visit) = 0;
};

}  // namespace evoke

#endif  // EVOKE_STORAGE_TIER_MANAGER_H_
