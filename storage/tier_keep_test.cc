// KeepSession and retention classes. A session kept for N seconds (an
// agent's tool call) rides out the pressure that evicts everything around
// it from both tiers, then competes as any other; keeps protect at most a
// share of tier 1, and when nothing else can go, kept blocks go too. Blocks
// of class low go first, of class high last, each until its ttl.
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
using ::evoke::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kBlock = 64 * kKiB;

class TierKeepTest : public ::testing::Test {
 protected:
  // A tier 1 of 1 MiB (16 blocks), a spill budget of 512 KiB (8 blocks).
  void Open(size_t max_kept_sessions = 65536) {
    TierManagerOptions options;
    options.spill_bytes = 512 * kKiB;
    options.spill_batch_bytes = 256 * kKiB;
    options.max_kept_sessions = max_kept_sessions;
    options.clock = &clock_;
    auto tm = OpenEngine(dir_.Join("db"), 1 * kMiB, options, nullptr);
    ASSERT_OK(tm);
    tm_ = std::move(tm).value();
  }

  // Saves `n` blocks of a fresh session each time (so that ids differ).
  void SaveOthers(int n) {
    std::vector<v1::BlockMeta> metas;
    std::vector<BlockId> ids;
    ASSERT_OK(SaveBlocks(*tm_, "other" + std::to_string(others_++), n, 1000, false, &metas,
                         &ids));
    ASSERT_TRUE(tm_->WaitForSpillerIdle(absl::Seconds(10)));
  }

  BlockLocation Where(const BlockId& id) {
    absl::StatusOr<BlockInfo> info = tm_->Describe(id);
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->location : BlockLocation::kBreadcrumb;
  }

  evoke::testing::FakeClock clock_;
  evoke::testing::TempDir dir_;
  std::unique_ptr<TierManager> tm_;
  int others_ = 0;
};

TEST_F(TierKeepTest, AKeptSessionRidesOutPressureThenCompetes) {
  Open();
  std::vector<v1::BlockMeta> metas;
  std::vector<BlockId> ids;
  ASSERT_OK(SaveBlocks(*tm_, "agent", 3, 0, false, &metas, &ids));
  ASSERT_OK_AND_ASSIGN(size_t n, tm_->KeepSession("ns", "agent", absl::Seconds(30)));
  EXPECT_EQ(n, 3u);
  EXPECT_EQ(tm_->Stats().kept_sessions, 1u);
  // A block the session saves while kept (its sequence 3) is kept too.
  {
    const v1::BlockMeta meta = evoke::testing::SessionMeta(evoke::testing::OpaqueFingerprint(),
                                                           "agent", 3, 16, 0, 1, 0);
    const std::string payload = Payload(3, kBlock);
    const SaveItem item{&meta, payload.size(), false};
    HostSaveSource source({payload});
    ASSERT_OK(tm_->Save({&item, 1}, source, false, absl::InfiniteFuture(), 1).status());
    ids.push_back(evoke::testing::IdOf(meta));
  }

  // 10 s into the pause, 48 other blocks (three times tier 1, six times the
  // spill budget) pass through.
  clock_.Advance(absl::Seconds(10));
  SaveOthers(48);
  const TierStats st = tm_->Stats();
  EXPECT_GT(st.counters.spills, 0u);
  EXPECT_GT(st.breadcrumb_blocks, 0u);
  EXPECT_EQ(st.counters.keep_overrides, 0u);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(Where(ids[i]), BlockLocation::kHost) << i;
  }

  // Past the keep, the session is the coldest thing stored: it goes first.
  clock_.Advance(absl::Seconds(21));
  SaveOthers(48);
  int gone = 0;
  for (const BlockId& id : ids) gone += Where(id) == BlockLocation::kBreadcrumb;
  EXPECT_EQ(gone, 4);
  EXPECT_EQ(tm_->Stats().counters.keep_overrides, 0u);
}

// A keep bends the order of eviction, never its necessity: with only kept
// blocks left to evict, they go, and that is counted.
TEST_F(TierKeepTest, WhenNothingElseCanGoKeptBlocksGoAndAreCounted) {
  Open();
  std::vector<v1::BlockMeta> metas;
  std::vector<BlockId> ids;
  ASSERT_OK(tm_->KeepSession("ns", "big", absl::Minutes(5)).status());
  ASSERT_OK(SaveBlocks(*tm_, "big", 40, 0, false, &metas, &ids));
  ASSERT_TRUE(tm_->WaitForSpillerIdle(absl::Seconds(10)));
  const TierStats st = tm_->Stats();
  EXPECT_GT(st.counters.keep_overrides, 0u);
  EXPECT_LE(st.disk.payload_bytes, 512 * kKiB);
  EXPECT_LE(st.host.used_bytes, st.host.capacity_bytes);
  // The newest are still there.
  ASSERT_OK(tm_->Describe(ids.back()));
  EXPECT_EQ(Where(ids.back()), BlockLocation::kHost);
}

// Keeps protect at most kept_tier1_fraction of tier 1 (a quarter of 1 MiB:
// 4 blocks); the rest of a kept session competes as any other block.
TEST_F(TierKeepTest, KeepsProtectAtMostTheirShareOfTier1) {
  Open();
  std::vector<v1::BlockMeta> metas;
  std::vector<BlockId> ids;
  ASSERT_OK(SaveBlocks(*tm_, "wide", 8, 0, false, &metas, &ids));
  ASSERT_OK(tm_->KeepSession("ns", "wide", absl::Seconds(30)).status());
  SaveOthers(48);
  int in_tier1 = 0;
  for (const BlockId& id : ids) in_tier1 += Where(id) == BlockLocation::kHost;
  EXPECT_EQ(in_tier1, 4);
  EXPECT_GE(tm_->Stats().counters.keep_overrides, 4u);
}

TEST_F(TierKeepTest, KeepsAreCappedRenewableAndEndable) {
  Open(/*max_kept_sessions=*/2);
  ASSERT_OK(tm_->KeepSession("ns", "a", absl::Seconds(30)).status());
  ASSERT_OK(tm_->KeepSession("ns", "b", absl::Seconds(30)).status());
  EXPECT_THAT(tm_->KeepSession("ns", "c", absl::Seconds(30)),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("2 sessions")));
  // Renewing a kept session is not one more.
  ASSERT_OK(tm_->KeepSession("ns", "a", absl::Seconds(60)).status());
  // Ending one makes room; so does a keep running out.
  ASSERT_OK(tm_->KeepSession("ns", "b", absl::ZeroDuration()).status());
  ASSERT_OK(tm_->KeepSession("ns", "c", absl::Seconds(30)).status());
  EXPECT_THAT(tm_->KeepSession("other-ns", "a", absl::Seconds(30)),
              StatusIs(absl::StatusCode::kResourceExhausted));
  clock_.Advance(absl::Seconds(31));
  ASSERT_OK(tm_->KeepSession("other-ns", "a", absl::Seconds(30)).status());
  EXPECT_EQ(tm_->Stats().kept_sessions, 2u);  // ns/a (60 s) and other-ns/a.
}

// Retention classes (SetRetention): kLow blocks go before older ones, kHigh
// blocks after everything else, each until its ttl.
class TierRetentionTest : public TierKeepTest {};

TEST_F(TierRetentionTest, LowGoesFirstHighLastThenTheyCompete) {
  Open();
  std::vector<v1::BlockMeta> metas;
  std::vector<BlockId> ids;
  ASSERT_OK(SaveBlocks(*tm_, "s", 12, 0, false, &metas, &ids));
  // The oldest two kept high for 5 s; the newest two low until changed.
  ASSERT_OK(tm_->SetRetention({ids[0], ids[1]}, RetentionClass::kHigh, absl::Seconds(5)));
  ASSERT_OK(tm_->SetRetention({ids[10], ids[11]}, RetentionClass::kLow, absl::ZeroDuration()));
  TierStats st = tm_->Stats();
  EXPECT_EQ(st.high_blocks, 2u);
  EXPECT_EQ(st.low_blocks, 2u);
  SaveOthers(6);
  // Each block written out once (a low block is no victim of both walks).
  st = tm_->Stats();
  EXPECT_EQ(st.counters.spills, st.disk.blocks);
  EXPECT_EQ(Where(ids[10]), BlockLocation::kDisk);
  EXPECT_EQ(Where(ids[11]), BlockLocation::kDisk);
  EXPECT_EQ(Where(ids[0]), BlockLocation::kHost);
  EXPECT_EQ(Where(ids[1]), BlockLocation::kHost);
  EXPECT_EQ(Where(ids[2]), BlockLocation::kDisk);  // Then the least recently used.
  EXPECT_EQ(Where(ids[9]), BlockLocation::kHost);
  EXPECT_EQ(tm_->Stats().counters.keep_overrides, 0u);
  // The high class ends with its ttl: the two compete again, oldest first.
  clock_.Advance(absl::Seconds(6));
  EXPECT_EQ(tm_->Stats().high_blocks, 0u);
  SaveOthers(4);
  EXPECT_EQ(Where(ids[0]), BlockLocation::kDisk);
  EXPECT_EQ(Where(ids[1]), BlockLocation::kDisk);
  // kNormal ends the low class.
  ASSERT_OK(tm_->SetRetention({ids[10]}, RetentionClass::kNormal, absl::ZeroDuration()));
  EXPECT_EQ(tm_->Stats().low_blocks, 1u);
  // Deleted: no class left behind.
  ASSERT_OK(tm_->Delete({&ids[11], 1}));
  EXPECT_EQ(tm_->Stats().low_blocks, 0u);
}

TEST_F(TierRetentionTest, AnUnknownIdChangesNothing) {
  Open();
  std::vector<v1::BlockMeta> metas;
  std::vector<BlockId> ids;
  ASSERT_OK(SaveBlocks(*tm_, "s", 1, 0, false, &metas, &ids));
  const BlockId absent = evoke::testing::IdOf(evoke::testing::SessionMeta(
      evoke::testing::OpaqueFingerprint(), "absent", 0, 16, 0, 1, 0));
  EXPECT_THAT(tm_->SetRetention({ids[0], absent}, RetentionClass::kHigh, absl::Seconds(5)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("not found")));
  EXPECT_EQ(tm_->Stats().high_blocks, 0u);
}

}  // namespace
}  // namespace evoke
