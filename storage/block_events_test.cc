// BlockEventLog: a ring of numbered events that readers catch up from; the
// engine records a block's life in it (stored, spilled, demoted, promoted,
// removed), and a save over a breadcrumb is one STORED.
#include "storage/block_events.h"

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

using ::evoke::testing::SaveBlocks;

v1::BlockMeta Meta(const std::string& ns) {
  v1::BlockMeta meta;
  meta.mutable_fingerprint()->set_namespace_(ns);
  meta.set_kind(v1::BLOCK_KIND_SESSION);
  return meta;
}

TEST(BlockEventLogTest, RecordsNothingUntilEnabled) {
  BlockEventLog log(4, 7);
  log.Record(BlockEventKind::kStored, BlockId(), Meta("a"), BlockLocation::kHost,
             BlockLocation::kHost);
  EXPECT_EQ(log.next_seq(), 1u);
  log.Enable();
  log.Record(BlockEventKind::kStored, BlockId(), Meta("a"), BlockLocation::kHost,
             BlockLocation::kHost);
  EXPECT_EQ(log.next_seq(), 2u);
  EXPECT_EQ(log.epoch(), 7u);
}

TEST(BlockEventLogTest, ReadersCatchUpAndAreToldWhatTheRingNoLongerHolds) {
  BlockEventLog log(4, 1);
  log.Enable();
  for (int i = 0; i < 6; ++i) {
    log.Record(BlockEventKind::kStored, BlockId(), Meta(std::to_string(i)), BlockLocation::kHost,
               BlockLocation::kHost);
  }
  std::vector<BlockEvent> out;
  uint64_t lost = 0;
  // From 1: events 1 and 2 were overwritten; 3..6 remain.
  uint64_t next = log.Read(1, 10, &out, &lost);
  EXPECT_EQ(lost, 2u);
  EXPECT_EQ(next, 7u);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].seq, 3u);
  EXPECT_EQ(out[0].ns, "2");
  EXPECT_EQ(out[3].seq, 6u);
  // In batches, nothing lost.
  next = log.Read(4, 2, &out, &lost);
  EXPECT_EQ(lost, 0u);
  EXPECT_EQ(next, 6u);
  EXPECT_EQ(out.size(), 2u);
  // Caught up: nothing, and no wait for what exists.
  next = log.Read(7, 10, &out, &lost);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(next, 7u);
  EXPECT_TRUE(log.WaitForNew(6, absl::ZeroDuration()));
  EXPECT_FALSE(log.WaitForNew(7, absl::Milliseconds(1)));
}

std::vector<BlockEventKind> KindsOf(BlockEventLog& log, uint64_t from) {
  std::vector<BlockEvent> out;
  uint64_t lost = 0;
  log.Read(from, 1000, &out, &lost);
  std::vector<BlockEventKind> kinds;
  for (const BlockEvent& e : out) kinds.push_back(e.kind);
  return kinds;
}

TEST(BlockEventLogTest, TheEngineRecordsABlocksLife) {
  evoke::testing::TempDir dir;
  BlockEventLog log(1024, 1);
  log.Enable();
  TierManagerOptions options;
  options.events = &log;
  options.spill_bytes = 64 << 10;  // One block: a second spilled drops the first's payload.
  auto tm = evoke::testing::OpenEngine(dir.Join("db"), 1 << 20, options, nullptr);
  ASSERT_OK(tm);
  std::vector<v1::BlockMeta> metas;
  std::vector<BlockId> ids;
  ASSERT_OK(SaveBlocks(**tm, "s", 1, 0, false, &metas, &ids));
  ASSERT_OK((*tm)->Flush(/*evict=*/false));
  ASSERT_OK((*tm)->Flush(/*evict=*/true));
  StringLoadSink sink;
  std::vector<v1::BlockMeta> loaded;
  std::vector<LoadedInfo> infos;
  ASSERT_OK((*tm)->Load(ids, evoke::testing::OpaqueFingerprint(), sink, &loaded, &infos));
  using K = BlockEventKind;
  EXPECT_THAT(KindsOf(log, 1), ::testing::ElementsAre(K::kStored, K::kSpilled, K::kDemoted,
                                                      K::kPromoted));
  // A second block through tier 2 drops the first's payload past the
  // budget once both are out of tier 1: a breadcrumb (EVICTED).
  const uint64_t before = log.next_seq();
  ASSERT_OK(SaveBlocks(**tm, "t", 1, 9, false, &metas, &ids));
  ASSERT_OK((*tm)->Flush(/*evict=*/true));
  ASSERT_TRUE((*tm)->WaitForSpillerIdle(absl::Seconds(10)));
  ASSERT_OK_AND_ASSIGN(BlockInfo first, (*tm)->Describe(ids[0]));
  ASSERT_FALSE(first.bytes_available);
  EXPECT_THAT(KindsOf(log, before), ::testing::Contains(K::kEvicted));
  // Saved again over its breadcrumb: one STORED.
  const uint64_t revive = log.next_seq();
  const std::string payload = evoke::testing::Payload(0, 64 << 10);
  const SaveItem item{&metas[0], payload.size(), false};
  HostSaveSource source({payload});
  ASSERT_OK((*tm)->Save({&item, 1}, source, false, absl::InfiniteFuture()).status());
  EXPECT_THAT(KindsOf(log, revive), ::testing::ElementsAre(K::kStored));
  const uint64_t removal = log.next_seq();
  ASSERT_OK((*tm)->Delete({&ids[1], 1}));
  EXPECT_THAT(KindsOf(log, removal), ::testing::ElementsAre(K::kRemoved));
}

TEST(BlockEventLogTest, ARetentionClassThatRunsOutIsOneExpiredEventWithinSeconds) {
  evoke::testing::TempDir dir;
  BlockEventLog log(1024, 1);
  log.Enable();
  evoke::testing::FakeClock clock;
  TierManagerOptions options;
  options.events = &log;
  options.clock = &clock;
  auto tm = evoke::testing::OpenEngine(dir.Join("db"), 1 << 20, options, nullptr);
  ASSERT_OK(tm);
  std::vector<v1::BlockMeta> metas;
  std::vector<BlockId> ids;
  ASSERT_OK(SaveBlocks(**tm, "s", 3, 0, false, &metas, &ids));
  ASSERT_OK((*tm)->SetRetention({&ids[0], 1}, RetentionClass::kHigh, absl::Seconds(5)));
  ASSERT_OK((*tm)->SetRetention({&ids[1], 1}, RetentionClass::kLow, absl::Seconds(60)));
  ASSERT_OK((*tm)->SetRetention({&ids[2], 1}, RetentionClass::kHigh, absl::ZeroDuration()));
  const uint64_t from = log.next_seq();
  // Not before its time; then once, from the spiller's own wake-ups.
  clock.Advance(absl::Seconds(4));
  absl::SleepFor(absl::Milliseconds(1500));
  EXPECT_TRUE(KindsOf(log, from).empty());
  clock.Advance(absl::Seconds(2));
  ASSERT_TRUE(evoke::testing::WaitUntil([&] { return !KindsOf(log, from).empty(); },
                                        absl::Seconds(10)));
  std::vector<BlockEvent> out;
  uint64_t lost = 0;
  absl::SleepFor(absl::Milliseconds(1500));  // Another wake-up: still one.
  log.Read(from, 100, &out, &lost);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, BlockEventKind::kExpired);
  EXPECT_EQ(out[0].id, ids[0]);
  EXPECT_EQ(out[0].location, BlockLocation::kHost);
  EXPECT_EQ((*tm)->Stats().high_blocks, 1u);  // The one without an end.
}

}  // namespace
}  // namespace evoke
