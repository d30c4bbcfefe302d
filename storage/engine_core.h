// EngineCore: the state the TierManager and its Spiller share. Internal to
// storage/.
#ifndef EVOKE_STORAGE_ENGINE_CORE_H_
#define EVOKE_STORAGE_ENGINE_CORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/copy_pool.h"
#include "storage/block_index.h"
#include "storage/host_tier.h"
#include "storage/quota_ledger.h"
#include "storage/spill_record.pb.h"
#include "storage/staging_budget.h"
#include "storage/tier.h"
#include "storage/tier_manager.h"

namespace evoke {

// "block <hex id>", as errors and logs name a block.
inline std::string BlockName(const BlockId& id) { return absl::StrCat("block ", id.ToHex()); }

// Locks: disk_mu before mu. `mu` guards the index and the counters and is
// never held across I/O or a payload copy. `disk_mu` serializes every
// mutation of tier 2 (write-back, the spill budget, deletes); while it is
// held no entry leaves the index, so write-back can read tier-1 bytes
// without `mu`.
struct EngineCore {
  EngineCore(const TierManagerOptions& options, std::unique_ptr<PinnedArena> arena,
             std::unique_ptr<Tier> disk);

  int64_t NowMs() const { return absl::ToUnixMillis(clock->Now()); }
  // RecordOf is the tier-2 record of an entry (payload_present is set by
  // the tier).
  static storage::SpillRecord RecordOf(const IndexEntry& e);
  // LogTierError logs a failed tier-2 write at most once every 10 s (a full
  // disk fails every round).
  void LogTierError(const absl::Status& s);

  // ReadFromDisk reads a block from tier 2 and copies it to `dest`, hashing
  // the tier's private copy (never `dest`, which a client may share), and
  // with `promote` also there. DATA_LOSS when the checksum fails, NOT_FOUND
  // when absent or replaced by another version meanwhile.
  absl::Status ReadFromDisk(const BlockId& id, uint64_t checksum, uint64_t payload_bytes,
                            uint8_t* dest, uint8_t* promote = nullptr);
  // QuarantineDisk drops a tier-2 copy that failed verification (the block
  // becomes a breadcrumb, or keeps only its tier-1 copy).
  void QuarantineDisk(const BlockId& id, uint64_t gen) ABSL_EXCLUSIVE_LOCKS_REQUIRED(disk_mu);
  // CommitPromotion makes `ram` (filled from tier 2) the block's tier-1
  // copy, unless the block changed meanwhile (then `ram` is freed). With
  // `hold`, returns the entry with a reader held (else nullptr); when
  // another Load promoted the same generation first, that entry (its
  // tier-1 copy holds the same bytes), and `ram` is freed.
  IndexEntry* CommitPromotion(const BlockId& id, uint64_t gen, ArenaReservation ram,
                              bool hold);

  // Stats reads occupancy and counters (tier 2's size outside `mu`).
  TierStats Stats();

  const TierManagerOptions options;
  const Clock* const clock;
  absl::Mutex disk_mu ABSL_ACQUIRED_BEFORE(mu);
  mutable absl::Mutex mu;
  absl::CondVar room_cv;    // Tier-1 bytes were freed or became evictable.
  absl::CondVar writes_cv;  // An in-flight save finished.
  HostTier host;            // Tells room_cv whenever bytes return.
  const std::unique_ptr<Tier> disk;
  CopyPool copier;
  StagingBudget staging;    // Heap buffers of Loads outside tier 1.
  const uint64_t high_bytes;  // Tier 1 spills past this...
  const uint64_t low_bytes;   // ...down to this.
  const absl::Time start;
  std::atomic<int64_t> last_tier_error_log_s{0};

  BlockIndex index ABSL_GUARDED_BY(mu);
  // Records that failed validation at start, with the reason: on disk, not
  // in the index, never served.
  absl::flat_hash_map<BlockId, std::string> invalid_records ABSL_GUARDED_BY(mu);
  StorageCounters counters ABSL_GUARDED_BY(mu);
  // What Saves between their quota check and their commit have reserved.
  QuotaLedger quotas ABSL_GUARDED_BY(mu);
};

}  // namespace evoke

#endif  // EVOKE_STORAGE_ENGINE_CORE_H_
