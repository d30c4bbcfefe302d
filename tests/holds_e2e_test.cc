// Holds against a real evoked. Acquire and Release: what a handle holds
// stays loadable while other clients evict both tiers around it, until it
// is released or its lease ends; bad handles are refused, naming the field.
// KeepSession: a kept session outlives the pressure of other clients for
// its seconds; bad requests are refused, naming the field. Retention
// classes: high blocks stay, low ones go first; a policy caps the class.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
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

class AcquireTest : public E2eTest {
 protected:
  // Tier 1 of 4 MiB (16 blocks), a spill budget of 4 MiB: a few hundred
  // saves push the oldest blocks through both tiers into breadcrumbs.
  void SetUp() override {
    // The 16 writers and this test's client share one uid: room for all.
    StartDaemon({"--pinned-bytes", "4MiB", "--spill-bytes", "4MiB", "--max-calls-per-uid", "64"});
  }

  std::vector<BlockId> IdsOf(const std::vector<TestBlock>& blocks) {
    std::vector<BlockId> ids;
    for (const TestBlock& b : blocks) ids.push_back(b.id());
    return ids;
  }
};

// The case: 16 clients evicting. Each round saves a chain, acquires
// it, lets the writers push far more than both tiers hold through, then
// loads what the handle holds: never NOT_FOUND, the bytes exact.
// (Without the hold, the odd rounds' chains become breadcrumbs.)
TEST_F(AcquireTest, HeldBlocksSurvive16EvictingClients) {
  std::atomic<bool> stop{false}, paused{false};
  std::atomic<uint64_t> saved{0};
  std::atomic<int> saving{0};
  std::vector<std::thread> writers;
  StopAndJoin joiner{stop, writers};
  for (int w = 0; w < 16; ++w) {
    writers.emplace_back([&, w] {
      std::unique_ptr<Client> c = daemon_->Connect();
      for (uint64_t i = 0; !stop.load(); ++i) {
        const TestBlock b = SessionBlock("w" + std::to_string(w), i, kTokens);
        ++saving;
        if (paused.load()) {
          --saving;
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          continue;
        }
        if (SaveBlocks(*c, {b}).ok()) ++saved;
        --saving;
      }
    });
  }
  for (int round = 0; round < 4; ++round) {
    std::vector<TestBlock> chain;
    for (int i = 0; i < 4; ++i) chain.push_back(SessionBlock("r" + std::to_string(round), i, kTokens));
    // The writers pause from the chain's Save to its Acquire: otherwise
    // they could evict it before it is acquired (the race Acquire closes
    // from then on).
    paused = true;
    ASSERT_TRUE(WaitUntil([&] { return saving.load() == 0; }));
    ASSERT_OK(SaveBlocks(*client_, chain));
    // Odd rounds hold the chain where only tier 2 has it (the spill budget's
    // victims); even rounds in tier 1 (the spiller's).
    if (round % 2 == 1) {
      ASSERT_OK(client_->Flush(/*evict=*/true));
    }
    ASSERT_OK_AND_ASSIGN(Client::Acquired held, client_->Acquire(IdsOf(chain)));
    paused = false;
    ASSERT_EQ(held.tiers.size(), 4u);
    if (round % 2 == 1) {
      EXPECT_EQ(held.tiers[0], v1::TIER_SPILL);
    }
    ASSERT_NE(held.handle, 0u);
    // Far more than tier 1 and the spill budget together pass through.
    const uint64_t target = saved.load() + 80;
    ASSERT_TRUE(WaitUntil([&] { return saved.load() >= target; }, absl::Seconds(60)));
    for (size_t i = 0; i < chain.size(); ++i) {
      absl::StatusOr<std::vector<LoadedBlock>> got =
          client_->Load({chain[i].id()}, SmallFingerprint());
      ASSERT_OK(got) << "round " << round << " block " << i;
      EXPECT_TRUE((*got)[0].payload == chain[i].payload);
    }
    ASSERT_OK_AND_ASSIGN(uint32_t released, client_->Release(held.handle));
    EXPECT_EQ(released, 4u);
  }
  const v1::StatResponse st = Stat();
  EXPECT_GT(st.counters().breadcrumbs(), 0u);  // Tier 2 did evict.
  EXPECT_EQ(st.pinned_blocks(), 0u);
}

TEST_F(AcquireTest, ModesHandlesAndLeases) {
  std::vector<TestBlock> chain;
  for (int i = 0; i < 3; ++i) chain.push_back(SessionBlock("m", i, 16));
  ASSERT_OK(SaveBlocks(*client_, chain));
  const TestBlock absent = SessionBlock("absent", 0, 16);
  const std::vector<BlockId> asked = {chain[0].id(), chain[1].id(), absent.id(), chain[2].id()};

  // PREFIX: the run up to the first miss; ALL: NOT_FOUND naming it.
  ASSERT_OK_AND_ASSIGN(Client::Acquired run, client_->Acquire(asked));
  EXPECT_EQ(run.tiers.size(), 2u);
  EXPECT_THAT(client_->Acquire(asked, v1::ACQUIRE_MODE_ALL),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("ids[2]")));
  ASSERT_OK_AND_ASSIGN(Client::Acquired none, client_->Acquire({absent.id()}));
  EXPECT_EQ(none.handle, 0u);
  EXPECT_TRUE(none.tiers.empty());
  ASSERT_OK_AND_ASSIGN(v1::BlockInfo info, client_->Describe(chain[0].id()));
  EXPECT_EQ(info.pin_count(), 1u);

  // Bad handles, each refused naming the field; another lease's handle
  // reads as an unknown one.
  EXPECT_THAT(client_->Release(0), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("handle")));
  EXPECT_THAT(client_->Release(run.handle + 1000),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("handle")));
  std::unique_ptr<Client> other = daemon_->Connect();
  ASSERT_OK(other->OpenLease("other"));
  EXPECT_THAT(other->Release(run.handle),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("handle")));
  auto stub = RawStub(daemon_->socket());
  {
    grpc::ClientContext context;
    v1::AcquireRequest request;
    request.add_ids(chain[0].id().ToBytes());
    v1::AcquireResponse response;
    const grpc::Status s = stub->Acquire(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("lease_id"));
  }
  {
    grpc::ClientContext context;
    v1::AcquireRequest request;
    request.add_ids(chain[0].id().ToBytes());
    request.set_lease_id(std::string(16, 'x'));
    request.set_mode(static_cast<v1::AcquireMode>(9));
    v1::AcquireResponse response;
    const grpc::Status s = stub->Acquire(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("mode"));
  }

  // The other client's handle ends with its lease (the client goes away).
  ASSERT_OK_AND_ASSIGN(Client::Acquired theirs, other->Acquire({chain[2].id()}));
  EXPECT_EQ(theirs.tiers.size(), 1u);
  ASSERT_OK_AND_ASSIGN(info, client_->Describe(chain[2].id()));
  EXPECT_EQ(info.pin_count(), 1u);
  other.reset();
  EXPECT_TRUE(Eventually(
      [&] {
        absl::StatusOr<v1::BlockInfo> i = client_->Describe(chain[2].id());
        return i.ok() && i->pin_count() == 0;
      },
      "the ended lease's handle is released"));
  ASSERT_OK_AND_ASSIGN(uint32_t released, client_->Release(run.handle));
  EXPECT_EQ(released, 2u);
  EXPECT_EQ(Stat().pinned_blocks(), 0u);
}

// A client with a command ring acquires and releases through it (no RPC
// each): the same answers as the RPCs, counted as ring.Acquire and
// ring.Release.
TEST_F(AcquireTest, AClientWithARingAcquiresThroughIt) {
  std::vector<TestBlock> chain;
  for (int i = 0; i < 3; ++i) chain.push_back(SessionBlock("ringed", i, 16));
  ASSERT_OK(SaveBlocks(*client_, chain));
  ASSERT_OK_AND_ASSIGN(auto region, client_->CreateSharedRegion(1 << 20));
  ASSERT_TRUE(client_->has_ring());
  const TestBlock absent = SessionBlock("ringed-absent", 0, 16);
  ASSERT_OK_AND_ASSIGN(Client::Acquired held,
                       client_->Acquire({chain[0].id(), chain[1].id(), absent.id()}));
  EXPECT_NE(held.handle, 0u);
  EXPECT_EQ(held.tiers, std::vector<v1::Tier>(2, v1::TIER_PINNED_HOST));
  EXPECT_THAT(client_->Acquire({chain[2].id(), absent.id()}, v1::ACQUIRE_MODE_ALL),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("ids[1]")));
  ASSERT_OK_AND_ASSIGN(v1::BlockInfo info, client_->Describe(chain[1].id()));
  EXPECT_EQ(info.pin_count(), 1u);
  ASSERT_OK_AND_ASSIGN(uint32_t released, client_->Release(held.handle));
  EXPECT_EQ(released, 2u);
  EXPECT_THAT(client_->Release(held.handle),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("handle")));
  uint64_t ring_acquires = 0, ring_releases = 0, rpc_acquires = 0;
  const v1::StatResponse st = Stat();
  for (const v1::RpcStat& r : st.rpcs()) {
    if (r.method() == "ring.Acquire") ring_acquires = r.calls();
    if (r.method() == "ring.Release") ring_releases = r.calls();
    if (r.method() == "Acquire") rpc_acquires = r.calls();
  }
  EXPECT_EQ(ring_acquires, 2u);
  EXPECT_EQ(ring_releases, 2u);
  EXPECT_EQ(rpc_acquires, 0u);
}

// An agent's session, kept through a "tool call" while 8 other clients save
// four times tier 1 and the spill budget together, loads from tier 1 after
// it; the same session not kept does not.
TEST_F(AcquireTest, AKeptSessionOutlivesOtherClientsPressure) {
  for (bool keep : {true, false}) {
    const std::string session = keep ? "kept" : "unkept";
    std::vector<TestBlock> blocks;
    for (int i = 0; i < 4; ++i) blocks.push_back(SessionBlock(session, i, kTokens));
    ASSERT_OK(SaveBlocks(*client_, blocks));
    if (keep) {
      ASSERT_OK_AND_ASSIGN(uint32_t n, client_->KeepSession("test", session, 60));
      EXPECT_EQ(n, 4u);
    }
    std::vector<std::thread> others;
    for (int w = 0; w < 8; ++w) {
      others.emplace_back([&, w] {
        std::unique_ptr<Client> c = daemon_->Connect();
        for (int i = 0; i < 16; ++i) {
          EXPECT_OK(SaveBlocks(*c, {SessionBlock(session + "-other" + std::to_string(w), i,
                                                 kTokens)}));
        }
      });
    }
    for (std::thread& t : others) t.join();
    int in_tier1 = 0;
    for (const TestBlock& b : blocks) {
      absl::StatusOr<std::vector<LoadedBlock>> got = client_->Load({b.id()}, SmallFingerprint());
      if (keep) {
        ASSERT_OK(got);
        EXPECT_TRUE((*got)[0].payload == b.payload);
      }
      in_tier1 += got.ok() && (*got)[0].served_from == v1::TIER_PINNED_HOST;
    }
    EXPECT_EQ(in_tier1, keep ? 4 : 0) << session;
  }
  const v1::StatResponse st = Stat();
  EXPECT_EQ(st.kept_sessions(), 1u);
  EXPECT_EQ(st.counters().keep_overrides(), 0u);
  ASSERT_OK(client_->KeepSession("test", "kept", 0));
  EXPECT_EQ(Stat().kept_sessions(), 0u);
}

TEST_F(AcquireTest, KeepSessionRefusesBadRequestsNamingTheField) {
  EXPECT_THAT(client_->KeepSession("", "s", 10),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("namespace")));
  EXPECT_THAT(client_->KeepSession("test", "", 10),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("session_id")));
  EXPECT_THAT(client_->KeepSession("test", "s", 86401),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("seconds")));
  // An unknown session may be kept: its blocks may be about to come.
  ASSERT_OK_AND_ASSIGN(uint32_t n, client_->KeepSession("test", "not-yet", 10));
  EXPECT_EQ(n, 0u);
}

// Retention classes: a HIGH chain stays in tier 1 while 8 clients write
// twice tiers 1 and 2 through it, and a LOW chain leaves it first.
TEST_F(AcquireTest, RetentionClassesOrderEvictionUnderOtherClientsWrites) {
  // Older blocks of no class, then three high (within the quarter of tier 1
  // that keeps protect), then three low: the newest.
  std::vector<TestBlock> old, high, low;
  for (int i = 0; i < 4; ++i) old.push_back(SessionBlock("old", i, kTokens));
  for (int i = 0; i < 3; ++i) {
    high.push_back(SessionBlock("high", i, kTokens));
    low.push_back(SessionBlock("low", i, kTokens));
  }
  ASSERT_OK(SaveBlocks(*client_, old));
  ASSERT_OK(SaveBlocks(*client_, high));
  ASSERT_OK(SaveBlocks(*client_, low));
  ASSERT_OK(client_->SetRetention(IdsOf(high), v1::RETENTION_HIGH, 60));
  ASSERT_OK(client_->SetRetention(IdsOf(low), v1::RETENTION_LOW, 0));
  EXPECT_EQ(Stat().high_blocks(), 3u);
  EXPECT_EQ(Stat().low_blocks(), 3u);
  // Tier 1 past its high watermark (16 blocks): about four leave, the low
  // ones first, though older blocks are there.
  std::vector<TestBlock> some;
  for (int i = 0; i < 6; ++i) some.push_back(SessionBlock("some", i, kTokens));
  ASSERT_OK(SaveBlocks(*client_, some));
  WaitForSpillToSettle();
  for (const TestBlock& b : low) {
    ASSERT_OK_AND_ASSIGN(v1::BlockInfo info, client_->Describe(b.id()));
    EXPECT_NE(info.tier(), v1::TIER_PINNED_HOST);
  }
  ASSERT_OK_AND_ASSIGN(v1::BlockInfo newest_old, client_->Describe(old[3].id()));
  EXPECT_EQ(newest_old.tier(), v1::TIER_PINNED_HOST);
  std::vector<std::thread> writers;
  for (int w = 0; w < 8; ++w) {
    writers.emplace_back([&, w] {
      std::unique_ptr<Client> c = daemon_->Connect();
      for (int i = 0; i < 8; ++i) {
        (void)SaveBlocks(*c, {SessionBlock("p" + std::to_string(w), i, kTokens)});
      }
    });
  }
  for (std::thread& t : writers) t.join();
  WaitForSpillToSettle();
  for (const TestBlock& b : high) {
    ASSERT_OK_AND_ASSIGN(v1::BlockInfo info, client_->Describe(b.id()));
    EXPECT_EQ(info.tier(), v1::TIER_PINNED_HOST);
  }
  // Bad requests name the field.
  EXPECT_THAT(client_->SetRetention(IdsOf(high), v1::RETENTION_UNSPECIFIED, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("retention")));
  EXPECT_THAT(client_->SetRetention(IdsOf(high), v1::RETENTION_HIGH, 86401),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ttl_seconds")));
  EXPECT_THAT(client_->SetRetention({high[0].id(), SessionBlock("absent", 0, kTokens).id()},
                                    v1::RETENTION_LOW, 0),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("ids[1]")));
}

// A namespace's policy caps the class its callers may set (and keeps,
// which are class high).
TEST_F(AcquireTest, APolicyCapsTheRetentionClass) {
  const std::string policy = dir_.Join("policy.textproto");
  std::ofstream(policy) << "principals { name: \"me\" uids: " << geteuid()
                        << " namespaces: \"*\" admin: true }\n"
                        << "namespaces { name: \"test\" max_retention: 2 }\n";
  client_.reset();
  daemon_.reset();
  StartDaemon({"--policy", policy});
  const TestBlock b = SessionBlock("capped", 0, kTokens);
  ASSERT_OK(SaveBlocks(*client_, {b}));
  EXPECT_THAT(client_->SetRetention({b.id()}, v1::RETENTION_HIGH, 10),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("max_retention")));
  EXPECT_OK(client_->SetRetention({b.id()}, v1::RETENTION_LOW, 10));
  EXPECT_THAT(client_->KeepSession("test", "capped", 10),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("max_retention")));
  EXPECT_OK(client_->KeepSession("test", "capped", 0));
}

}  // namespace
}  // namespace evoke::testing
