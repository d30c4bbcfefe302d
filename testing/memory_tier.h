// MemoryTier: an in-memory evoke::Tier (storage/tier.h) for tests, with
// fault injection: failing calls, torn writes, corrupt payloads and records,
// a byte capacity, slow calls, and counters of every call.
//
//   evoke::testing::MemoryTier disk;                   // keep this one to steer
//   auto tm = TierManager::Open(options, std::move(arena), disk.Share());
//   disk.FailNext(evoke::testing::TierOp::kPut, 3,
//                 absl::ResourceExhaustedError("injected: no space"));
//   ...
//   EXPECT_EQ(disk.counters().calls_of(TierOp::kPut), 5u);
//
// Semantics follow the Tier contract as SpillStore implements it: Put and
// DropPayloads set payload_present from whether the payload is empty; Read
// hands one consistent copy of the record and payload to `consume` and is
// NOT_FOUND when the block or its payload is absent; ForEachRecord visits in
// id order and reports unparseable records in `skipped`. Records are kept
// serialized, as a store keeps them, so a corrupt record fails to parse.
#ifndef EVOKE_TESTING_MEMORY_TIER_H_
#define EVOKE_TESTING_MEMORY_TIER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/hash128.h"
#include "storage/spill_record.pb.h"
#include "storage/tier.h"

namespace evoke::testing {

// The calls of the Tier interface that can be made to fail or slowed.
enum class TierOp : int {
  kPut = 0,
  kDropPayloads,
  kDelete,
  kRead,
  kForEachRecord,
  kPersist,
};
inline constexpr int kTierOpCount = 6;
absl::string_view TierOpName(TierOp op);

struct MemoryTierOptions {
  std::string name = "memory tier";
  TierLevel level = TierLevel::kDisk;
  // Bytes the tier holds (payloads plus serialized records); a Put that
  // would pass it fails with RESOURCE_EXHAUSTED and writes nothing.
  // Default: unlimited.
  uint64_t capacity_bytes = std::numeric_limits<uint64_t>::max();
};

// Thread-safe. Every MemoryTier made by Share() sees the same blocks, faults
// and counters.
class MemoryTier final : public Tier {
 public:
  explicit MemoryTier(MemoryTierOptions options = {});
  ~MemoryTier() override;

  // Share returns another MemoryTier over the same store: hand it to a
  // TierManager and keep this one to inject faults and look inside, or to
  // open a second TierManager over the blocks a first one left behind.
  std::unique_ptr<MemoryTier> Share() const;

  // ---------------------------------------------------------------- Tier
  absl::string_view name() const override;
  TierLevel level() const override;
  absl::Status Put(absl::Span<const TierWrite> writes, bool sync) override;
  absl::Status DropPayloads(absl::Span<const TierWrite> breadcrumbs) override;
  absl::Status Delete(absl::Span<const BlockId> ids) override;
  absl::Status Read(
      const BlockId& id,
      const std::function<absl::Status(const storage::SpillRecord& record,
                                       absl::string_view payload)>& consume) override;
  absl::Status ForEachRecord(const RecordVisitor& visit,
                             std::vector<std::string>* skipped) override;
  uint64_t UsedBytes() override;
  absl::Status Persist() override;

  // ------------------------------------------------------------- Faults
  // FailNext makes the next `n` calls of `op` fail with `status` (not OK)
  // without touching the store; a later FailNext or FailAlways for the same
  // op replaces it.
  void FailNext(TierOp op, int n, absl::Status status);
  // FailAlways makes every call of `op` fail with `status` until ClearFaults.
  void FailAlways(TierOp op, absl::Status status);
  // TearNextPut makes the next Put apply only its first `applied` writes
  // (each whole: the contract is atomic per block) and then fail with
  // `status`. Checked after FailNext/FailAlways (a failing Put writes
  // nothing).
  void TearNextPut(size_t applied,
                   absl::Status status = absl::UnavailableError("injected: torn write"));
  // SetDelay makes every call of `op` sleep `delay` first (a slow store).
  void SetDelay(TierOp op, absl::Duration delay);
  // ClearFaults removes every injected failure, torn write and delay.
  void ClearFaults();
  // SetCapacity changes capacity_bytes (it applies to later Puts).
  void SetCapacity(uint64_t bytes);

  // CorruptPayload flips bit `bit` (0..7) of byte `offset` of the stored
  // payload of `id`, as a failing disk would; the record, and its checksum,
  // stay. NOT_FOUND when the block has no payload, OUT_OF_RANGE when
  // `offset` is past it.
  absl::Status CorruptPayload(const BlockId& id, uint64_t offset = 0, int bit = 0);
  // CorruptRecord overwrites the stored record of `id` with bytes that do
  // not parse: ForEachRecord then skips it and Read is DATA_LOSS.
  // NOT_FOUND when absent.
  absl::Status CorruptRecord(const BlockId& id);

  // ------------------------------------------------------------ Inspect
  struct Counters {
    std::array<uint64_t, kTierOpCount> calls{};   // Per TierOp, failed included.
    std::array<uint64_t, kTierOpCount> failed{};  // Injected failures (torn included).
    uint64_t blocks_written = 0;   // Put writes applied.
    uint64_t payloads_dropped = 0; // DropPayloads writes applied.
    uint64_t synced_puts = 0;      // Put calls with sync that succeeded.
    uint64_t calls_of(TierOp op) const { return calls[static_cast<int>(op)]; }
    uint64_t failed_of(TierOp op) const { return failed[static_cast<int>(op)]; }
  };
  Counters counters() const;
  void ResetCounters();

  // Ids of every stored record, in id order.
  std::vector<BlockId> Ids() const;
  bool HasRecord(const BlockId& id) const;
  bool HasPayload(const BlockId& id) const;
  // The stored record (nullopt when absent or unparseable).
  std::optional<storage::SpillRecord> Record(const BlockId& id) const;
  // The stored payload (nullopt when absent).
  std::optional<std::string> Payload(const BlockId& id) const;

  struct State;

 private:
  explicit MemoryTier(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace evoke::testing

#endif  // EVOKE_TESTING_MEMORY_TIER_H_
