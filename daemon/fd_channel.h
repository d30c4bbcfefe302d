// FdChannel: the shared-memory registration socket. Clients hand the daemon
// a sealed memfd over a Unix socket (SCM_RIGHTS); the protocol is documented
// in proto/evoke/v1/kvtier.proto ("FdChannel").
#ifndef EVOKE_DAEMON_FD_CHANNEL_H_
#define EVOKE_DAEMON_FD_CHANNEL_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/fd_passing.h"  // The protocol's codec and wire constants.
#include "daemon/lease_manager.h"

namespace evoke {

// FdChannel listens on `path` (mode 0660) and serves one registration per
// connection on its own thread: it receives the fd, maps it (ShmRegion::Map),
// adds it to the lease, and replies with a status code and the region id.
// A connection that sends no fd, several fds, a short or malformed request,
// or stalls for more than 2 s is answered with an error and closed; every
// received fd is closed on every path. Thread-safe; stops on destruction.
class FdChannel {
 public:
  static absl::StatusOr<std::unique_ptr<FdChannel>> Start(const std::string& path,
                                                          LeaseManager* leases);
  ~FdChannel();
  FdChannel(const FdChannel&) = delete;
  FdChannel& operator=(const FdChannel&) = delete;
  const std::string& path() const { return path_; }

 private:
  FdChannel(std::string path, int listen_fd, int wake_fd, LeaseManager* leases);
  void Serve();
  void Handle(int conn);

  const std::string path_;
  const int listen_fd_;
  const int wake_fd_;  // eventfd to stop the poll loop.
  LeaseManager* const leases_;
  std::thread thread_;
};

}  // namespace evoke

#endif  // EVOKE_DAEMON_FD_CHANNEL_H_
