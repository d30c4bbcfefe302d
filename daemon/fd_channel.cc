#include "daemon/fd_channel.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/fd_passing.h"
#include "common/log.h"

namespace evoke {

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
  // The received fd closes with `request` on every path, unless handed to
  // the region below.
  absl::StatusOr<FdChannelRequest> request = ReceiveFdChannelRequest(conn);
  if (!request.ok()) return SendFdChannelReply(conn, request.status(), 0);
  absl::StatusOr<Lease> lease = leases_->Find(request->lease_id);
  if (!lease.ok()) return SendFdChannelReply(conn, lease.status(), 0);
  // ShmRegion::Map owns the fd from here, on failure too.
  absl::StatusOr<std::unique_ptr<ShmRegion>> region = ShmRegion::Map(
      request->fd.Release(), request->size, leases_->options().max_region_bytes);
  if (!region.ok()) return SendFdChannelReply(conn, region.status(), 0);
  absl::StatusOr<uint64_t> id = leases_->AddRegion(lease->id, std::move(region).value());
  if (!id.ok()) return SendFdChannelReply(conn, id.status(), 0);
  SendFdChannelReply(conn, absl::OkStatus(), *id);
}

}  // namespace evoke
