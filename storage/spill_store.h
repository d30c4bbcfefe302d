// SpillStore: tier 2, RocksDB in data_dir.
#ifndef EVOKE_STORAGE_SPILL_STORE_H_
#define EVOKE_STORAGE_SPILL_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/hash128.h"

namespace evoke {

namespace storage {
class SpillRecord;
}  // namespace storage

struct SpillStoreOptions {
  // Directory of the RocksDB database; created when missing.
  std::string path;
  // fsync the WAL on every write batch. When false, a process crash loses
  // nothing that was written, a machine crash may lose the last writes.
  // Writes that ask for durability (WriteOptions.sync) always fsync.
  // Default: false.
  bool sync = false;
  // Payloads of at least this many bytes go to blob files (key-value
  // separation), so compaction does not rewrite them. Default: 4 KiB.
  uint64_t min_blob_bytes = 4096;
  // Blob file size. Default: 256 MiB.
  uint64_t blob_file_bytes = 256ull << 20;
  // Block cache for metadata and small payloads. Default: 32 MiB.
  uint64_t block_cache_bytes = 32ull << 20;
};

// One block to write: its record (with payload_present set by the store)
// and its payload, or no payload for a metadata-only record.
struct SpillWrite {
  BlockId id;
  const storage::SpillRecord* record = nullptr;
  absl::string_view payload;  // Empty: write a breadcrumb record.
};

// SpillStore keeps block records in a "meta" column family and payloads in a
// "payload" column family with blob files. Every mutation is one atomic
// WriteBatch: a crash leaves each block either fully old or fully new.
// RocksDB errors are translated here, once: NotFound -> NOT_FOUND,
// Corruption -> DATA_LOSS, out of space -> RESOURCE_EXHAUSTED, other I/O
// errors -> UNAVAILABLE.
//
// Thread-safe. Reads never block writes.
class SpillStore {
 public:
  // Open opens or creates the database. FAILED_PRECONDITION when the
  // directory holds a store of another format version, UNAVAILABLE when it
  // cannot be opened (e.g. locked by another evoked).
  static absl::StatusOr<std::unique_ptr<SpillStore>> Open(
      const SpillStoreOptions& options);
  virtual ~SpillStore() = default;

  // Put writes records and payloads of several blocks in one batch. With
  // `sync`, returns after fsync.
  virtual absl::Status Put(absl::Span<const SpillWrite> writes, bool sync) = 0;

  // DropPayloads deletes the payloads of `ids` and rewrites their records
  // (given in `breadcrumbs`, payload_present false) in one batch.
  virtual absl::Status DropPayloads(absl::Span<const SpillWrite> breadcrumbs) = 0;

  // Delete removes records and payloads of `ids` in one batch. Absent ids are
  // not an error.
  virtual absl::Status Delete(absl::Span<const BlockId> ids) = 0;

  // Read reads a block's record and payload from one consistent snapshot and
  // hands the payload to `consume` (valid only during the call). NOT_FOUND
  // when the block or its payload is absent. The checksum is NOT verified
  // here; the caller verifies its own copy.
  virtual absl::Status Read(
      const BlockId& id,
      const std::function<absl::Status(const storage::SpillRecord& record,
                                       absl::string_view payload)>& consume) = 0;

  // ForEachRecord calls `visit` for every stored record in id order. A
  // record that cannot be parsed is reported as DATA_LOSS and skipped; the
  // first visit error stops the scan and is returned.
  virtual absl::Status ForEachRecord(
      const std::function<absl::Status(const BlockId& id,
                                       storage::SpillRecord record)>& visit,
      std::vector<std::string>* skipped) = 0;

  // ApproximateDiskBytes returns the database's size on disk (SST, blob and
  // WAL files).
  virtual uint64_t ApproximateDiskBytes() = 0;

  // Persist makes everything written so far durable and compact: fsyncs the
  // WAL and flushes memtables into SST and blob files (so that a restart
  // replays no WAL). Blocks while flushing.
  virtual absl::Status Persist() = 0;
};

}  // namespace evoke

#endif  // EVOKE_STORAGE_SPILL_STORE_H_
