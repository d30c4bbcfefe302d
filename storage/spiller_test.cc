// The Spiller on its own: an EngineCore over a MemoryTier, entries made
// through the BlockIndex, no TierManager.
#include "storage/spiller.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "gtest/gtest.h"
#include "storage/spill_record.pb.h"
#include "testing/blocks.h"
#include "testing/memory_tier.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

using ::evoke::testing::MemoryTier;
using ::evoke::testing::StatusIs;
using ::evoke::testing::TierOp;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kBlock = 4 * kKiB;

class SpillerTest : public ::testing::Test {
 protected:
  void Open(uint64_t tier1_bytes, uint64_t spill_bytes = 1ull << 30) {
    PinnedArenaOptions arena;
    arena.capacity_bytes = tier1_bytes;
    arena.lock_memory = false;
    TierManagerOptions options;
    options.spill_bytes = spill_bytes;
    options.spill_batch_bytes = 4 * kBlock;
    core_ = std::make_unique<EngineCore>(options, PinnedArena::Create(arena).value(),
                                         disk_.Share());
    spiller_ = std::make_unique<Spiller>(core_.get());
  }
  void TearDown() override {
    spiller_.reset();  // Before the core it works on.
    core_.reset();
  }

  // Add stores a dirty block `seq` of kBlock bytes filled with `seq`.
  IndexEntry* Add(uint64_t seq, bool pin = false) {
    const v1::BlockMeta meta = evoke::testing::SessionMeta(
        evoke::testing::OpaqueFingerprint(), "s", seq, 16, 0, 1, 0);
    std::optional<ArenaReservation> ram = core_->host().Reserve(kBlock);
    EXPECT_TRUE(ram.has_value());
    std::memset(ram->data(), static_cast<int>(seq), kBlock);
    absl::MutexLock lock(core_->mu());
    BlockIndex& index = core_->index_for_testing();
    bool revived = false;
    IndexEntry* e = index.BeginWrite(evoke::testing::IdOf(meta), &revived);
    v1::BlockMeta stored = meta;
    stored.set_payload_bytes(kBlock);
    stored.set_checksum(PayloadChecksum(ram->data(), kBlock));
    index.ReplaceMetaForWrite(e, stored);
    e->payload_bytes = kBlock;
    e->checksum = stored.checksum();
    if (pin) index.AddPin(e, 1);
    index.CommitWrite(e, std::move(*ram), static_cast<int64_t>(seq));
    return e;
  }

  absl::Status WriteBack(const std::vector<IndexEntry*>& entries) {
    absl::MutexLock disk(core_->disk_mu());
    uint64_t blocks = 0, bytes = 0;
    return spiller_->WriteBack(entries, /*sync=*/false, &blocks, &bytes);
  }

  BlockState StateOf(const IndexEntry* e) {
    absl::MutexLock lock(core_->mu());
    return e->state;
  }

  bool PayloadOnDisk(const IndexEntry* e) {
    return disk_
        .Read(e->id, [](const storage::SpillRecord&, absl::string_view) {
          return absl::OkStatus();
        })
        .ok();
  }

  MemoryTier disk_;
  std::unique_ptr<EngineCore> core_;
  std::unique_ptr<Spiller> spiller_;
};

TEST_F(SpillerTest, WriteBackMakesDirtyBlocksClean) {
  Open(256 * kKiB);
  std::vector<IndexEntry*> entries = {Add(1), Add(2), Add(3), Add(4), Add(5)};
  ASSERT_OK(WriteBack(entries));
  for (IndexEntry* e : entries) {
    EXPECT_EQ(StateOf(e), BlockState::kClean);
    EXPECT_TRUE(PayloadOnDisk(e));
  }
  // Five blocks in batches of four bytes' worth: two Puts.
  EXPECT_EQ(disk_.counters().calls_of(TierOp::kPut), 2u);
  const TierStats stats = core_->Stats();
  EXPECT_EQ(stats.counters.spills, 5u);
  EXPECT_EQ(stats.disk.blocks, 5u);
}

TEST_F(SpillerTest, FailedWriteBackLeavesBlocksDirtyAndCounts) {
  Open(256 * kKiB);
  IndexEntry* e = Add(1);
  disk_.FailNext(TierOp::kPut, 1, absl::ResourceExhaustedError("injected: no space"));
  EXPECT_THAT(WriteBack({e}), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(StateOf(e), BlockState::kDirty);
  EXPECT_FALSE(PayloadOnDisk(e));
  EXPECT_EQ(core_->Stats().counters.spill_errors, 1u);
  {
    absl::MutexLock lock(core_->mu());
    EXPECT_EQ(e->readers, 0u);  // The write's reader was released.
  }
  ASSERT_OK(WriteBack({e}));  // The disk came back.
  EXPECT_EQ(StateOf(e), BlockState::kClean);
}

TEST_F(SpillerTest, BudgetTurnsTheColdestIntoBreadcrumbs) {
  Open(256 * kKiB, /*spill_bytes=*/2 * kBlock);
  std::vector<IndexEntry*> entries = {Add(1), Add(2), Add(3), Add(4)};
  ASSERT_OK(WriteBack(entries));
  {
    // 1 and 2 leave tier 1 (spilled); 3 and 4 stay clean.
    absl::MutexLock lock(core_->mu());
    core_->Evict(entries[0]);
    core_->Evict(entries[1]);
  }
  {
    absl::MutexLock disk(core_->disk_mu());
    spiller_->EnforceBudget();
  }
  // The disk LRU is in write-back order: 1 and 2 are the coldest.
  EXPECT_EQ(StateOf(entries[0]), BlockState::kBreadcrumb);
  EXPECT_EQ(StateOf(entries[1]), BlockState::kBreadcrumb);
  EXPECT_FALSE(PayloadOnDisk(entries[0]));
  EXPECT_EQ(StateOf(entries[2]), BlockState::kClean);
  const TierStats stats = core_->Stats();
  EXPECT_EQ(stats.counters.breadcrumbs, 2u);
  EXPECT_LE(stats.disk.payload_bytes, 2 * kBlock);
  absl::MutexLock lock(core_->mu());
  EXPECT_TRUE(entries[0]->record_on_disk);  // The breadcrumb record stays.
}

TEST_F(SpillerTest, BudgetDropsDiskCopiesOfBlocksStillInTier1) {
  Open(256 * kKiB, /*spill_bytes=*/kBlock);
  std::vector<IndexEntry*> entries = {Add(1), Add(2)};
  ASSERT_OK(WriteBack(entries));
  {
    absl::MutexLock disk(core_->disk_mu());
    spiller_->EnforceBudget();
  }
  EXPECT_EQ(StateOf(entries[0]), BlockState::kDirty);  // Back to tier 1 only.
  EXPECT_FALSE(PayloadOnDisk(entries[0]));
  EXPECT_EQ(core_->Stats().counters.breadcrumbs, 0u);
  absl::MutexLock lock(core_->mu());
  EXPECT_FALSE(entries[0]->record_on_disk);
}

TEST_F(SpillerTest, WaitForRoomRefusesWhatWaitingCannotFix) {
  Open(64 * kKiB);
  for (int i = 0; i < 16; ++i) Add(i, /*pin=*/true);  // Tier 1 full of pins.
  spiller_->Start();
  absl::MutexLock lock(core_->mu());
  const absl::Status pinned =
      spiller_->WaitForRoom(kBlock, kBlock, absl::Now() + absl::Seconds(5));
  EXPECT_THAT(pinned, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(ErrorLimit(pinned), StorageLimit::kTier1Capacity);
  EXPECT_THAT(spiller_->WaitForRoom(128 * kKiB, kBlock, absl::InfiniteFuture()),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST_F(SpillerTest, SpillsPastTheHighWatermarkDownToTheLow) {
  Open(64 * kKiB);  // 16 blocks; high 95% (15.2), low 80% (12.8).
  spiller_->Start();
  std::vector<IndexEntry*> entries;
  for (int i = 0; i < 16; ++i) entries.push_back(Add(i));
  spiller_->Wake();
  ASSERT_TRUE(spiller_->WaitForIdle(absl::Seconds(10)));
  EXPECT_LE(core_->host().used_bytes(), 64 * kKiB * 80 / 100);
  // The coldest left first.
  EXPECT_EQ(StateOf(entries[0]), BlockState::kSpilled);
  EXPECT_TRUE(PayloadOnDisk(entries[0]));
  EXPECT_NE(StateOf(entries.back()), BlockState::kSpilled);
}

TEST_F(SpillerTest, FlushWritesEverythingAndEvictsOnlyUnpinned) {
  Open(256 * kKiB);
  IndexEntry* free_block = Add(1);
  IndexEntry* pinned = Add(2, /*pin=*/true);
  ASSERT_OK_AND_ASSIGN(FlushResult flushed, spiller_->Flush(/*evict=*/true));
  EXPECT_EQ(flushed.blocks_written, 2u);
  EXPECT_EQ(flushed.bytes_written, 2 * kBlock);
  EXPECT_EQ(flushed.blocks_evicted, 1u);
  EXPECT_EQ(StateOf(free_block), BlockState::kSpilled);
  EXPECT_EQ(StateOf(pinned), BlockState::kClean);
  EXPECT_EQ(disk_.counters().calls_of(TierOp::kPersist), 1u);
}

}  // namespace
}  // namespace evoke
