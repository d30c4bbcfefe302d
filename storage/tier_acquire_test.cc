// Acquire: a lookup and pins in one step, that keep what it found loadable
// whatever tier 1's spiller and tier 2's budget evict around it.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/tier_manager.h"
#include "testing/blocks.h"
#include "testing/engine.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke {
namespace {

using ::evoke::testing::OpenEngine;
using ::evoke::testing::Payload;
using ::evoke::testing::SaveBlocks;
using ::evoke::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kBlock = 64 * kKiB;
constexpr PinOwner kHandle = 7;

class TierAcquireTest : public ::testing::Test {
 protected:
  // A tier 1 of 1 MiB (16 blocks) and a spill budget of `spill_bytes`.
  void Open(uint64_t spill_bytes) {
    TierManagerOptions options;
    options.spill_bytes = spill_bytes;
    options.spill_batch_bytes = 256 * kKiB;
    auto tm = OpenEngine(dir_.Join("db"), 1 * kMiB, options, nullptr);
    ASSERT_OK(tm);
    tm_ = std::move(tm).value();
  }

  absl::StatusOr<std::string> Load(const BlockId& id) {
    StringLoadSink sink;
    std::vector<v1::BlockMeta> metas;
    std::vector<LoadedInfo> infos;
    EVOKE_RETURN_IF_ERROR(
        tm_->Load({&id, 1}, evoke::testing::OpaqueFingerprint(), sink, &metas, &infos));
    return sink.payloads()[0];
  }

  evoke::testing::TempDir dir_;
  std::unique_ptr<TierManager> tm_;
};

TEST_F(TierAcquireTest, HoldsTheLongestRunOrEveryIdAndNothingOnAMiss) {
  Open(1ull << 30);
  std::vector<v1::BlockMeta> metas;
  std::vector<BlockId> ids;
  ASSERT_OK(SaveBlocks(*tm_, "s", 5, 0, /*durable=*/false, &metas, &ids));
  ASSERT_OK(tm_->Flush(/*evict=*/false));
  // Block 0 only in tier 2, the rest in tier 1 (1 and 2 also on disk).
  ASSERT_OK(tm_->Flush(/*evict=*/true));
  ASSERT_OK(Load(ids[1]));
  const BlockId missing = evoke::testing::IdOf(evoke::testing::SessionMeta(
      evoke::testing::OpaqueFingerprint(), "absent", 0, 16, 0, 1, 0));
  const std::vector<BlockId> asked = {ids[0], ids[1], ids[2], missing, ids[4]};

  ASSERT_OK_AND_ASSIGN(std::vector<BlockLocation> run, tm_->Acquire(asked, kHandle, false));
  EXPECT_THAT(run, ElementsAre(BlockLocation::kDisk, BlockLocation::kHost, BlockLocation::kDisk));
  EXPECT_EQ(tm_->Stats().pinned_blocks, 3u);
  ASSERT_OK_AND_ASSIGN(BlockInfo held, tm_->Describe(ids[0]));
  EXPECT_EQ(held.pin_count, 1u);
  EXPECT_EQ(held.location, BlockLocation::kDisk);  // Held where it was: no promotion.

  // ALL: the first missing id is named, and nothing more is held.
  EXPECT_THAT(tm_->Acquire(asked, kHandle + 1, true),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("not found")));
  EXPECT_EQ(tm_->Stats().pinned_blocks, 3u);
  EXPECT_EQ(tm_->ReleaseOwner(kHandle + 1), 0u);
  ASSERT_OK_AND_ASSIGN(run, tm_->Acquire({ids[4], ids[3]}, kHandle + 1, true));
  EXPECT_EQ(run.size(), 2u);
  // A miss at the head holds nothing.
  ASSERT_OK_AND_ASSIGN(run, tm_->Acquire({missing, ids[0]}, kHandle + 2, false));
  EXPECT_TRUE(run.empty());

  EXPECT_EQ(tm_->ReleaseOwner(kHandle), 3u);
  EXPECT_EQ(tm_->ReleaseOwner(kHandle + 1), 2u);
  EXPECT_EQ(tm_->Stats().pinned_blocks, 0u);
}

// Held blocks ride out both evictions: tier 1's (the spiller) and tier 2's
// spill budget (breadcrumbs), which take the blocks around them; released,
// they compete again and the budget holds.
TEST_F(TierAcquireTest, HeldBlocksStayLoadableUnderBothTiersPressure) {
  Open(/*spill_bytes=*/256 * kKiB);
  std::vector<v1::BlockMeta> metas;
  std::vector<BlockId> ids;
  // 0-3 pushed to tier 2 and held there; 4-7 held in tier 1.
  ASSERT_OK(SaveBlocks(*tm_, "held", 4, 0, false, &metas, &ids));
  ASSERT_OK(tm_->Flush(/*evict=*/true));
  ASSERT_OK(SaveBlocks(*tm_, "held2", 4, 4, false, &metas, &ids));
  ASSERT_OK_AND_ASSIGN(std::vector<BlockLocation> run, tm_->Acquire(ids, kHandle, true));
  ASSERT_EQ(run.size(), 8u);
  EXPECT_EQ(run[0], BlockLocation::kDisk);
  EXPECT_EQ(run[7], BlockLocation::kHost);

  std::vector<v1::BlockMeta> other_metas;
  std::vector<BlockId> others;
  ASSERT_OK(SaveBlocks(*tm_, "others", 40, 1000, false, &other_metas, &others));
  ASSERT_OK(tm_->Flush(/*evict=*/true));
  ASSERT_TRUE(tm_->WaitForSpillerIdle(absl::Seconds(10)));
  // The pressure was real: the oldest of the others lost their bytes.
  ASSERT_OK_AND_ASSIGN(BlockInfo crumb, tm_->Describe(others[0]));
  EXPECT_EQ(crumb.location, BlockLocation::kBreadcrumb);
  for (size_t i = 4; i < 8; ++i) {
    ASSERT_OK_AND_ASSIGN(BlockInfo info, tm_->Describe(ids[i]));
    EXPECT_EQ(info.location, BlockLocation::kHost) << i;  // Never spilled.
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(std::string got, Load(ids[i]));
    EXPECT_TRUE(got == Payload(i, kBlock)) << i;
  }
  // Over the budget only by what is held.
  EXPECT_LE(tm_->Stats().disk.payload_bytes, 256 * kKiB + 8 * kBlock);

  EXPECT_EQ(tm_->ReleaseOwner(kHandle), 8u);
  ASSERT_OK(SaveBlocks(*tm_, "more", 20, 2000, false, &other_metas, &others));
  ASSERT_OK(tm_->Flush(/*evict=*/true));
  ASSERT_TRUE(tm_->WaitForSpillerIdle(absl::Seconds(10)));
  EXPECT_LE(tm_->Stats().disk.payload_bytes, 256 * kKiB);
  size_t crumbs = 0;
  for (const BlockId& id : ids) {
    ASSERT_OK_AND_ASSIGN(BlockInfo info, tm_->Describe(id));
    crumbs += info.location == BlockLocation::kBreadcrumb;
  }
  EXPECT_GT(crumbs, 0u);
}

// The race Acquire closes (a lookup, then a load, with eviction between):
// 16 writers keep both tiers evicting while a reader acquires the newest
// run of a chain and loads it. No Load of a held block may fail.
TEST_F(TierAcquireTest, NoAcquiredBlockIsLostUnder16EvictingWriters) {
  Open(/*spill_bytes=*/512 * kKiB);
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;
  for (int w = 0; w < 16; ++w) {
    writers.emplace_back([&, w] {
      std::vector<v1::BlockMeta> metas;
      std::vector<BlockId> ids;
      for (uint64_t round = 0; !stop.load(); ++round) {
        metas.clear();
        ids.clear();
        if (!SaveBlocks(*tm_, "w" + std::to_string(w) + "-" + std::to_string(round), 2,
                        round, false, &metas, &ids, 16 * kKiB)
                 .ok()) {
          std::this_thread::yield();
        }
      }
    });
  }
  int held_runs = 0, loads = 0;
  for (int round = 0; round < 60; ++round) {
    std::vector<v1::BlockMeta> metas;
    std::vector<BlockId> ids;
    ASSERT_OK(SaveBlocks(*tm_, "r" + std::to_string(round), 4, round * 10, false, &metas,
                         &ids, 16 * kKiB));
    const PinOwner owner = 100 + round;
    ASSERT_OK_AND_ASSIGN(std::vector<BlockLocation> run, tm_->Acquire(ids, owner, false));
    held_runs += !run.empty();
    for (size_t i = 0; i < run.size(); ++i) {
      absl::StatusOr<std::string> got = Load(ids[i]);
      ASSERT_OK(got) << "round " << round << " block " << i;
      ASSERT_TRUE(*got == Payload(round * 10 + i, 16 * kKiB));
      ++loads;
    }
    EXPECT_EQ(tm_->ReleaseOwner(owner), run.size());
  }
  stop = true;
  for (std::thread& t : writers) t.join();
  EXPECT_GT(held_runs, 0);
  const TierStats st = tm_->Stats();
  EXPECT_GT(st.counters.spills, 0u);
  EXPECT_GT(st.breadcrumb_blocks, 0u);  // Tier 2 evicted too.
  EXPECT_EQ(st.pinned_blocks, 0u);
  RecordProperty("acquired_loads", loads);
}

}  // namespace
}  // namespace evoke
