// SpillStore: tier 2, records in RocksDB and payloads in segment files in
// data_dir.
#ifndef EVOKE_STORAGE_TIER2_SPILL_STORE_H_
#define EVOKE_STORAGE_TIER2_SPILL_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/hash128.h"
#include "storage/tier.h"

namespace evoke {

class DiskFaults;  // storage/tier2/fault_env.h

struct SpillStoreOptions {
  // Directory of the RocksDB database; created when missing.
  std::string path;
  // fsync the WAL on every write batch. When false, a process crash loses
  // nothing that was written, a machine crash may lose the last writes.
  // Writes that ask for durability (WriteOptions.sync) always fsync.
  // Default: false.
  bool sync = false;
  // Size of a payload segment file (preallocated; a multiple of 1 MiB, at
  // least 4 MiB). Default: 256 MiB.
  uint64_t segment_bytes = 256ull << 20;
  // Write and read segments with O_DIRECT where the filesystem allows it
  // (it falls back to buffered I/O with fdatasync where not, e.g. tmpfs).
  bool direct_io = true;
  // Payloads of at least this many bytes went to blob files in format 1
  // (read only while a format-1 dir is migrated). Default: 4 KiB.
  uint64_t min_blob_bytes = 4096;
  // Blob file size of format 1. Default: 256 MiB.
  uint64_t blob_file_bytes = 256ull << 20;
  // Block cache for metadata. Default: 32 MiB.
  uint64_t block_cache_bytes = 32ull << 20;
  // Free bytes kept on the data dir's filesystem: a write that adds payload
  // bytes is refused (RESOURCE_EXHAUSTED, nothing written) when fewer would
  // remain, so that RocksDB keeps room for its flushes, compactions and
  // MANIFEST and rarely meets ENOSPC itself. 0: 5% of the filesystem, at
  // most 256 MiB.
  uint64_t reserve_bytes = 0;
  // While writes are stopped (started on a full disk, or a write failed)
  // the store tries to resume them this often. Default: 1 s.
  absl::Duration retry_interval = absl::Seconds(1);
  // Tests: make the store's file writes fail on demand.
  std::shared_ptr<DiskFaults> faults;
};

// What the store went through: degraded modes and what start-up recovery
// had to do. For Stat, logs and tests.
using SpillStoreHealth = TierHealth;

using SpillWrite = TierWrite;

// SpillStore keeps block records in RocksDB (a "meta" column family) and
// payloads in append-only segment files under <path>/segments
// (storage/tier2/segment_log.h): a Put appends the payloads (one pwrite stream,
// one fdatasync), then commits the records, each naming its payload's
// location, in one atomic WriteBatch. A crash leaves each block fully old or
// fully new, and a record never names bytes that were not synced; payload
// bytes are written once and never hashed by the store (the engine verifies
// the block checksum of every copy it reads). Segment compaction, on the
// maintenance thread, removes segments without live records and moves the
// live records out of the one where most space is garbage (at least half).
// Open drops a torn tail of the segment files and turns every record whose
// payload is not in a valid segment into a breadcrumb (counted in
// unreadable_records, noted in Health().recovery).
//
// A format-1 dir (payloads in a "payload" column family with blob files) is
// migrated at open: its payloads move into segments in batches, each
// committed with sync, so a crash resumes where it stopped. Without free
// space for them they stay where they are, readable, and move at a later
// start (noted in Health().recovery). An evoked older than format 2 refuses
// a migrated dir (its format key says 2).
//
// RocksDB errors are translated here, once: NotFound -> NOT_FOUND,
// Corruption -> DATA_LOSS, out of space -> RESOURCE_EXHAUSTED, other I/O
// errors -> UNAVAILABLE.
//
// A full disk: writes that add bytes are refused before they reach RocksDB
// or a segment when fewer than reserve_bytes would stay free; a segment
// append that fails (ENOSPC at fallocate or pwrite, EIO at fdatasync) fails
// its Put with nothing committed, and the next Put starts a new segment.
// When a RocksDB write fails anyway
// (RocksDB stops writes after a failed WAL or flush write), every later
// write is refused at once (RESOURCE_EXHAUSTED for no space, else
// UNAVAILABLE) and the WAL is never synced again (RocksDB asserts on a WAL
// that failed an append), until a background thread, every
// retry_interval, finds the space back and DB::Resume() succeeds. Open on a
// disk too full to recover the WAL opens read-only (reads keep working) and
// the same thread reopens read-write once space returns.
//
// Corrupt files: Open tries, in order, a normal open, one that skips
// corrupt WAL records (kSkipAnyCorruptedRecords), best-efforts recovery
// (an older MANIFEST version, WAL not replayed), and last moving every file
// into <path>/quarantine-<time>/ and starting empty; each step is logged and
// listed in Health().recovery. A compaction that meets a corrupt SST does not
// stop writes (the error is suppressed, counted, and automatic compaction
// turned off for this run). The start-up scan reads around corrupt blocks.
//
// Thread-safe. Reads never block writes.
class SpillStore : public Tier {
 public:
  // Open opens or creates the database. FAILED_PRECONDITION when the
  // directory holds a store of another format version, UNAVAILABLE when it
  // cannot be opened (e.g. locked by another evoked).
  static absl::StatusOr<std::unique_ptr<SpillStore>> Open(
      const SpillStoreOptions& options);

  absl::string_view name() const override { return "spill store"; }
  TierLevel level() const override { return TierLevel::kDisk; }

  // Health reports degraded modes and start-up recovery (a wrapper that
  // does not forward it reports a healthy store).
  TierHealth Health() const override { return TierHealth(); }
};

}  // namespace evoke

#endif  // EVOKE_STORAGE_TIER2_SPILL_STORE_H_
