// The storage engine's vocabulary: what it returns (plain structs, not wire
// messages) and how its errors name the item and the limit they are about.
// The daemon maps these to evoke.v1 messages, wire field paths and flags.
#ifndef EVOKE_STORAGE_TIER_TYPES_H_
#define EVOKE_STORAGE_TIER_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/hash128.h"
#include "evoke/v1/block.pb.h"

namespace evoke {

// Who holds a pin (a lease). Pins are counted per owner.
using PinOwner = uint64_t;

// Where a block's bytes are, seen from outside: the fastest copy.
enum class BlockLocation : uint8_t {
  kHost = 1,        // Tier 1 (maybe with a tier-2 copy too).
  kDisk = 2,        // Tier 2 only.
  kBreadcrumb = 3,  // No bytes: metadata only.
  kRemote = 4,      // Only in tier 3, the object store shared by several hosts.
};

// NamespaceScope: the namespaces one caller may see. Storage treats the
// blocks of every other namespace exactly as ids it does not hold (the same
// NOT_FOUND, the same message, the same Lookup answer), so a caller cannot
// tell another tenant's block from an absent one. A null scope sees all.
class NamespaceScope {
 public:
  virtual ~NamespaceScope() = default;
  virtual bool SeesAll() const = 0;
  virtual bool Sees(absl::string_view ns) const = 0;
  // SeesBlock: whether a block with fingerprint `fp` is visible: its
  // namespace and, where the scope keeps trust groups, its trust group.
  virtual bool SeesBlock(const v1::LayoutFingerprint& fp) const {
    return SeesAll() || Sees(fp.namespace_());
  }
  // SeesEveryBlock: every namespace and every trust group (an admin).
  virtual bool SeesEveryBlock() const { return SeesAll(); }
  // SeesTokensOf: whether a block's tokens (its prompt) are shown to this
  // caller; reads clear them otherwise (n_tokens stays).
  virtual bool SeesTokensOf(const v1::BlockMeta& meta) const {
    (void)meta;
    return true;
  }
};

// TierHealth: a lower tier's degraded modes and start-up recovery.
// What a salvage (rebuilding lost metadata from the payload segments)
// found, by kind.
struct SalvageCounts {
  bool ran = false;
  uint64_t restored = 0;        // Records rebuilt from their identity records.
  uint64_t removed = 0;         // Records tombstones removed (deleted, dropped).
  uint64_t damaged = 0;         // Payloads that did not match their checksum.
  uint64_t unidentified = 0;    // Payloads without an identity record (older files).
  uint64_t unreadable_segments = 0;  // Segments whose records could not be walked.
  // Blocks lost for good: damaged + unidentified (+ what unreadable
  // segments held, not countable).
  uint64_t lost() const { return damaged + unidentified; }
};

struct TierHealth {
  // Writes are accepted. False while degraded: opened read-only on a full
  // disk, or stopped by a failed write until space (or the device) returns.
  bool writable = true;
  std::string reason;                // Why not writable.
  bool opened_read_only = false;     // The last open was read-only.
  uint64_t write_failures = 0;       // Writes or flushes RocksDB failed.
  uint64_t refused_writes = 0;       // Writes refused for lack of free space.
  uint64_t resumes = 0;              // Times writes resumed after a stop.
  absl::Duration last_outage;        // Length of the last stop.
  uint64_t corrupt_files = 0;        // SST files found corrupt (start, compaction).
  uint64_t unreadable_records = 0;   // Records the start-up scan could not read.
  // The last open found nothing readable and started empty (files moved to
  // a quarantine directory).
  bool quarantined = false;
  uint64_t quarantined_segments = 0;  // Segment files moved aside at open.
  SalvageCounts salvage;             // The last open's salvage, if one ran.
  // Payload segment files (spill format 2).
  uint64_t segments = 0;             // Segment files.
  uint64_t segment_file_bytes = 0;   // Their preallocated bytes.
  uint64_t segment_live_bytes = 0;   // Bytes of records that metadata points at.
  uint64_t segment_syncs = 0;        // fdatasync calls (one per appended batch).
  uint64_t segment_bytes_written = 0;  // Since open, everything pwrite'd.
  uint64_t segment_payload_bytes = 0;  // The payload bytes among them.
  uint64_t compacted_records = 0;    // Records compaction moved.
  uint64_t removed_segments = 0;     // Segments removed (no live record left).
  bool direct_io = false;            // Segments use O_DIRECT.
  // The recovery steps Open took, in order, with what each cost (empty for
  // a clean open).
  std::vector<std::string> recovery;
};

// A namespace's quotas (0: none); Saves past them are RESOURCE_EXHAUSTED.
struct NamespaceQuota {
  uint64_t tier1_bytes = 0;     // Payload bytes resident in tier 1.
  uint64_t tier2_bytes = 0;     // Payload bytes in tier 2.
  uint64_t metadata_bytes = 0;  // Accounted metadata bytes (see MetadataBytes).
};

// What one namespace holds now.
struct NamespaceUsage {
  uint64_t blocks = 0;  // Visible blocks, breadcrumbs included.
  uint64_t tier1_bytes = 0;
  uint64_t tier2_bytes = 0;
  uint64_t metadata_bytes = 0;
};

// MetadataBytes is what one block's metadata is charged in memory: its
// serialized size plus the index's per-entry overhead. Summaries, tokens and
// positions dominate for real blocks.
uint64_t MetadataBytes(const v1::BlockMeta& meta);

struct ListFilter {
  std::string ns;          // Empty: any.
  std::string session_id;  // Empty: any.
  std::optional<BlockLocation> location;  // Empty: any.
  const NamespaceScope* scope = nullptr;  // Only blocks it sees; null: any.
};

// One block as Describe and List show it.
struct BlockInfo {
  v1::BlockMeta meta;
  BlockLocation location = BlockLocation::kBreadcrumb;
  bool bytes_available = false;
  bool on_disk = false;  // Has a tier-2 payload (also when in tier 1).
  uint32_t pin_count = 0;
  int64_t last_access_unix_ms = 0;
};

// One result of Save, per item.
struct SavedBlock {
  BlockId id;
  uint64_t checksum = 0;
  bool deduplicated = false;
  BlockLocation location = BlockLocation::kHost;
};

// Where Load found a block.
struct LoadedInfo {
  BlockLocation served_from = BlockLocation::kHost;
};

struct TierOccupancy {
  uint64_t blocks = 0;
  uint64_t payload_bytes = 0;  // Sum of payload sizes.
  uint64_t used_bytes = 0;     // What the tier occupies (extents, files).
  uint64_t capacity_bytes = 0;
};

struct StorageCounters {
  uint64_t saves = 0, dedups = 0, loads = 0, hits_tier1 = 0, hits_tier2 = 0,
           misses = 0, spills = 0, spilled_bytes = 0, evictions = 0,
           promotions = 0, breadcrumbs = 0, checksum_failures = 0, deletes = 0,
           spill_errors = 0, invalid_records = 0,
           keep_overrides = 0;  // Kept sessions' blocks evicted: nothing else could go.
  // Prefetch: blocks it brought into tier 1 (from tier 2 or 3), those a Load
  // then found there (the first Load of each), and those that left tier 1
  // before any Load.
  uint64_t prefetched = 0, prefetch_hits = 0, prefetch_unused = 0;
};

// A block's retention class (SetRetention): the spiller and the spill
// budget take kLow blocks first and kHigh blocks last (as kept sessions',
// within kept_tier1_fraction of tier 1), each until its class ends.
enum class RetentionClass : uint8_t { kLow = 0, kNormal = 1, kHigh = 2 };

// What one Prefetch did with the blocks it was given.
struct PrefetchResult {
  uint32_t in_tier1 = 0;  // There already (now the most recently used).
  uint32_t promoted = 0;  // Read from tier 2 into tier 1.
  uint32_t fetched = 0;   // Fetched from tier 3 into tier 1.
  uint32_t missing = 0;   // Held by no tier (or only as a breadcrumb).
  uint32_t no_room = 0;   // Not brought: tier 1 had no room for it.
  uint32_t failed = 0;    // A read failed (checksum, disk, tier 3); nothing served.
};

// What Stat shows of the remote tier. The write-behind queue's fields are
// filled by the engine.
struct RemoteStats {
  bool connected = false;
  std::string state;  // "closed", "open", "half-open" or "disconnected".
  std::string last_error;
  std::string store;  // e.g. "rados pool evoke".
  uint64_t objects_written = 0;
  uint64_t bytes_written = 0;
  uint64_t dedups = 0;  // Exclusive writes that found the object (another host wrote it).
  uint64_t fetches = 0;
  uint64_t fetched_bytes = 0;
  uint64_t misses = 0;
  uint64_t checksum_failures = 0;  // Objects refused: bad checksum or record.
  uint64_t refused_records = 0;    // Records outside this host's limits (kept).
  uint64_t errors = 0;             // Failed operations (timeouts included).
  uint64_t timeouts = 0;
  uint64_t breaker_opens = 0;
  uint64_t probes = 0;       // Ids probed by fleet-wide lookups.
  uint64_t unavailable = 0;  // Calls refused because the tier was down.
  uint64_t pool_used_bytes = 0;
  uint64_t pool_objects = 0;
  uint64_t expired_objects = 0;  // Removed by the expiry sweep.
  // Write-behind (the engine's uploader).
  uint64_t queue_blocks = 0;
  uint64_t queue_bytes = 0;
  uint64_t dropped_blocks = 0;
  uint64_t inflight = 0;
  // Remote copies of deleted session blocks waiting to be removed, and
  // those given up (queue full, or the store refused).
  uint64_t removals_queued = 0;
  uint64_t removals_dropped = 0;
  // Times a write-behind batch waited for its budget (--remote-write-bytes-per-s).
  uint64_t paced = 0;
};

struct TierStats {
  TierOccupancy host;  // Tier 1.
  TierOccupancy disk;  // Tier 2 (capacity: the spill budget).
  uint64_t breadcrumb_blocks = 0;
  uint64_t pinned_blocks = 0;
  uint64_t pins = 0;  // Sum of pin counts over every owner.
  uint64_t kept_sessions = 0;  // KeepSession hints in force.
  // Blocks whose retention class (SetRetention) is in force now.
  uint64_t low_blocks = 0, high_blocks = 0;
  StorageCounters counters;
  bool host_locked = false;  // mlock of tier 1 succeeded.
  std::string host_lock_error;
  uint64_t host_prefaulted_bytes = 0;  // Faulted in ahead of use.
  std::string host_prefault_error;
  uint64_t host_largest_free_bytes = 0;
  double high_watermark = 0;
  double low_watermark = 0;
  absl::Duration uptime;
  TierHealth disk_health;
  uint64_t metadata_bytes = 0;         // Accounted, every namespace.
  uint64_t metadata_budget_bytes = 0;  // 0: none.
  // The namespaces that hold blocks (at most 4096 of them, in no
  // particular order), with their usage.
  std::vector<std::pair<std::string, NamespaceUsage>> namespaces;
  // Tier 3, when configured.
  std::optional<RemoteStats> remote;
};

struct FlushResult {
  uint64_t blocks_written = 0;
  uint64_t bytes_written = 0;
  uint64_t blocks_evicted = 0;
};

struct CorruptCopy {
  BlockId id;
  BlockLocation tier = BlockLocation::kHost;  // kHost or kDisk.
  std::string detail;
};

struct VerifyReport {
  uint64_t blocks_checked = 0;
  uint64_t copies_checked = 0;
  uint64_t copies_ok = 0;
  uint64_t missing = 0;
  std::vector<CorruptCopy> corrupt;
};

// --- errors ---------------------------------------------------------------
// An error about one item of a batch carries the item's index and which part
// of it is wrong, as a status payload; its message names the block, not the
// request field. The daemon turns (item, part) into a wire path such as
// "blocks[3].meta.checksum" or "ids[3]".
enum class ItemPart : uint8_t {
  kBlock = 0,        // The item as a whole.
  kId = 1,           // Its id.
  kChecksum = 2,     // Its checksum.
  kFingerprint = 3,  // The layout fingerprint it was asked with.
};

struct ItemRef {
  size_t index = 0;
  ItemPart part = ItemPart::kBlock;
};

absl::Status ItemError(absl::StatusCode code, size_t index, ItemPart part,
                       absl::string_view message);
// WithItem attaches (index, part) to an existing error (keeps its code and
// message). OK stays OK.
absl::Status WithItem(absl::Status status, size_t index, ItemPart part);
std::optional<ItemRef> ErrorItem(const absl::Status& status);

// A configured limit an error ran into, so that the daemon can name the
// setting that raises it.
enum class StorageLimit : uint8_t {
  kTier1Capacity = 1,  // The pinned arena's size.
};
absl::Status WithLimit(absl::Status status, StorageLimit limit);
std::optional<StorageLimit> ErrorLimit(const absl::Status& status);

}  // namespace evoke

#endif  // EVOKE_STORAGE_TIER_TYPES_H_
