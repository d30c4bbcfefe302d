#include "common/fd_passing.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::HasSubstr;

// A connected pair of stream sockets, closed with the test.
struct SocketPair {
  SocketPair() {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    a.Reset(sv[0]);
    b.Reset(sv[1]);
  }
  UniqueFd a, b;
};

// A memfd of `size` bytes holding `content` at its start.
UniqueFd Memfd(const std::string& content, unsigned seals = 0) {
  UniqueFd fd(memfd_create("fd-passing-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(write(fd.get(), content.data(), content.size()),
            static_cast<ssize_t>(content.size()));
  if (seals != 0) {
    EXPECT_EQ(fcntl(fd.get(), F_ADD_SEALS, seals), 0);
  }
  return fd;
}

// Whether two descriptors refer to the same open file.
bool SameFile(int x, int y) {
  struct stat sx, sy;
  if (fstat(x, &sx) != 0 || fstat(y, &sy) != 0) return false;
  return sx.st_dev == sy.st_dev && sx.st_ino == sy.st_ino;
}

void SetReceiveTimeout(int sock, int ms) {
  timeval t{ms / 1000, (ms % 1000) * 1000};
  ASSERT_EQ(setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof(t)), 0);
}

const std::string kLease(16, 'L');

TEST(UniqueFdTest, ClosesReleasesAndMoves) {
  int raw = -1;
  {
    UniqueFd fd(memfd_create("x", MFD_CLOEXEC));
    raw = fd.get();
    ASSERT_GE(raw, 0);
    UniqueFd moved = std::move(fd);
    EXPECT_FALSE(fd.valid());
    EXPECT_EQ(moved.get(), raw);
    EXPECT_GE(fcntl(raw, F_GETFD), 0);
  }
  EXPECT_EQ(fcntl(raw, F_GETFD), -1);  // Closed with its owner.
  UniqueFd kept(memfd_create("y", MFD_CLOEXEC));
  const int released = kept.Release();
  EXPECT_FALSE(kept.valid());
  EXPECT_GE(fcntl(released, F_GETFD), 0);
  close(released);
}

TEST(FdPassingTest, OneFdArrivesWithItsMessage) {
  SocketPair p;
  UniqueFd memfd = Memfd("hello");
  ASSERT_OK(SendWithFds(p.a.get(), "payload", {memfd.get()}));
  ReceivedWithFds got = ReceiveWithFds(p.b.get(), 7);
  EXPECT_EQ(got.data, "payload");
  EXPECT_EQ(got.stopped, "");
  EXPECT_FALSE(got.fds_truncated);
  ASSERT_EQ(got.fds.size(), 1u);
  EXPECT_NE(got.fds[0].get(), memfd.get());  // A new descriptor...
  EXPECT_TRUE(SameFile(got.fds[0].get(), memfd.get()));  // ...of the same file,
  EXPECT_EQ(fcntl(got.fds[0].get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);  // close-on-exec.
  char buf[5];
  EXPECT_EQ(pread(got.fds[0].get(), buf, 5, 0), 5);
  EXPECT_EQ(std::string(buf, 5), "hello");
}

TEST(FdPassingTest, TwoFdsBothArriveInOrder) {
  SocketPair p;
  UniqueFd x = Memfd("x"), y = Memfd("y");
  ASSERT_OK(SendWithFds(p.a.get(), "m", {x.get(), y.get()}));
  ReceivedWithFds got = ReceiveWithFds(p.b.get(), 1);
  ASSERT_EQ(got.fds.size(), 2u);
  EXPECT_TRUE(SameFile(got.fds[0].get(), x.get()));
  EXPECT_TRUE(SameFile(got.fds[1].get(), y.get()));
}

TEST(FdPassingTest, MoreFdsThanRoomAreReportedTruncated) {
  SocketPair p;
  std::vector<UniqueFd> owned;
  std::vector<int> fds;
  for (int i = 0; i < 3; ++i) {
    owned.push_back(Memfd("z"));
    fds.push_back(owned.back().get());
  }
  ASSERT_OK(SendWithFds(p.a.get(), "m", fds));
  ReceivedWithFds got = ReceiveWithFds(p.b.get(), 1, /*max_fds_per_read=*/2);
  EXPECT_TRUE(got.fds_truncated);
  EXPECT_LE(got.fds.size(), 2u);
}

TEST(FdPassingTest, DataInSeveralReadsIsCollected) {
  SocketPair p;
  UniqueFd memfd = Memfd("q");
  ASSERT_OK(SendWithFds(p.a.get(), "abc", {memfd.get()}));
  ASSERT_OK(SendWithFds(p.a.get(), "defg", {}));
  ReceivedWithFds got = ReceiveWithFds(p.b.get(), 7);
  EXPECT_EQ(got.data, "abcdefg");
  EXPECT_EQ(got.fds.size(), 1u);
}

TEST(FdPassingTest, TruncatedMessageStopsAtPeerClose) {
  SocketPair p;
  ASSERT_OK(SendWithFds(p.a.get(), "short", {}));
  p.a.Reset();
  ReceivedWithFds got = ReceiveWithFds(p.b.get(), 32);
  EXPECT_EQ(got.data, "short");
  EXPECT_EQ(got.stopped, "peer closed");
}

TEST(FdPassingTest, SilentPeerTimesOut) {
  SocketPair p;
  SetReceiveTimeout(p.b.get(), 50);
  ReceivedWithFds got = ReceiveWithFds(p.b.get(), 8);
  EXPECT_EQ(got.data, "");
  EXPECT_NE(got.stopped, "");
  EXPECT_NE(got.stopped, "peer closed");
}

TEST(FdPassingTest, SendingToAClosedPeerIsAnErrorNotSigpipe) {
  SocketPair p;
  p.b.Reset();
  UniqueFd memfd = Memfd("x");
  EXPECT_THAT(SendWithFds(p.a.get(), "data", {memfd.get()}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("sendmsg: ")));
}

TEST(FdPassingTest, FdsNeedData) {
  SocketPair p;
  UniqueFd memfd = Memfd("x");
  EXPECT_THAT(SendWithFds(p.a.get(), "", {memfd.get()}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(FdPassingTest, ReadFullNamesWhatWasShort) {
  SocketPair p;
  ASSERT_OK(SendWithFds(p.a.get(), "abc", {}));
  p.a.Reset();
  EXPECT_THAT(ReadFull(p.b.get(), 5, "reply"),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("reply: peer closed after 3 of 5 bytes")));
}

TEST(FdPassingTest, ConnectToAMissingSocketNamesIt) {
  evoke::testing::TempDir dir;
  EXPECT_THAT(ConnectUnixSocket(dir.Join("none.sock")),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("connect " + dir.Join("none.sock") + ": ")));
  EXPECT_THAT(ConnectUnixSocket(std::string(200, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too long")));
}

TEST(FdPassingTest, ReceiveAvailableNeverWaits) {
  SocketPair p;
  ReceivedWithFds into;
  // Nothing yet: it returns at once (the socket is blocking).
  EXPECT_EQ(ReceiveAvailable(p.b.get(), 7, &into), ReceiveProgress::kWouldBlock);
  UniqueFd memfd = Memfd("q");
  ASSERT_OK(SendWithFds(p.a.get(), "abc", {memfd.get()}));
  EXPECT_EQ(ReceiveAvailable(p.b.get(), 7, &into), ReceiveProgress::kWouldBlock);
  EXPECT_EQ(into.data, "abc");
  ASSERT_EQ(into.fds.size(), 1u);
  ASSERT_OK(SendWithFds(p.a.get(), "defgXYZ", {}));
  EXPECT_EQ(ReceiveAvailable(p.b.get(), 7, &into), ReceiveProgress::kComplete);
  EXPECT_EQ(into.data, "abcdefg");  // No byte past what was asked.
  ReceivedWithFds rest;
  p.a.Reset();
  EXPECT_EQ(ReceiveAvailable(p.b.get(), 7, &rest), ReceiveProgress::kStopped);
  EXPECT_EQ(rest.data, "XYZ");
  EXPECT_EQ(rest.stopped, "peer closed");
}

// --- The FdChannel protocol.

TEST(FdChannelCodecTest, RequestRoundTrips) {
  const std::string body = EncodeFdChannelRequest(kLease, 0x0102030405060708ull);
  ASSERT_EQ(body.size(), kFdChannelRequestBytes);
  EXPECT_EQ(body.substr(0, 8), "EVKFD001");
  EXPECT_EQ(body[24], '\x08');  // Little endian.
  EXPECT_EQ(body[31], '\x01');
  ASSERT_OK_AND_ASSIGN(FdChannelRequest request, DecodeFdChannelRequest(body));
  EXPECT_EQ(request.lease_id, kLease);
  EXPECT_EQ(request.size, 0x0102030405060708ull);
  EXPECT_THAT(DecodeFdChannelRequest(body.substr(0, 31)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("request: short or timed out")));
  EXPECT_THAT(DecodeFdChannelRequest("XXXXXXXX" + body.substr(8)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("request: bad magic (want EVKFD001)")));
}

TEST(FdChannelCodecTest, ReceiverTakesExactlyOneFd) {
  SocketPair p;
  UniqueFd memfd = Memfd("region");
  ASSERT_OK(SendWithFds(p.a.get(), EncodeFdChannelRequest(kLease, 6), {memfd.get()}));
  ASSERT_OK_AND_ASSIGN(FdChannelRequest request, ReceiveFdChannelRequest(p.b.get()));
  EXPECT_EQ(request.lease_id, kLease);
  EXPECT_EQ(request.size, 6u);
  EXPECT_TRUE(SameFile(request.fd.get(), memfd.get()));
}

TEST(FdChannelCodecTest, ReceiverRefusesTwoFdsAndClosesThem) {
  SocketPair p;
  UniqueFd x = Memfd("x"), y = Memfd("y");
  ASSERT_OK(SendWithFds(p.a.get(), EncodeFdChannelRequest(kLease, 1), {x.get(), y.get()}));
  // The descriptor numbers the receiver gets are the lowest free ones; after
  // the refusal they must be free again.
  const int probe1 = dup(p.a.get()), probe2 = dup(p.a.get());
  ASSERT_GE(probe1, 0);
  ASSERT_GE(probe2, 0);
  close(probe1);
  close(probe2);
  EXPECT_THAT(ReceiveFdChannelRequest(p.b.get()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "fd: exactly one file descriptor must come with the request "
                       "(SCM_RIGHTS), got 2"));
  EXPECT_EQ(fcntl(probe1, F_GETFD), -1) << "a received descriptor leaked";
  EXPECT_EQ(fcntl(probe2, F_GETFD), -1) << "a received descriptor leaked";
}

TEST(FdChannelCodecTest, ReceiverRefusesNoFd) {
  SocketPair p;
  ASSERT_OK(SendWithFds(p.a.get(), EncodeFdChannelRequest(kLease, 1), {}));
  EXPECT_THAT(ReceiveFdChannelRequest(p.b.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got 0")));
}

TEST(FdChannelCodecTest, ReceiverReportsDroppedFds) {
  SocketPair p;
  std::vector<UniqueFd> owned;
  std::vector<int> fds;
  for (int i = 0; i < 6; ++i) {
    owned.push_back(Memfd("z"));
    fds.push_back(owned.back().get());
  }
  ASSERT_OK(SendWithFds(p.a.get(), EncodeFdChannelRequest(kLease, 1), fds));
  EXPECT_THAT(ReceiveFdChannelRequest(p.b.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(" or more")));
}

TEST(FdChannelCodecTest, ReceiverChecksLengthThenMagic) {
  {
    SocketPair p;
    UniqueFd memfd = Memfd("x");
    ASSERT_OK(SendWithFds(p.a.get(), "EVKFD001", {memfd.get()}));
    p.a.Reset();  // A truncated request: the peer closes after 8 bytes.
    EXPECT_THAT(ReceiveFdChannelRequest(p.b.get()),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         "request: short or timed out"));
  }
  {
    SocketPair p;
    SetReceiveTimeout(p.b.get(), 50);  // The peer stalls instead.
    ASSERT_OK(SendWithFds(p.a.get(), "EVKFD001", {}));
    EXPECT_THAT(ReceiveFdChannelRequest(p.b.get()),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         "request: short or timed out"));
  }
  {
    SocketPair p;
    UniqueFd memfd = Memfd("x");
    ASSERT_OK(SendWithFds(p.a.get(), "XXXXXXXX" + EncodeFdChannelRequest(kLease, 1).substr(8),
                          {memfd.get(), memfd.get()}));
    EXPECT_THAT(ReceiveFdChannelRequest(p.b.get()),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad magic")));
  }
}

TEST(FdChannelCodecTest, RepliesRoundTrip) {
  SocketPair p;
  SendFdChannelReply(p.a.get(), absl::OkStatus(), 42);
  SendFdChannelReply(p.a.get(), absl::NotFoundError("lease_id: unknown or ended lease"), 0);
  ASSERT_OK_AND_ASSIGN(FdChannelReply ok, ReadFdChannelReply(p.b.get()));
  EXPECT_OK(ok.status);
  EXPECT_EQ(ok.region_id, 42u);
  ASSERT_OK_AND_ASSIGN(FdChannelReply refused, ReadFdChannelReply(p.b.get()));
  EXPECT_THAT(refused.status,
              StatusIs(absl::StatusCode::kNotFound, "lease_id: unknown or ended lease"));
  EXPECT_EQ(EncodeFdChannelReply(absl::InvalidArgumentError("ab"), 7),
            std::string("\x03\0\0\0\x07\0\0\0\0\0\0\0\x02\0\0\0ab", 18));
}

TEST(FdChannelCodecTest, ReplyCutShort) {
  SocketPair p;
  ASSERT_OK(SendWithFds(p.a.get(), std::string(10, '\0'), {}));  // Part of a head.
  p.a.Reset();
  EXPECT_THAT(ReadFdChannelReply(p.b.get()),
              StatusIs(absl::StatusCode::kUnavailable, "fd socket closed before replying"));
  // A message shorter than its length field says is kept as far as it came.
  SocketPair q;
  std::string reply = EncodeFdChannelReply(absl::InternalError("abcdef"), 0);
  reply.resize(reply.size() - 3);
  ASSERT_OK(SendWithFds(q.a.get(), reply, {}));
  q.a.Reset();
  ASSERT_OK_AND_ASSIGN(FdChannelReply cut, ReadFdChannelReply(q.b.get()));
  EXPECT_THAT(cut.status, StatusIs(absl::StatusCode::kInternal, "abc"));
}

// The whole exchange over a listening socket, as the client and the daemon
// run it: connect, one request with its fd, one reply.
TEST(FdChannelCodecTest, RequestAndReplyOverAListeningSocket) {
  evoke::testing::TempDir dir;
  const std::string path = dir.Join("fd.sock");
  UniqueFd listener(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  ASSERT_EQ(bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener.get(), 4), 0);
  std::string served_lease;
  std::string served_content;
  std::thread server([&] {
    for (int i = 0; i < 2; ++i) {
      UniqueFd conn(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      absl::StatusOr<FdChannelRequest> request = ReceiveFdChannelRequest(conn.get());
      if (!request.ok()) {
        SendFdChannelReply(conn.get(), request.status(), 0);
        continue;
      }
      served_lease = request->lease_id;
      served_content.resize(request->size);
      if (pread(request->fd.get(), served_content.data(), request->size, 0) < 0) {
        served_content = "pread failed";
      }
      SendFdChannelReply(conn.get(), absl::OkStatus(), 7);
    }
  });
  UniqueFd memfd = Memfd("shared", F_SEAL_SHRINK);
  absl::StatusOr<FdChannelReply> reply =
      SendFdChannelRequest(path, EncodeFdChannelRequest(kLease, 6), {memfd.get()});
  absl::StatusOr<FdChannelReply> refused =
      SendFdChannelRequest(path, EncodeFdChannelRequest(kLease, 6), {memfd.get(), memfd.get()});
  server.join();
  ASSERT_OK(reply);
  EXPECT_OK(reply->status);
  EXPECT_EQ(reply->region_id, 7u);
  EXPECT_EQ(served_lease, kLease);
  EXPECT_EQ(served_content, "shared");
  ASSERT_OK(refused);
  EXPECT_THAT(refused->status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got 2")));
}

// A server that answers before reading (an unadmitted peer) and closes: the
// client's send fails, and it still reports the server's answer.
TEST(FdChannelCodecTest, AnAnswerBeforeTheRequestIsStillRead) {
  evoke::testing::TempDir dir;
  const std::string path = dir.Join("fd.sock");
  UniqueFd listener(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  ASSERT_EQ(bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener.get(), 4), 0);
  // The client's socket is connected once listen() returns: answer first.
  std::thread server([&] {
    UniqueFd conn(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    SendFdChannelReply(conn.get(), absl::PermissionDeniedError("not admitted"), 0);
  });
  absl::StatusOr<UniqueFd> sock = ConnectUnixSocket(path);
  ASSERT_OK(sock);
  server.join();  // Answered and closed before the request is sent.
  UniqueFd memfd = Memfd("x");
  EXPECT_FALSE(SendWithFds(sock->get(), EncodeFdChannelRequest(kLease, 1), {memfd.get()}).ok());
  ASSERT_OK_AND_ASSIGN(FdChannelReply reply, ReadFdChannelReply(sock->get()));
  EXPECT_THAT(reply.status, StatusIs(absl::StatusCode::kPermissionDenied, "not admitted"));
  // And the whole exchange, through SendFdChannelRequest.
  std::thread again([&] {
    UniqueFd conn(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    SendFdChannelReply(conn.get(), absl::ResourceExhaustedError("busy"), 0);
  });
  absl::StatusOr<FdChannelReply> whole =
      SendFdChannelRequest(path, EncodeFdChannelRequest(kLease, 1), {memfd.get()});
  again.join();
  ASSERT_OK(whole);
  EXPECT_THAT(whole->status, StatusIs(absl::StatusCode::kResourceExhausted, "busy"));
}

}  // namespace
}  // namespace evoke
