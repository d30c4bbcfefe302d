// Daemon: one running evoked (spill store, tier 1, tier manager, gRPC server).
#ifndef EVOKE_DAEMON_DAEMON_H_
#define EVOKE_DAEMON_DAEMON_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/daemon_options.h"

namespace evoke {

// Thread-safe. Owns every part of the daemon; destroying it shuts it down.
class Daemon {
 public:
  // Start validates `options`, opens the spill store (which locks data_dir),
  // allocates tier 1, rebuilds the block index from disk, and serves
  // evoke.v1.KvTier, grpc.health.v1.Health and reflection on the Unix socket
  // (mode 0660). A stale socket file is replaced; a live one is not.
  // Errors: INVALID_ARGUMENT (options), UNAVAILABLE (data_dir locked by
  // another evoked, socket in use, bind failed), RESOURCE_EXHAUSTED (tier 1
  // cannot be mapped), FAILED_PRECONDITION (spill store of another format).
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Shutdown stops serving (health NOT_SERVING, new calls refused), waits up
  // to shutdown_grace_ms for calls in flight, writes every tier-1 block that
  // has no disk copy to the spill store, closes it and removes the socket.
  // Returns the flush's error, if any. Idempotent.
  absl::Status Shutdown();

  // The absolute socket path served.
  const std::string& socket_path() const;

  class Impl;

 private:
  explicit Daemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace evoke

#endif  // EVOKE_DAEMON_DAEMON_H_
