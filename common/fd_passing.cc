#include "common/fd_passing.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace evoke {
namespace {

void PutLE(std::string* out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetLE(const char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// RecvSome is recv() retried on EINTR: > 0 bytes, 0 at EOF, < 0 on error.
ssize_t RecvSome(int sock, char* data, size_t size) {
  for (;;) {
    const ssize_t n = recv(sock, data, size, 0);
    if (n >= 0 || errno != EINTR) return n;
  }
}

}  // namespace

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
}

absl::StatusOr<UniqueFd> ConnectUnixSocket(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", path));
  }
  UniqueFd sock(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) {
    return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  // A Unix socket's connect blocks only while the listener's backlog is
  // full; a signal then interrupts it before it links, so it is retried.
  int rc;
  do {
    rc = connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("connect ", path, ": ", std::strerror(errno)));
  }
  return sock;
}

absl::Status SendWithFds(int sock, absl::string_view data, absl::Span<const int> fds) {
  if (data.empty() && !fds.empty()) {
    // A stream socket delivers ancillary data only along with data.
    return absl::InvalidArgumentError("sendmsg: descriptors need at least one byte of data");
  }
  iovec iov{const_cast<char*>(data.data()), data.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  // cmsghdr alignment: a vector of cmsghdr-sized units.
  std::vector<cmsghdr> control;
  if (!fds.empty()) {
    const size_t space = CMSG_SPACE(sizeof(int) * fds.size());
    control.resize((space + sizeof(cmsghdr) - 1) / sizeof(cmsghdr));
    std::memset(control.data(), 0, control.size() * sizeof(cmsghdr));
    msg.msg_control = control.data();
    msg.msg_controllen = space;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(data.size())) {
    return absl::UnavailableError(absl::StrCat("sendmsg: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

namespace {

// ReadInto does one recvmsg toward `size` bytes of `into`: > 0 bytes read,
// 0 at EOF, < 0 on error (errno set), EINTR retried.
ssize_t ReadInto(int sock, size_t size, ReceivedWithFds* into, size_t max_fds_per_read,
                 int flags) {
  const size_t got = into->data.size();
  into->data.resize(size);
  std::vector<cmsghdr> control(
      (CMSG_SPACE(sizeof(int) * max_fds_per_read) + sizeof(cmsghdr) - 1) / sizeof(cmsghdr));
  iovec iov{into->data.data() + got, size - got};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (max_fds_per_read > 0) {
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * max_fds_per_read);
  }
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | flags);
  } while (n < 0 && errno == EINTR);
  const int err = errno;
  into->data.resize(got + static_cast<size_t>(std::max<ssize_t>(n, 0)));
  if (n <= 0) {
    errno = err;
    return n;
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0) into->fds_truncated = true;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      into->fds.emplace_back(received);
    }
  }
  return n;
}

}  // namespace

ReceivedWithFds ReceiveWithFds(int sock, size_t size, size_t max_fds_per_read) {
  ReceivedWithFds out;
  while (out.data.size() < size) {
    const ssize_t n = ReadInto(sock, size, &out, max_fds_per_read, 0);
    if (n <= 0) {
      out.stopped = n == 0 ? "peer closed" : std::strerror(errno);
      break;
    }
  }
  return out;
}

ReceiveProgress ReceiveAvailable(int sock, size_t size, ReceivedWithFds* into,
                                 size_t max_fds_per_read) {
  while (into->data.size() < size) {
    const ssize_t n = ReadInto(sock, size, into, max_fds_per_read, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return ReceiveProgress::kWouldBlock;
    if (n <= 0) {
      into->stopped = n == 0 ? "peer closed" : std::strerror(errno);
      return ReceiveProgress::kStopped;
    }
  }
  return ReceiveProgress::kComplete;
}

absl::StatusOr<std::string> ReadFull(int sock, size_t size, absl::string_view what) {
  std::string out(size, '\0');
  size_t got = 0;
  while (got < size) {
    const ssize_t n = RecvSome(sock, out.data() + got, size - got);
    if (n <= 0) {
      return absl::UnavailableError(
          absl::StrCat(what, ": ", n == 0 ? "peer closed" : std::strerror(errno), " after ",
                       got, " of ", size, " bytes"));
    }
    got += static_cast<size_t>(n);
  }
  return out;
}

std::string EncodeFdChannelRequest(absl::string_view lease_id, uint64_t size) {
  std::string body(kFdChannelMagic, sizeof(kFdChannelMagic));
  body.append(lease_id.data(), lease_id.size());
  PutLE(&body, size, 8);
  return body;
}

absl::StatusOr<FdChannelRequest> DecodeFdChannelRequest(absl::string_view body) {
  if (body.size() < kFdChannelRequestBytes) {
    return absl::InvalidArgumentError("request: short or timed out");
  }
  if (std::memcmp(body.data(), kFdChannelMagic, sizeof(kFdChannelMagic)) != 0) {
    return absl::InvalidArgumentError("request: bad magic (want EVKFD001)");
  }
  FdChannelRequest request;
  request.lease_id = std::string(body.substr(8, 16));
  request.size = GetLE(body.data() + 24, 8);
  return request;
}

absl::StatusOr<FdChannelRequest> ReceiveFdChannelRequest(int sock) {
  return ParseFdChannelRequest(ReceiveWithFds(sock, kFdChannelRequestBytes));
}

absl::StatusOr<FdChannelRequest> ParseFdChannelRequest(ReceivedWithFds received) {
  EVOKE_ASSIGN_OR_RETURN(FdChannelRequest request, DecodeFdChannelRequest(received.data));
  if (received.fds_truncated || received.fds.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fd: exactly one file descriptor must come with the request (SCM_RIGHTS), got ",
        received.fds.size(), received.fds_truncated ? " or more" : ""));
  }
  request.fd = std::move(received.fds[0]);
  return request;
}

std::string EncodeFdChannelReply(const absl::Status& status, uint64_t region_id) {
  std::string out;
  PutLE(&out, static_cast<uint32_t>(status.code()), 4);
  PutLE(&out, region_id, 8);
  PutLE(&out, status.message().size(), 4);
  out.append(status.message().data(), status.message().size());
  return out;
}

void SendFdChannelReply(int sock, const absl::Status& status, uint64_t region_id,
                        bool nonblocking) {
  const std::string out = EncodeFdChannelReply(status, region_id);
  size_t sent = 0;
  while (sent < out.size()) {
    const ssize_t n = send(sock, out.data() + sent, out.size() - sent,
                           MSG_NOSIGNAL | (nonblocking ? MSG_DONTWAIT : 0));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

absl::StatusOr<FdChannelReply> ReadFdChannelReply(int sock) {
  absl::StatusOr<std::string> head = ReadFull(sock, kFdChannelReplyHeadBytes, "fd socket");
  if (!head.ok()) return absl::UnavailableError("fd socket closed before replying");
  const auto code = static_cast<absl::StatusCode>(GetLE(head->data(), 4));
  FdChannelReply reply;
  reply.region_id = GetLE(head->data() + 4, 8);
  // The daemon's messages are short; a length past 1 MiB is read only that
  // far rather than allocated whole.
  std::string message(std::min<uint64_t>(GetLE(head->data() + 12, 4), 1 << 20), '\0');
  size_t got = 0;
  while (got < message.size()) {
    const ssize_t n = RecvSome(sock, message.data() + got, message.size() - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  message.resize(got);
  reply.status = absl::Status(code, message);
  return reply;
}

absl::StatusOr<FdChannelReply> SendFdChannelRequest(const std::string& path,
                                                    absl::string_view body,
                                                    absl::Span<const int> fds) {
  EVOKE_ASSIGN_OR_RETURN(UniqueFd sock, ConnectUnixSocket(path));
  const absl::Status sent = SendWithFds(sock.get(), body, fds);
  // The daemon may answer before reading anything (a peer it does not
  // admit, too many connections) and close: the send then fails, but its
  // answer is there to read, and says more than "Broken pipe".
  absl::StatusOr<FdChannelReply> reply = ReadFdChannelReply(sock.get());
  if (!sent.ok() && !reply.ok()) return sent;
  return reply;
}

}  // namespace evoke
