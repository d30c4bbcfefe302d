// PeerListener: evoked's own accept loop on its gRPC Unix socket. gRPC 1.51
// does not tell a handler who connected, so evoked accepts each connection
// itself, reads the peer's credentials from the kernel (SO_PEERCRED), and
// only then hands the connection to gRPC (grpc::AddInsecureChannelFromFd).
// gRPC names such a connection's peer "fd:<n>"; ConnectionTable maps that
// back to the caller's rights.
#ifndef EVOKE_DAEMON_PEER_LISTENER_H_
#define EVOKE_DAEMON_PEER_LISTENER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/peer_cred.h"
#include "daemon/access_policy.h"

namespace evoke {

// ConnectionTable: the rights of each open connection, by fd. An entry is
// written before gRPC sees the fd and overwritten when the kernel reuses
// the number for a later connection (gRPC closes a connection's fd only
// after its last call), so a lookup always finds the connection's own.
class ConnectionTable {
 public:
  void Set(int fd, absl::StatusOr<std::shared_ptr<const Caller>> caller);
  // Lookup resolves grpc::ServerContext::peer(): "fd:<n>".
  // UNAUTHENTICATED for a peer that did not come through the listener.
  absl::StatusOr<std::shared_ptr<const Caller>> Lookup(absl::string_view peer) const;

 private:
  struct Entry {
    std::shared_ptr<const Caller> caller;  // Or, when null:
    absl::Status refused;
  };
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, Entry> by_fd_ ABSL_GUARDED_BY(mu_);
};

class PeerListener {
 public:
  // Called on the listener's thread for each accepted connection (a
  // non-blocking, close-on-exec fd that the callee now owns).
  using OnAccept = std::function<void(int fd, const PeerCred& peer)>;

  // Start binds `path` (mode 0660; a stale socket must have been removed)
  // and accepts until destruction.
  static absl::StatusOr<std::unique_ptr<PeerListener>> Start(const std::string& path,
                                                            OnAccept on_accept);
  ~PeerListener();
  PeerListener(const PeerListener&) = delete;
  PeerListener& operator=(const PeerListener&) = delete;

  // Stop ends the accept loop (idempotent); connections already handed over
  // are not affected.
  void Stop();

 private:
  PeerListener(int listen_fd, int wake_fd, OnAccept on_accept);
  void Serve();

  const int listen_fd_;
  const int wake_fd_;
  const OnAccept on_accept_;
  std::thread thread_;
};

}  // namespace evoke

#endif  // EVOKE_DAEMON_PEER_LISTENER_H_
