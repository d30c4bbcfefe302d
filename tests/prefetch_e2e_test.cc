// Prefetch against a real evoked: blocks in tier 2 brought into tier 1
// ahead of their Loads, which then read them from tier 1 (waited for, or
// polled with Lookup), under other clients' writes too; bad requests are
// refused, naming the field.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "tests/e2e_fixture.h"

namespace evoke::testing {
namespace {

using ::testing::HasSubstr;

// 256 KiB per block (128 tokens of SmallFingerprint).
constexpr uint32_t kTokens = 128;

class PrefetchTest : public E2eTest {
 protected:
  // Tier 1 of 8 MiB (32 blocks).
  void SetUp() override {
    StartDaemon({"--pinned-bytes", "8MiB", "--max-calls-per-uid", "64"});
  }

  static std::vector<BlockId> IdsOf(const std::vector<TestBlock>& blocks) {
    std::vector<BlockId> ids;
    for (const TestBlock& b : blocks) ids.push_back(b.id());
    return ids;
  }

  // Saves `n` blocks of `session` and leaves them in tier 2 only.
  std::vector<TestBlock> SavedToDisk(const std::string& session, int n) {
    std::vector<TestBlock> blocks;
    for (int i = 0; i < n; ++i) blocks.push_back(SessionBlock(session, i, kTokens));
    EXPECT_OK(SaveBlocks(*client_, blocks));
    EXPECT_OK(client_->Flush(/*evict=*/true));
    return blocks;
  }

  // Loads each block and returns how many came from tier 1 (bytes checked).
  int LoadFromTier1(const std::vector<TestBlock>& blocks) {
    int hits = 0;
    for (const TestBlock& b : blocks) {
      absl::StatusOr<std::vector<LoadedBlock>> got = client_->Load({b.id()}, SmallFingerprint());
      EXPECT_OK(got);
      if (!got.ok()) continue;
      EXPECT_TRUE((*got)[0].payload == b.payload);
      hits += (*got)[0].served_from == v1::TIER_PINNED_HOST;
    }
    return hits;
  }
};

TEST_F(PrefetchTest, AWaitedPrefetchLeavesEveryBlockInTierOne) {
  const std::vector<TestBlock> blocks = SavedToDisk("w", 8);
  std::vector<BlockId> ids = IdsOf(blocks);
  ids.push_back(SessionBlock("absent", 0, kTokens).id());
  Client::PrefetchOptions options;
  options.wait = true;
  ASSERT_OK_AND_ASSIGN(v1::PrefetchResponse r, client_->Prefetch(ids, options));
  EXPECT_TRUE(r.done());
  EXPECT_EQ(r.promoted(), 8u);
  EXPECT_EQ(r.missing(), 1u);
  EXPECT_EQ(LoadFromTier1(blocks), 8);
  const v1::StatResponse st = Stat();
  EXPECT_EQ(st.counters().prefetched(), 8u);
  EXPECT_EQ(st.counters().prefetch_hits(), 8u);
}

TEST_F(PrefetchTest, AQueuedPrefetchIsSeenByPollingLookup) {
  const std::vector<TestBlock> blocks = SavedToDisk("p", 8);
  const std::vector<BlockId> ids = IdsOf(blocks);
  ASSERT_OK_AND_ASSIGN(v1::PrefetchResponse r, client_->Prefetch(ids));
  EXPECT_FALSE(r.done());
  EXPECT_TRUE(WaitUntil([&] {
    absl::StatusOr<std::vector<v1::Tier>> tiers = client_->Lookup(ids);
    if (!tiers.ok() || tiers->size() != ids.size()) return false;
    for (v1::Tier t : *tiers) {
      if (t != v1::TIER_PINNED_HOST) return false;
    }
    return true;
  }));
  EXPECT_EQ(LoadFromTier1(blocks), 8);
}

// The measure: loads right after a completed prefetch, while 8
// other clients write through tier 1 (each round's blocks are new to it).
TEST_F(PrefetchTest, LoadsAfterAPrefetchHitTierOneUnderOtherClientsWrites) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;
  StopAndJoin joiner{stop, writers};
  for (int w = 0; w < 8; ++w) {
    writers.emplace_back([&, w] {
      std::unique_ptr<Client> c = daemon_->Connect();
      for (uint64_t i = 0; !stop.load(); ++i) {
        (void)SaveBlocks(*c, {SessionBlock("w" + std::to_string(w), i, kTokens)});
      }
    });
  }
  int loads = 0, hits = 0;
  Client::PrefetchOptions options;
  options.wait = true;
  options.room_wait_ms = 5000;
  for (int round = 0; round < 50; ++round) {
    const std::vector<TestBlock> blocks = SavedToDisk("r" + std::to_string(round), 4);
    ASSERT_OK_AND_ASSIGN(v1::PrefetchResponse r, client_->Prefetch(IdsOf(blocks), options));
    ASSERT_EQ(r.promoted() + r.in_tier1(), 4u) << r.ShortDebugString();
    loads += 4;
    hits += LoadFromTier1(blocks);
  }
  std::printf("loads after a prefetch: %d of %d from tier 1\n", hits, loads);
  // 8 writers of 256 KiB blocks pass a 32-block tier 1 within milliseconds;
  // prefetched blocks not read yet are the spiller's last choice (without
  // that, 69 of 100 came from tier 1). The goal: 99%.
  EXPECT_GE(hits * 100, loads * 99);
}

TEST_F(PrefetchTest, RefusesBadRequestsNamingTheField) {
  const TestBlock b = SessionBlock("bad", 0, kTokens);
  EXPECT_THAT(client_->Prefetch({}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ids")));
  EXPECT_THAT(client_->Prefetch({b.id(), b.id()}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ids[1]")));
  Client::PrefetchOptions options;
  options.room_wait_ms = 3'600'000;
  EXPECT_THAT(client_->Prefetch({b.id()}, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("room_wait_ms")));
  v1::LayoutFingerprint fp = SmallFingerprint();
  fp.set_head_dim(0);
  options = Client::PrefetchOptions();
  options.fingerprint = &fp;
  EXPECT_THAT(client_->Prefetch({b.id()}, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fingerprint.")));
  // Still serving.
  ASSERT_OK(SaveBlocks(*client_, {b}));
  EXPECT_EQ(LoadFromTier1({b}), 1);
}

}  // namespace
}  // namespace evoke::testing
