#include "policy/session_driver.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/fake_recovery_source.h"
#include "testing/status_matchers.h"

namespace evoke::policy {
namespace {

using ::evoke::testing::IsOk;
using ::evoke::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Records what the driver asked; 10 bytes per token moved.
class FakeEngine final : public BlockEngine {
 public:
  struct EvictCall {
    BlockHandle handle;
    bool stored;
  };
  struct BringCall {
    BlockHandle handle;
    uint32_t n_tokens;
    int64_t first_position;
  };
  absl::StatusOr<uint64_t> Evict(const ResidentBlock& block, bool stored) override {
    if (!evict_error.ok()) return evict_error;
    evicts.push_back({block.handle, stored});
    return stored ? 0 : 10ull * block.n_tokens;
  }
  absl::StatusOr<uint64_t> Bring(BlockHandle handle, uint32_t n_tokens,
                                 int64_t first_position) override {
    if (!bring_error.ok()) return bring_error;
    brings.push_back({handle, n_tokens, first_position});
    return 10ull * n_tokens;
  }
  std::vector<EvictCall> evicts;
  std::vector<BringCall> brings;
  absl::Status evict_error;
  absl::Status bring_error;
};

std::vector<BlockHandle> Handles(absl::Span<const ResidentBlock> blocks) {
  std::vector<BlockHandle> out;
  for (const ResidentBlock& b : blocks) out.push_back(b.handle);
  return out;
}

class SessionDriverTest : public ::testing::Test {
 protected:
  void Make(const char* name, uint64_t budget, PolicyParams params = {}) {
    params.block_tokens = 8;
    params.sink_tokens = 4;
    policy_ = std::move(MakePolicy(name, params)).value();
    DriverOptions options;
    options.budget_tokens = budget;
    options.block_tokens = 8;
    options.sink_tokens = 4;
    driver_ = std::make_unique<SessionDriver>(policy_.get(), &engine_, &source_, nullptr, options);
  }
  // Decodes `n` tokens the way an engine does: room first, then the token.
  void Decode(int n) {
    for (int i = 0; i < n; ++i) {
      ASSERT_OK(driver_->MakeRoom(1));
      ASSERT_OK(driver_->TokenDecoded(position_++).status());
    }
  }

  FakeEngine engine_;
  FakeRecoverySource source_;
  std::unique_ptr<Policy> policy_;
  std::unique_ptr<SessionDriver> driver_;
  int64_t position_ = 0;
};

TEST_F(SessionDriverTest, BlocksFormAtTheSinkThenAtBlockBoundaries) {
  Make("streaming_llm", 1000);
  std::vector<std::optional<BlockHandle>> formed;
  for (int i = 0; i < 20; ++i) {
    ASSERT_OK_AND_ASSIGN(std::optional<BlockHandle> b, driver_->TokenDecoded(100 + i));
    formed.push_back(b);
  }
  for (int i = 0; i < 20; ++i) {
    const bool boundary = i == 3 || i == 11 || i == 19;
    EXPECT_EQ(formed[i].has_value(), boundary) << i;
  }
  ASSERT_EQ(driver_->resident().size(), 3u);
  const ResidentBlock& sink = driver_->resident()[0];
  EXPECT_EQ(sink.first_token, 0u);
  EXPECT_EQ(sink.n_tokens, 4u);
  EXPECT_EQ(sink.first_position, 100);
  EXPECT_EQ(driver_->resident()[1].first_token, 4u);
  EXPECT_EQ(driver_->resident()[1].n_tokens, 8u);
  EXPECT_EQ(driver_->resident()[1].first_position, 104);
  EXPECT_EQ(driver_->resident()[2].first_token, 12u);
  EXPECT_EQ(driver_->pending_tokens(), 0u);
  ASSERT_OK(driver_->TokenDecoded(120).status());
  EXPECT_EQ(driver_->pending_tokens(), 1u);
  EXPECT_EQ(driver_->resident_tokens(), 21u);
  EXPECT_EQ(driver_->View().session_tokens, 21u);
}

TEST_F(SessionDriverTest, PositionsFollowTheEnginesShifts) {
  Make("streaming_llm", 1000);
  for (int i = 0; i < 22; ++i) ASSERT_OK(driver_->TokenDecoded(i).status());  // 2 pending.
  // The engine compacted the cache by -8 from position 12 (as after removing 4..11).
  driver_->PositionsShifted(12, -8);
  EXPECT_EQ(driver_->resident()[0].first_position, 0);
  EXPECT_EQ(driver_->resident()[1].first_position, 4);   // Below `from`: not moved.
  EXPECT_EQ(driver_->resident()[2].first_position, 4);   // Was 12.
  for (int i = 0; i < 6; ++i) ASSERT_OK(driver_->TokenDecoded(14 + i).status());
  EXPECT_EQ(driver_->resident()[3].first_position, 12);  // Pending started at 20 -> 12.
}

TEST_F(SessionDriverTest, NoSinkBlockWithoutSinkTokens) {
  PolicyParams params;
  policy_ = std::move(MakePolicy("recency", params)).value();
  DriverOptions options;
  options.budget_tokens = 1000;
  options.block_tokens = 8;
  options.sink_tokens = 0;
  SessionDriver driver(policy_.get(), &engine_, nullptr, nullptr, options);
  for (int i = 0; i < 16; ++i) ASSERT_OK(driver.TokenDecoded(i).status());
  ASSERT_EQ(driver.resident().size(), 2u);
  EXPECT_EQ(driver.resident()[0].n_tokens, 8u);
  EXPECT_EQ(driver.resident()[1].first_token, 8u);
}

TEST_F(SessionDriverTest, MakeRoomEvictsThroughTheEngine) {
  Make("streaming_llm", 4 + 2 * 8);  // Sinks + two blocks.
  Decode(20);                        // Sink + 2 blocks: full.
  EXPECT_TRUE(engine_.evicts.empty());
  Decode(1);  // Needs a token: block 1 (tokens 4..11) goes.
  ASSERT_EQ(engine_.evicts.size(), 1u);
  EXPECT_EQ(engine_.evicts[0].handle, 1u);
  EXPECT_FALSE(engine_.evicts[0].stored);
  EXPECT_TRUE(driver_->IsStored(1));
  EXPECT_THAT(Handles(driver_->resident()), ElementsAre(0u, 2u));
  EXPECT_EQ(driver_->stats().blocks_saved, 1u);
  EXPECT_EQ(driver_->stats().bytes_moved, 80u);
  EXPECT_LE(driver_->resident_tokens(), 20u);
  Decode(40);
  EXPECT_LE(driver_->resident_tokens(), 20u);
  EXPECT_EQ(driver_->resident()[0].handle, 0u);  // The sink stayed.
}

TEST_F(SessionDriverTest, MakeRoomRefusesWhatThePolicyCannotFree) {
  Make("streaming_llm", 4 + 8);
  Decode(12);
  EXPECT_THAT(driver_->MakeRoom(9), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_TRUE(engine_.evicts.empty());
}

TEST_F(SessionDriverTest, EvictFailureIsReturnedAndBooksUnchanged) {
  Make("streaming_llm", 4 + 16);
  Decode(20);
  engine_.evict_error = absl::UnavailableError("daemon down");
  EXPECT_THAT(driver_->MakeRoom(1), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(Handles(driver_->resident()), ElementsAre(0u, 1u, 2u));
  EXPECT_FALSE(driver_->IsStored(1));
  EXPECT_EQ(driver_->stats().blocks_saved, 0u);
  engine_.evict_error = absl::OkStatus();
  EXPECT_OK(driver_->MakeRoom(1));
  EXPECT_THAT(Handles(driver_->resident()), ElementsAre(0u, 2u));
}

TEST_F(SessionDriverTest, RecoveryBringsBlocksAtTheTailAndAdvancesPositions) {
  PolicyParams params;
  params.evoke_topk = 2;
  params.evoke_resident_gate = false;
  Make("evoke", 4 + 3 * 8, params);
  Decode(36);  // Sink 0, blocks 1..4; 1 was evicted.
  ASSERT_EQ(engine_.evicts.size(), 1u);
  Decode(8);  // Block 2 evicted too.
  ASSERT_TRUE(driver_->IsStored(1));
  ASSERT_TRUE(driver_->IsStored(2));
  ASSERT_OK(driver_->SetSummary(3, {5.0f, 5.0f}));
  // The source knows both stored blocks, and one the driver never stored.
  source_.AddWithScore(1, 8, 0.9f);
  source_.AddWithScore(2, 8, 0.5f);
  source_.AddWithScore(77, 8, 1.0f);
  int64_t next = position_;
  const std::vector<float> q = {1, 0};
  ASSERT_OK(driver_->RecoveryPoint({q, 1}, &next));
  // Two chosen (77 and 1); 77 is unknown and skipped; 1 lands at the tail.
  ASSERT_EQ(engine_.brings.size(), 1u);
  EXPECT_EQ(engine_.brings[0].handle, 1u);
  EXPECT_EQ(engine_.brings[0].n_tokens, 8u);
  EXPECT_EQ(engine_.brings[0].first_position, position_);
  EXPECT_EQ(next, position_ + 8);
  const ResidentBlock& back = driver_->resident().back();
  EXPECT_EQ(back.handle, 1u);
  EXPECT_TRUE(back.recovered);
  EXPECT_EQ(back.first_token, 4u);
  EXPECT_EQ(back.first_position, position_);
  EXPECT_LE(driver_->resident_tokens(), 28u);
  EXPECT_EQ(driver_->stats().blocks_recovered, 1u);
  EXPECT_EQ(driver_->stats().recovery_points, 1u);
  // Block 3 (the oldest entered) made room.
  EXPECT_THAT(Handles(driver_->resident()), ::testing::Not(::testing::Contains(3u)));
  // Evicting the recovered block again drops it: no second save.
  position_ = next;
  source_.SetResident(1, true);
  const size_t before = engine_.evicts.size();
  Decode(24);
  bool dropped = false;
  for (size_t i = before; i < engine_.evicts.size(); ++i) {
    const FakeEngine::EvictCall& e = engine_.evicts[i];
    if (e.handle == 1u) {
      EXPECT_TRUE(e.stored);
      dropped = true;
    }
  }
  EXPECT_TRUE(dropped);
  EXPECT_EQ(driver_->stats().blocks_dropped, 1u);
}

TEST_F(SessionDriverTest, SummariesComeBackWithTheBlock) {
  PolicyParams params;
  params.evoke_resident_gate = false;
  params.evoke_topk = 1;
  Make("evoke", 4 + 2 * 8, params);
  Decode(12);
  ASSERT_OK(driver_->SetSummary(1, {1.0f, 2.0f}));
  Decode(16);  // Block 1 evicted.
  ASSERT_TRUE(driver_->IsStored(1));
  source_.AddWithScore(1, 8, 1.0f);
  int64_t next = position_;
  ASSERT_OK(driver_->RecoveryPoint({std::vector<float>{1, 0}, 1}, &next));
  ASSERT_EQ(driver_->resident().back().handle, 1u);
  EXPECT_THAT(driver_->resident().back().summary, ElementsAre(1.0f, 2.0f));
  EXPECT_THAT(driver_->SetSummary(99, {}), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(SessionDriverTest, CandidatesThatDoNotFitDropTheWeakest) {
  PolicyParams params;
  params.evoke_topk = 3;
  params.evoke_resident_gate = false;
  Make("evoke", 4 + 2 * 8, params);
  Decode(44);  // Blocks 1..3 evicted, 4 and 5 resident.
  ASSERT_TRUE(driver_->IsStored(3));
  source_.AddWithScore(1, 8, 0.1f);
  source_.AddWithScore(2, 8, 0.2f);
  source_.AddWithScore(3, 8, 0.3f);
  int64_t next = position_;
  ASSERT_OK(driver_->RecoveryPoint({std::vector<float>{1, 0}, 1}, &next));
  // Room for two blocks next to the sink: the best two, weaker first.
  ASSERT_EQ(engine_.brings.size(), 2u);
  EXPECT_EQ(engine_.brings[0].handle, 2u);
  EXPECT_EQ(engine_.brings[1].handle, 3u);
  EXPECT_EQ(engine_.brings[1].first_position, position_ + 8);
  EXPECT_THAT(Handles(driver_->resident()), ElementsAre(0u, 2u, 3u));
}

TEST_F(SessionDriverTest, SourceUnavailableDegradesAndDecodingGoesOn) {
  Make("evoke", 4 + 2 * 8);
  Decode(28);
  source_.SetError(absl::UnavailableError("daemon down"));
  int64_t next = position_;
  EXPECT_OK(driver_->RecoveryPoint({std::vector<float>{1, 0}, 1}, &next));
  EXPECT_OK(driver_->RecoveryPoint({std::vector<float>{1, 0}, 1}, &next));
  EXPECT_EQ(next, position_);
  EXPECT_EQ(driver_->stats().recovery_failures, 2u);
  EXPECT_EQ(driver_->stats().recovery_points, 2u);
  EXPECT_TRUE(engine_.brings.empty());
  Decode(16);  // Decoding goes on.
  // Back up: recovery works again.
  source_.SetError(absl::OkStatus());
  source_.AddWithScore(1, 8, 1.0f);
  next = position_;
  EXPECT_OK(driver_->RecoveryPoint({std::vector<float>{1, 0}, 1}, &next));
  EXPECT_EQ(engine_.brings.size(), 1u);
  EXPECT_EQ(driver_->stats().recovery_failures, 2u);
}

TEST_F(SessionDriverTest, BringFailureDegrades) {
  PolicyParams params;
  params.evoke_resident_gate = false;
  Make("evoke", 4 + 2 * 8, params);
  Decode(28);
  source_.AddWithScore(1, 8, 1.0f);
  engine_.bring_error = absl::UnavailableError("daemon down");
  int64_t next = position_;
  EXPECT_OK(driver_->RecoveryPoint({std::vector<float>{1, 0}, 1}, &next));
  EXPECT_EQ(next, position_);
  EXPECT_EQ(driver_->stats().recovery_failures, 1u);
  EXPECT_EQ(driver_->stats().blocks_recovered, 0u);
  for (const ResidentBlock& b : driver_->resident()) EXPECT_NE(b.handle, 1u);
}

TEST_F(SessionDriverTest, AnEngineResourceExhaustedWhileMakingRoomIsReturned) {
  // evoked answers RESOURCE_EXHAUSTED for a tier 1 full of pinned blocks:
  // that is the engine's error, not the policy saying the picks cannot fit,
  // so it comes back as it is and nothing is brought.
  PolicyParams params;
  params.evoke_resident_gate = false;
  Make("evoke", 4 + 2 * 8, params);
  Decode(28);
  source_.AddWithScore(1, 8, 1.0f);
  source_.AddWithScore(2, 8, 2.0f);
  engine_.evict_error = absl::ResourceExhaustedError("tier 1 is full of pinned blocks");
  int64_t next = position_;
  EXPECT_THAT(driver_->RecoveryPoint({std::vector<float>{1, 0}, 1}, &next),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("pinned")));
  EXPECT_EQ(next, position_);
  EXPECT_TRUE(engine_.brings.empty());
}

TEST_F(SessionDriverTest, RecoveryLessPoliciesNeverAskTheSource) {
  Make("streaming_llm", 4 + 2 * 8);
  Decode(28);
  source_.AddWithScore(1, 8, 1.0f);
  int64_t next = position_;
  EXPECT_OK(driver_->RecoveryPoint({std::vector<float>{1, 0}, 1}, &next));
  EXPECT_EQ(source_.calls(), 0);
  EXPECT_EQ(driver_->stats().recovery_points, 1u);
}

}  // namespace
}  // namespace evoke::policy
