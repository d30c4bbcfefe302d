#include "common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

extern char** environ;

namespace evoke {
namespace {

// What failed in the child before exec; reported to the parent over a
// close-on-exec pipe with the errno (EOF on the pipe means exec succeeded).
enum Stage : int { kStdin = 0, kStdout = 1, kStderr = 2, kDup = 3, kExec = 4 };
struct ChildError {
  int stage;
  int error;
};

absl::Status ErrnoStatus(int error, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(error));
  switch (error) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

// Resolve returns argv0 when it names a path, else its first executable
// match on $PATH (what execvp would run; execvp itself may allocate, which a
// child of a multi-threaded process must not).
absl::StatusOr<std::string> Resolve(const std::string& argv0) {
  if (argv0.find('/') != std::string::npos) return argv0;
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
    const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", argv0);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return absl::NotFoundError(absl::StrCat(argv0, ": not found on $PATH"));
}

// In the child: report `stage` and errno, then exit.
[[noreturn]] void ChildFail(int report_fd, int stage) {
  const ChildError e{stage, errno};
  ssize_t unused = write(report_fd, &e, sizeof(e));
  (void)unused;
  _exit(127);
}

}  // namespace

int DecodeWaitStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  return -1000;  // Stopped or continued: not asked for (no WUNTRACED).
}

absl::StatusOr<Subprocess> Subprocess::Spawn(const SpawnOptions& options) {
  if (options.argv.empty() || options.argv[0].empty()) {
    return absl::InvalidArgumentError("spawn: empty argv");
  }
  absl::StatusOr<std::string> program = Resolve(options.argv[0]);
  if (!program.ok()) return program.status();

  // Everything the child needs is built before fork: between fork and exec
  // the child of a multi-threaded process may only make async-signal-safe
  // calls (no allocation).
  std::vector<char*> args;
  for (const std::string& a : options.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    const size_t eq = entry.find('=');
    const absl::string_view name = entry.substr(0, eq == entry.npos ? entry.size() : eq + 1);
    const bool replaced = std::any_of(options.env.begin(), options.env.end(),
                                      [&](const std::string& o) {
                                        return absl::string_view(o).substr(0, name.size()) == name;
                                      });
    if (!replaced) envp.push_back(*e);
  }
  for (const std::string& e : options.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const bool shared_out_err = options.stderr_fd < 0 && options.stdout_fd < 0 &&
                              !options.stdout_path.empty() &&
                              options.stderr_path == options.stdout_path;
  const int out_flags =
      O_WRONLY | O_CREAT | O_CLOEXEC | (options.stdout_append ? O_APPEND : O_TRUNC);
  const int err_flags =
      O_WRONLY | O_CREAT | O_CLOEXEC | (options.stderr_append ? O_APPEND : O_TRUNC);

  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) return ErrnoStatus(errno, "spawn: pipe");
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int error = errno;
    close(report[0]);
    close(report[1]);
    return ErrnoStatus(error, "spawn: fork");
  }
  if (pid == 0) {
    close(report[0]);
    if (options.new_process_group) setpgid(0, 0);
    if (options.death_signal != 0) {
      prctl(PR_SET_PDEATHSIG, options.death_signal);
      // The parent may have gone before prctl: then nobody will signal us.
      if (getppid() != parent) kill(getpid(), options.death_signal);
    }
    // The source of each standard stream, moved above 2 first so that no
    // dup2 below clobbers a source another stream still needs.
    int sources[3] = {-1, -1, -1};
    const int given[3] = {options.stdin_fd, options.stdout_fd, options.stderr_fd};
    const std::string* paths[3] = {&options.stdin_path, &options.stdout_path,
                                   &options.stderr_path};
    const int flags[3] = {O_RDONLY | O_CLOEXEC, out_flags, err_flags};
    for (int k = 0; k < 3; ++k) {
      if (given[k] >= 0) {
        sources[k] = fcntl(given[k], F_DUPFD_CLOEXEC, 3);
        if (sources[k] < 0) ChildFail(report[1], kDup);
      } else if (k == 2 && shared_out_err) {
        sources[k] = sources[1];
      } else if (!paths[k]->empty()) {
        const int fd = open(paths[k]->c_str(), flags[k], 0644);
        if (fd < 0) ChildFail(report[1], k);
        sources[k] = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (sources[k] < 0) ChildFail(report[1], kDup);
      }
    }
    for (int k = 0; k < 3; ++k) {
      if (sources[k] >= 0 && dup2(sources[k], k) < 0) ChildFail(report[1], kDup);
    }
    // The child starts clean: no blocked signals, SIGPIPE at its default
    // (an ignored signal would stay ignored across exec).
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGPIPE, &dfl, nullptr);
    execve(program->c_str(), args.data(), envp.data());
    ChildFail(report[1], kExec);
  }
  // Also in the parent: no window in which KillGroup would miss.
  if (options.new_process_group) setpgid(pid, pid);
  close(report[1]);
  ChildError e{};
  size_t got = 0;
  while (got < sizeof(e)) {
    const ssize_t n = read(report[0], reinterpret_cast<char*>(&e) + got, sizeof(e) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(report[0]);
  Subprocess child;
  child.pid_ = pid;
  if (got < sizeof(e)) return child;  // EOF: exec succeeded.
  child.Wait().IgnoreError();        // Reap the child that failed.
  switch (e.stage) {
    case kStdin:
      return ErrnoStatus(e.error, absl::StrCat("spawn: open ", options.stdin_path, " for stdin"));
    case kStdout:
      return ErrnoStatus(e.error,
                         absl::StrCat("spawn: open ", options.stdout_path, " for stdout"));
    case kStderr:
      return ErrnoStatus(e.error,
                         absl::StrCat("spawn: open ", options.stderr_path, " for stderr"));
    case kDup:
      return absl::InternalError(
          absl::StrCat("spawn: redirecting standard streams: ", std::strerror(e.error)));
    default:
      return ErrnoStatus(e.error, absl::StrCat("exec ", *program));
  }
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), reaped_(std::exchange(other.reaped_, false)) {}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    if (running()) Kill().IgnoreError();
    pid_ = std::exchange(other.pid_, -1);
    reaped_ = std::exchange(other.reaped_, false);
  }
  return *this;
}

Subprocess::~Subprocess() {
  if (running()) Kill().IgnoreError();
}

absl::StatusOr<bool> Subprocess::TryWait(int* exit_code) {
  if (!running()) return absl::FailedPreconditionError("no running process to wait for");
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r < 0) {
    reaped_ = true;  // Nothing left to wait for (ECHILD).
    return absl::InternalError(absl::StrCat("waitpid ", pid_, ": ", std::strerror(errno)));
  }
  if (r == 0) return false;
  reaped_ = true;
  *exit_code = DecodeWaitStatus(status);
  return true;
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  if (!running()) return absl::FailedPreconditionError("no running process to wait for");
  if (timeout == absl::InfiniteDuration()) {
    int status = 0;
    pid_t r;
    do {
      r = waitpid(pid_, &status, 0);
    } while (r < 0 && errno == EINTR);
    reaped_ = true;
    if (r < 0) {
      return absl::InternalError(absl::StrCat("waitpid ", pid_, ": ", std::strerror(errno)));
    }
    return DecodeWaitStatus(status);
  }
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Milliseconds(1);
  for (;;) {
    int code = 0;
    absl::StatusOr<bool> done = TryWait(&code);
    if (!done.ok()) return done.status();
    if (*done) return code;
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " did not exit within ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(std::min(pause, deadline - now));
    pause = std::min(pause * 2, absl::Milliseconds(10));
  }
}

bool Subprocess::Exited() const {
  if (!running()) return true;
  siginfo_t info;
  std::memset(&info, 0, sizeof(info));
  while (waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) < 0) {
    if (errno != EINTR) return true;  // ECHILD: nothing left to wait for.
  }
  return info.si_pid == pid_;
}

void Subprocess::Signal(int signal) {
  if (running()) kill(pid_, signal);
}

void Subprocess::KillGroup(int signal) {
  if (running()) kill(-pid_, signal);
}

absl::StatusOr<int> Subprocess::Kill() {
  if (!running()) return absl::FailedPreconditionError("no running process to kill");
  kill(pid_, SIGKILL);
  return Wait();
}

absl::StatusOr<int> Subprocess::Stop(absl::Duration grace) {
  if (!running()) return absl::FailedPreconditionError("no running process to stop");
  kill(pid_, SIGTERM);
  absl::StatusOr<int> code = Wait(grace);
  if (code.status().code() != absl::StatusCode::kDeadlineExceeded) return code;
  return Kill();
}

pid_t Subprocess::Release() {
  const pid_t pid = running() ? pid_ : -1;
  pid_ = -1;
  reaped_ = false;
  return pid;
}

}  // namespace evoke
