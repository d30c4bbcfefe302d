// The real TierManager over a MemoryTier with injected faults: what the
// engine does when the tier below tier 1 is full, down, torn or corrupt.
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/chain_hash.h"
#include "common/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/pinned_arena.h"
#include "storage/tier_manager.h"
#include "testing/blocks.h"
#include "testing/fake_clock.h"
#include "testing/memory_tier.h"
#include "testing/status_matchers.h"

namespace evoke::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * 1024;
constexpr PinOwner kOwner = 1;

v1::BlockMeta SessionMeta(uint64_t seq) {
  return evoke::testing::SessionMeta(OpaqueFingerprint(), "s", seq, /*n_tokens=*/16,
                                     /*layer_begin=*/0, /*layer_end=*/1,
                                     /*first_position=*/0);
}

BlockId IdOf(uint64_t seq) { return SessionBlockId("ns", "s", seq); }

std::string Payload(uint64_t seed, uint64_t size) {
  std::string s(size, '\0');
  std::mt19937_64 rng(seed);
  for (uint64_t i = 0; i < size; i += 8) {
    const uint64_t v = rng();
    std::memcpy(&s[i], &v, std::min<uint64_t>(8, size - i));
  }
  return s;
}

class MemoryTierEngineTest : public ::testing::Test {
 protected:
  // Open starts a TierManager over `disk_` (which outlives it: a restart
  // opens a new one over the same blocks).
  absl::Status Open(uint64_t pinned_bytes, absl::Duration wait = absl::Seconds(10),
                    uint64_t spill_batch_bytes = 256 * kKiB) {
    tm_.reset();
    PinnedArenaOptions arena_options;
    arena_options.capacity_bytes = pinned_bytes;
    arena_options.lock_memory = false;
    absl::StatusOr<std::unique_ptr<PinnedArena>> arena = PinnedArena::Create(arena_options);
    if (!arena.ok()) return arena.status();
    TierManagerOptions options;
    options.clock = clock_;
    options.max_wait_for_room = wait;
    options.spill_batch_bytes = spill_batch_bytes;
    absl::StatusOr<std::unique_ptr<TierManager>> tm =
        TierManager::Open(options, std::move(arena).value(), disk_.Share());
    if (!tm.ok()) return tm.status();
    tm_ = std::move(tm).value();
    return absl::OkStatus();
  }

  absl::Status Save(uint64_t seq, uint64_t bytes = 64 * kKiB, bool durable = false) {
    const v1::BlockMeta meta = SessionMeta(seq);
    const std::string payload = Payload(seq, bytes);
    const SaveItem item{&meta, payload.size(), false};
    HostSaveSource source({payload});
    return tm_->Save({&item, 1}, source, durable, absl::InfiniteFuture(), kOwner).status();
  }

  absl::StatusOr<std::string> Load(uint64_t seq, BlockLocation* from = nullptr) {
    const BlockId id = IdOf(seq);
    StringLoadSink sink;
    std::vector<v1::BlockMeta> metas;
    std::vector<LoadedInfo> infos;
    if (absl::Status s =
            tm_->Load({&id, 1}, SessionMeta(seq).fingerprint(), sink, &metas, &infos);
        !s.ok()) {
      return s;
    }
    if (from != nullptr) *from = infos[0].served_from;
    return sink.payloads()[0];
  }

  // ExpectDiskAgrees checks that every block the engine says has a disk copy
  // has one in the tier, whole and with the bytes that were saved.
  void ExpectDiskAgrees(uint64_t first, uint64_t end, uint64_t bytes = 64 * kKiB) {
    for (uint64_t seq = first; seq < end; ++seq) {
      absl::StatusOr<BlockInfo> info = tm_->Describe(IdOf(seq));
      if (!info.ok() || !info->on_disk) continue;
      std::optional<std::string> p = disk_.Payload(IdOf(seq));
      ASSERT_TRUE(p.has_value()) << "block " << seq << " is reported on disk but is not";
      EXPECT_EQ(*p, Payload(seq, bytes)) << seq;
      EXPECT_TRUE(disk_.Record(IdOf(seq))->payload_present()) << seq;
    }
  }

  MemoryTier disk_;
  const Clock* clock_ = nullptr;  // Null: the wall clock.
  std::unique_ptr<TierManager> tm_;
};

TEST_F(MemoryTierEngineTest, RoundTripThroughTheTier) {
  ASSERT_OK(Open(1 * kMiB));
  for (uint64_t i = 0; i < 40; ++i) ASSERT_OK(Save(i)) << i;
  ASSERT_TRUE(tm_->WaitForSpillerIdle(absl::Seconds(10)));
  EXPECT_GT(disk_.counters().blocks_written, 0u);
  ExpectDiskAgrees(0, 40);
  // The oldest went down first and come back from the tier.
  BlockLocation from;
  ASSERT_OK_AND_ASSIGN(std::string got, Load(0, &from));
  EXPECT_EQ(got, Payload(0, 64 * kKiB));
  EXPECT_EQ(from, BlockLocation::kDisk);
  EXPECT_GT(disk_.counters().calls_of(TierOp::kRead), 0u);

  // A restart rebuilds the index from the tier's records, in id order.
  ASSERT_OK(tm_->Shutdown());
  ASSERT_OK(Open(1 * kMiB));
  EXPECT_EQ(disk_.counters().calls_of(TierOp::kForEachRecord), 2u);
  for (uint64_t i = 0; i < 40; ++i) {
    ASSERT_OK_AND_ASSIGN(got, Load(i));
    ASSERT_EQ(got, Payload(i, 64 * kKiB)) << i;
  }
}

TEST_F(MemoryTierEngineTest, NoSpaceBelowMakesSavesWaitThenFail) {
  ASSERT_OK(Open(1 * kMiB, /*wait=*/absl::Milliseconds(300)));
  disk_.FailAlways(TierOp::kPut, absl::ResourceExhaustedError("injected: no space"));
  uint64_t saved = 0;
  absl::Status last;
  for (uint64_t i = 0; i < 32 && last.ok(); ++i) {
    const absl::Time start = absl::Now();
    last = Save(i);
    if (last.ok()) {
      ++saved;
    } else {
      // It waited for the spiller to make room before giving up.
      EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
    }
  }
  EXPECT_THAT(last, StatusIs(absl::StatusCode::kResourceExhausted));
  ASSERT_GT(saved, 0u);
  EXPECT_GT(disk_.counters().failed_of(TierOp::kPut), 0u);
  EXPECT_GT(tm_->Stats().counters.spill_errors, 0u);
  // Nothing reached the tier, and the engine claims no disk copy.
  EXPECT_THAT(disk_.Ids(), IsEmpty());
  for (uint64_t i = 0; i < saved; ++i) {
    ASSERT_OK_AND_ASSIGN(BlockInfo info, tm_->Describe(IdOf(i)));
    EXPECT_FALSE(info.on_disk) << i;
    EXPECT_EQ(info.location, BlockLocation::kHost) << i;
  }
  // The failed save left nothing behind; reads keep working.
  EXPECT_THAT(tm_->Describe(IdOf(saved)), StatusIs(absl::StatusCode::kNotFound));
  for (uint64_t i = 0; i < saved; ++i) {
    ASSERT_OK_AND_ASSIGN(std::string got, Load(i));
    ASSERT_EQ(got, Payload(i, 64 * kKiB)) << i;
  }
  // A Flush cannot write either, and says why.
  EXPECT_THAT(tm_->Flush(/*evict=*/false), StatusIs(absl::StatusCode::kResourceExhausted));

  // Room again: spilling resumes, saves succeed, and disk and index agree.
  disk_.ClearFaults();
  ASSERT_OK(Save(100));
  ASSERT_OK(tm_->Flush(/*evict=*/false));
  for (uint64_t i = 0; i < saved; ++i) {
    ASSERT_OK_AND_ASSIGN(BlockInfo info, tm_->Describe(IdOf(i)));
    EXPECT_TRUE(info.on_disk) << i;
  }
  ExpectDiskAgrees(0, saved);
}

TEST_F(MemoryTierEngineTest, FullByCapacityIsTheSameAsNoSpace) {
  disk_.SetCapacity(200 * kKiB);  // Room for three 64 KiB blocks.
  ASSERT_OK(Open(4 * kMiB));
  for (uint64_t i = 0; i < 8; ++i) ASSERT_OK(Save(i));
  // One batch of eight does not fit; Flush reports the tier's no-space.
  EXPECT_THAT(tm_->Flush(false), StatusIs(absl::StatusCode::kResourceExhausted,
                                          HasSubstr("no space")));
  ExpectDiskAgrees(0, 8);
  disk_.SetCapacity(std::numeric_limits<uint64_t>::max());
  ASSERT_OK(tm_->Flush(false));
  ExpectDiskAgrees(0, 8);
  EXPECT_EQ(disk_.Ids().size(), 8u);
}

TEST_F(MemoryTierEngineTest, CorruptDiskPayloadIsDataLossThenBreadcrumb) {
  ASSERT_OK(Open(1 * kMiB));
  ASSERT_OK(Save(0, 256 * kKiB));
  ASSERT_OK(Save(1, 256 * kKiB));
  ASSERT_OK(tm_->Flush(/*evict=*/true));
  ASSERT_OK_AND_ASSIGN(BlockInfo before, tm_->Describe(IdOf(0)));
  ASSERT_EQ(before.location, BlockLocation::kDisk);

  ASSERT_OK(disk_.CorruptPayload(IdOf(0), 100 * kKiB, 5));
  EXPECT_THAT(Load(0), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksum")));
  EXPECT_EQ(tm_->Stats().counters.checksum_failures, 1u);
  // Quarantined: a breadcrumb, in the index and in the tier (record kept,
  // payload dropped), never served.
  ASSERT_OK_AND_ASSIGN(BlockInfo after, tm_->Describe(IdOf(0)));
  EXPECT_EQ(after.location, BlockLocation::kBreadcrumb);
  EXPECT_FALSE(after.bytes_available);
  EXPECT_TRUE(disk_.HasRecord(IdOf(0)));
  EXPECT_FALSE(disk_.HasPayload(IdOf(0)));
  EXPECT_THAT(Load(0), StatusIs(absl::StatusCode::kNotFound));
  // The other block is untouched.
  ASSERT_OK_AND_ASSIGN(std::string got, Load(1));
  EXPECT_EQ(got, Payload(1, 256 * kKiB));
}

TEST_F(MemoryTierEngineTest, VerifyFindsACorruptDiskCopy) {
  ASSERT_OK(Open(4 * kMiB));
  ASSERT_OK(Save(0));
  ASSERT_OK(Save(1));
  ASSERT_OK(tm_->Flush(/*evict=*/false));  // In tier 1 and on disk.
  ASSERT_OK(disk_.CorruptPayload(IdOf(1), 7, 0));
  ASSERT_OK_AND_ASSIGN(VerifyReport report, tm_->Verify({}));
  EXPECT_EQ(report.blocks_checked, 2u);
  ASSERT_EQ(report.corrupt.size(), 1u);
  EXPECT_EQ(report.corrupt[0].id, IdOf(1));
  EXPECT_EQ(report.corrupt[0].tier, BlockLocation::kDisk);
  // The tier-1 copy still serves it, and its bad disk copy is gone.
  BlockLocation from;
  ASSERT_OK_AND_ASSIGN(std::string got, Load(1, &from));
  EXPECT_EQ(got, Payload(1, 64 * kKiB));
  EXPECT_EQ(from, BlockLocation::kHost);
  ASSERT_OK_AND_ASSIGN(BlockInfo info, tm_->Describe(IdOf(1)));
  EXPECT_FALSE(info.on_disk);
  EXPECT_FALSE(disk_.HasPayload(IdOf(1)));
}

TEST_F(MemoryTierEngineTest, TornFlushReportsNoBlockOnDiskThatIsNot) {
  ASSERT_OK(Open(4 * kMiB, absl::Seconds(10), /*spill_batch_bytes=*/1 * kMiB));
  for (uint64_t i = 0; i < 6; ++i) ASSERT_OK(Save(i));
  disk_.TearNextPut(2);
  EXPECT_THAT(tm_->Flush(/*evict=*/true), StatusIs(absl::StatusCode::kUnavailable));
  // Two blocks reached the tier, whole; the engine may not count them yet,
  // but it counts none of the others.
  EXPECT_EQ(disk_.Ids().size(), 2u);
  ExpectDiskAgrees(0, 6);
  for (uint64_t i = 0; i < 6; ++i) {
    ASSERT_OK_AND_ASSIGN(std::string got, Load(i));
    ASSERT_EQ(got, Payload(i, 64 * kKiB)) << i;  // Nothing was evicted unsafely.
  }
  // The next flush completes the job.
  ASSERT_OK(tm_->Flush(/*evict=*/true));
  ExpectDiskAgrees(0, 6);
  for (uint64_t i = 0; i < 6; ++i) {
    ASSERT_OK_AND_ASSIGN(BlockInfo info, tm_->Describe(IdOf(i)));
    EXPECT_TRUE(info.on_disk) << i;
    EXPECT_EQ(info.location, BlockLocation::kDisk) << i;
  }
}

TEST_F(MemoryTierEngineTest, TornWriteThenCrashRecoversOnlyWholeBlocks) {
  ASSERT_OK(Open(4 * kMiB, absl::Seconds(10), /*spill_batch_bytes=*/1 * kMiB));
  for (uint64_t i = 0; i < 4; ++i) ASSERT_OK(Save(i));
  disk_.TearNextPut(3);
  EXPECT_THAT(tm_->Flush(false), StatusIs(absl::StatusCode::kUnavailable));
  // "Crash": drop the engine without Shutdown; restart over the same tier.
  ASSERT_OK(Open(4 * kMiB));
  int recovered = 0;
  for (uint64_t i = 0; i < 4; ++i) {
    absl::StatusOr<std::string> got = Load(i);
    if (got.ok()) {
      ++recovered;
      EXPECT_EQ(*got, Payload(i, 64 * kKiB)) << i;
    } else {
      EXPECT_THAT(got, StatusIs(absl::StatusCode::kNotFound)) << i;
    }
  }
  EXPECT_EQ(recovered, 3);
  EXPECT_EQ(tm_->Stats().counters.checksum_failures, 0u);
}

TEST_F(MemoryTierEngineTest, DurableSaveWithFailingTierIsUnavailableAndKeepsTier1) {
  ASSERT_OK(Open(4 * kMiB));
  disk_.FailNext(TierOp::kPut, 1, absl::UnavailableError("injected: tier down"));
  EXPECT_THAT(Save(0, 64 * kKiB, /*durable=*/true), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_FALSE(disk_.HasRecord(IdOf(0)));
  ASSERT_OK_AND_ASSIGN(BlockInfo info, tm_->Describe(IdOf(0)));
  EXPECT_EQ(info.location, BlockLocation::kHost);
  EXPECT_FALSE(info.on_disk);
  // Retried once the tier is back, the durable save lands on disk.
  ASSERT_OK(Save(0, 64 * kKiB, /*durable=*/true));
  EXPECT_TRUE(disk_.HasPayload(IdOf(0)));
  EXPECT_GE(disk_.counters().synced_puts, 1u);
  ASSERT_OK_AND_ASSIGN(info, tm_->Describe(IdOf(0)));
  EXPECT_TRUE(info.on_disk);
}

TEST_F(MemoryTierEngineTest, UnavailableReadLeavesTheBlockInPlace) {
  ASSERT_OK(Open(1 * kMiB));
  ASSERT_OK(Save(0));
  ASSERT_OK(tm_->Flush(/*evict=*/true));
  disk_.FailNext(TierOp::kRead, 1, absl::UnavailableError("injected: tier down"));
  EXPECT_THAT(Load(0), StatusIs(absl::StatusCode::kUnavailable));
  // Not taken for corruption: still on disk, no checksum failure.
  ASSERT_OK_AND_ASSIGN(BlockInfo info, tm_->Describe(IdOf(0)));
  EXPECT_EQ(info.location, BlockLocation::kDisk);
  EXPECT_TRUE(info.bytes_available);
  EXPECT_EQ(tm_->Stats().counters.checksum_failures, 0u);
  ASSERT_OK_AND_ASSIGN(std::string got, Load(0));
  EXPECT_EQ(got, Payload(0, 64 * kKiB));
}

TEST_F(MemoryTierEngineTest, FailingDeleteDeletesNothing) {
  ASSERT_OK(Open(4 * kMiB));
  ASSERT_OK(Save(0));
  ASSERT_OK(Save(1));
  ASSERT_OK(tm_->Flush(false));
  disk_.FailNext(TierOp::kDelete, 1, absl::UnavailableError("injected: tier down"));
  const BlockId ids[] = {IdOf(0), IdOf(1)};
  EXPECT_THAT(tm_->Delete(ids), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_OK(tm_->Describe(IdOf(0)));
  EXPECT_OK(tm_->Describe(IdOf(1)));
  EXPECT_TRUE(disk_.HasPayload(IdOf(0)));
  ASSERT_OK(tm_->Delete(ids));
  EXPECT_THAT(tm_->Describe(IdOf(0)), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(disk_.Ids(), IsEmpty());
}

TEST_F(MemoryTierEngineTest, RestartSkipsUnreadableRecordsAndFailsOnAFailingScan) {
  ASSERT_OK(Open(4 * kMiB));
  for (uint64_t i = 0; i < 3; ++i) ASSERT_OK(Save(i));
  ASSERT_OK(tm_->Shutdown());
  ASSERT_OK(disk_.CorruptRecord(IdOf(1)));
  ASSERT_OK(Open(4 * kMiB));
  EXPECT_OK(Load(0));
  EXPECT_THAT(Load(1), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_OK(Load(2));
  EXPECT_EQ(tm_->Stats().counters.checksum_failures, 1u);

  tm_.reset();
  disk_.FailNext(TierOp::kForEachRecord, 1, absl::UnavailableError("injected: tier down"));
  EXPECT_THAT(Open(4 * kMiB), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(MemoryTierEngineTest, TimesComeFromTheInjectedClock) {
  FakeClock clock;
  clock_ = &clock;
  const int64_t t0_ms = absl::ToUnixMillis(clock.Now());
  ASSERT_OK(Open(4 * kMiB));
  ASSERT_OK(Save(0));
  ASSERT_OK_AND_ASSIGN(BlockInfo info, tm_->Describe(IdOf(0)));
  EXPECT_EQ(info.last_access_unix_ms, t0_ms);
  clock.Advance(absl::Hours(1));
  ASSERT_OK(Load(0));
  ASSERT_OK_AND_ASSIGN(info, tm_->Describe(IdOf(0)));
  EXPECT_EQ(info.last_access_unix_ms, t0_ms + 3600 * 1000);
  EXPECT_EQ(tm_->Stats().uptime, absl::Hours(1));
  // The record written below carries the same time (it orders the disk LRU
  // after a restart).
  ASSERT_OK(tm_->Flush(false));
  ASSERT_TRUE(disk_.Record(IdOf(0)).has_value());
  EXPECT_EQ(disk_.Record(IdOf(0))->last_access_unix_ms(), t0_ms + 3600 * 1000);
  tm_.reset();  // Before `clock` goes.
}

}  // namespace
}  // namespace evoke::testing
