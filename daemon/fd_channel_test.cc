// FdChannel against slow, idle, crowding and foreign clients (issue #11,
// "hostile or slow clients"), in this process over a real Unix socket.
#include "daemon/fd_channel.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/pinned_arena.h"
#include "testing/memory_tier.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::HasSubstr;

int SealedMemfd(uint64_t size) {
  const int fd = memfd_create("fd-channel-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
  EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  return fd;
}

// Sends one request and reads the reply, giving up after `timeout` (the
// old channel made a good client wait behind slow ones: the test must not).
absl::StatusOr<FdChannelReply> Register(const std::string& path, const std::string& lease,
                                        uint64_t size, int fd,
                                        absl::Duration timeout = absl::Seconds(5)) {
  absl::StatusOr<UniqueFd> sock = ConnectUnixSocket(path);
  if (!sock.ok()) return sock.status();
  const timeval t = absl::ToTimeval(timeout);
  setsockopt(sock->get(), SOL_SOCKET, SO_RCVTIMEO, &t, sizeof(t));
  // A refused connection is answered and closed before the send: read the
  // answer anyway (as SendFdChannelRequest does).
  absl::Status sent = SendWithFds(sock->get(), EncodeFdChannelRequest(lease, size), {fd});
  absl::StatusOr<FdChannelReply> reply = ReadFdChannelReply(sock->get());
  if (!sent.ok() && !reply.ok()) return sent;
  return reply;
}

class FdChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PinnedArenaOptions arena_options;
    arena_options.capacity_bytes = 1 << 20;
    arena_options.lock_memory = false;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PinnedArena> arena,
                         PinnedArena::Create(arena_options));
    ASSERT_OK_AND_ASSIGN(tiers_, TierManager::Open(TierManagerOptions(), std::move(arena),
                                                   std::make_unique<testing::MemoryTier>()));
    leases_ = std::make_unique<LeaseManager>(LeaseManagerOptions(), tiers_.get());
    ASSERT_OK_AND_ASSIGN(Lease lease, leases_->Grant("test", geteuid()));
    lease_ = lease.id;
  }
  void StartChannel(FdChannelOptions options = FdChannelOptions()) {
    ASSERT_OK_AND_ASSIGN(channel_, FdChannel::Start(dir_.Join("fd.sock"), leases_.get(),
                                                    std::move(options)));
  }
  std::string lease() const { return lease_.ToBytes(); }

  evoke::testing::TempDir dir_;
  std::unique_ptr<TierManager> tiers_;
  std::unique_ptr<LeaseManager> leases_;
  BlockId lease_;
  std::unique_ptr<FdChannel> channel_;
};

TEST_F(FdChannelTest, RegistersAndRefuses) {
  StartChannel();
  const int fd = SealedMemfd(4096);
  ASSERT_OK_AND_ASSIGN(FdChannelReply ok, Register(channel_->path(), lease(), 4096, fd));
  EXPECT_OK(ok.status);
  EXPECT_NE(ok.region_id, 0u);
  ASSERT_OK_AND_ASSIGN(FdChannelReply bad, Register(channel_->path(), lease(), 8192, fd));
  EXPECT_THAT(bad.status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("does not match")));
  close(fd);
  EXPECT_EQ(channel_->counters().registered, 1u);
  EXPECT_EQ(channel_->counters().refused, 1u);
}

// Finding: the channel served one connection at a time with a per-read
// timeout: five idle connections delayed a valid registration by 10 s, a
// trickling one by 17 s.
TEST_F(FdChannelTest, IdleAndTricklingClientsDelayNoOne) {
  StartChannel();
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK_AND_ASSIGN(UniqueFd s, ConnectUnixSocket(channel_->path()));
    idle.push_back(std::move(s));
  }
  ASSERT_OK_AND_ASSIGN(UniqueFd trickler, ConnectUnixSocket(channel_->path()));
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    const std::string body = EncodeFdChannelRequest(lease(), 4096);
    for (size_t i = 0; i < body.size() && !stop; ++i) {
      if (send(trickler.get(), &body[i], 1, MSG_NOSIGNAL) != 1) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
  absl::SleepFor(absl::Milliseconds(100));  // All of them are in before us.
  const int fd = SealedMemfd(4096);
  const absl::Time start = absl::Now();
  absl::StatusOr<FdChannelReply> reply =
      Register(channel_->path(), lease(), 4096, fd, absl::Seconds(3));
  const absl::Duration took = absl::Now() - start;
  close(fd);
  stop = true;
  trickle.join();
  ASSERT_OK(reply);
  EXPECT_OK(reply->status);
  EXPECT_LT(took, absl::Seconds(1));
}

// Each connection has one deadline in all, however it trickles.
TEST_F(FdChannelTest, OneTotalDeadlinePerConnection) {
  FdChannelOptions options;
  options.connection_timeout = absl::Milliseconds(300);
  StartChannel(options);
  ASSERT_OK_AND_ASSIGN(UniqueFd trickler, ConnectUnixSocket(channel_->path()));
  const absl::Time start = absl::Now();
  const std::string body = EncodeFdChannelRequest(lease(), 4096);
  // One byte every 40 ms: each read comes well within any per-read timeout.
  for (size_t i = 0; i < body.size() - 1; ++i) {
    if (send(trickler.get(), &body[i], 1, MSG_NOSIGNAL) != 1) break;
    absl::SleepFor(absl::Milliseconds(40));
    if (absl::Now() - start > absl::Seconds(2)) break;
  }
  ASSERT_OK_AND_ASSIGN(FdChannelReply reply, ReadFdChannelReply(trickler.get()));
  EXPECT_THAT(reply.status,
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("short or timed out")));
  const absl::Duration took = absl::Now() - start;
  EXPECT_LT(took, absl::Milliseconds(1000));
  EXPECT_EQ(channel_->counters().timed_out, 1u);
  // And a silent one.
  ASSERT_OK_AND_ASSIGN(UniqueFd silent, ConnectUnixSocket(channel_->path()));
  ASSERT_OK_AND_ASSIGN(FdChannelReply silent_reply, ReadFdChannelReply(silent.get()));
  EXPECT_THAT(silent_reply.status, StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(FdChannelTest, ConnectionsBeyondTheCapAreRefusedAtOnce) {
  FdChannelOptions options;
  options.max_connections = 6;
  options.max_connections_per_uid = 4;
  StartChannel(options);
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(UniqueFd s, ConnectUnixSocket(channel_->path()));
    idle.push_back(std::move(s));
  }
  absl::SleepFor(absl::Milliseconds(100));
  const int fd = SealedMemfd(4096);
  const absl::Time start = absl::Now();
  ASSERT_OK_AND_ASSIGN(FdChannelReply refused,
                       Register(channel_->path(), lease(), 4096, fd, absl::Seconds(1)));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_THAT(refused.status, StatusIs(absl::StatusCode::kResourceExhausted,
                                       HasSubstr("too many connections")));
  EXPECT_GE(channel_->counters().over_capacity, 1u);
  // Once the idle ones go, registration works again.
  idle.clear();
  absl::Status last;
  for (int i = 0; i < 50; ++i) {
    absl::StatusOr<FdChannelReply> r = Register(channel_->path(), lease(), 4096, fd);
    last = r.ok() ? r->status : r.status();
    if (last.ok()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_OK(last);
  close(fd);
}

TEST_F(FdChannelTest, AdmissionSeesTheKernelsCredentialsBeforeAnyRead) {
  std::vector<PeerCred> seen;
  FdChannelOptions options;
  options.admit = [&](const PeerCred& peer) {
    seen.push_back(peer);
    return absl::PermissionDeniedError("uid not in the access policy");
  };
  StartChannel(options);
  const int fd = SealedMemfd(4096);
  ASSERT_OK_AND_ASSIGN(FdChannelReply reply, Register(channel_->path(), lease(), 4096, fd));
  close(fd);
  EXPECT_THAT(reply.status, StatusIs(absl::StatusCode::kPermissionDenied,
                                     "uid not in the access policy"));
  channel_.reset();  // Joins the thread: `seen` is safe to read.
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].uid, geteuid());
  EXPECT_EQ(seen[0].pid, getpid());
  EXPECT_EQ(leases_->Stats().shm_regions(), 0u);
}

TEST_F(FdChannelTest, ExtraDescriptorsAreRefusedWithoutWaitingForTheRest) {
  StartChannel();
  ASSERT_OK_AND_ASSIGN(UniqueFd sock, ConnectUnixSocket(channel_->path()));
  const int a = SealedMemfd(4096), b = SealedMemfd(4096);
  // Four bytes of the request and two descriptors, then nothing.
  ASSERT_OK(SendWithFds(sock.get(), "EVKF", {a, b}));
  const absl::Time start = absl::Now();
  ASSERT_OK_AND_ASSIGN(FdChannelReply reply, ReadFdChannelReply(sock.get()));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(1500));
  EXPECT_THAT(reply.status, StatusIs(absl::StatusCode::kInvalidArgument));
  close(a);
  close(b);
}

// Finding: any process that could open the socket could add regions to any
// lease whose id it had; a lease now takes regions from its owner's uid
// only, and to anyone else it looks like no lease at all.
TEST_F(FdChannelTest, AnotherUidCannotAddRegionsToMyLease) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as uid 65534";
  StartChannel();
  ASSERT_EQ(chmod(dir_.path().c_str(), 0711), 0);
  ASSERT_EQ(chmod(channel_->path().c_str(), 0666), 0);
  // The reply codes of the child: to my lease, and to a lease that does not
  // exist; through a pipe, as "code code\n".
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(out[0]);
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    const int fd = SealedMemfd(4096);
    absl::StatusOr<FdChannelReply> mine = Register(channel_->path(), lease(), 4096, fd);
    absl::StatusOr<FdChannelReply> none =
        Register(channel_->path(), std::string(16, 'q'), 4096, fd);
    if (!mine.ok() || !none.ok()) _exit(3);
    const std::string line = std::to_string(static_cast<int>(mine->status.code())) + " " +
                             std::string(mine->status.message()) + "|" +
                             std::to_string(static_cast<int>(none->status.code())) + " " +
                             std::string(none->status.message());
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
  EXPECT_EQ(got.substr(0, bar), got.substr(bar + 1)) << "my lease is distinguishable";
  EXPECT_THAT(got.substr(0, bar), HasSubstr("5 lease_id: unknown or ended lease"));
  EXPECT_EQ(leases_->Stats().shm_regions(), 0u);
  // Its owner still can.
  const int fd = SealedMemfd(4096);
  ASSERT_OK_AND_ASSIGN(FdChannelReply reply, Register(channel_->path(), lease(), 4096, fd));
  close(fd);
  EXPECT_OK(reply.status);
}

}  // namespace
}  // namespace evoke
