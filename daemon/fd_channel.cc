#include "daemon/fd_channel.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"

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

void Reply(int conn, const absl::Status& status, uint64_t region_id) {
  std::string out;
  PutLE(&out, static_cast<uint32_t>(status.code()), 4);
  PutLE(&out, region_id, 8);
  const std::string msg(status.message());
  PutLE(&out, msg.size(), 4);
  out += msg;
  size_t sent = 0;
  while (sent < out.size()) {
    const ssize_t n = send(conn, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += n;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<FdChannel>> FdChannel::Start(const std::string& path,
                                                            LeaseManager* leases) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("fd socket path too long: ", path));
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  unlink(path.c_str());  // Ours: the main socket's liveness was checked first.
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const mode_t old = umask(0117);
  const int bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(old);
  if (bound != 0 || chmod(path.c_str(), 0660) != 0 || listen(fd, 64) != 0) {
    const std::string err = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("fd socket ", path, ": ", err));
  }
  const int wake = eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  std::unique_ptr<FdChannel> channel(new FdChannel(path, fd, wake, leases));
  channel->thread_ = std::thread([c = channel.get()] { c->Serve(); });
  return channel;
}

FdChannel::FdChannel(std::string path, int listen_fd, int wake_fd, LeaseManager* leases)
    : path_(std::move(path)), listen_fd_(listen_fd), wake_fd_(wake_fd), leases_(leases) {}

FdChannel::~FdChannel() {
  const uint64_t one = 1;
  ssize_t unused = write(wake_fd_, &one, sizeof(one));
  (void)unused;
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  close(wake_fd_);
  unlink(path_.c_str());
}

void FdChannel::Serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      EVOKE_LOG_ERROR("fd channel: poll: ", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    Handle(conn);
    close(conn);
  }
}

void FdChannel::Handle(int conn) {
  timeval timeout{2, 0};
  setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  char request[kFdChannelRequestBytes];
  std::vector<int> fds;
  size_t got = 0;
  bool truncated = false;
  // The fd rides on the first bytes; later reads carry only data.
  while (got < sizeof(request)) {
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
    iovec iov{request + got, sizeof(request) - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC);
    if (n <= 0) break;
    if ((msg.msg_flags & MSG_CTRUNC) != 0) truncated = true;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int received;
          std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
          fds.push_back(received);
        }
      }
    }
    got += n;
  }
  auto close_all = [&]() {
    for (int f : fds) close(f);
    fds.clear();
  };
  if (got < sizeof(request)) {
    close_all();
    return Reply(conn, absl::InvalidArgumentError("request: short or timed out"), 0);
  }
  if (std::memcmp(request, kFdChannelMagic, sizeof(kFdChannelMagic)) != 0) {
    close_all();
    return Reply(conn, absl::InvalidArgumentError("request: bad magic (want EVKFD001)"), 0);
  }
  if (truncated || fds.size() != 1) {
    const size_t received = fds.size();
    close_all();
    return Reply(conn, absl::InvalidArgumentError(absl::StrCat(
                           "fd: exactly one file descriptor must come with the "
                           "request (SCM_RIGHTS), got ", received,
                           truncated ? " or more" : "")), 0);
  }
  const int fd = fds[0];
  fds.clear();
  absl::StatusOr<Lease> lease = leases_->Find(absl::string_view(request + 8, 16));
  if (!lease.ok()) {
    close(fd);
    return Reply(conn, lease.status(), 0);
  }
  const uint64_t size = GetLE(request + 24, 8);
  absl::StatusOr<std::unique_ptr<ShmRegion>> region =
      ShmRegion::Map(fd, size, leases_->options().max_region_bytes);
  if (!region.ok()) return Reply(conn, region.status(), 0);
  absl::StatusOr<uint64_t> id = leases_->AddRegion(lease->id, std::move(region).value());
  if (!id.ok()) return Reply(conn, id.status(), 0);
  Reply(conn, absl::OkStatus(), *id);
}

}  // namespace evoke
