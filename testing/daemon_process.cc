#include "testing/daemon_process.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "testing/blocks.h"
#include "testing/temp_dir.h"

namespace evoke::testing {
namespace {

std::atomic<int> g_counter{0};

}  // namespace

CommandResult RunCommand(const std::vector<std::string>& argv,
                         const std::vector<std::string>& env) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string base = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp",
                                        "/evoke-cmd-", getpid(), "-", g_counter++);
  SpawnOptions options{.argv = argv, .env = env};
  options.stdin_path = "/dev/null";
  options.stdout_path = base + ".out";
  options.stderr_path = base + ".err";
  CommandResult result;
  absl::StatusOr<Subprocess> process = Subprocess::Spawn(options);
  if (!process.ok()) {
    result.exit_code = 127;  // What a shell reports for a command it cannot run.
    result.err = process.status().ToString();
    return result;
  }
  absl::StatusOr<int> code = process->Wait();
  if (code.ok()) result.exit_code = *code >= 0 ? *code : -1;
  result.out = ReadFile(options.stdout_path);
  result.err = ReadFile(options.stderr_path);
  unlink(options.stdout_path.c_str());
  unlink(options.stderr_path.c_str());
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
  SpawnOptions options{.argv = argv};
  options.stdin_path = "/dev/null";
  options.stdout_path = "/dev/null";
  options.stderr_path = d->log_path_;
  options.stderr_append = true;  // One log across restarts in the same dir.
  absl::StatusOr<Subprocess> process = Subprocess::Spawn(options);
  if (!process.ok()) {
    return absl::UnavailableError(
        absl::StrCat("evoked could not start: ", process.status().ToString()));
  }
  d->process_ = std::move(process).value();
  absl::Status exited;
  const bool done = WaitUntil(
      [&] {
        int code = 0;
        absl::StatusOr<bool> gone = d->process_.TryWait(&code);
        if (!gone.ok() || *gone) {
          const std::string how =
              gone.ok() ? absl::StrCat(code) : gone.status().ToString();
          exited = absl::UnavailableError(
              absl::StrCat("evoked exited with ", how, " during start:\n", d->Log()));
          return true;
        }
        if (access(d->socket_.c_str(), F_OK) != 0) return false;
        ClientOptions client_options;
        client_options.target = d->socket_;
        client_options.connect_timeout = absl::Milliseconds(200);
        absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(client_options);
        // Healthy, and it is our child answering (not another daemon that
        // already serves this socket).
        if (!c.ok() || !(*c)->HealthCheck().ok()) return false;
        absl::StatusOr<v1::StatResponse> stat = (*c)->Stat();
        return stat.ok() && stat->pid() == static_cast<uint32_t>(d->pid());
      },
      timeout, absl::Milliseconds(20));
  if (!exited.ok()) return exited;
  if (done) return d;
  return absl::UnavailableError(
      absl::StrCat("evoked did not become healthy in time:\n", d->Log()));
}

DaemonProcess::~DaemonProcess() { KillHard(); }

void DaemonProcess::Signal(int signal) { process_.Signal(signal); }

absl::StatusOr<int> DaemonProcess::Wait(absl::Duration timeout) {
  if (!process_.running()) return absl::FailedPreconditionError("already reaped");
  absl::StatusOr<int> code = process_.Wait(timeout);
  if (absl::IsDeadlineExceeded(code.status())) {
    return absl::DeadlineExceededError(
        absl::StrCat("evoked (pid ", pid(), ") did not exit:\n", Log()));
  }
  return code;
}

absl::StatusOr<int> DaemonProcess::Terminate() {
  Signal(SIGTERM);
  return Wait();
}

void DaemonProcess::KillHard() {
  if (process_.running()) process_.Kill().IgnoreError();
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
