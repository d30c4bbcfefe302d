#include "testing/memory_tier.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/spill_record.pb.h"
#include "testing/status_matchers.h"

namespace evoke::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::SizeIs;

storage::SpillRecord RecordOf(uint64_t seq, uint64_t bytes) {
  storage::SpillRecord r;
  r.mutable_meta()->set_sequence(seq);
  r.mutable_meta()->set_payload_bytes(bytes);
  r.set_last_access_unix_ms(1000 + static_cast<int64_t>(seq));
  return r;
}

// ReadAll reads a block and returns its record and payload.
absl::StatusOr<std::pair<storage::SpillRecord, std::string>> ReadAll(Tier& tier,
                                                                     const BlockId& id) {
  std::pair<storage::SpillRecord, std::string> out;
  absl::Status s = tier.Read(id, [&](const storage::SpillRecord& r, absl::string_view p) {
    out = {r, std::string(p)};
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return out;
}

TEST(MemoryTierTest, PutReadDropDelete) {
  MemoryTier tier;
  EXPECT_EQ(tier.name(), "memory tier");
  EXPECT_EQ(tier.level(), TierLevel::kDisk);
  const storage::SpillRecord r1 = RecordOf(1, 5), r2 = RecordOf(2, 0);
  const TierWrite writes[] = {{BlockId(0, 1), &r1, "hello"}, {BlockId(0, 2), &r2, ""}};
  ASSERT_OK(tier.Put(writes, /*sync=*/true));

  ASSERT_OK_AND_ASSIGN(auto got, ReadAll(tier, BlockId(0, 1)));
  EXPECT_EQ(got.second, "hello");
  EXPECT_TRUE(got.first.payload_present());  // Set by the tier, not the caller.
  EXPECT_EQ(got.first.meta().sequence(), 1u);
  // A record written without a payload is a breadcrumb: present, not readable.
  EXPECT_TRUE(tier.HasRecord(BlockId(0, 2)));
  EXPECT_FALSE(tier.Record(BlockId(0, 2))->payload_present());
  EXPECT_THAT(ReadAll(tier, BlockId(0, 2)), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(ReadAll(tier, BlockId(9, 9)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("has no payload")));

  const uint64_t before = tier.UsedBytes();
  EXPECT_GT(before, 5u);
  const TierWrite crumb[] = {{BlockId(0, 1), &r1, ""}};
  ASSERT_OK(tier.DropPayloads(crumb));
  EXPECT_FALSE(tier.HasPayload(BlockId(0, 1)));
  EXPECT_FALSE(tier.Record(BlockId(0, 1))->payload_present());
  EXPECT_THAT(ReadAll(tier, BlockId(0, 1)), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_LE(tier.UsedBytes(), before - 5);  // The payload, and the flag, went.

  const BlockId gone[] = {BlockId(0, 1), BlockId(7, 7)};  // Absent ids are fine.
  ASSERT_OK(tier.Delete(gone));
  EXPECT_THAT(tier.Ids(), ElementsAre(BlockId(0, 2)));

  const MemoryTier::Counters c = tier.counters();
  EXPECT_EQ(c.calls_of(TierOp::kPut), 1u);
  EXPECT_EQ(c.calls_of(TierOp::kRead), 4u);
  EXPECT_EQ(c.calls_of(TierOp::kDropPayloads), 1u);
  EXPECT_EQ(c.calls_of(TierOp::kDelete), 1u);
  EXPECT_EQ(c.blocks_written, 2u);
  EXPECT_EQ(c.synced_puts, 1u);
}

TEST(MemoryTierTest, ForEachRecordInIdOrderSkipsUnparseable) {
  MemoryTier tier;
  const storage::SpillRecord r = RecordOf(0, 1);
  // Written out of order; BlockId order is big-endian byte order.
  const TierWrite writes[] = {{BlockId(2, 0), &r, "c"},
                              {BlockId(0, 5), &r, "a"},
                              {BlockId(1, 0), &r, "b"}};
  ASSERT_OK(tier.Put(writes, false));
  ASSERT_OK(tier.CorruptRecord(BlockId(1, 0)));
  std::vector<BlockId> seen;
  std::vector<std::string> skipped;
  ASSERT_OK(tier.ForEachRecord(
      [&](const BlockId& id, storage::SpillRecord) {
        seen.push_back(id);
        return absl::OkStatus();
      },
      &skipped));
  EXPECT_THAT(seen, ElementsAre(BlockId(0, 5), BlockId(2, 0)));
  ASSERT_THAT(skipped, SizeIs(1));
  EXPECT_THAT(skipped[0], HasSubstr(BlockId(1, 0).ToHex()));
  EXPECT_THAT(ReadAll(tier, BlockId(1, 0)), StatusIs(absl::StatusCode::kDataLoss));

  // The first visit error stops the scan and is returned.
  int visits = 0;
  EXPECT_THAT(tier.ForEachRecord(
                  [&](const BlockId&, storage::SpillRecord) {
                    ++visits;
                    return absl::AbortedError("stop");
                  },
                  nullptr),
              StatusIs(absl::StatusCode::kAborted));
  EXPECT_EQ(visits, 1);
}

TEST(MemoryTierTest, FailNextAndFailAlways) {
  MemoryTier tier;
  const storage::SpillRecord r = RecordOf(0, 1);
  const TierWrite w[] = {{BlockId(0, 1), &r, "x"}};
  tier.FailNext(TierOp::kPut, 2, absl::ResourceExhaustedError("injected: no space"));
  EXPECT_THAT(tier.Put(w, false), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(tier.Put(w, false), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_FALSE(tier.HasRecord(BlockId(0, 1)));  // A failed Put writes nothing.
  ASSERT_OK(tier.Put(w, false));
  EXPECT_TRUE(tier.HasRecord(BlockId(0, 1)));

  const std::pair<TierOp, absl::StatusCode> ops[] = {
      {TierOp::kDropPayloads, absl::StatusCode::kUnavailable},
      {TierOp::kDelete, absl::StatusCode::kUnavailable},
      {TierOp::kRead, absl::StatusCode::kDataLoss},
      {TierOp::kForEachRecord, absl::StatusCode::kUnavailable},
      {TierOp::kPersist, absl::StatusCode::kResourceExhausted},
  };
  for (const auto& [op, code] : ops) {
    tier.FailAlways(op, absl::Status(code, absl::StrCat("injected ", TierOpName(op))));
  }
  for (int round = 0; round < 2; ++round) {
    EXPECT_THAT(tier.DropPayloads(w), StatusIs(absl::StatusCode::kUnavailable));
    const BlockId id = BlockId(0, 1);
    EXPECT_THAT(tier.Delete({&id, 1}), StatusIs(absl::StatusCode::kUnavailable));
    EXPECT_THAT(ReadAll(tier, id), StatusIs(absl::StatusCode::kDataLoss));
    EXPECT_THAT(tier.ForEachRecord([](const BlockId&, storage::SpillRecord) {
                  return absl::OkStatus();
                }, nullptr),
                StatusIs(absl::StatusCode::kUnavailable, HasSubstr("ForEachRecord")));
    EXPECT_THAT(tier.Persist(), StatusIs(absl::StatusCode::kResourceExhausted));
  }
  // Nothing was dropped or deleted by the failing calls.
  EXPECT_TRUE(tier.HasPayload(BlockId(0, 1)));
  EXPECT_EQ(tier.counters().failed_of(TierOp::kRead), 2u);
  EXPECT_EQ(tier.counters().failed_of(TierOp::kPut), 2u);
  tier.ClearFaults();
  EXPECT_OK(tier.Persist());
  EXPECT_OK(ReadAll(tier, BlockId(0, 1)));
}

TEST(MemoryTierTest, TornPutAppliesOnlyTheFirstBlocks) {
  MemoryTier tier;
  const storage::SpillRecord r = RecordOf(0, 1);
  const TierWrite w[] = {{BlockId(0, 1), &r, "a"}, {BlockId(0, 2), &r, "b"},
                         {BlockId(0, 3), &r, "c"}};
  tier.TearNextPut(1);
  EXPECT_THAT(tier.Put(w, true), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("torn")));
  EXPECT_THAT(tier.Ids(), ElementsAre(BlockId(0, 1)));
  EXPECT_EQ(*tier.Payload(BlockId(0, 1)), "a");  // The applied block is whole.
  EXPECT_EQ(tier.counters().synced_puts, 0u);
  // Only the next Put is torn.
  ASSERT_OK(tier.Put(w, false));
  EXPECT_THAT(tier.Ids(), SizeIs(3));
}

TEST(MemoryTierTest, CapacityIsResourceExhaustedAndFreedByDrops) {
  MemoryTierOptions options;
  const storage::SpillRecord r = RecordOf(0, 100);
  const std::string payload(100, 'x');
  // Size of one block as stored.
  MemoryTier sizer;
  const TierWrite one[] = {{BlockId(0, 1), &r, payload}};
  ASSERT_OK(sizer.Put(one, false));
  const uint64_t block_bytes = sizer.UsedBytes();

  options.capacity_bytes = 2 * block_bytes;
  MemoryTier tier(options);
  const TierWrite w[] = {{BlockId(0, 1), &r, payload}, {BlockId(0, 2), &r, payload}};
  ASSERT_OK(tier.Put(w, false));
  EXPECT_EQ(tier.UsedBytes(), 2 * block_bytes);
  const TierWrite third[] = {{BlockId(0, 3), &r, payload}};
  EXPECT_THAT(tier.Put(third, false),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("no space")));
  EXPECT_FALSE(tier.HasRecord(BlockId(0, 3)));
  // Rewriting a block in place needs no new room.
  ASSERT_OK(tier.Put(absl::MakeConstSpan(w, 1), false));
  // A breadcrumb keeps its record: dropping a payload frees less than a
  // block.
  const TierWrite crumb[] = {{BlockId(0, 1), &r, ""}};
  ASSERT_OK(tier.DropPayloads(crumb));
  EXPECT_THAT(tier.Put(third, false), StatusIs(absl::StatusCode::kResourceExhausted));
  const BlockId del = BlockId(0, 1);
  ASSERT_OK(tier.Delete({&del, 1}));
  ASSERT_OK(tier.Put(third, false));
  // A smaller capacity applies to later Puts.
  tier.SetCapacity(block_bytes);
  const TierWrite fourth[] = {{BlockId(0, 4), &r, payload}};
  EXPECT_THAT(tier.Put(fourth, false), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(tier.counters().failed_of(TierOp::kPut), 3u);
}

TEST(MemoryTierTest, CorruptPayloadFlipsOneBit) {
  MemoryTier tier;
  const storage::SpillRecord r = RecordOf(0, 4);
  const TierWrite w[] = {{BlockId(0, 1), &r, std::string("\x00\x00\x00\x00", 4)}};
  ASSERT_OK(tier.Put(w, false));
  ASSERT_OK(tier.CorruptPayload(BlockId(0, 1), 2, 3));
  EXPECT_EQ(*tier.Payload(BlockId(0, 1)), std::string("\x00\x00\x08\x00", 4));
  EXPECT_THAT(tier.CorruptPayload(BlockId(0, 1), 4), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(tier.CorruptPayload(BlockId(0, 9)), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(tier.CorruptRecord(BlockId(0, 9)), StatusIs(absl::StatusCode::kNotFound));
}

TEST(MemoryTierTest, SharedTiersSeeOneStore) {
  MemoryTier control;
  std::unique_ptr<MemoryTier> engine_side = control.Share();
  const storage::SpillRecord r = RecordOf(0, 1);
  const TierWrite w[] = {{BlockId(0, 1), &r, "z"}};
  ASSERT_OK(engine_side->Put(w, false));
  EXPECT_TRUE(control.HasPayload(BlockId(0, 1)));
  control.FailNext(TierOp::kRead, 1, absl::UnavailableError("injected"));
  EXPECT_THAT(ReadAll(*engine_side, BlockId(0, 1)), StatusIs(absl::StatusCode::kUnavailable));
  engine_side.reset();  // The store outlives any one handle.
  EXPECT_OK(ReadAll(control, BlockId(0, 1)));
  EXPECT_EQ(control.counters().calls_of(TierOp::kRead), 2u);
}

TEST(MemoryTierTest, DelayAppliesToItsOpOnly) {
  MemoryTier tier;
  tier.SetDelay(TierOp::kPersist, absl::Milliseconds(50));
  absl::Time start = absl::Now();
  ASSERT_OK(tier.Persist());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  start = absl::Now();
  ASSERT_OK(tier.Delete({}));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(50));
}

TEST(MemoryTierTest, ReadHandsOutACopyTakenUnderTheLock) {
  // Writers racing a reader never show it a mix of two versions.
  MemoryTier tier;
  const storage::SpillRecord ra = RecordOf(1, 4096), rb = RecordOf(2, 4096);
  const std::string a(4096, 'a'), b(4096, 'b');
  const TierWrite wa[] = {{BlockId(0, 1), &ra, a}}, wb[] = {{BlockId(0, 1), &rb, b}};
  ASSERT_OK(tier.Put(wa, false));
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int i = 0; i < 2000; ++i) ASSERT_OK(tier.Put(i % 2 ? wa : wb, false));
    done = true;
  });
  int mixed = 0;
  while (!done) {
    ASSERT_OK(tier.Read(BlockId(0, 1), [&](const storage::SpillRecord& r, absl::string_view p) {
      const char expect = r.meta().sequence() == 1 ? 'a' : 'b';
      if (p != std::string(4096, expect)) ++mixed;
      return absl::OkStatus();
    }));
  }
  writer.join();
  EXPECT_EQ(mixed, 0);
  EXPECT_THAT(tier.Ids(), SizeIs(1));
}

}  // namespace
}  // namespace evoke::testing
