#include "testing/daemon_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace evoke::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::atomic<int> g_counter{0};

// Spawn forks and execs argv with stdout/stderr redirected to files.
pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
            const std::string& out_path, const std::string& err_path) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // Build the environment before fork: between fork and exec the child of a
  // multi-threaded process may only call async-signal-safe functions.
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (out >= 0) dup2(out, STDOUT_FILENO);
    if (err >= 0) dup2(err, STDERR_FILENO);
    const int null_in = open("/dev/null", O_RDONLY);
    if (null_in >= 0) dup2(null_in, STDIN_FILENO);
    // Tests block no signals, but be explicit: the child starts clean.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  return pid;
}

int DecodeStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  return -1000;
}

}  // namespace

CommandResult RunCommand(const std::vector<std::string>& argv,
                         const std::vector<std::string>& env) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string base = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp",
                                        "/evoke-cmd-", getpid(), "-", g_counter++);
  const std::string out_path = base + ".out", err_path = base + ".err";
  const pid_t pid = Spawn(argv, env, out_path, err_path);
  CommandResult result;
  int status = 0;
  if (pid > 0 && waitpid(pid, &status, 0) == pid) {
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  result.out = ReadFile(out_path);
  result.err = ReadFile(err_path);
  unlink(out_path.c_str());
  unlink(err_path.c_str());
  return result;
}

std::string BinaryPath(const char* env_var, const char* built) {
  const char* v = std::getenv(env_var);
  return v != nullptr && *v != '\0' ? std::string(v) : std::string(built);
}
std::string EvokedPath() { return BinaryPath("EVOKE_EVOKED", EVOKE_EVOKED_PATH); }
std::string EvokectlPath() { return BinaryPath("EVOKE_EVOKECTL", EVOKE_EVOKECTL_PATH); }

CommandResult RunEvokectl(const std::string& socket,
                          const std::vector<std::string>& args) {
  std::vector<std::string> argv = {EvokectlPath(), "--socket", socket};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv);
}

absl::StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(
    const std::string& dir, const std::vector<std::string>& flags,
    absl::Duration timeout) {
  std::unique_ptr<DaemonProcess> d(new DaemonProcess());
  d->socket_ = dir + "/evoked.sock";
  d->data_dir_ = dir + "/data";
  d->log_path_ = dir + "/evoked.log";
  std::vector<std::string> argv = {EvokedPath(), "--socket", d->socket_,
                                   "--data-dir", d->data_dir_, "--pinned-bytes",
                                   "32MiB", "--worker-threads", "4"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  for (size_t i = 0; i + 1 < flags.size(); ++i) {
    if (flags[i] == "--socket") d->socket_ = flags[i + 1];
    if (flags[i] == "--data-dir") d->data_dir_ = flags[i + 1];
  }
  {
    std::ofstream(d->log_path_, std::ios::app)
        << "---- start: " << absl::FormatTime(absl::Now()) << "\n";
  }
  d->pid_ = Spawn(argv, {}, "/dev/null", d->log_path_);
  if (d->pid_ <= 0) return absl::UnavailableError("fork failed");
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(d->pid_, &status, WNOHANG) == d->pid_) {
      d->reaped_ = true;
      return absl::UnavailableError(absl::StrCat(
          "evoked exited with ", DecodeStatus(status), " during start:\n", d->Log()));
    }
    if (access(d->socket_.c_str(), F_OK) == 0) {
      ClientOptions options;
      options.target = d->socket_;
      options.connect_timeout = absl::Milliseconds(200);
      absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(options);
      // Healthy, and it is our child answering (not another daemon that
      // already serves this socket).
      if (c.ok() && (*c)->HealthCheck().ok()) {
        absl::StatusOr<v1::StatResponse> stat = (*c)->Stat();
        if (stat.ok() && stat->pid() == static_cast<uint32_t>(d->pid_)) return d;
      }
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::UnavailableError(
      absl::StrCat("evoked did not become healthy in time:\n", d->Log()));
}

DaemonProcess::~DaemonProcess() {
  if (!reaped_ && pid_ > 0) KillHard();
}

void DaemonProcess::Signal(int signal) {
  if (!reaped_ && pid_ > 0) kill(pid_, signal);
}

absl::StatusOr<int> DaemonProcess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!reaped_) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return DecodeStatus(status);
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("evoked (pid ", pid_, ") did not exit:\n", Log()));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::FailedPreconditionError("already reaped");
}

absl::StatusOr<int> DaemonProcess::Terminate() {
  Signal(SIGTERM);
  return Wait();
}

void DaemonProcess::KillHard() {
  if (reaped_ || pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  reaped_ = true;
}

std::unique_ptr<Client> DaemonProcess::Connect(uint64_t max_message_bytes) const {
  ClientOptions options;
  options.target = socket_;
  options.max_message_bytes = max_message_bytes;
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(options);
  return c.ok() ? std::move(c).value() : nullptr;
}

std::string DaemonProcess::Log() const { return ReadFile(log_path_); }

}  // namespace evoke::testing
