#include "daemon/peer_listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log.h"

namespace evoke {

void ConnectionTable::Set(int fd, absl::StatusOr<std::shared_ptr<const Caller>> caller) {
  Entry entry;
  if (caller.ok()) {
    entry.caller = *std::move(caller);
  } else {
    entry.refused = caller.status();
  }
  absl::MutexLock lock(&mu_);
  by_fd_[fd] = std::move(entry);
}

absl::StatusOr<std::shared_ptr<const Caller>> ConnectionTable::Lookup(
    absl::string_view peer) const {
  int fd = -1;
  if (!absl::ConsumePrefix(&peer, "fd:") || !absl::SimpleAtoi(peer, &fd)) {
    return absl::UnauthenticatedError(
        absl::StrCat("caller not identified (peer \"", peer, "\")"));
  }
  absl::MutexLock lock(&mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) {
    return absl::UnauthenticatedError(absl::StrCat("caller not identified (fd ", fd, ")"));
  }
  if (it->second.caller == nullptr) return it->second.refused;
  return it->second.caller;
}

absl::StatusOr<std::unique_ptr<PeerListener>> PeerListener::Start(const std::string& path,
                                                                 OnAccept on_accept) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("--socket: path longer than ",
                                                   sizeof(addr.sun_path) - 1, " bytes"));
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket(): ", std::strerror(errno)));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  // Keep "other" out from the moment the socket exists.
  const mode_t old_umask = umask(0117);
  const int bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  umask(old_umask);
  if (bound != 0 || listen(fd, 512) != 0) {
    const int err = bound != 0 ? bind_errno : errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("--socket: cannot listen on ", path, ": ", std::strerror(err)));
  }
  if (chmod(path.c_str(), 0660) != 0) {
    EVOKE_LOG_WARNING("chmod 0660 ", path, ": ", std::strerror(errno));
  }
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("eventfd(): ", std::strerror(errno)));
  }
  std::unique_ptr<PeerListener> l(new PeerListener(fd, wake, std::move(on_accept)));
  l->thread_ = std::thread([raw = l.get()] { raw->Serve(); });
  return l;
}

PeerListener::PeerListener(int listen_fd, int wake_fd, OnAccept on_accept)
    : listen_fd_(listen_fd), wake_fd_(wake_fd), on_accept_(std::move(on_accept)) {}

PeerListener::~PeerListener() {
  Stop();
  close(listen_fd_);
  close(wake_fd_);
}

void PeerListener::Stop() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  thread_.join();
}

void PeerListener::Serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      EVOKE_LOG_ERROR("accept loop: poll: ", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    for (;;) {
      const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (conn < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE) {
          // Out of fds: back off rather than spin; the client waits in the
          // backlog or gives up.
          EVOKE_LOG_WARNING_EVERY_N_SEC(10, "accept: ", std::strerror(errno),
                                        "; retrying in 100 ms");
          poll(nullptr, 0, 100);
        }
        break;  // EAGAIN: drained.
      }
      absl::StatusOr<PeerCred> peer = GetPeerCred(conn);
      if (!peer.ok()) {
        EVOKE_LOG_WARNING_EVERY_N_SEC(1, "refused a connection: ", peer.status().ToString());
        close(conn);
        continue;
      }
      on_accept_(conn, *peer);
    }
  }
}

}  // namespace evoke
