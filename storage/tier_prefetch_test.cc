// Prefetch: blocks brought into tier 1 ahead of their Loads, which then find
// them there; what it could not bring is reported, never failed.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/tier_manager.h"
#include "testing/blocks.h"
#include "testing/engine.h"
#include "testing/fake_clock.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke {
namespace {

using ::evoke::testing::OpenEngine;
using ::evoke::testing::Payload;
using ::evoke::testing::SaveBlocks;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

class TierPrefetchTest : public ::testing::Test {
 protected:
  // A tier 1 of 1 MiB: 16 blocks of 64 KiB.
  void SetUp() override {
    TierManagerOptions options;
    options.spill_batch_bytes = 256 * kKiB;
    options.clock = &clock_;
    auto tm = OpenEngine(dir_.Join("db"), 1 * kMiB, options, nullptr);
    ASSERT_OK(tm);
    tm_ = std::move(tm).value();
  }

  // Loads `id` and returns where it was served from; `bytes` gets its payload.
  absl::StatusOr<BlockLocation> Load(const BlockId& id, std::string* bytes) {
    StringLoadSink sink;
    std::vector<v1::BlockMeta> metas;
    std::vector<LoadedInfo> infos;
    EVOKE_RETURN_IF_ERROR(
        tm_->Load({&id, 1}, evoke::testing::OpaqueFingerprint(), sink, &metas, &infos));
    *bytes = sink.payloads()[0];
    return infos[0].served_from;
  }

  absl::StatusOr<PrefetchResult> Prefetch(absl::Span<const BlockId> ids) {
    return tm_->Prefetch(ids, nullptr, absl::Now() + absl::Seconds(10));
  }

  evoke::testing::FakeClock clock_;
  evoke::testing::TempDir dir_;
  std::unique_ptr<TierManager> tm_;
};

TEST_F(TierPrefetchTest, BringsSpilledBlocksSoThatLoadsHitTierOne) {
  std::vector<v1::BlockMeta> metas;
  std::vector<BlockId> ids;
  ASSERT_OK(SaveBlocks(*tm_, "s", 8, 100, /*durable=*/false, &metas, &ids));
  ASSERT_OK(tm_->Flush(/*evict=*/true));
  ASSERT_EQ(tm_->Stats().host.blocks, 0u);
  std::vector<BlockId> asked = ids;
  asked.push_back(evoke::testing::IdOf(evoke::testing::SessionMeta(
      evoke::testing::OpaqueFingerprint(), "absent", 0, 16, 0, 1, 0)));

  ASSERT_OK_AND_ASSIGN(PrefetchResult r, Prefetch(asked));
  EXPECT_EQ(r.promoted, 8u);
  EXPECT_EQ(r.missing, 1u);
  EXPECT_EQ(r.in_tier1 + r.no_room + r.failed + r.fetched, 0u);
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string bytes;
    ASSERT_OK_AND_ASSIGN(BlockLocation where, Load(ids[i], &bytes));
    EXPECT_EQ(where, BlockLocation::kHost) << i;
    EXPECT_EQ(bytes, Payload(100 + i, 64 * kKiB)) << i;
  }
  TierStats stats = tm_->Stats();
  EXPECT_EQ(stats.counters.prefetched, 8u);
  EXPECT_EQ(stats.counters.prefetch_hits, 8u);
  EXPECT_EQ(stats.counters.prefetch_unused, 0u);
  // Only a prefetched copy's first Load is its hit.
  std::string bytes;
  ASSERT_OK(Load(ids[0], &bytes));
  EXPECT_EQ(tm_->Stats().counters.prefetch_hits, 8u);

  // Again: everything is in tier 1 now.
  ASSERT_OK_AND_ASSIGN(r, Prefetch(ids));
  EXPECT_EQ(r.in_tier1, 8u);
  EXPECT_EQ(r.promoted, 0u);
}

TEST_F(TierPrefetchTest, CopiesThatLeaveTierOneUnreadAreCountedUnused) {
  std::vector<v1::BlockMeta> metas;
  std::vector<BlockId> ids;
  ASSERT_OK(SaveBlocks(*tm_, "s", 4, 0, /*durable=*/false, &metas, &ids));
  ASSERT_OK(tm_->Flush(/*evict=*/true));
  ASSERT_OK_AND_ASSIGN(PrefetchResult r, Prefetch(ids));
  EXPECT_EQ(r.promoted, 4u);
  ASSERT_OK(tm_->Flush(/*evict=*/true));
  std::string bytes;
  ASSERT_OK_AND_ASSIGN(BlockLocation where, Load(ids[0], &bytes));
  EXPECT_EQ(where, BlockLocation::kDisk);
  const TierStats stats = tm_->Stats();
  EXPECT_EQ(stats.counters.prefetch_unused, 4u);
  EXPECT_EQ(stats.counters.prefetch_hits, 0u);
}

TEST_F(TierPrefetchTest, BringsAtMostTheLowWatermarkPerCall) {
  std::vector<v1::BlockMeta> metas;
  std::vector<BlockId> ids;
  ASSERT_OK(SaveBlocks(*tm_, "s", 20, 0, /*durable=*/false, &metas, &ids));
  ASSERT_OK(tm_->Flush(/*evict=*/true));
  ASSERT_OK_AND_ASSIGN(PrefetchResult r, Prefetch(ids));
  // 0.8 of 16 blocks: 12 come, the first 12 asked.
  EXPECT_EQ(r.promoted, 12u);
  EXPECT_EQ(r.no_room, 8u);
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(BlockInfo info, tm_->Describe(ids[i]));
    EXPECT_EQ(info.location, i < 12 ? BlockLocation::kHost : BlockLocation::kDisk) << i;
  }
}

TEST_F(TierPrefetchTest, WaitsForTheSpillerWhenTierOneIsFull) {
  std::vector<v1::BlockMeta> metas;
  std::vector<BlockId> ids;
  ASSERT_OK(SaveBlocks(*tm_, "cold", 4, 0, /*durable=*/false, &metas, &ids));
  ASSERT_OK(tm_->Flush(/*evict=*/true));
  // Tier 1 at its high watermark with blocks only it holds.
  std::vector<v1::BlockMeta> hot_metas;
  std::vector<BlockId> hot;
  ASSERT_OK(SaveBlocks(*tm_, "hot", 15, 50, /*durable=*/false, &hot_metas, &hot));
  ASSERT_OK_AND_ASSIGN(PrefetchResult r, Prefetch(ids));
  EXPECT_EQ(r.promoted, 4u);
  EXPECT_EQ(r.no_room, 0u);
  for (const BlockId& id : ids) {
    std::string bytes;
    ASSERT_OK_AND_ASSIGN(BlockLocation where, Load(id, &bytes));
    EXPECT_EQ(where, BlockLocation::kHost);
  }
  // Nothing the spiller made room from was lost.
  for (size_t i = 0; i < hot.size(); ++i) {
    std::string bytes;
    ASSERT_OK(Load(hot[i], &bytes));
    EXPECT_EQ(bytes, Payload(50 + i, 64 * kKiB)) << i;
  }
}

// Until a Load reads it (or prefetch_hold passes), a prefetched block is
// the spiller's last choice: other writes pass through tier 1 around it.
TEST_F(TierPrefetchTest, UnreadPrefetchedBlocksRideOutWritesForTheirHold) {
  std::vector<v1::BlockMeta> metas;
  std::vector<BlockId> ids;
  ASSERT_OK(SaveBlocks(*tm_, "s", 3, 0, /*durable=*/false, &metas, &ids));
  ASSERT_OK(tm_->Flush(/*evict=*/true));
  ASSERT_OK_AND_ASSIGN(PrefetchResult r, Prefetch(ids));
  ASSERT_EQ(r.promoted, 3u);
  // Read one now: it competes again.
  std::string bytes;
  ASSERT_OK(Load(ids[0], &bytes));
  std::vector<v1::BlockMeta> other_metas;
  std::vector<BlockId> others;
  ASSERT_OK(SaveBlocks(*tm_, "writer", 40, 500, /*durable=*/false, &other_metas, &others));
  ASSERT_TRUE(tm_->WaitForSpillerIdle(absl::Seconds(10)));
  ASSERT_OK_AND_ASSIGN(BlockInfo read, tm_->Describe(ids[0]));
  EXPECT_EQ(read.location, BlockLocation::kDisk);
  for (size_t i = 1; i < ids.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(BlockInfo info, tm_->Describe(ids[i]));
    EXPECT_EQ(info.location, BlockLocation::kHost) << i;
  }
  // Once the hold has passed, they are evicted as any other.
  clock_.Advance(absl::Seconds(3));
  ASSERT_OK(SaveBlocks(*tm_, "writer2", 40, 900, /*durable=*/false, &other_metas, &others));
  ASSERT_TRUE(tm_->WaitForSpillerIdle(absl::Seconds(10)));
  for (size_t i = 1; i < ids.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(BlockInfo info, tm_->Describe(ids[i]));
    EXPECT_EQ(info.location, BlockLocation::kDisk) << i;
  }
  const TierStats stats = tm_->Stats();
  EXPECT_EQ(stats.counters.prefetch_unused, 2u);
  EXPECT_EQ(stats.counters.keep_overrides, 0u);
}

TEST_F(TierPrefetchTest, ADeletedOrBreadcrumbBlockIsMissingNotAnError) {
  std::vector<v1::BlockMeta> metas;
  std::vector<BlockId> ids;
  ASSERT_OK(SaveBlocks(*tm_, "s", 3, 0, /*durable=*/false, &metas, &ids));
  ASSERT_OK(tm_->Flush(/*evict=*/true));
  ASSERT_OK(tm_->Delete({&ids[1], 1}));
  ASSERT_OK_AND_ASSIGN(PrefetchResult r, Prefetch(ids));
  EXPECT_EQ(r.promoted, 2u);
  EXPECT_EQ(r.missing, 1u);
}

TEST_F(TierPrefetchTest, AfterShutdownItIsUnavailable) {
  ASSERT_OK(tm_->Shutdown());
  EXPECT_THAT(Prefetch({}), evoke::testing::StatusIs(absl::StatusCode::kUnavailable));
}

}  // namespace
}  // namespace evoke
