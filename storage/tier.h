// Tier: a store that holds copies of blocks by id, below the host tier.
#ifndef EVOKE_STORAGE_TIER_H_
#define EVOKE_STORAGE_TIER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/hash128.h"
#include "storage/tier_types.h"

namespace evoke {

namespace storage {
class SpillRecord;
}  // namespace storage

// Where a tier sits in the walk: the engine looks for bytes in the host tier
// first, then in each lower tier in this order.
enum class TierLevel : uint8_t {
  kHost = 1,    // Tier 1: the pinned arena (HostTier), bytes addressable.
  kDisk = 2,    // Tier 2: RocksDB on local disk (SpillStore).
  kRemote = 3,  // Tier 3: an object store shared by several hosts.
};

// One block to write: its record (payload_present is set by the tier) and
// its payload, or no payload for a metadata-only record (a breadcrumb).
struct TierWrite {
  BlockId id;
  const storage::SpillRecord* record = nullptr;
  absl::string_view payload;  // Empty: write a breadcrumb record.
  // The engine knows the tier holds no record of this id (it never wrote
  // one, or deleted it): the tier may skip looking for an earlier copy to
  // count as garbage. A wrong `true` costs space accounting, never data.
  bool fresh = false;
};

// Visits one record of a tier's scan (Tier::ForEachRecord).
using RecordVisitor =
    std::function<absl::Status(const BlockId& id, storage::SpillRecord& record)>;

// Tier is what the TierManager needs from a store below tier 1: write-back
// (Put), lookup and read (Read), drop (DropPayloads, Delete), and a scan of
// its records to rebuild the index at start (ForEachRecord).
//
// The contract is written for a remote object store as much as for the
// local disk:
//   - every call may fail: UNAVAILABLE means the tier is down or slow (the
//     engine keeps the block where it is, counts, logs and retries later);
//     RESOURCE_EXHAUSTED means full; DATA_LOSS means a stored copy is bad;
//     NOT_FOUND means absent. Nothing else is expected;
//   - a write of several blocks is atomic per block (a crash or an outage
//     leaves each block fully old or fully new), not across blocks;
//   - Read never verifies checksums: the engine hashes its own copy, so a
//     tier cannot hand out bytes that differ from their checksum;
//   - calls are thread-safe and may block for I/O; the engine never calls a
//     tier with its index lock held once it serves calls (only the start-up
//     ForEachRecord runs under it), so a slow tier slows only the callers
//     that need it (the spiller, a Load that misses tier 1).
class Tier {
 public:
  virtual ~Tier() = default;

  // For logs and errors, e.g. "spill store".
  virtual absl::string_view name() const = 0;
  virtual TierLevel level() const = 0;

  // Put writes records and payloads of several blocks in one batch. With
  // `sync`, returns after they are durable.
  virtual absl::Status Put(absl::Span<const TierWrite> writes, bool sync) = 0;

  // DropPayloads deletes the payloads of the blocks in `breadcrumbs` and
  // rewrites their records (given, payload_present false) in one batch.
  virtual absl::Status DropPayloads(absl::Span<const TierWrite> breadcrumbs) = 0;

  // Delete removes records and payloads of `ids`. Absent ids are not an
  // error.
  virtual absl::Status Delete(absl::Span<const BlockId> ids) = 0;

  // Read reads a block's record and payload from one consistent snapshot and
  // hands the payload to `consume` (valid only during the call). NOT_FOUND
  // when the block or its payload is absent. The checksum is NOT verified
  // here; the caller verifies its own copy.
  virtual absl::Status Read(
      const BlockId& id,
      const std::function<absl::Status(const storage::SpillRecord& record,
                                       absl::string_view payload)>& consume) = 0;

  // ForEachRecord calls `visit` for every stored record in id order, on the
  // calling thread; `visit` may take what it keeps out of `record` (moving
  // it is cheaper than a copy). A record that cannot be parsed is reported
  // in `skipped` and passed over; the first visit error stops the scan and
  // is returned.
  virtual absl::Status ForEachRecord(const RecordVisitor& visit,
                                     std::vector<std::string>* skipped) = 0;

  // UsedBytes returns the bytes the tier occupies (approximate).
  virtual uint64_t UsedBytes() = 0;

  // Health reports degraded modes (full disk, stopped writes) and what the
  // last open recovered. Default: healthy, nothing to report.
  virtual TierHealth Health() const { return TierHealth(); }

  // Persist makes everything written so far durable and compact. Blocks.
  virtual absl::Status Persist() = 0;

  // Sync makes everything written so far durable, and no more (a store may
  // leave compacting it to its next open). Blocks. Default: Persist.
  virtual absl::Status Sync() { return Persist(); }

  // Close makes the tier durable and releases its files (the process is
  // about to exit); every later call fails UNAVAILABLE. Destroying a tier
  // closes it too. Default: nothing to release.
  virtual absl::Status Close() { return absl::OkStatus(); }
};

}  // namespace evoke

#endif  // EVOKE_STORAGE_TIER_H_
