#include "daemon/fd_channel.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/fd_passing.h"
#include "common/log.h"
#include "common/peer_cred.h"

namespace evoke {

struct FdChannel::Connection {
  UniqueFd fd;
  PeerCred peer;
  absl::Time deadline;
  ReceivedWithFds received;
};

absl::StatusOr<std::unique_ptr<FdChannel>> FdChannel::Start(const std::string& path,
                                                            LeaseManager* leases,
                                                            FdChannelOptions options) {
  if (options.max_connections == 0 || options.max_connections_per_uid == 0) {
    return absl::InvalidArgumentError("fd channel: connection limits must be >= 1");
  }
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("fd socket path too long: ", path));
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  unlink(path.c_str());  // Ours: the main socket's liveness was checked first.
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const mode_t old = umask(0117);
  const int bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(old);
  if (bound != 0 || chmod(path.c_str(), 0660) != 0 || listen(fd, 128) != 0) {
    const std::string err = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("fd socket ", path, ": ", err));
  }
  const int wake = eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  std::unique_ptr<FdChannel> channel(
      new FdChannel(path, fd, wake, leases, std::move(options)));
  channel->thread_ = std::thread([c = channel.get()] { c->Serve(); });
  return channel;
}

FdChannel::FdChannel(std::string path, int listen_fd, int wake_fd, LeaseManager* leases,
                     FdChannelOptions options)
    : path_(std::move(path)),
      listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      leases_(leases),
      options_(std::move(options)) {}

FdChannel::~FdChannel() {
  const uint64_t one = 1;
  ssize_t unused = write(wake_fd_, &one, sizeof(one));
  (void)unused;
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  close(wake_fd_);
  unlink(path_.c_str());
}

FdChannel::Counters FdChannel::counters() const {
  Counters c;
  c.accepted = accepted_.load();
  c.registered = registered_.load();
  c.refused = refused_.load();
  c.timed_out = timed_out_.load();
  c.over_capacity = over_capacity_.load();
  c.not_admitted = not_admitted_.load();
  return c;
}

void FdChannel::Serve() {
  // Only this thread touches the connections.
  std::vector<std::unique_ptr<Connection>> conns;
  absl::Time accept_paused_until = absl::InfinitePast();
  std::vector<pollfd> fds;
  for (;;) {
    const absl::Time now = absl::Now();
    // Whatever passed its deadline is answered and closed first.
    for (std::unique_ptr<Connection>& c : conns) {
      if (now >= c->deadline) {
        Finish(*c, /*timed_out=*/true);
        c.reset();
      }
    }
    std::erase(conns, nullptr);

    absl::Time wake_at = absl::InfiniteFuture();
    for (const std::unique_ptr<Connection>& c : conns) wake_at = std::min(wake_at, c->deadline);
    const bool accepting = now >= accept_paused_until;
    if (!accepting) wake_at = std::min(wake_at, accept_paused_until);
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
    for (const std::unique_ptr<Connection>& c : conns) fds.push_back({c->fd.get(), POLLIN, 0});
    int timeout_ms = -1;
    if (wake_at != absl::InfiniteFuture()) {
      // Rounded up, so that a deadline is never polled for 0 ms in a loop.
      timeout_ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(wake_at - now + absl::Milliseconds(1) -
                                    absl::Nanoseconds(1)),
          0, 60'000));
    }
    if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      EVOKE_LOG_ERROR("fd channel: poll: ", std::strerror(errno));
      absl::SleepFor(absl::Milliseconds(10));  // Never spin.
      continue;
    }
    if (fds[0].revents != 0) return;  // Stopping: open connections just close.
    for (size_t i = 0; i < conns.size(); ++i) {
      if (fds[i + 2].revents == 0) continue;
      Connection& c = *conns[i];
      const ReceiveProgress progress =
          ReceiveAvailable(c.fd.get(), kFdChannelRequestBytes, &c.received);
      // More than one descriptor is refused at once, so that no connection
      // holds more than the few of one read.
      if (progress != ReceiveProgress::kWouldBlock || c.received.fds.size() > 1 ||
          c.received.fds_truncated) {
        Finish(c, /*timed_out=*/false);
        conns[i].reset();
      }
    }
    std::erase(conns, nullptr);
    if (fds[1].revents != 0 && !AcceptAll(conns)) {
      // Out of descriptors: the pending connection stays readable, so wait
      // a little rather than spin on it; the open ones finish meanwhile.
      accept_paused_until = absl::Now() + absl::Milliseconds(100);
    }
  }
}

bool FdChannel::AcceptAll(std::vector<std::unique_ptr<Connection>>& conns) {
  // At most a backlog's worth per round, so that the open connections are
  // read between floods.
  for (int round = 0; round < 128; ++round) {
    const int raw = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (raw < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return !(errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM);
    }
    UniqueFd fd(raw);
    ++accepted_;
    // Who it is, before reading anything.
    absl::StatusOr<PeerCred> peer = GetPeerCred(fd.get());
    absl::Status admitted = peer.status();
    if (admitted.ok() && options_.admit) admitted = options_.admit(*peer);
    if (!admitted.ok()) {
      ++not_admitted_;
      ++refused_;
      EVOKE_LOG_DEBUG("fd channel: ",
                      peer.ok() ? DescribePeer(*peer) : std::string("unknown peer"),
                      " not admitted: ", admitted.ToString());
      SendFdChannelReply(fd.get(), admitted, 0, /*nonblocking=*/true);
      continue;
    }
    const auto same_uid = std::count_if(
        conns.begin(), conns.end(),
        [&](const std::unique_ptr<Connection>& c) { return c->peer.uid == peer->uid; });
    if (conns.size() >= options_.max_connections ||
        static_cast<uint64_t>(same_uid) >= options_.max_connections_per_uid) {
      ++over_capacity_;
      ++refused_;
      SendFdChannelReply(
          fd.get(),
          absl::ResourceExhaustedError(absl::StrCat(
              "fd channel: too many connections at once (",
              conns.size() >= options_.max_connections
                  ? absl::StrCat(options_.max_connections, " in all")
                  : absl::StrCat(options_.max_connections_per_uid, " of uid ", peer->uid),
              "); retry")),
          0, /*nonblocking=*/true);
      continue;
    }
    auto conn = std::make_unique<Connection>();
    conn->fd = std::move(fd);
    conn->peer = *peer;
    conn->deadline = absl::Now() + options_.connection_timeout;
    conns.push_back(std::move(conn));
  }
  return true;
}

void FdChannel::Finish(Connection& conn, bool timed_out) {
  absl::Status status;
  uint64_t region_id = 0;
  // The received fd closes with `request` on every path, unless handed on.
  absl::StatusOr<FdChannelRequest> request = ParseFdChannelRequest(std::move(conn.received));
  if (!request.ok()) {
    status = request.status();
  } else {
    // Owns the fd from here, on failure too.
    absl::StatusOr<uint64_t> id = leases_->AddSharedMemoryRegion(
        request->lease_id, conn.peer.uid, request->fd.Release(), request->size);
    status = id.status();
    if (id.ok()) region_id = *id;
  }
  if (status.ok()) {
    ++registered_;
  } else {
    ++refused_;
    if (timed_out) ++timed_out_;
  }
  SendFdChannelReply(conn.fd.get(), status, region_id, /*nonblocking=*/true);
  conn.fd.Reset();
}

}  // namespace evoke
