// WatchBlocks against a real evoked: a block's life as events, in order;
// a watcher that reconnects with its resume token misses nothing while 16
// clients save; one that stops reading is dropped and told what it lost
// when it comes back; bad requests are refused, naming the field.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/time/clock.h"
#include "evoke/v1/kvtier.grpc.pb.h"
#include "gmock/gmock.h"
#include "tests/e2e_fixture.h"

namespace evoke::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kTokens = 16;

class WatchTest : public E2eTest {
 protected:
  void SetUp() override { StartDaemon({"--max-calls-per-uid", "64"}); }
  // Stops this test's daemon and starts another in its directory.
  void StartAnother(const std::vector<std::string>& flags) {
    client_.reset();
    daemon_.reset();
    StartDaemon(flags);
  }

  static std::vector<BlockId> IdsOf(const std::vector<TestBlock>& blocks) {
    std::vector<BlockId> ids;
    for (const TestBlock& b : blocks) ids.push_back(b.id());
    return ids;
  }

  std::unique_ptr<BlockWatch> Watch(const v1::WatchBlocksRequest& request,
                                    v1::BlockEvents* first) {
    absl::StatusOr<std::unique_ptr<BlockWatch>> w = client_->WatchBlocks(request);
    EXPECT_OK(w);
    if (!w.ok()) return nullptr;
    EXPECT_TRUE((*w)->Next(first));
    return *std::move(w);
  }

  // Reads events until `want` of them (in order) arrived.
  static std::vector<v1::BlockEvent> ReadEvents(BlockWatch& w, size_t want) {
    std::vector<v1::BlockEvent> out;
    v1::BlockEvents batch;
    while (out.size() < want && w.Next(&batch)) {
      for (const v1::BlockEvent& e : batch.events()) out.push_back(e);
    }
    return out;
  }
};

TEST_F(WatchTest, ABlocksLifeArrivesInOrder) {
  v1::BlockEvents first;
  std::unique_ptr<BlockWatch> w = Watch(v1::WatchBlocksRequest(), &first);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(first.events_size(), 0);
  EXPECT_EQ(first.resume_token().size(), 16u);
  EXPECT_EQ(first.lost_events(), 0u);
  EXPECT_EQ(Stat().watchers(), 1u);

  const TestBlock b = SessionBlock("life", 0, kTokens);
  ASSERT_OK(SaveBlocks(*client_, {b}));
  ASSERT_OK(client_->Flush(/*evict=*/false));  // Spilled.
  ASSERT_OK(client_->Flush(/*evict=*/true));   // Demoted.
  ASSERT_OK(client_->Load({b.id()}, SmallFingerprint()));  // Promoted.
  ASSERT_OK(client_->Delete({b.id()}));        // Removed.

  const std::vector<v1::BlockEvent> events = ReadEvents(*w, 5);
  ASSERT_EQ(events.size(), 5u);
  const v1::BlockEventKind kinds[] = {v1::BLOCK_EVENT_STORED, v1::BLOCK_EVENT_SPILLED,
                                      v1::BLOCK_EVENT_DEMOTED, v1::BLOCK_EVENT_PROMOTED,
                                      v1::BLOCK_EVENT_REMOVED};
  const v1::Tier locations[] = {v1::TIER_PINNED_HOST, v1::TIER_PINNED_HOST, v1::TIER_SPILL,
                                v1::TIER_PINNED_HOST, v1::TIER_BREADCRUMB};
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].kind(), kinds[i]) << i;
    EXPECT_EQ(events[i].location(), locations[i]) << i;
    EXPECT_EQ(events[i].id(), b.id().ToBytes()) << i;
    EXPECT_EQ(events[i].namespace_(), SmallFingerprint().namespace_()) << i;
    EXPECT_EQ(events[i].block_kind(), v1::BLOCK_KIND_SESSION) << i;
    if (i > 0) {
      EXPECT_GT(events[i].seq(), events[i - 1].seq());
    }
  }
  EXPECT_EQ(events[1].tier(), v1::TIER_SPILL);
  EXPECT_EQ(events[2].tier(), v1::TIER_PINNED_HOST);
  w->Cancel();
}

// A retention class with a ttl: one EXPIRED event when it runs out, to a
// watcher that asked for that kind only.
TEST_F(WatchTest, ARetentionClassRunningOutIsAnExpiredEvent) {
  v1::WatchBlocksRequest request;
  request.add_kinds(v1::BLOCK_EVENT_EXPIRED);
  v1::BlockEvents first;
  std::unique_ptr<BlockWatch> w = Watch(request, &first);
  ASSERT_NE(w, nullptr);
  const TestBlock b = SessionBlock("ttl", 0, kTokens);
  ASSERT_OK(SaveBlocks(*client_, {b}));
  const absl::Time set = absl::Now();
  ASSERT_OK(client_->SetRetention({b.id()}, v1::RETENTION_HIGH, 1));
  const std::vector<v1::BlockEvent> events = ReadEvents(*w, 1);
  const absl::Duration after = absl::Now() - set;
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind(), v1::BLOCK_EVENT_EXPIRED);
  EXPECT_EQ(events[0].id(), b.id().ToBytes());
  EXPECT_EQ(events[0].location(), v1::TIER_PINNED_HOST);
  EXPECT_GE(after, absl::Milliseconds(900));
  EXPECT_LE(after, absl::Seconds(5));
  EXPECT_EQ(Stat().high_blocks(), 0u);
  w->Cancel();
}

// The case: 16 clients saving; the watcher goes away and comes
// back with its token: every save is seen exactly once, none lost. Event
// delivery (event time to receipt) is reported.
TEST_F(WatchTest, AReconnectWithTheTokenMissesNothingUnder16SavingClients) {
  v1::BlockEvents first;
  v1::WatchBlocksRequest request;
  request.add_kinds(v1::BLOCK_EVENT_STORED);
  std::unique_ptr<BlockWatch> w = Watch(request, &first);
  ASSERT_NE(w, nullptr);
  constexpr int kWriters = 16, kPerWriter = 60;
  std::atomic<int> saved{0};
  std::vector<std::thread> writers;
  for (int t = 0; t < kWriters; ++t) {
    writers.emplace_back([&, t] {
      std::unique_ptr<Client> c = daemon_->Connect();
      for (int i = 0; i < kPerWriter; ++i) {
        if (SaveBlocks(*c, {SessionBlock("w" + std::to_string(t), i, kTokens)}).ok()) ++saved;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
  }
  absl::flat_hash_map<std::string, int> seen;
  std::vector<double> delays_ms;  // Of events received while watching.
  bool measuring = true;  // Not after the reconnect: its backlog waited.
  uint64_t last_seq = 0;
  auto take = [&](const v1::BlockEvents& batch) {
    const int64_t now_us = absl::ToUnixMicros(absl::Now());
    for (const v1::BlockEvent& e : batch.events()) {
      EXPECT_GT(e.seq(), last_seq);
      last_seq = e.seq();
      ++seen[e.id()];
      if (measuring) delays_ms.push_back((now_us - e.unix_micros()) / 1000.0);
    }
  };
  // Part of the stream, then away while the writers go on.
  v1::BlockEvents batch;
  std::string token = first.resume_token();
  while (seen.size() < kWriters * kPerWriter / 2 && w->Next(&batch)) {
    take(batch);
    token = batch.resume_token();
  }
  w.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  request.set_resume_token(token);
  w = Watch(request, &first);
  ASSERT_NE(w, nullptr);
  measuring = false;
  EXPECT_EQ(first.lost_events(), 0u);
  EXPECT_FALSE(first.lost_unknown());
  take(first);
  for (std::thread& t : writers) t.join();
  ASSERT_EQ(saved.load(), kWriters * kPerWriter) << daemon_->Log();
  while (seen.size() < static_cast<size_t>(kWriters * kPerWriter) && w->Next(&batch)) {
    take(batch);
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kWriters * kPerWriter));
  for (const auto& [id, n] : seen) EXPECT_EQ(n, 1);
  std::sort(delays_ms.begin(), delays_ms.end());
  std::printf("delivery while watching, over %zu events: p50 %.2f ms, p99 %.2f ms\n",
              delays_ms.size(), delays_ms[delays_ms.size() / 2],
              delays_ms[delays_ms.size() * 99 / 100]);
  w->Cancel();
}

// A watcher that stops reading: the daemon drops it once the log has moved
// on by more than its backlog, and its token then reports the loss.
TEST_F(WatchTest, AWatcherThatStopsReadingIsDroppedAndToldWhatItLost) {
  StartAnother({"--watch-backlog-events", "64"});
  // A channel of its own with a small receive window, so that the daemon's
  // writes stall once the watcher stops reading.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
  auto channel = grpc::CreateCustomChannel("unix:" + daemon_->socket(),
                                           grpc::InsecureChannelCredentials(), args);
  std::unique_ptr<v1::KvTier::Stub> stub = v1::KvTier::NewStub(channel);
  grpc::ClientContext context;
  auto reader = stub->WatchBlocks(&context, v1::WatchBlocksRequest());
  v1::BlockEvents first;
  ASSERT_TRUE(reader->Read(&first));
  // It reads no more. Thousands of events pass.
  for (int round = 0; round < 40; ++round) {
    std::vector<TestBlock> blocks;
    for (int i = 0; i < 64; ++i) {
      blocks.push_back(SessionBlock("r" + std::to_string(round), i, kTokens));
    }
    ASSERT_OK(SaveBlocks(*client_, blocks));
    ASSERT_OK(client_->Delete(IdsOf(blocks)));
  }
  // Dropped: the stream ends (CANCELLED) whatever the watcher reads now.
  v1::BlockEvents batch;
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  bool ended = false;
  while (absl::Now() < give_up) {
    if (!reader->Read(&batch)) {
      ended = true;
      break;
    }
  }
  ASSERT_TRUE(ended);
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // Back with its first token: told how many events it lost.
  v1::WatchBlocksRequest again;
  again.set_resume_token(first.resume_token());
  v1::BlockEvents after;
  std::unique_ptr<BlockWatch> w = Watch(again, &after);
  ASSERT_NE(w, nullptr);
  EXPECT_GT(after.lost_events(), 0u);
  EXPECT_FALSE(after.lost_unknown());
  EXPECT_EQ(Stat().watchers_dropped(), 1u);
  w->Cancel();
  // The daemon serves on.
  ASSERT_OK(SaveBlocks(*client_, {SessionBlock("after", 0, kTokens)}));
}

// One uid holds at most a quarter of --max-watchers; a stream that ends
// gives its place back.
TEST_F(WatchTest, OneUidHoldsAtMostAQuarterOfTheWatchers) {
  StartAnother({"--max-watchers", "4"});
  v1::BlockEvents first;
  std::unique_ptr<BlockWatch> w = Watch(v1::WatchBlocksRequest(), &first);
  ASSERT_NE(w, nullptr);
  absl::StatusOr<std::unique_ptr<BlockWatch>> second =
      client_->WatchBlocks(v1::WatchBlocksRequest());
  ASSERT_OK(second);
  v1::BlockEvents batch;
  EXPECT_FALSE((*second)->Next(&batch));
  EXPECT_THAT((*second)->Finish(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("watchers")));
  w->Cancel();
  w.reset();
  EXPECT_TRUE(WaitUntil([&] { return Stat().watchers() == 0; }));
  w = Watch(v1::WatchBlocksRequest(), &first);
  ASSERT_NE(w, nullptr);
  w->Cancel();
}

TEST_F(WatchTest, ATokenOfAnotherRunIsReportedAsAnUnknownLoss) {
  v1::BlockEvents first;
  std::unique_ptr<BlockWatch> w = Watch(v1::WatchBlocksRequest(), &first);
  ASSERT_NE(w, nullptr);
  w->Cancel();
  w.reset();
  StartAnother({});  // A new run: a new epoch.
  v1::WatchBlocksRequest again;
  again.set_resume_token(first.resume_token());
  v1::BlockEvents after;
  w = Watch(again, &after);
  ASSERT_NE(w, nullptr);
  EXPECT_TRUE(after.lost_unknown());
  w->Cancel();
}

TEST_F(WatchTest, RefusesBadRequestsNamingTheField) {
  auto first_status = [&](const v1::WatchBlocksRequest& request) {
    absl::StatusOr<std::unique_ptr<BlockWatch>> w = client_->WatchBlocks(request);
    EXPECT_OK(w);
    v1::BlockEvents batch;
    EXPECT_FALSE((*w)->Next(&batch));
    return (*w)->Finish();
  };
  v1::WatchBlocksRequest r;
  r.set_resume_token("short");
  EXPECT_THAT(first_status(r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("resume_token")));
  r.Clear();
  r.add_kinds(static_cast<v1::BlockEventKind>(99));
  EXPECT_THAT(first_status(r), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kinds")));
  // A token of this run but ahead of its events.
  v1::BlockEvents first;
  std::unique_ptr<BlockWatch> w = Watch(v1::WatchBlocksRequest(), &first);
  ASSERT_NE(w, nullptr);
  std::string ahead = first.resume_token();
  ahead[15] = static_cast<char>(0x7f);
  r.Clear();
  r.set_resume_token(ahead);
  EXPECT_THAT(first_status(r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("resume_token")));
  w->Cancel();
}

}  // namespace
}  // namespace evoke::testing
