// DaemonProcess: a real evoked child process for end-to-end tests, on a Unix
// socket inside a test directory, with its log captured to a file.
#ifndef EVOKE_TESTING_DAEMON_PROCESS_H_
#define EVOKE_TESTING_DAEMON_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "evoke/client.h"

namespace evoke::testing {

struct CommandResult {
  int exit_code = -1;  // -1 when killed by a signal; 127 when it cannot start.
  std::string out;
  std::string err;     // When it cannot start: why.
};

// RunCommand runs argv[0] with arguments (and `env` entries added to the
// environment; stdin is /dev/null), waits, and captures both streams.
CommandResult RunCommand(const std::vector<std::string>& argv,
                         const std::vector<std::string>& env = {});

// Paths of the binaries under test: the build tree's, unless the
// environment names others (EVOKE_EVOKED, EVOKE_EVOKECTL), e.g. when the
// tests run on another machine from a copied tree.
std::string EvokedPath();
std::string EvokectlPath();
// BinaryPath returns $env_var when set, else `built`.
std::string BinaryPath(const char* env_var, const char* built);

// Runs evokectl against `socket` with `args`.
CommandResult RunEvokectl(const std::string& socket,
                          const std::vector<std::string>& args);

class DaemonProcess {
 public:
  // Start runs `evoked --socket DIR/evoked.sock --data-dir DIR/data
  // --pinned-bytes 32MiB --worker-threads 4 FLAGS...` (later flags override earlier ones) and
  // waits until its health check answers SERVING. UNAVAILABLE (with the
  // daemon's log) when it exits or does not answer within `timeout`.
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Start(
      const std::string& dir, const std::vector<std::string>& flags = {},
      absl::Duration timeout = absl::Seconds(30));
  // Kills the process (SIGKILL) if it is still running.
  ~DaemonProcess();

  // Signal sends `signal` to the daemon.
  void Signal(int signal);
  // Wait waits for the process to exit and returns its exit code (-signal
  // when killed by a signal). DEADLINE_EXCEEDED after `timeout`.
  absl::StatusOr<int> Wait(absl::Duration timeout = absl::Seconds(60));
  // Terminate sends SIGTERM and waits; returns the exit code.
  absl::StatusOr<int> Terminate();
  // KillHard sends SIGKILL and reaps the process.
  void KillHard();

  // Connect returns a client for this daemon.
  std::unique_ptr<Client> Connect(uint64_t max_message_bytes = 80ull << 20) const;

  const std::string& socket() const { return socket_; }
  const std::string& data_dir() const { return data_dir_; }
  pid_t pid() const { return process_.pid(); }
  // Log returns what the daemon wrote to stderr so far.
  std::string Log() const;

 private:
  DaemonProcess() = default;
  Subprocess process_;
  std::string socket_;
  std::string data_dir_;
  std::string log_path_;
};

}  // namespace evoke::testing

#endif  // EVOKE_TESTING_DAEMON_PROCESS_H_
