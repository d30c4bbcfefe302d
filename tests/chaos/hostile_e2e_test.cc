// Trial: hostile and slow shared-memory clients against a real evoked
// (issue #11, "hostile or slow clients"; reliability checklist item 9).
//
// Each test speaks the FdChannel protocol raw (common/fd_passing.h), as a
// hostile client would, and checks that the daemon refuses what it must,
// stays up and healthy, keeps no descriptor or mapping of what it refused,
// and serves a good client meanwhile. The long form of the flood
// (EVOKE_TRIAL_LONG=1) sends 70,000 registrations, past vm.max_map_count.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/fd_passing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e_fixture.h"

namespace evoke::testing {
namespace {

using ::testing::HasSubstr;

constexpr unsigned kSeals = F_SEAL_SHRINK | F_SEAL_GROW;

int Memfd(uint64_t size, unsigned seals = kSeals) {
  const int fd = memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
  if (seals != 0) {
    EXPECT_EQ(fcntl(fd, F_ADD_SEALS, seals), 0);
  }
  return fd;
}

int CountFds(pid_t pid) {
  int n = 0;
  DIR* d = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (d == nullptr) return -1;
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n - 2;
}

// Lines of /proc/PID/maps, and those that map a memfd named "hostile".
std::pair<int, int> CountMaps(pid_t pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  int all = 0, ours = 0;
  while (std::getline(maps, line)) {
    ++all;
    if (line.find("memfd:hostile") != std::string::npos) ++ours;
  }
  return {all, ours};
}

// A kB field of /proc/PID/status, in bytes.
uint64_t StatusBytes(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}

bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

// One raw registration; the reply, or what failed in the exchange. Gives up
// waiting for the reply after `timeout`.
absl::StatusOr<FdChannelReply> Register(const std::string& path, const std::string& body,
                                        const std::vector<int>& fds,
                                        absl::Duration timeout = absl::Seconds(5)) {
  absl::StatusOr<UniqueFd> sock = ConnectUnixSocket(path);
  if (!sock.ok()) return sock.status();
  const timeval t = absl::ToTimeval(timeout);
  setsockopt(sock->get(), SOL_SOCKET, SO_RCVTIMEO, &t, sizeof(t));
  const absl::Status sent = SendWithFds(sock->get(), body, fds);
  absl::StatusOr<FdChannelReply> reply = ReadFdChannelReply(sock->get());
  if (!sent.ok() && !reply.ok()) return sent;
  return reply;
}

// Its status, or the exchange's error.
absl::Status RegisterStatus(const std::string& path, const std::string& lease, uint64_t size,
                            int fd) {
  absl::StatusOr<FdChannelReply> r = Register(path, EncodeFdChannelRequest(lease, size), {fd});
  return r.ok() ? r->status : r.status();
}

bool TrialLong() {
  const char* v = std::getenv("EVOKE_TRIAL_LONG");
  return v != nullptr && std::string(v) == "1";
}

class HostileTest : public E2eTest {
 protected:
  // Call as ASSERT_NO_FATAL_FAILURE(Start(...)).
  void Start(const std::vector<std::string>& flags = {}) {
    ASSERT_NO_FATAL_FAILURE(StartDaemon(flags));
    // A lease of our own through the raw API, so the test knows its id.
    stub_ = RawStub(daemon_->socket());
    lease_context_ = std::make_unique<grpc::ClientContext>();
    lease_stream_ = stub_->OpenLease(lease_context_.get(), v1::OpenLeaseRequest());
    v1::LeaseEvent grant;
    ASSERT_TRUE(lease_stream_->Read(&grant));
    lease_ = grant.grant().lease_id();
    fd_socket_ = grant.grant().fd_socket();
    ASSERT_EQ(lease_.size(), 16u);
  }
  void EndLease() {
    if (lease_context_ == nullptr) return;
    lease_context_->TryCancel();
    lease_stream_->Finish();
    lease_stream_.reset();
    lease_context_.reset();
  }
  void TearDown() override { EndLease(); }

  // The daemon answers, and a Save and Load round-trip: through a fresh
  // shared region of the client library, or inline (`with_region` false:
  // while this uid is at its mapping cap).
  void ExpectHealthy(bool with_region = true) {
    ASSERT_TRUE(Alive(daemon_->pid())) << LogTail();
    EXPECT_OK(client_->HealthCheck()) << LogTail();
    const TestBlock b = SessionBlock("hostile-health", seq_++, 64);
    if (with_region) {
      absl::StatusOr<std::unique_ptr<SharedRegion>> region =
          client_->CreateSharedRegion(1 << 20);
      ASSERT_OK(region);
      std::memcpy((*region)->data(), b.payload.data(), b.payload.size());
      ASSERT_OK(client_->Save({BlockToSave(b.meta, (*region)->Slice(0, b.payload.size()))}));
    } else {
      ASSERT_OK(SaveBlocks(*client_, {b})) << LogTail();
    }
    ASSERT_OK_AND_ASSIGN(std::vector<LoadedBlock> back, client_->Load({b.id()}, SmallFingerprint()));
    ASSERT_EQ(back.size(), 1u);
    EXPECT_EQ(back[0].payload, b.payload);
  }

  // The end of the daemon's log, for failures.
  std::string LogTail() const {
    const std::string log = daemon_->Log();
    return log.substr(log.size() > 2000 ? log.size() - 2000 : 0);
  }

  std::unique_ptr<v1::KvTier::Stub> stub_;
  std::unique_ptr<grpc::ClientContext> lease_context_;
  std::unique_ptr<grpc::ClientReader<v1::LeaseEvent>> lease_stream_;
  std::string lease_;
  std::string fd_socket_;
  uint64_t seq_ = 0;
};

// Finding: registration mapped with MAP_POPULATE, so the daemon allocated
// whatever size a sparse memfd claimed (1 GiB per registration).
TEST_F(HostileTest, SparseGigabyteMemfdCostsTheDaemonNothing) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const pid_t pid = daemon_->pid();
  const uint64_t before = StatusBytes(pid, "VmRSS");
  const int fd = Memfd(1ull << 30);
  const absl::Status st = RegisterStatus(fd_socket_, lease_, 1ull << 30, fd);
  close(fd);
  EXPECT_OK(st);
  const uint64_t after = StatusBytes(pid, "VmRSS");
  EXPECT_LT(after, before + (64ull << 20))
      << "registering a sparse 1 GiB memfd grew evoked's VmRSS from " << (before >> 20)
      << " MiB to " << (after >> 20) << " MiB";
  ExpectHealthy();
}

// Finding: mappings were capped per lease only; 65k one-page regions passed
// vm.max_map_count and the daemon aborted (SIGABRT in an allocator). Now a
// global and a per-uid cap refuse them well before, RESOURCE_EXHAUSTED.
TEST_F(HostileTest, FloodOfTinyRegistrationsIsCappedAndTheDaemonStaysHealthy) {
  // No per-lease limit in the way: one lease tries them all.
  ASSERT_NO_FATAL_FAILURE(Start({"--max-regions-per-lease", "1000000"}));
  const pid_t pid = daemon_->pid();
  const int fds_before = CountFds(pid);
  const int attempts = TrialLong() ? 70000 : 10000;
  const int fd = Memfd(4096);
  int ok = 0, exhausted = 0, other = 0;
  std::string other_example;
  const absl::Time start = absl::Now();
  for (int i = 0; i < attempts; ++i) {
    const absl::Status st = RegisterStatus(fd_socket_, lease_, 4096, fd);
    if (st.ok()) {
      ++ok;
    } else if (st.code() == absl::StatusCode::kResourceExhausted) {
      ++exhausted;
    } else {
      if (other++ == 0) other_example = st.ToString();
      if (!Alive(pid)) break;
    }
  }
  close(fd);
  const absl::Duration took = absl::Now() - start;
  const auto [maps, ours] = CountMaps(pid);
  std::cerr << attempts << " registrations in " << took << ": " << ok << " mapped, "
            << exhausted << " refused (RESOURCE_EXHAUSTED), " << other << " other ("
            << other_example << "); evoked has " << maps << " mappings\n";
  ASSERT_TRUE(Alive(pid)) << "evoked died under the flood:\n" << LogTail();
  EXPECT_EQ(other, 0) << other_example;
  EXPECT_GT(exhausted, 0) << "no cap: all " << ok << " mapped";
  EXPECT_EQ(ours, ok);
  std::ifstream kernel("/proc/sys/vm/max_map_count");
  int max_map_count = 65530;
  kernel >> max_map_count;
  EXPECT_LE(maps, max_map_count / 2) << "the cap leaves too little room under vm.max_map_count";
  // Serving goes on; this uid's next region waits for some to go.
  ExpectHealthy(/*with_region=*/false);
  EXPECT_THAT(client_->CreateSharedRegion(4096),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("unregister some")));
  // Ending the lease unmaps them all and returns their share of the caps.
  EndLease();
  EXPECT_TRUE(Eventually([&] { return CountMaps(pid).second == 0; }, "the regions unmap"));
  EXPECT_TRUE(Eventually([&] { return CountFds(pid) <= fds_before; }, "no descriptor kept"));
  // A new lease registers again.
  stub_ = RawStub(daemon_->socket());
  lease_context_ = std::make_unique<grpc::ClientContext>();
  lease_stream_ = stub_->OpenLease(lease_context_.get(), v1::OpenLeaseRequest());
  v1::LeaseEvent grant;
  ASSERT_TRUE(lease_stream_->Read(&grant));
  const int again = Memfd(4096);
  EXPECT_OK(RegisterStatus(fd_socket_, grant.grant().lease_id(), 4096, again));
  close(again);
  ExpectHealthy();
}

// Finding: the fd socket served one connection at a time with a per-read
// timeout: five idle connections delayed a valid registration by 10 s, a
// trickling one by 17 s.
TEST_F(HostileTest, IdleAndTricklingConnectionsDoNotDelayARegistration) {
  ASSERT_NO_FATAL_FAILURE(Start());
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK_AND_ASSIGN(UniqueFd s, ConnectUnixSocket(fd_socket_));
    idle.push_back(std::move(s));
  }
  ASSERT_OK_AND_ASSIGN(UniqueFd trickler, ConnectUnixSocket(fd_socket_));
  const absl::Time trickle_start = absl::Now();
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    // One byte every 500 ms: each read well within a per-read timeout.
    const std::string body = EncodeFdChannelRequest(lease_, 4096);
    for (size_t i = 0; i < body.size() && !stop; ++i) {
      if (send(trickler.get(), &body[i], 1, MSG_NOSIGNAL) != 1) break;
      for (int t = 0; t < 10 && !stop; ++t) absl::SleepFor(absl::Milliseconds(50));
    }
  });
  // Joined on every path, an ASSERT's early return included.
  struct Joiner {
    std::atomic<bool>& stop;
    std::thread& thread;
    ~Joiner() {
      stop = true;
      if (thread.joinable()) thread.join();
    }
  } joiner{stop, trickle};
  absl::SleepFor(absl::Milliseconds(200));  // They are all queued before us.
  const int fd = Memfd(4096);
  const absl::Time start = absl::Now();
  absl::StatusOr<FdChannelReply> reply =
      Register(fd_socket_, EncodeFdChannelRequest(lease_, 4096), {fd}, absl::Seconds(3));
  const absl::Duration took = absl::Now() - start;
  close(fd);
  std::cerr << "a valid registration behind 5 idle and 1 trickling connections took " << took
            << "\n";
  ASSERT_OK(reply);
  EXPECT_OK(reply->status);
  EXPECT_LT(took, absl::Seconds(1));
  // The slow ones are cut off by one deadline for the whole connection, not
  // one per read: the trickler is answered long before its 16 s.
  const timeval t = absl::ToTimeval(absl::Seconds(8));
  setsockopt(trickler.get(), SOL_SOCKET, SO_RCVTIMEO, &t, sizeof(t));
  absl::StatusOr<FdChannelReply> cut = ReadFdChannelReply(trickler.get());
  const absl::Duration trickled = absl::Now() - trickle_start;
  ASSERT_OK(cut);
  EXPECT_THAT(cut->status, StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("short or timed out")));
  EXPECT_LT(trickled, absl::Seconds(5));
  for (UniqueFd& s : idle) {
    setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &t, sizeof(t));
    EXPECT_OK(ReadFdChannelReply(s.get()));
  }
  ExpectHealthy();
}

// Checklist item 9: undersized, shrunk, unsealed, wrong file type, offset +
// len overflow, len 0 or above the cap: all refused, no SIGBUS, no fd leak.
TEST_F(HostileTest, HostileDescriptorsAreRefusedWithoutLeaksOrSignals) {
  ASSERT_NO_FATAL_FAILURE(Start({"--max-region-bytes", "1MiB"}));
  const pid_t pid = daemon_->pid();
  const int fds_before = CountFds(pid);
  TempDir scratch;
  const std::string plain_path = scratch.Join("plain");
  const int plain = open(plain_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_EQ(ftruncate(plain, 4096), 0);
  const int sealed = Memfd(4096);
  struct Case {
    const char* name;
    uint64_t size;
    std::function<std::vector<int>()> fds;
    absl::StatusCode code;
    const char* message;
  };
  const std::string self = "/proc/self/fd/" + std::to_string(sealed);
  const Case cases[] = {
      {"unsealed", 4096, [] { return std::vector<int>{Memfd(4096, 0)}; },
       absl::StatusCode::kInvalidArgument, "F_SEAL_SHRINK"},
      {"not sealed against shrinking", 4096,
       [] { return std::vector<int>{Memfd(4096, F_SEAL_GROW)}; },
       absl::StatusCode::kInvalidArgument, "F_SEAL_SHRINK"},
      {"not sealed against growing", 4096,
       [] { return std::vector<int>{Memfd(4096, F_SEAL_SHRINK)}; },
       absl::StatusCode::kInvalidArgument, "F_SEAL_GROW"},
      {"undersized", 8192, [] { return std::vector<int>{Memfd(4096)}; },
       absl::StatusCode::kInvalidArgument, "does not match"},
      {"oversized", 4096, [] { return std::vector<int>{Memfd(8192)}; },
       absl::StatusCode::kInvalidArgument, "does not match"},
      {"zero", 0, [] { return std::vector<int>{Memfd(0)}; },
       absl::StatusCode::kInvalidArgument, "size: 0"},
      {"above the cap", 2 << 20, [] { return std::vector<int>{Memfd(2 << 20)}; },
       absl::StatusCode::kInvalidArgument, "--max-region-bytes"},
      {"huge", UINT64_MAX, [] { return std::vector<int>{Memfd(4096)}; },
       absl::StatusCode::kInvalidArgument, "--max-region-bytes"},
      {"write-sealed", 4096, [] { return std::vector<int>{Memfd(4096, kSeals | F_SEAL_WRITE)}; },
       absl::StatusCode::kInvalidArgument, "F_SEAL_WRITE"},
      {"read-only", 4096, [&] { return std::vector<int>{open(self.c_str(), O_RDONLY)}; },
       absl::StatusCode::kInvalidArgument, "cannot map"},
      {"O_PATH", 4096, [&] { return std::vector<int>{open(self.c_str(), O_PATH)}; },
       absl::StatusCode::kInvalidArgument, "fd: "},
      {"pipe", 4096,
       [] {
         int p[2];
         EXPECT_EQ(pipe(p), 0);
         close(p[1]);
         return std::vector<int>{p[0]};
       },
       absl::StatusCode::kInvalidArgument, "a pipe"},
      {"directory", 4096,
       [&] { return std::vector<int>{open(scratch.path().c_str(), O_RDONLY | O_DIRECTORY)}; },
       absl::StatusCode::kInvalidArgument, "a directory"},
      {"regular file on disk", 4096, [&] { return std::vector<int>{dup(plain)}; },
       absl::StatusCode::kInvalidArgument, "must be a memfd"},
      {"socket", 4096, [] { return std::vector<int>{socket(AF_UNIX, SOCK_STREAM, 0)}; },
       absl::StatusCode::kInvalidArgument, "a socket"},
      {"/dev/zero", 4096, [] { return std::vector<int>{open("/dev/zero", O_RDWR)}; },
       absl::StatusCode::kInvalidArgument, "a character device"},
      {"eventfd", 4096, [] { return std::vector<int>{eventfd(0, 0)}; },
       absl::StatusCode::kInvalidArgument, "not a memfd"},
      {"two fds", 4096, [] { return std::vector<int>{Memfd(4096), Memfd(4096)}; },
       absl::StatusCode::kInvalidArgument, "got 2"},
      {"no fd", 4096, [] { return std::vector<int>{}; },
       absl::StatusCode::kInvalidArgument, "got 0"},
  };
  for (const Case& c : cases) {
    std::vector<int> fds = c.fds();
    absl::StatusOr<FdChannelReply> r = Register(fd_socket_, EncodeFdChannelRequest(lease_, c.size), fds);
    for (int fd : fds) close(fd);
    ASSERT_OK(r) << c.name;
    EXPECT_THAT(r->status, StatusIs(c.code, HasSubstr(c.message))) << c.name;
    ASSERT_TRUE(Alive(pid)) << c.name << "\n" << daemon_->Log();
  }
  close(plain);
  // A good one, which can then neither shrink nor grow under the daemon.
  ASSERT_OK_AND_ASSIGN(FdChannelReply good,
                       Register(fd_socket_, EncodeFdChannelRequest(lease_, 4096), {sealed}));
  ASSERT_OK(good.status);
  EXPECT_NE(ftruncate(sealed, 0), 0);
  EXPECT_NE(ftruncate(sealed, 1 << 20), 0);
  // Slices of it: len 0, past its end, offset + len wrapping around 2^64.
  const TestBlock b = SessionBlock("hostile-slices", 0, 1);
  struct Slice {
    uint64_t offset, length;
  };
  for (const Slice s : {Slice{0, 0}, Slice{4096, b.payload.size()},
                        Slice{UINT64_MAX - 1, b.payload.size()},
                        Slice{1, UINT64_MAX}}) {
    v1::SaveRequest save;
    save.set_lease_id(lease_);
    v1::SaveBlock* block = save.add_blocks();
    *block->mutable_meta() = b.meta;
    block->mutable_region()->set_region_id(good.region_id);
    block->mutable_region()->set_offset(s.offset);
    block->mutable_region()->set_length(s.length);
    grpc::ClientContext ctx;
    v1::SaveResponse response;
    const grpc::Status st = stub_->Save(&ctx, save, &response);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << s.offset << "+" << s.length << ": " << st.error_message();
  }
  close(sealed);
  ASSERT_TRUE(Alive(pid)) << daemon_->Log();
  // No descriptor of any request is kept (a transient one of RocksDB or
  // gRPC may come and go: wait for the count to settle).
  EXPECT_TRUE(Eventually([&] { return CountFds(pid) <= fds_before; },
                         "evoked's descriptors return to their count"))
      << CountFds(pid) << " vs " << fds_before;
  EXPECT_EQ(CountMaps(pid).second, 1);  // The good one only.
  ExpectHealthy();
}

// Finding: a lease id was all it took to add regions to a lease, from any
// uid. Now only the uid that opened the lease can, and to any other it is
// indistinguishable from a lease that does not exist.
TEST_F(HostileTest, AnotherUidCannotAddRegionsToMyLease) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as uid 65534";
  ASSERT_NO_FATAL_FAILURE(Start());
  // Let uid 65534 reach the socket at all (the test directory is 0700).
  ASSERT_EQ(chmod(dir_.path().c_str(), 0711), 0);
  const std::string parent = fd_socket_.substr(0, fd_socket_.rfind('/'));
  if (parent != dir_.path()) {
    ASSERT_EQ(chmod(parent.c_str(), 0711), 0) << parent;
  }
  ASSERT_EQ(chmod(fd_socket_.c_str(), 0666), 0);
  const uint64_t regions_before = Stat().leases().shm_regions();
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(out[0]);
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    const int fd = Memfd(4096);
    const absl::Status mine = RegisterStatus(fd_socket_, lease_, 4096, fd);
    const absl::Status none = RegisterStatus(fd_socket_, std::string(16, 'q'), 4096, fd);
    const std::string line = mine.ToString() + "|" + none.ToString();
    if (write(out[1], line.data(), line.size()) < 0) _exit(4);
    _exit(0);
  }
  close(out[1]);
  std::string got;
  char buf[512];
  for (ssize_t n; (n = read(out[0], buf, sizeof(buf))) > 0;) got.append(buf, n);
  close(out[0]);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << wstatus;
  const size_t bar = got.find('|');
  ASSERT_NE(bar, std::string::npos) << got;
  const std::string mine = got.substr(0, bar), none = got.substr(bar + 1);
  EXPECT_NE(mine, "OK") << "uid 65534 added a region to root's lease";
  EXPECT_EQ(mine, none) << "another uid can tell my lease from no lease";
  EXPECT_EQ(Stat().leases().shm_regions(), regions_before);
  // Its owner can.
  const int fd = Memfd(4096);
  EXPECT_OK(RegisterStatus(fd_socket_, lease_, 4096, fd));
  close(fd);
}

}  // namespace
}  // namespace evoke::testing
