// Subprocess: the one way evoke's tools and tests start other programs
// (evoked under test, the benchmark's evoked and redis-server, evoke-sim's
// evoked, evoke-tune's fitness command): fork and exec with an argv, extra
// environment, standard streams redirected, optionally a parent-death signal
// and a process group of its own; then wait with a timeout, signal, kill.
#ifndef EVOKE_COMMON_SUBPROCESS_H_
#define EVOKE_COMMON_SUBPROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace evoke {

// Every field has a default, so designated initializers can name only what
// they set: Subprocess::Spawn({.argv = {"sleep", "1"}}).
struct SpawnOptions {
  // argv[0] is the program: a path (with a '/'), or a name looked up on
  // $PATH. Must not be empty.
  std::vector<std::string> argv = {};
  // "NAME=value" entries added to this process's environment; an entry
  // replaces a variable of the same name.
  std::vector<std::string> env = {};

  // Standard streams. A descriptor (>= 0) wins over a path; with neither the
  // child inherits this process's stream. Descriptors stay the caller's
  // (the child gets duplicates); paths are opened in the child, stdout and
  // stderr created with mode 0644.
  int stdin_fd = -1;
  std::string stdin_path = {};  // e.g. "/dev/null"
  int stdout_fd = -1;
  std::string stdout_path = {};
  bool stdout_append = false;  // else truncated
  int stderr_fd = -1;
  std::string stderr_path = {};  // Equal to stdout_path: one file, both streams.
  bool stderr_append = false;

  // When not 0, the child receives this signal when the thread that spawned
  // it exits (PR_SET_PDEATHSIG): it goes when its parent goes, however the
  // parent ends (kill -9 included). Note: the spawning THREAD, so spawn from
  // a thread that lives as long as the child should.
  int death_signal = 0;
  // The child leads a new process group (its pgid is its pid), so that
  // KillGroup reaches whatever it starts too.
  bool new_process_group = false;
};

// A started child process. Exit codes are the exit status (0..255) of a
// process that exited, or -N when signal N killed it. Not thread-safe: one
// owner waits for it.
class Subprocess {
 public:
  // Spawn starts the program. NOT_FOUND when it does not exist or is not on
  // $PATH, PERMISSION_DENIED when it cannot be executed, INVALID_ARGUMENT for
  // an empty argv, INTERNAL when fork, exec or a redirect fails (naming it).
  // The child starts with no blocked signals and SIGPIPE at its default.
  static absl::StatusOr<Subprocess> Spawn(const SpawnOptions& options);

  Subprocess() = default;
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  // Kills (SIGKILL) and reaps the process if it is still running.
  ~Subprocess();

  pid_t pid() const { return pid_; }
  // Whether a process was started and has not been reaped yet.
  bool running() const { return pid_ > 0 && !reaped_; }

  // TryWait returns true and sets *exit_code when the process has exited (it
  // is reaped then); false while it runs. FAILED_PRECONDITION when there is no
  // process or it was already reaped; INTERNAL when waitpid fails (e.g.
  // ECHILD: SIGCHLD is ignored, or another waiter reaped it).
  absl::StatusOr<bool> TryWait(int* exit_code);
  // Wait waits up to `timeout` (InfiniteDuration: for as long as it takes)
  // for the process to exit and returns its exit code. DEADLINE_EXCEEDED when
  // it still runs (it is left running); errors as TryWait.
  absl::StatusOr<int> Wait(absl::Duration timeout = absl::InfiniteDuration());
  // Exited reports whether the process has exited WITHOUT reaping it, so its
  // pid (and process group id) cannot be reused meanwhile.
  bool Exited() const;
  // Signal sends `signal` to the process (nothing once it is reaped).
  void Signal(int signal);
  // KillGroup sends `signal` to the process's group (new_process_group).
  void KillGroup(int signal);
  // Kill sends SIGKILL, reaps the process and returns its exit code.
  absl::StatusOr<int> Kill();
  // Stop sends SIGTERM, waits up to `grace`, then kills; returns the exit
  // code. A process that is already reaped: FAILED_PRECONDITION.
  absl::StatusOr<int> Stop(absl::Duration grace = absl::Seconds(10));
  // Release gives up ownership and returns the pid (-1 when none, or when it
  // was reaped already): this object no longer waits for or kills it; the
  // caller reaps it.
  pid_t Release();

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

// DecodeWaitStatus turns a waitpid status into an exit code (see Subprocess).
int DecodeWaitStatus(int status);

}  // namespace evoke

#endif  // EVOKE_COMMON_SUBPROCESS_H_
