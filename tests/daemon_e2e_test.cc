// End-to-end behaviour of a real evoked: serving surfaces, spilling,
// restarts (graceful and kill -9), corruption on disk and concurrent clients.
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/checksum.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "tests/e2e_fixture.h"

namespace evoke::testing {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

// 256 KiB per block: 128 tokens x 2 KiB.
constexpr uint32_t kTokens = 128;

class DaemonTest : public E2eTest {};

TEST_F(DaemonTest, ServesHealthReflectionOnPrivateSocket) {
  StartDaemon();
  struct stat st;
  ASSERT_EQ(stat(daemon_->socket().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);

  auto channel = grpc::CreateChannel("unix:" + daemon_->socket(),
                                     grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  for (const char* service : {"", "evoke.v1.KvTier"}) {
    grpc::ClientContext context;
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    grpc::health::v1::HealthCheckResponse response;
    ASSERT_TRUE(health->Check(&context, request, &response).ok()) << service;
    EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }

  auto reflection = grpc::reflection::v1alpha::ServerReflection::NewStub(channel);
  grpc::ClientContext context;
  auto stream = reflection->ServerReflectionInfo(&context);
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  request.set_list_services("");
  ASSERT_TRUE(stream->Write(request));
  grpc::reflection::v1alpha::ServerReflectionResponse response;
  ASSERT_TRUE(stream->Read(&response));
  std::vector<std::string> services;
  for (const auto& s : response.list_services_response().service()) {
    services.push_back(s.name());
  }
  EXPECT_THAT(services, Contains("evoke.v1.KvTier"));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

// The data dir and everything in it are the owner's alone, even when evoked
// starts under umask 000 (RocksDB's files would otherwise be 0666 and the
// WAL, which holds payload bytes, readable by every local user).
TEST_F(DaemonTest, DataDirIsOwnerOnlyWhateverTheUmask) {
  const mode_t old = umask(0);
  StartDaemon();
  umask(old);
  const v1::BlockMeta meta = evoke::testing::SessionMeta(SmallFingerprint(), "perm", 0, 16);
  const std::string payload = Payload(1, CanonicalPayloadBytes(SmallFingerprint(), 16, 4).value());
  ASSERT_OK(client_->Save({BlockToSave(meta, payload)}, /*durable=*/true));
  ASSERT_OK(client_->Flush(/*evict=*/false));
  struct stat st;
  ASSERT_EQ(stat(daemon_->data_dir().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  int files = 0;
  for (const auto& f : std::filesystem::recursive_directory_iterator(daemon_->data_dir())) {
    ASSERT_EQ(stat(f.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 077, 0u) << f.path() << " is open to others";
    ++files;
  }
  EXPECT_GT(files, 3);
}

TEST_F(DaemonTest, RefusesSecondDaemonOnSameDataDirOrSocket) {
  StartDaemon();
  // Same socket: refused, and the first daemon keeps serving.
  auto second = DaemonProcess::Start(dir_.path(), {}, absl::Seconds(10));
  EXPECT_THAT(second, StatusIs(absl::StatusCode::kUnavailable));
  // Same data dir through another socket: RocksDB's lock refuses it.
  auto third = DaemonProcess::Start(dir_.path(),
                                    {"--socket", dir_.Join("other.sock")},
                                    absl::Seconds(10));
  ASSERT_FALSE(third.ok());
  EXPECT_THAT(std::string(third.status().message()), HasSubstr("in use by another evoked"));
  EXPECT_OK(client_->HealthCheck());
}

TEST_F(DaemonTest, StaleSocketFromCrashIsReplaced) {
  StartDaemon();
  daemon_->KillHard();
  ASSERT_TRUE(std::filesystem::exists(dir_.Join("evoked.sock")));
  Restart();
  EXPECT_OK(client_->HealthCheck());
}

TEST_F(DaemonTest, SpillsAndLoadsBackByteIdentical) {
  StartDaemon();
  std::vector<TestBlock> blocks;
  for (int i = 0; i < 200; ++i) blocks.push_back(SessionBlock("s", i, kTokens));  // 50 MiB.
  for (size_t i = 0; i < blocks.size(); i += 10) {
    ASSERT_OK(SaveBlocks(*client_, {blocks.begin() + i, blocks.begin() + i + 10}));
    const v1::StatResponse st = Stat();
    ASSERT_LE(st.pinned().used_bytes(), st.pinned().capacity_bytes());
  }
  WaitForSpillToSettle();
  v1::StatResponse st = Stat();
  EXPECT_GT(st.spill().blocks(), 0u);
  EXPECT_GT(st.counters().spills(), 0u);
  EXPECT_EQ(st.counters().saves(), 200u);
  std::vector<BlockId> ids;
  for (const TestBlock& b : blocks) ids.push_back(b.id());
  absl::StatusOr<std::vector<LoadedBlock>> loaded = client_->Load(ids, SmallFingerprint());
  ASSERT_OK(loaded);
  ASSERT_EQ(loaded->size(), blocks.size());
  int from_disk = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_EQ((*loaded)[i].payload, blocks[i].payload) << i;
    EXPECT_EQ((*loaded)[i].meta.checksum(),
              PayloadChecksum(blocks[i].payload.data(), blocks[i].payload.size()));
    if ((*loaded)[i].served_from == v1::TIER_SPILL) ++from_disk;
  }
  EXPECT_GT(from_disk, 0);
  st = Stat();
  EXPECT_EQ(st.counters().hits_tier2(), static_cast<uint64_t>(from_disk));
  EXPECT_LE(st.pinned().used_bytes(), st.pinned().capacity_bytes());
}

TEST_F(DaemonTest, KillDashNineKeepsSpilledBlocksAndNeverServesGarbage) {
  StartDaemon();
  std::vector<TestBlock> blocks;
  for (int i = 0; i < 160; ++i) blocks.push_back(SessionBlock("k9", i, kTokens));  // 40 MiB.
  ASSERT_OK(SaveBlocks(*client_, blocks));
  WaitForSpillToSettle();
  // Record where each block is now. Below the high watermark nothing more
  // spills, so this stays true until the kill.
  std::vector<bool> on_disk(blocks.size());
  int disk = 0, ram_only = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    absl::StatusOr<v1::BlockInfo> info = client_->Describe(blocks[i].id());
    ASSERT_OK(info);
    on_disk[i] = info->on_disk();
    on_disk[i] ? ++disk : ++ram_only;
  }
  ASSERT_GT(disk, 0);
  ASSERT_GT(ram_only, 0);
  daemon_->KillHard();
  Restart();
  const v1::StatResponse st = Stat();
  EXPECT_EQ(st.spill().blocks(), static_cast<uint64_t>(disk));
  EXPECT_EQ(st.pinned().blocks(), 0u);
  for (size_t i = 0; i < blocks.size(); ++i) {
    absl::StatusOr<std::vector<LoadedBlock>> got =
        client_->Load({blocks[i].id()}, SmallFingerprint());
    if (on_disk[i]) {
      ASSERT_OK(got) << i;
      EXPECT_EQ((*got)[0].payload, blocks[i].payload) << i;
    } else {
      EXPECT_THAT(got, StatusIs(absl::StatusCode::kNotFound)) << i;
    }
  }
  EXPECT_EQ(Stat().counters().checksum_failures(), 0u);
}

TEST_F(DaemonTest, SigtermKeepsEverything) {
  StartDaemon();
  std::vector<TestBlock> blocks;
  for (int i = 0; i < 160; ++i) blocks.push_back(SessionBlock("term", i, kTokens));
  ASSERT_OK(SaveBlocks(*client_, {blocks.begin(), blocks.begin() + 8}, false, /*pin=*/true));
  ASSERT_OK(SaveBlocks(*client_, {blocks.begin() + 8, blocks.end()}));
  client_.reset();
  absl::StatusOr<int> code = daemon_->Terminate();
  ASSERT_OK(code);
  EXPECT_EQ(*code, 0) << daemon_->Log();
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("evoked.sock")));
  EXPECT_THAT(daemon_->Log(), HasSubstr("flushing tier 1 to disk"));
  Restart();
  const v1::StatResponse st = Stat();
  EXPECT_EQ(st.spill().blocks(), blocks.size());
  std::vector<BlockId> ids;
  for (const TestBlock& b : blocks) ids.push_back(b.id());
  absl::StatusOr<std::vector<LoadedBlock>> loaded = client_->Load(ids, SmallFingerprint());
  ASSERT_OK(loaded);
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_EQ((*loaded)[i].payload, blocks[i].payload) << i;
  }
  // SIGINT is as graceful as SIGTERM.
  daemon_->Signal(SIGINT);
  absl::StatusOr<int> code2 = daemon_->Wait();
  ASSERT_OK(code2);
  EXPECT_EQ(*code2, 0);
}

// A delete is kept across kill -9 even where the metadata must be
// salvaged: the deleted blocks were the newest payloads on disk (above the
// watermark of the last clean close), so the restart salvages the newest
// segments, and only the tombstones keep those blocks from coming back.
TEST_F(DaemonTest, DeletesOfTheNewestBlocksSurviveKillDashNine) {
  StartDaemon();
  std::vector<TestBlock> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back(SessionBlock("del", i, kTokens));
  ASSERT_OK(SaveBlocks(*client_, blocks, /*durable=*/true));
  ASSERT_OK(client_->Flush(/*evict=*/true));
  ASSERT_OK(client_->Delete({blocks[4].id(), blocks[5].id()}));
  client_.reset();
  daemon_->KillHard();
  Restart();
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<std::vector<LoadedBlock>> got =
        client_->Load({blocks[i].id()}, SmallFingerprint());
    if (i >= 4) {
      EXPECT_THAT(got, StatusIs(absl::StatusCode::kNotFound)) << i << " came back";
    } else {
      ASSERT_OK(got) << i;
      EXPECT_EQ((*got)[0].payload, blocks[i].payload);
    }
  }
}

TEST_F(DaemonTest, CorruptSpillFileIsDataLossNeverServed) {
  StartDaemon();
  std::vector<TestBlock> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(SessionBlock("c", i, kTokens));
  ASSERT_OK(SaveBlocks(*client_, blocks));
  ASSERT_OK(client_->Flush(/*evict=*/true));
  client_.reset();
  ASSERT_OK(daemon_->Terminate());
  // Every other payload in the segment files damaged.
  const int corrupted =
      DamagePayloads(dir_.Join("data/segments"), [](int n) { return n % 2 == 0; });
  ASSERT_GT(corrupted, 0);
  Restart();
  int data_loss = 0, ok = 0;
  for (const TestBlock& b : blocks) {
    absl::StatusOr<std::vector<LoadedBlock>> got = client_->Load({b.id()}, SmallFingerprint());
    if (got.ok()) {
      ASSERT_EQ((*got)[0].payload, b.payload);  // Whatever is served is intact.
      ++ok;
    } else {
      EXPECT_THAT(got, StatusIs(absl::StatusCode::kDataLoss));
      ++data_loss;
    }
  }
  EXPECT_GT(data_loss, 0);
  EXPECT_EQ(Stat().counters().checksum_failures(), static_cast<uint64_t>(data_loss));
  EXPECT_OK(client_->HealthCheck());
}

TEST_F(DaemonTest, BreadcrumbsPastTheSpillBudget) {
  StartDaemon({"--spill-bytes", "4MiB"});
  std::vector<TestBlock> blocks;
  for (int i = 0; i < 40; ++i) blocks.push_back(SessionBlock("bc", i, kTokens));  // 10 MiB.
  ASSERT_OK(SaveBlocks(*client_, blocks));
  ASSERT_OK(client_->Flush(/*evict=*/true));
  const v1::StatResponse st = Stat();
  EXPECT_LE(st.spill().payload_bytes(), 4u << 20);
  EXPECT_GE(st.breadcrumb_blocks(), 24u);
  EXPECT_EQ(st.counters().breadcrumbs(), st.breadcrumb_blocks());
  // The oldest are breadcrumbs: metadata kept, bytes gone, loads say so.
  absl::StatusOr<v1::BlockInfo> info = client_->Describe(blocks[0].id());
  ASSERT_OK(info);
  EXPECT_EQ(info->tier(), v1::TIER_BREADCRUMB);
  EXPECT_FALSE(info->bytes_available());
  EXPECT_EQ(info->meta().n_tokens(), kTokens);
  EXPECT_THAT(client_->Load({blocks[0].id()}, SmallFingerprint()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("breadcrumb")));
  // Lookup stops at a breadcrumb: its bytes are not there to splice.
  absl::StatusOr<std::vector<v1::Tier>> present =
      client_->Lookup({blocks[39].id(), blocks[0].id()});
  ASSERT_OK(present);
  EXPECT_EQ(present->size(), 1u);
  // The newest kept their bytes, and breadcrumbs survive a restart.
  absl::StatusOr<std::vector<LoadedBlock>> got =
      client_->Load({blocks[39].id()}, SmallFingerprint());
  ASSERT_OK(got);
  EXPECT_EQ((*got)[0].payload, blocks[39].payload);
  client_.reset();
  ASSERT_OK(daemon_->Terminate());
  Restart();
  EXPECT_EQ(Stat().breadcrumb_blocks(), st.breadcrumb_blocks());
  const CommandResult ls = RunEvokectl(daemon_->socket(), {"ls", "--tier", "breadcrumb"});
  EXPECT_THAT(ls.out, HasSubstr(absl::StrCat(st.breadcrumb_blocks(), " blocks")));
}

TEST_F(DaemonTest, EightConcurrentClients) {
  StartDaemon();
  constexpr int kClients = 8;
  constexpr int kBlocks = 40;  // x 256 KiB x 8 = 80 MiB through a 32 MiB tier 1.
  std::atomic<bool> done{false};
  std::atomic<uint64_t> max_used{0};
  std::atomic<int> over_budget{0};
  std::thread watcher([&] {
    std::unique_ptr<Client> c = daemon_->Connect();
    while (!done) {
      absl::StatusOr<v1::StatResponse> s = c->Stat();
      if (s.ok()) {
        if (s->pinned().used_bytes() > s->pinned().capacity_bytes()) ++over_budget;
        uint64_t prev = max_used.load();
        while (s->pinned().used_bytes() > prev &&
               !max_used.compare_exchange_weak(prev, s->pinned().used_bytes())) {
        }
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
  });
  std::atomic<int> errors{0};
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kClients; ++t) {
    threads.emplace_back([&, t] {
      std::unique_ptr<Client> c = daemon_->Connect();
      const std::string session = "client" + std::to_string(t);
      for (int i = 0; i < kBlocks; ++i) {
        const TestBlock b = SessionBlock(session, i, kTokens);
        if (!SaveBlocks(*c, {b}).ok()) ++errors;
        // Read back a random earlier block of this client.
        const int j = (i * 7 + t) % (i + 1);
        const TestBlock earlier = SessionBlock(session, j, kTokens);
        absl::StatusOr<std::vector<LoadedBlock>> got =
            c->Load({earlier.id()}, SmallFingerprint());
        if (!got.ok()) {
          ++errors;
        } else if ((*got)[0].payload != earlier.payload) {
          ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  watcher.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(over_budget.load(), 0);
  const v1::StatResponse st = Stat();
  EXPECT_LE(max_used.load(), st.pinned().capacity_bytes());
  EXPECT_EQ(st.counters().saves(), static_cast<uint64_t>(kClients * kBlocks));
  EXPECT_GT(st.counters().spills(), 0u);
  // Every block of every client is still there and intact.
  for (int t = 0; t < kClients; ++t) {
    std::vector<BlockId> ids;
    std::vector<TestBlock> expected;
    for (int i = 0; i < kBlocks; ++i) {
      expected.push_back(SessionBlock("client" + std::to_string(t), i, kTokens));
      ids.push_back(expected.back().id());
    }
    absl::StatusOr<std::vector<LoadedBlock>> got = client_->Load(ids, SmallFingerprint());
    ASSERT_OK(got);
    for (int i = 0; i < kBlocks; ++i) ASSERT_EQ((*got)[i].payload, expected[i].payload);
  }
}

TEST_F(DaemonTest, PrefixBlocksAreSharedAndLookedUp) {
  StartDaemon();
  const v1::LayoutFingerprint fp = SmallFingerprint();
  std::vector<int32_t> tokens(64);
  for (int i = 0; i < 64; ++i) tokens[i] = 1000 + i;
  std::vector<BlockToSave> batch;
  std::vector<std::string> payloads;
  BlockId parent;
  std::vector<BlockId> chain;
  for (int b = 0; b < 4; ++b) {
    v1::BlockMeta meta = PrefixBlockMeta(
        fp, parent, absl::MakeConstSpan(tokens).subspan(b * 16, 16), 0, 4, b * 16);
    parent = BlockIdOf(meta);
    chain.push_back(parent);
    payloads.push_back(Payload(b, CanonicalPayloadBytes(fp, 16, 4).value()));
    batch.push_back(BlockToSave(meta, absl::string_view()));
  }
  for (int b = 0; b < 4; ++b) batch[b].payload = payloads[b];
  ASSERT_OK(client_->Save({batch.data(), 2}));
  // A second process with the same prefix finds the first two blocks.
  std::unique_ptr<Client> other = daemon_->Connect();
  absl::StatusOr<std::vector<v1::Tier>> present = other->Lookup(chain);
  ASSERT_OK(present);
  EXPECT_EQ(present->size(), 2u);
  // It saves the whole chain: the shared blocks are deduplicated.
  absl::StatusOr<std::vector<v1::SaveResult>> r = other->Save(batch);
  ASSERT_OK(r);
  EXPECT_TRUE((*r)[0].deduplicated());
  EXPECT_TRUE((*r)[1].deduplicated());
  EXPECT_FALSE((*r)[2].deduplicated());
  present = client_->Lookup(chain);
  ASSERT_OK(present);
  EXPECT_EQ(present->size(), 4u);
  // The same tokens under another model do not match.
  v1::LayoutFingerprint other_model = fp;
  other_model.set_model_id("another-model");
  EXPECT_NE(PrefixChain(tokens, 16, DigestFingerprint(other_model))[0], chain[0]);
}

}  // namespace
}  // namespace evoke::testing
