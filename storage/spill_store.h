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
#include "storage/tier.h"

namespace evoke {

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

using SpillWrite = TierWrite;

// SpillStore keeps block records in a "meta" column family and payloads in a
// "payload" column family with blob files. Every mutation is one atomic
// WriteBatch: a crash leaves each block either fully old or fully new.
// RocksDB errors are translated here, once: NotFound -> NOT_FOUND,
// Corruption -> DATA_LOSS, out of space -> RESOURCE_EXHAUSTED, other I/O
// errors -> UNAVAILABLE.
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
};

}  // namespace evoke

#endif  // EVOKE_STORAGE_SPILL_STORE_H_
