// evoke-sim starts its own evoked: a child process on a Unix socket in a
// temporary directory, with a small tier 1 so that blocks spill to RocksDB.
#ifndef EVOKE_SIM_EVOKED_PROCESS_H_
#define EVOKE_SIM_EVOKED_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "evoke/client.h"

namespace evoke::sim {

struct EvokedProcessOptions {
  std::string binary;            // Path of evoked (see DefaultEvokedPath).
  std::string pinned_bytes = "16MiB";  // Small: most blocks spill to RocksDB.
  int32_t summary_layer = 0;     // The simulator's recovery layer (-1: the middle).
  uint32_t worker_threads = 4;
  // Where its socket, data and log go. Empty: a temporary directory,
  // removed when the process is stopped; else this one, created if absent
  // and kept (its blocks outlive the process, for the next start).
  std::string dir;
};

class EvokedProcess {
 public:
  // Start makes a temporary directory (or uses options.dir), runs `evoked
  // --socket DIR/evoked.sock --data-dir DIR/data --pinned-bytes ...
  // --summary-layer ...
  // --lock-memory=false` with its log in DIR/evoked.log, and waits (up to
  // 30 s) until it answers. UNAVAILABLE with the log's tail when it exits or
  // does not answer; NOT_FOUND when the binary does not exist.
  static absl::StatusOr<std::unique_ptr<EvokedProcess>> Start(const EvokedProcessOptions& options);
  // Stops the daemon (SIGTERM, then SIGKILL after 10 s) and removes a
  // temporary directory.
  ~EvokedProcess();

  const std::string& socket() const { return socket_; }
  // Connect returns a new client of this daemon.
  absl::StatusOr<std::unique_ptr<Client>> Connect() const;

 private:
  EvokedProcess() = default;
  pid_t pid_ = -1;
  std::string dir_;
  bool keep_dir_ = false;
  std::string socket_;
};

// DefaultEvokedPath: daemon/evoked in the build tree next to this binary's
// directory (found via /proc/self/exe: <build>/sim/evoke-sim ->
// <build>/daemon/evoked), else evoked in this binary's own directory (an
// installed <prefix>/bin), else "evoked" looked up on PATH.
std::string DefaultEvokedPath();

}  // namespace evoke::sim

#endif  // EVOKE_SIM_EVOKED_PROCESS_H_
