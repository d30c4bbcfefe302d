// Shared-memory data path, leases and region validation against a real
// evoked (CUDA IPC has its own tests, which need a GPU).
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "common/fd_passing.h"
#include "common/status_macros.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "tests/e2e_fixture.h"

namespace evoke::testing {
namespace {

using ::testing::HasSubstr;

int CountFds(pid_t pid) {
  int n = 0;
  DIR* d = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (d == nullptr) return -1;
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n - 2;
}

int CountMappedRegions(pid_t pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) {
    if (line.find("memfd:evoke-region") != std::string::npos) ++n;
  }
  return n;
}

// Sends one raw FdChannel request: `fds` ride as SCM_RIGHTS. Returns the
// daemon's code and message, or -1 and what failed in the exchange.
std::pair<int, std::string> SendFds(const std::string& path, const std::string& body,
                                    const std::vector<int>& fds) {
  absl::StatusOr<FdChannelReply> reply = SendFdChannelRequest(path, body, fds);
  if (!reply.ok()) return {-1, reply.status().ToString()};
  return {static_cast<int>(reply->status.code()), std::string(reply->status.message())};
}

std::string Request(const std::string& lease, uint64_t size) {
  return EncodeFdChannelRequest(lease, size);
}

int SealedMemfd(uint64_t size, unsigned seals) {
  const int fd = memfd_create("test", MFD_ALLOW_SEALING);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) return -1;
  if (seals != 0) fcntl(fd, F_ADD_SEALS, seals);
  return fd;
}

class DataPathTest : public E2eTest {
 protected:
  void SetUp() override { StartDaemon({"--pinned-bytes", "64MiB"}); }
  std::string LeaseId() {
    // The lease id is private to the client; tests that speak the raw
    // protocol open their own lease through a raw stream.
    return "";
  }
};

// Both ways a region's blocks travel: the command ring (the client's
// default once it has a region) and the Save/Load RPCs naming slices.
class SharedMemoryPathTest : public DataPathTest,
                             public ::testing::WithParamInterface<bool> {};

TEST_P(SharedMemoryPathTest, SaveAndLoadCopyOnce) {
  const bool ring = GetParam();
  ClientOptions options;
  options.target = daemon_->socket();
  options.use_ring = ring;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(options));
  ASSERT_OK(client->OpenLease("copy-once"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> region,
                       client->CreateSharedRegion(32 << 20));
  EXPECT_EQ(client->has_ring(), ring);
  const v1::StatResponse st0 = Stat();
  EXPECT_EQ(st0.leases().leases(), 2u);  // The fixture's and this one.
  EXPECT_EQ(st0.leases().rings(), ring ? 1u : 0u);
  // The ring is a region of the lease too.
  EXPECT_EQ(st0.leases().shm_regions(), ring ? 2u : 1u);
  if (ring) {
    EXPECT_GT(st0.leases().shm_bytes(), 32u << 20);
  } else {
    EXPECT_EQ(st0.leases().shm_bytes(), 32u << 20);
  }

  // 64 blocks of 128 KiB (64 tokens x 2 KiB) written into the region,
  // saved in one batch that names slices.
  std::vector<TestBlock> blocks;
  std::vector<BlockToSave> batch;
  uint64_t offset = 0;
  for (int i = 0; i < 64; ++i) {
    blocks.push_back(SessionBlock("shm", i, 64));
    std::memcpy(region->data() + offset, blocks.back().payload.data(),
                blocks.back().payload.size());
    batch.emplace_back(blocks.back().meta,
                       region->Slice(offset, blocks.back().payload.size()));
    offset += blocks.back().payload.size();
  }
  ASSERT_OK_AND_ASSIGN(std::vector<v1::SaveResult> saved, client->Save(batch));
  ASSERT_EQ(saved.size(), 64u);
  // What the daemon stored is exactly what the region held.
  std::vector<BlockId> ids;
  for (const TestBlock& b : blocks) ids.push_back(b.id());
  ASSERT_OK_AND_ASSIGN(std::vector<LoadedBlock> inline_back,
                       client->Load(ids, SmallFingerprint()));
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_EQ(inline_back[i].payload, blocks[i].payload);
  }
  // Load into the second half of the region, in reverse order.
  std::vector<v1::RegionSlice> dests;
  const uint64_t half = 16 << 20;
  for (size_t i = 0; i < blocks.size(); ++i) {
    dests.push_back(region->Slice(half + (blocks.size() - 1 - i) * (128 << 10), 128 << 10));
  }
  std::memset(region->data() + half, 0, half);
  ASSERT_OK_AND_ASSIGN(std::vector<LoadedBlock> loaded,
                       client->LoadInto(ids, SmallFingerprint(), dests));
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(loaded[i].meta.payload_bytes(), blocks[i].payload.size());
    EXPECT_TRUE(loaded[i].payload.empty());
    ASSERT_EQ(std::memcmp(region->data() + dests[i].offset(), blocks[i].payload.data(),
                          blocks[i].payload.size()),
              0)
        << i;
  }
  // A spilled block also loads straight into a region.
  ASSERT_OK(client->Flush(/*evict=*/true));
  std::memset(region->data() + half, 0, half);
  ASSERT_OK_AND_ASSIGN(loaded, client->LoadInto(ids, SmallFingerprint(), dests));
  EXPECT_EQ(loaded[0].served_from, v1::TIER_SPILL);
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_EQ(std::memcmp(region->data() + dests[i].offset(), blocks[i].payload.data(),
                          blocks[i].payload.size()),
              0);
  }
  const v1::StatResponse st1 = Stat();
  EXPECT_EQ(st1.leases().ring_ops() - st0.leases().ring_ops(), ring ? 192u : 0u);
  ASSERT_OK(client->UnregisterRegion(region->id()));
  EXPECT_EQ(Stat().leases().shm_regions(), ring ? 1u : 0u);
}

INSTANTIATE_TEST_SUITE_P(RingAndRpc, SharedMemoryPathTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("Ring") : std::string("Rpc");
                         });

TEST_F(DataPathTest, ScribblingDuringSaveNeverStoresMismatchedBytes) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> region,
                       client_->CreateSharedRegion(4 << 20));
  std::atomic<bool> stop{false};
  std::thread scribbler([&] {
    std::mt19937 rng(5);
    while (!stop) region->data()[rng() % (4 << 20)] = static_cast<uint8_t>(rng());
  });
  for (int i = 0; i < 50; ++i) {
    const TestBlock b = SessionBlock("toctou", i, 512);  // 1 MiB.
    ASSERT_OK(client_->Save({BlockToSave(b.meta, region->Slice(0, b.payload.size()))}));
  }
  stop = true;
  scribbler.join();
  // Whatever was stored matches its checksum.
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse report, client_->Verify({}));
  EXPECT_EQ(report.corrupt_size(), 0);
  EXPECT_EQ(report.blocks_checked(), 50u);
}

TEST_F(DataPathTest, SliceAndLeaseErrorsNameTheField) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> region,
                       client_->CreateSharedRegion(1 << 20));
  const TestBlock b = SessionBlock("bad", 0, 64);  // 128 KiB.
  EXPECT_THAT(client_->Save({BlockToSave(b.meta, region->Slice((1 << 20) - 4096, 128 << 10))}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("blocks[0].region: [1044480, 1044480 + 131072) is outside "
                                 "the region")));
  EXPECT_THAT(client_->Save({BlockToSave(b.meta, region->Slice(UINT64_MAX - 10, 128 << 10))}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside the region")));
  v1::RegionSlice unknown = region->Slice(0, 128 << 10);
  unknown.set_region_id(999);
  EXPECT_THAT(client_->Save({BlockToSave(b.meta, unknown)}),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("blocks[0].region.region_id: region 999 is not registered")));
  // The region of another lease is not ours.
  std::unique_ptr<Client> other = daemon_->Connect();
  ASSERT_OK(other->OpenLease("other"));
  EXPECT_THAT(other->Save({BlockToSave(b.meta, region->Slice(0, 128 << 10))}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("not registered by this lease")));
  // Without a lease, regions and pins are refused.
  std::unique_ptr<Client> anonymous = daemon_->Connect();
  EXPECT_THAT(anonymous->Save({BlockToSave(b.meta, region->Slice(0, 128 << 10))}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lease_id: is required")));
  EXPECT_THAT(anonymous->Save({BlockToSave(b.meta, b.payload, /*pin=*/true)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lease_id: is required")));
  {
    auto stub = RawStub(daemon_->socket());
    grpc::ClientContext context;
    v1::PinRequest pin;
    pin.add_ids(b.id().ToBytes());
    pin.set_lease_id(std::string(16, 'x'));
    v1::PinResponse response;
    const grpc::Status s = stub->Pin(&context, pin, &response);
    EXPECT_EQ(s.error_code(), grpc::NOT_FOUND);
    EXPECT_THAT(s.error_message(), HasSubstr("lease_id: unknown or ended lease"));
  }
  // A destination shorter than the block.
  ASSERT_OK(SaveBlocks(*client_, {b}));
  EXPECT_THAT(client_->LoadInto({b.id()}, SmallFingerprint(), {region->Slice(0, 4096)}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("destinations[0].length: 4096 is shorter")));
  // CUDA registration on a machine without a usable GPU is refused clearly.
  absl::StatusOr<uint64_t> cuda = client_->RegisterCudaRegion(std::string(64, '\0'), 0, 4096);
  if (!Stat().cuda_available()) {
    EXPECT_THAT(cuda, StatusIs(absl::StatusCode::kUnavailable));
  } else {
    EXPECT_FALSE(cuda.ok());
  }
  EXPECT_THAT(client_->RegisterCudaRegion(std::string(64, '\0'), 77, 4096),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_OK(client_->HealthCheck());
}

TEST_F(DataPathTest, HostileFdChannelRequestsAreRefusedWithoutLeaks) {
  // A lease of our own, through the raw API, so the test knows its id.
  auto channel = grpc::CreateChannel("unix:" + daemon_->socket(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::KvTier::NewStub(channel);
  grpc::ClientContext lease_context;
  auto reader = stub->OpenLease(&lease_context, v1::OpenLeaseRequest());
  v1::LeaseEvent grant;
  ASSERT_TRUE(reader->Read(&grant));
  const std::string lease = grant.grant().lease_id();
  const std::string path = grant.grant().fd_socket();
  const int fds_before = CountFds(daemon_->pid());

  struct Case {
    const char* name;
    std::string body;
    std::function<std::vector<int>()> fds;
    int code;
    const char* message;
  };
  char tmpl[] = "/tmp/evoke-plainXXXXXX";
  const int plain = mkstemp(tmpl);
  ASSERT_EQ(ftruncate(plain, 4096), 0);
  unlink(tmpl);
  const Case cases[] = {
      {"unsealed memfd", Request(lease, 4096), [] { return std::vector<int>{SealedMemfd(4096, 0)}; },
       3, "sealed with F_SEAL_SHRINK"},
      {"plain file", Request(lease, 4096), [&] { return std::vector<int>{dup(plain)}; }, 3,
       "sealed with F_SEAL_SHRINK"},
      {"size mismatch", Request(lease, 8192),
       [] { return std::vector<int>{SealedMemfd(4096, F_SEAL_SHRINK)}; }, 3,
       "does not match the memfd's size 4096"},
      {"zero size", Request(lease, 0),
       [] { return std::vector<int>{SealedMemfd(0, F_SEAL_SHRINK)}; }, 3, "size: 0 must be"},
      {"write-sealed", Request(lease, 4096),
       [] { return std::vector<int>{SealedMemfd(4096, F_SEAL_SHRINK | F_SEAL_WRITE)}; }, 3,
       "F_SEAL_WRITE"},
      {"no fd", Request(lease, 4096), [] { return std::vector<int>{}; }, 3,
       "exactly one file descriptor"},
      {"two fds", Request(lease, 4096),
       [] {
         return std::vector<int>{SealedMemfd(4096, F_SEAL_SHRINK),
                                 SealedMemfd(4096, F_SEAL_SHRINK)};
       },
       3, "exactly one file descriptor must come with the request (SCM_RIGHTS), got 2"},
      {"bad magic", "XXXXXXXX" + Request(lease, 4096).substr(8),
       [] { return std::vector<int>{SealedMemfd(4096, F_SEAL_SHRINK)}; }, 3, "bad magic"},
      {"unknown lease", Request(std::string(16, 'z'), 4096),
       [] { return std::vector<int>{SealedMemfd(4096, F_SEAL_SHRINK)}; }, 5,
       "unknown or ended lease"},
      {"short request", "EVKFD001",
       [] { return std::vector<int>{SealedMemfd(4096, F_SEAL_SHRINK)}; }, 3, "short"},
  };
  for (const Case& c : cases) {
    std::vector<int> fds = c.fds();
    const auto [code, message] = SendFds(path, c.body, fds);
    for (int fd : fds) close(fd);
    EXPECT_EQ(code, c.code) << c.name << ": " << message;
    EXPECT_THAT(message, HasSubstr(c.message)) << c.name;
  }
  close(plain);
  // A shrink after registration cannot happen: the seal forbids it.
  const int good = SealedMemfd(1 << 20, F_SEAL_SHRINK | F_SEAL_GROW);
  const auto [code, message] = SendFds(path, Request(lease, 1 << 20), {good});
  EXPECT_EQ(code, 0) << message;
  EXPECT_NE(ftruncate(good, 4096), 0);
  close(good);
  // The daemon keeps no fd of any request (a transient one, e.g. RocksDB's
  // or gRPC's own, may come and go: wait for the count to settle).
  int fds_after = CountFds(daemon_->pid());
  WaitUntil(
      [&] {
        fds_after = CountFds(daemon_->pid());
        return fds_after <= fds_before;
      },
      absl::Seconds(2), absl::Milliseconds(20));
  EXPECT_LE(fds_after, fds_before);
  lease_context.TryCancel();
  reader->Finish();
  WaitUntil([&] { return Stat().leases().leases() <= 1; }, absl::Seconds(2));
  EXPECT_EQ(Stat().leases().shm_regions(), 0u);
  EXPECT_EQ(CountMappedRegions(daemon_->pid()), 0);
  EXPECT_OK(client_->HealthCheck());
}

TEST_F(DataPathTest, RegionLimitPerLease) {
  client_.reset();
  ASSERT_OK(daemon_->Terminate());
  StartDaemon({"--max-regions-per-lease", "4"});
  std::vector<std::unique_ptr<SharedRegion>> regions;
  // The first region brings the command ring, itself one of the lease's
  // regions: three more fit.
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(auto r, client_->CreateSharedRegion(64 << 10));
    regions.push_back(std::move(r));
  }
  EXPECT_TRUE(client_->has_ring());
  EXPECT_THAT(client_->CreateSharedRegion(64 << 10),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("4 regions")));
  EXPECT_EQ(Stat().leases().shm_regions(), 4u);
}

// A running lease_client; `out` is the read end of its stdout, held open
// until it is killed (so that it never dies of SIGPIPE first).
struct LeaseClient {
  Subprocess process;
  UniqueFd out;
};

// Runs lease_client in `mode` and waits until it prints "ready".
absl::StatusOr<LeaseClient> StartLeaseClient(const std::string& socket,
                                             const std::string& mode) {
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return absl::InternalError("pipe2 failed");
  LeaseClient client;
  client.out.Reset(pipefd[0]);
  UniqueFd write_end(pipefd[1]);
  SpawnOptions options{
      .argv = {BinaryPath("EVOKE_LEASE_CLIENT", EVOKE_LEASE_CLIENT_PATH), socket, mode}};
  options.stdout_fd = write_end.get();
  EVOKE_ASSIGN_OR_RETURN(client.process, Subprocess::Spawn(options));
  write_end.Reset();  // The child holds its own copy.
  char buf[16] = {0};
  const ssize_t n = read(client.out.get(), buf, 6);
  if (n != 6 || std::string(buf, 5) != "ready") {
    return absl::UnavailableError(absl::StrCat("lease_client ", mode, " did not get ready"));
  }
  return client;
}

// The ring's handler keeps the regions its entries name mapped between
// submissions; one the client unregisters is let go of while the ring is
// idle (its liveness check), not held until the next submission.
TEST_F(DataPathTest, AnUnregisteredRegionUnmapsWhileTheRingIsIdle) {
  ASSERT_OK_AND_ASSIGN(auto keep, client_->CreateSharedRegion(1 << 20));
  ASSERT_TRUE(client_->has_ring());
  const int with_ring = CountMappedRegions(daemon_->pid());  // The ring and `keep`.
  ASSERT_OK_AND_ASSIGN(auto gone, client_->CreateSharedRegion(1 << 20));
  const TestBlock b = SessionBlock("unmap", 0, 8);
  std::memcpy(gone->data(), b.payload.data(), b.payload.size());
  ASSERT_OK(client_->Save({BlockToSave(b.meta, gone->Slice(0, b.payload.size()))}).status());
  EXPECT_EQ(CountMappedRegions(daemon_->pid()), with_ring + 1);
  ASSERT_OK(client_->UnregisterRegion(gone->id()));
  WaitUntil([&] { return CountMappedRegions(daemon_->pid()) == with_ring; }, absl::Seconds(5));
  EXPECT_EQ(CountMappedRegions(daemon_->pid()), with_ring);
  EXPECT_EQ(Stat().leases().rings(), 1u);  // The ring itself goes on.
}

TEST_F(DataPathTest, KilledClientLosesItsLeaseRegionsAndPins) {
  const int maps_before = CountMappedRegions(daemon_->pid());
  ASSERT_OK_AND_ASSIGN(LeaseClient lease_client, StartLeaseClient(daemon_->socket(), "hold"));
  v1::StatResponse st = Stat();
  EXPECT_EQ(st.leases().leases(), 2u);  // Ours and the client's.
  EXPECT_EQ(st.leases().shm_regions(), 2u);  // Its region and its ring.
  EXPECT_EQ(st.leases().rings(), 1u);
  EXPECT_EQ(st.pinned_blocks(), 8u);
  EXPECT_EQ(CountMappedRegions(daemon_->pid()), maps_before + 2);
  ASSERT_OK(lease_client.process.Kill());
  lease_client.out.Reset();
  const absl::Time killed = absl::Now();
  WaitUntil(
      [&] {
        st = Stat();
        // The ring's thread lets go of its region within its liveness
        // interval (100 ms).
        return st.leases().leases() == 1 && st.pinned_blocks() == 0 &&
               st.leases().rings() == 0;
      },
      absl::Seconds(5));
  EXPECT_EQ(st.leases().leases(), 1u);
  EXPECT_EQ(st.leases().rings(), 0u);
  EXPECT_EQ(st.leases().shm_regions(), 0u);
  EXPECT_EQ(st.pinned_blocks(), 0u);
  EXPECT_EQ(st.leases().lease_pins(), 0u);
  EXPECT_EQ(st.leases().pins_released_on_expiry(), 8u);
  EXPECT_EQ(CountMappedRegions(daemon_->pid()), maps_before);
  EXPECT_LT(absl::Now() - killed, absl::Seconds(5));
  // The blocks it saved stay stored (only its pins and regions went).
  EXPECT_EQ(st.pinned().blocks(), 8u);
}

TEST_F(DataPathTest, ClientKilledMidBatchLeavesTheDaemonConsistent) {
  for (int round = 0; round < 3; ++round) {
    ASSERT_OK_AND_ASSIGN(LeaseClient lease_client,
                         StartLeaseClient(daemon_->socket(), "churn"));
    absl::SleepFor(absl::Milliseconds(50 + 70 * round));  // Killed mid-batch.
    ASSERT_OK(lease_client.process.Kill());
  }
  WaitUntil([&] { return Stat().leases().leases() <= 1; }, absl::Seconds(5));
  const v1::StatResponse st = Stat();
  EXPECT_EQ(st.leases().leases(), 1u);
  EXPECT_EQ(st.leases().shm_regions(), 0u);
  EXPECT_LE(st.pinned().used_bytes(), st.pinned().capacity_bytes());
  // Every stored block is intact, and the daemon keeps serving.
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse report, client_->Verify({}));
  EXPECT_EQ(report.corrupt_size(), 0);
  EXPECT_GT(report.blocks_checked(), 0u);
  EXPECT_EQ(report.copies_ok(), report.copies_checked());
  const TestBlock b = SessionBlock("after", 0, 64);
  ASSERT_OK(SaveBlocks(*client_, {b}));
}

}  // namespace
}  // namespace evoke::testing
