#include "tune/external_fitness.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/subprocess.h"
#include "policy/layer_budgets.h"

namespace evoke::tune {
namespace {

constexpr size_t kMaxStdoutBytes = 1 << 20;  // beyond this, keep the tail
constexpr size_t kStdoutTailBytes = 64 << 10;
constexpr size_t kStderrTailBytes = 2048;
constexpr size_t kQuoteBytes = 400;

// Fd closes its descriptor on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      Close();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~Fd() { Close(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// TempFile removes its path on destruction.
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  ~TempFile() { ::unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

absl::Status ErrnoError(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

std::string Tail(absl::string_view s, size_t n) {
  if (s.size() <= n) return std::string(s);
  return absl::StrCat("...", s.substr(s.size() - n));
}

std::string Quote(absl::string_view s) {
  return absl::StrCat("\"", absl::CEscape(Tail(s, kQuoteBytes)), "\"");
}

absl::Status WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write");
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// ReadAvailable appends what `fd` holds now to `out`; false at EOF or on an
// error (the caller then closes it).
bool ReadAvailable(int fd, std::string* out, size_t cap, size_t keep) {
  char buf[16384];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      out->append(buf, static_cast<size_t>(n));
      if (out->size() > cap) out->erase(0, out->size() - keep);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;  // EOF or error
  }
}

}  // namespace

absl::StatusOr<double> RunFitnessCommand(const ExternalFitnessOptions& options,
                                         absl::Span<const uint32_t> budgets) {
  if (options.command.empty()) {
    return absl::InvalidArgumentError("fitness command: empty command");
  }
  const std::string who = absl::StrCat("fitness command `", options.command, "`");
  // Above a million seconds (11 days) the deadline's conversion to clock
  // ticks would overflow.
  if (!std::isfinite(options.timeout_s) || options.timeout_s <= 0 || options.timeout_s > 1e6) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": timeout_s must be in (0, 1e6], got ", options.timeout_s));
  }
  const std::string json = policy::BudgetsToJson(budgets, "evolkv-candidate");

  // The budgets file.
  std::string dir = options.temp_dir;
  if (dir.empty()) {
    const char* tmpdir = std::getenv("TMPDIR");
    dir = (tmpdir != nullptr && *tmpdir != '\0') ? tmpdir : "/tmp";
  }
  std::string file_template = dir + "/evoke-budgets-XXXXXX";
  Fd file(::mkostemp(file_template.data(), O_CLOEXEC));
  if (!file.valid()) return ErrnoError(absl::StrCat(who, ": creating a file in ", dir));
  TempFile budgets_file(file_template);
  if (absl::Status s = WriteAll(file.get(), json); !s.ok()) {
    return absl::InternalError(absl::StrCat(who, ": writing ", budgets_file.path(), ": ",
                                            s.message()));
  }
  file.Close();

  // stdin is a socket pair, not a pipe: send(MSG_NOSIGNAL) to a command that
  // never reads it fails with EPIPE instead of raising SIGPIPE here.
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
    return ErrnoError(absl::StrCat(who, ": socketpair"));
  }
  Fd in_parent(sv[0]), in_child(sv[1]);
  int out_fds[2], err_fds[2];
  if (::pipe2(out_fds, O_CLOEXEC) < 0) return ErrnoError(absl::StrCat(who, ": pipe"));
  Fd out_parent(out_fds[0]), out_child(out_fds[1]);
  if (::pipe2(err_fds, O_CLOEXEC) < 0) return ErrnoError(absl::StrCat(who, ": pipe"));
  Fd err_parent(err_fds[0]), err_child(err_fds[1]);

  const auto start = std::chrono::steady_clock::now();
  const auto deadline =
      start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                  std::chrono::duration<double>(options.timeout_s));

  // Its own process group, so that a timeout kills whatever it started too.
  SpawnOptions spawn{.argv = {"/bin/sh", "-c", options.command},
                     .env = {"EVOKE_BUDGETS_FILE=" + budgets_file.path()}};
  spawn.stdin_fd = in_child.get();
  spawn.stdout_fd = out_child.get();
  spawn.stderr_fd = err_child.get();
  spawn.new_process_group = true;
  absl::StatusOr<Subprocess> spawned = Subprocess::Spawn(spawn);
  if (!spawned.ok()) {
    return absl::InternalError(absl::StrCat(who, ": ", spawned.status().message()));
  }
  Subprocess& child = *spawned;
  in_child.Close();
  out_child.Close();
  err_child.Close();
  // In practice stdin, stdout and stderr are always non-blocking here.
  for (int fd : {in_parent.get(), out_parent.get(), err_parent.get()}) {
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }

  std::string out, err;
  absl::string_view to_send = json;
  bool timed_out = false;
  bool exited = false;
  for (;;) {
    if (to_send.empty() && in_parent.valid()) in_parent.Close();  // EOF for the command
    if (!out_parent.valid() && !err_parent.valid()) {
      exited = child.Exited();
      if (exited) break;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      timed_out = true;
      break;
    }
    pollfd fds[3];
    nfds_t n = 0;
    if (in_parent.valid()) fds[n++] = {in_parent.get(), POLLOUT, 0};
    if (out_parent.valid()) fds[n++] = {out_parent.get(), POLLIN, 0};
    if (err_parent.valid()) fds[n++] = {err_parent.get(), POLLIN, 0};
    // Wake at least every 50 ms to notice that the shell exited while
    // something it started in the background holds stdout open; every 1 ms
    // once its output is closed and only its exit is awaited.
    auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
    const long long cap_ms = (out_parent.valid() || err_parent.valid()) ? 50 : 1;
    int timeout_ms =
        static_cast<int>(std::min<long long>(std::max<long long>(wait_ms, 1), cap_ms));
    int ready = ::poll(fds, n, timeout_ms);
    if (ready < 0 && errno != EINTR) {
      const absl::Status error = ErrnoError(absl::StrCat(who, ": poll"));
      child.KillGroup(SIGKILL);
      child.Wait().IgnoreError();
      return error;
    }
    for (nfds_t i = 0; ready > 0 && i < n; ++i) {
      if (fds[i].revents == 0) continue;
      if (fds[i].fd == in_parent.get()) {
        ssize_t sent = ::send(in_parent.get(), to_send.data(), to_send.size(),
                              MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent > 0) {
          to_send.remove_prefix(static_cast<size_t>(sent));
        } else if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          to_send = {};  // it closed its stdin without reading it all: fine
          in_parent.Close();
        }
      } else if (fds[i].fd == out_parent.get()) {
        if (!ReadAvailable(out_parent.get(), &out, kMaxStdoutBytes, kStdoutTailBytes)) {
          out_parent.Close();
        }
      } else if (fds[i].fd == err_parent.get()) {
        if (!ReadAvailable(err_parent.get(), &err, 4 * kStderrTailBytes, kStderrTailBytes)) {
          err_parent.Close();
        }
      }
    }
    if (out_parent.valid() || err_parent.valid()) {
      if (child.Exited()) {
        // The shell is gone: take what its output holds now and stop.
        if (out_parent.valid()) ReadAvailable(out_parent.get(), &out, kMaxStdoutBytes,
                                              kStdoutTailBytes);
        if (err_parent.valid()) ReadAvailable(err_parent.get(), &err, 4 * kStderrTailBytes,
                                              kStderrTailBytes);
        exited = true;
        break;
      }
    }
  }
  // The leader is exited-but-unreaped (Exited does not reap) or still
  // running: either way its process group id is still ours to kill.
  child.KillGroup(SIGKILL);
  const absl::StatusOr<int> code = child.Wait();
  const double elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::string stderr_note;
  if (!absl::StripAsciiWhitespace(err).empty()) {
    stderr_note = absl::StrCat("; its stderr ends with ",
                               Quote(absl::StripTrailingAsciiWhitespace(err)));
  }
  if (timed_out || !exited) {
    return absl::DeadlineExceededError(absl::StrCat(
        who, ": did not finish within ", options.timeout_s,
        " s (the timeout); its process group was killed", stderr_note));
  }
  if (!code.ok()) {
    return absl::InternalError(absl::StrCat(
        who, ": its exit status could not be had (is SIGCHLD ignored, or the child reaped "
        "elsewhere?)", stderr_note));
  }
  if (*code < 0) {
    const int signal = -*code;
    return absl::AbortedError(absl::StrCat(who, ": killed by signal ", signal, " (",
                                           strsignal(signal), ") after ", elapsed_s, " s",
                                           stderr_note));
  }
  if (*code != 0) {
    return absl::AbortedError(absl::StrCat(
        who, ": exited with status ", *code,
        *code == 127 ? " (command not found, or /bin/sh could not run)" : "", stderr_note));
  }

  absl::string_view last;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    absl::string_view trimmed = absl::StripAsciiWhitespace(line);
    if (!trimmed.empty()) last = trimmed;
  }
  if (last.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": printed no number (its stdout is empty)", stderr_note));
  }
  double value = 0;
  if (!absl::SimpleAtod(last, &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": printed no number: its last non-empty stdout line is ",
                     Quote(last), ", expected one finite number", stderr_note));
  }
  return value;
}

FitnessFn MakeExternalFitness(ExternalFitnessOptions options) {
  return [options = std::move(options)](absl::Span<const uint32_t> budgets) {
    return RunFitnessCommand(options, budgets);
  };
}

}  // namespace evoke::tune
