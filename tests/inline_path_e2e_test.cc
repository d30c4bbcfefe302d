// The inline data path against a real evoked (issue #12): the daemon's raw
// Save and Load handlers (pooled buffers, hand-written LoadResponse) and the
// client's InlineCalls (payload slices that reference the caller's bytes, a
// Load decoded straight from the received slices) move 16 MiB blocks
// byte-identically, answer exactly as the generated stub does, and keep
// deadlines, message limits and verification.
#include <atomic>
#include <fstream>
#include <sstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "client/inline_calls.h"
#include "common/checksum.h"
#include "tests/e2e_fixture.h"

namespace evoke {
namespace {

using ::evoke::testing::E2eTest;
using ::evoke::testing::OpaqueFingerprint;
using ::evoke::testing::Payload;

constexpr uint64_t kKiB = 1 << 10;
constexpr uint64_t kMiB = 1 << 20;

std::shared_ptr<grpc::Channel> Channel(const std::string& socket, int max_message) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(max_message);
  args.SetMaxReceiveMessageSize(max_message);
  return grpc::CreateCustomChannel("unix:" + socket, grpc::InsecureChannelCredentials(), args);
}

class InlinePathTest : public E2eTest {
 protected:
  void Start(const std::vector<std::string>& flags = {}) {
    std::vector<std::string> all = {"--pinned-bytes", "160MiB", "--max-block-bytes", "64MiB"};
    all.insert(all.end(), flags.begin(), flags.end());
    StartDaemon(all);
    channel_ = Channel(daemon_->socket(), 200 << 20);
    calls_ = std::make_unique<InlineCalls>(channel_);
    stub_ = v1::KvTier::NewStub(channel_);
  }

  v1::BlockMeta Meta(int seq) {
    return testing::SessionMeta(OpaqueFingerprint("ns", "m"), "inline", seq, 1, 0, 1, seq);
  }

  grpc::Status Save(const std::vector<v1::BlockMeta>& metas,
                    const std::vector<std::string>& payloads, v1::SaveResponse* response,
                    absl::Duration timeout = absl::Seconds(30), InlineCalls* calls = nullptr) {
    v1::SaveRequest request;
    std::vector<absl::string_view> views;
    for (size_t i = 0; i < metas.size(); ++i) {
      *request.add_blocks()->mutable_meta() = metas[i];
      views.push_back(payloads[i]);
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
    return (calls != nullptr ? calls : calls_.get())->Save(&context, request, views, response);
  }

  v1::LoadRequest LoadRequestFor(const std::vector<v1::BlockMeta>& metas) {
    v1::LoadRequest request;
    for (const v1::BlockMeta& m : metas) request.add_ids(m.id());
    *request.mutable_fingerprint() = metas[0].fingerprint();
    return request;
  }

  grpc::Status Load(const std::vector<v1::BlockMeta>& metas, std::vector<LoadedBlock>* out,
                    absl::Duration timeout = absl::Seconds(30)) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
    return calls_->Load(&context, LoadRequestFor(metas), out);
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<InlineCalls> calls_;
  std::unique_ptr<v1::KvTier::Stub> stub_;
};

TEST_F(InlinePathTest, SixteenMiBBlocksRoundTripAsWithTheStub) {
  Start();
  std::vector<v1::BlockMeta> metas;
  std::vector<std::string> payloads;
  const uint64_t sizes[] = {16 * kMiB, 16 * kMiB, 4 * kKiB, 300 * kKiB, 1 * kMiB + 1};
  for (int i = 0; i < 5; ++i) {
    metas.push_back(Meta(i));
    payloads.push_back(Payload(100 + i, sizes[i]));
  }
  // Saved two ways: raw slices (blocks 0, 2, 3, 4) and the stub (block 1).
  v1::SaveResponse saved;
  ASSERT_TRUE(Save({metas[0], metas[2], metas[3], metas[4]},
                   {payloads[0], payloads[2], payloads[3], payloads[4]}, &saved)
                  .ok());
  ASSERT_EQ(saved.results_size(), 4);
  EXPECT_EQ(saved.results(0).checksum(), PayloadChecksum(payloads[0].data(), sizes[0]));
  {
    v1::SaveRequest request;
    v1::SaveBlock* b = request.add_blocks();
    *b->mutable_meta() = metas[1];
    b->set_inline_bytes(payloads[1]);
    grpc::ClientContext context;
    v1::SaveResponse response;
    ASSERT_TRUE(stub_->Save(&context, request, &response).ok());
  }
  // Loaded twice (the second time from the daemon's pooled buffers),
  // through InlineCalls and through the stub: the same blocks.
  for (int round = 0; round < 2; ++round) {
    std::vector<LoadedBlock> got;
    ASSERT_TRUE(Load(metas, &got).ok());
    ASSERT_EQ(got.size(), 5u);
    grpc::ClientContext context;
    v1::LoadResponse via_stub;
    ASSERT_TRUE(stub_->Load(&context, LoadRequestFor(metas), &via_stub).ok());
    for (int i = 0; i < 5; ++i) {
      EXPECT_TRUE(got[i].payload == payloads[i]) << "block " << i << " round " << round;
      EXPECT_TRUE(via_stub.blocks(i).inline_bytes() == payloads[i]) << i;
      EXPECT_EQ(got[i].meta.SerializeAsString(), via_stub.blocks(i).meta().SerializeAsString());
      EXPECT_EQ(got[i].meta.checksum(), PayloadChecksum(payloads[i].data(), sizes[i]));
      EXPECT_EQ(got[i].meta.payload_bytes(), sizes[i]);
      EXPECT_EQ(got[i].served_from, v1::TIER_PINNED_HOST);
    }
  }
  // The library's own Load agrees too.
  std::vector<BlockId> ids;
  for (const v1::BlockMeta& m : metas) ids.push_back(*BlockId::FromBytes(m.id()));
  ASSERT_OK_AND_ASSIGN(std::vector<LoadedBlock> lib, client_->Load(ids, metas[0].fingerprint()));
  ASSERT_EQ(lib.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(lib[i].payload == payloads[i]) << i;
}

// A large inline payload saved again under the same id is checksummed
// where gRPC received it (no copy): the same bytes are a duplicate, other
// bytes a conflict, and the first copy stays.
TEST_F(InlinePathTest, LargePayloadsSavedAgainDeduplicateOrConflict) {
  Start();
  const v1::BlockMeta meta = Meta(7);
  const std::string payload = Payload(70, 16 * kMiB + 3);
  v1::SaveResponse saved;
  ASSERT_TRUE(Save({meta}, {payload}, &saved).ok());
  EXPECT_FALSE(saved.results(0).deduplicated());
  ASSERT_TRUE(Save({meta}, {payload}, &saved).ok());
  EXPECT_TRUE(saved.results(0).deduplicated());
  std::string other = payload;
  other[9 * kMiB] ^= 1;
  const grpc::Status conflict = Save({meta}, {other}, &saved);
  EXPECT_EQ(conflict.error_code(), grpc::StatusCode::ALREADY_EXISTS) << conflict.error_message();
  std::vector<LoadedBlock> got;
  ASSERT_TRUE(Load({meta}, &got).ok());
  EXPECT_TRUE(got[0].payload == payload);
}

TEST_F(InlinePathTest, BlocksFromTheSpillStoreComeBackInline) {
  Start();
  std::vector<v1::BlockMeta> metas = {Meta(0), Meta(1)};
  std::vector<std::string> payloads = {Payload(1, 16 * kMiB), Payload(2, 100 * kKiB)};
  v1::SaveResponse saved;
  ASSERT_TRUE(Save(metas, payloads, &saved).ok());
  ASSERT_OK(client_->Flush(/*evict=*/true).status());
  std::vector<LoadedBlock> got;
  ASSERT_TRUE(Load(metas, &got).ok());
  ASSERT_EQ(got.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(got[i].payload == payloads[i]) << i;
    EXPECT_EQ(got[i].served_from, v1::TIER_SPILL) << i;
  }
}

TEST_F(InlinePathTest, MessageLimitsAndDeadlinesStillApply) {
  Start({"--max-block-bytes", "17MiB", "--max-message-bytes", "24MiB"});
  // Over the daemon's response limit: RESOURCE_EXHAUSTED naming the flag.
  std::vector<v1::BlockMeta> metas = {Meta(0), Meta(1)};
  std::vector<std::string> payloads = {Payload(1, 16 * kMiB), Payload(2, 16 * kMiB)};
  v1::SaveResponse saved;
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(Save({metas[i]}, {payloads[i]}, &saved).ok());
  std::vector<LoadedBlock> got;
  grpc::Status s = Load(metas, &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("--max-message-bytes"), std::string::npos) << s.error_message();
  EXPECT_TRUE(got.empty());
  // A request over the daemon's receive limit, and over this channel's send
  // limit: RESOURCE_EXHAUSTED, nothing stored.
  s = Save({Meta(2), Meta(3)}, {payloads[0], payloads[1]}, &saved);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  InlineCalls small(Channel(daemon_->socket(), 8 << 20));
  s = Save({Meta(4)}, {payloads[0]}, &saved, absl::Seconds(30), &small);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  // A deadline that has passed: DEADLINE_EXCEEDED, and Save returns (gRPC
  // let go of the payload slices).
  s = Save({Meta(5)}, {payloads[0]}, &saved, absl::Milliseconds(-1));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  s = Load({metas[0]}, &got, absl::Milliseconds(-1));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  for (int i = 2; i <= 5; ++i) {
    grpc::ClientContext context;
    v1::DescribeRequest request;
    request.set_id(Meta(i).id());
    v1::BlockInfo info;
    EXPECT_EQ(stub_->Describe(&context, request, &info).error_code(), grpc::StatusCode::NOT_FOUND)
        << i;
  }
  // The daemon still serves.
  ASSERT_TRUE(Load({metas[1]}, &got).ok());
  EXPECT_TRUE(got.back().payload == payloads[1]);
}

// Minor page faults of a process so far (field 10 of /proc/PID/stat).
uint64_t MinorFaults(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 10 && fields >> field; ++i) {
  }
  return std::strtoull(field.c_str(), nullptr, 10);
}

// The storm this path removes: an inline Load used to zero-fill a fresh
// response string and serialize into another fresh buffer, faulting in
// every page of both each time (32 MiB a 16 MiB load, when malloc hands the
// memory back between calls). Now the daemon copies into pooled buffers:
// after a first load, five more fault in far fewer pages than one payload.
TEST_F(InlinePathTest, RepeatedLoadsDoNotFaultInFreshBuffers) {
  Start();
  const v1::BlockMeta meta = Meta(0);
  const std::string payload = Payload(9, 16 * kMiB);
  v1::SaveResponse saved;
  ASSERT_TRUE(Save({meta}, {payload}, &saved).ok());
  std::vector<LoadedBlock> got;
  ASSERT_TRUE(Load({meta}, &got).ok());  // Warms the pool.
  const uint64_t before = MinorFaults(daemon_->pid());
  ASSERT_GT(before, 0u);
  for (int i = 0; i < 5; ++i) {
    got.clear();
    ASSERT_TRUE(Load({meta}, &got).ok());
    ASSERT_TRUE(got[0].payload == payload);
  }
  const uint64_t faults = MinorFaults(daemon_->pid()) - before;
  const uint64_t payload_pages = 16 * kMiB / 4096;
  EXPECT_LT(faults, payload_pages) << "the daemon faulted in " << faults
                                   << " pages for 5 loads of a 16 MiB block";
}

TEST_F(InlinePathTest, ConcurrentCallsKeepTheirOwnBytes) {
  Start();
  constexpr int kThreads = 4, kBlocks = 6;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      InlineCalls calls(channel_);
      for (int i = 0; i < kBlocks; ++i) {
        const v1::BlockMeta meta = Meta(100 * t + i);
        const std::string payload = Payload(100 * t + i, (1 + i % 3) * kMiB + 17 * t);
        v1::SaveResponse saved;
        std::vector<LoadedBlock> got;
        if (!Save({meta}, {payload}, &saved, absl::Seconds(30), &calls).ok() ||
            !Load({meta}, &got).ok() || got.size() != 1 || got[0].payload != payload) {
          ++failures;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace evoke
