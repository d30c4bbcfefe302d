// FdChannel: the shared-memory registration socket. Clients hand the daemon
// a sealed memfd over a Unix socket (SCM_RIGHTS); the protocol is documented
// in proto/evoke/v1/kvtier.proto ("FdChannel").
#ifndef EVOKE_DAEMON_FD_CHANNEL_H_
#define EVOKE_DAEMON_FD_CHANNEL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/fd_passing.h"  // The protocol's codec and wire constants.
#include "common/peer_cred.h"
#include "daemon/lease_manager.h"

namespace evoke {

struct FdChannelOptions {
  // One deadline for the whole of a connection, from accept to its reply:
  // a client that sends nothing, or trickles its 32 bytes, is answered
  // "request: short or timed out" and closed when it passes. Default: 2 s.
  absl::Duration connection_timeout = absl::Seconds(2);
  // Connections served at once; one more is answered RESOURCE_EXHAUSTED and
  // closed at once, without reading it. Default: 64.
  uint32_t max_connections = 64;
  // Of those, at once from one uid, so that one tenant's idle connections
  // cannot lock the others out. Default: 16.
  uint32_t max_connections_per_uid = 16;
  // Admission, by the peer's credentials (SO_PEERCRED), before anything is
  // read: a non-OK status is sent back and the connection closed. Called on
  // the channel's thread; must be quick and must not block. Default (empty):
  // admit everyone who can open the socket.
  std::function<absl::Status(const PeerCred&)> admit;
};

// FdChannel listens on `path` (mode 0660) and serves registrations, one per
// connection, on one thread that polls all connections at once: a slow or
// silent client delays no one. For each connection it reads the peer's
// credentials, admits it (options.admit), receives the request and its fd
// without ever blocking, maps the fd and adds it to the lease
// (LeaseManager::AddSharedMemoryRegion, charged to the peer's uid), and
// replies with a status code and the region id. A connection that sends no
// fd, several fds, a short or malformed request, or does not finish within
// options.connection_timeout is answered with an error and closed; every
// received fd is closed on every path. Thread-safe; stops on destruction.
class FdChannel {
 public:
  static absl::StatusOr<std::unique_ptr<FdChannel>> Start(
      const std::string& path, LeaseManager* leases,
      FdChannelOptions options = FdChannelOptions());
  ~FdChannel();
  FdChannel(const FdChannel&) = delete;
  FdChannel& operator=(const FdChannel&) = delete;
  const std::string& path() const { return path_; }

  // Counters, for tests and Stat.
  struct Counters {
    uint64_t accepted = 0;
    uint64_t registered = 0;       // Replied OK.
    uint64_t refused = 0;          // Replied with an error (any).
    uint64_t timed_out = 0;        // Of those, past connection_timeout.
    uint64_t over_capacity = 0;    // Closed at once: too many connections.
    uint64_t not_admitted = 0;     // Refused by options.admit (or no SO_PEERCRED).
  };
  Counters counters() const;

 private:
  struct Connection;
  FdChannel(std::string path, int listen_fd, int wake_fd, LeaseManager* leases,
            FdChannelOptions options);
  void Serve();
  // AcceptAll takes the pending connections into `conns`, refusing those
  // not admitted or over the limits; false when accept fails for lack of
  // descriptors (the caller then pauses accepting for a moment).
  bool AcceptAll(std::vector<std::unique_ptr<Connection>>& conns);
  // Finish answers a connection whose request is complete, stopped short or
  // invalid, and closes it.
  void Finish(Connection& conn, bool timed_out);

  const std::string path_;
  const int listen_fd_;
  const int wake_fd_;  // eventfd to stop the poll loop.
  LeaseManager* const leases_;
  const FdChannelOptions options_;
  std::thread thread_;
  // Written by the channel's thread, read by counters().
  std::atomic<uint64_t> accepted_{0}, registered_{0}, refused_{0}, timed_out_{0},
      over_capacity_{0}, not_admitted_{0};
};

}  // namespace evoke

#endif  // EVOKE_DAEMON_FD_CHANNEL_H_
