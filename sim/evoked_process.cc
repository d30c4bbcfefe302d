#include "sim/evoked_process.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/subprocess.h"

namespace evoke::sim {
namespace {

std::string Tail(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > 2000 ? s.substr(s.size() - 2000) : s;
}

}  // namespace

std::string DefaultEvokedPath() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    // The build tree (<build>/sim/evoke-sim -> <build>/daemon/evoked), then
    // an installed one beside this binary (<prefix>/bin).
    for (const std::filesystem::path& candidate :
         {self.parent_path().parent_path() / "daemon" / "evoked", self.parent_path() / "evoked"}) {
      if (std::filesystem::exists(candidate, ec)) return candidate.string();
    }
  }
  return "evoked";
}

absl::StatusOr<std::unique_ptr<EvokedProcess>> EvokedProcess::Start(
    const EvokedProcessOptions& options) {
  std::string binary = options.binary.empty() ? DefaultEvokedPath() : options.binary;
  if (binary.find('/') != std::string::npos && ::access(binary.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("evoked: no executable at ", binary,
                                            " (build the evoked target or pass --evoked)"));
  }
  std::string templ = options.dir;
  if (templ.empty()) {
    templ = (std::filesystem::temp_directory_path() / "evoke-sim.XXXXXX").string();
    if (::mkdtemp(templ.data()) == nullptr) {
      return absl::InternalError("mkdtemp failed for the evoked directory");
    }
  } else {
    std::error_code ec;
    std::filesystem::create_directories(templ, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("evoked's directory ", templ, ": ", ec.message()));
    }
    // A socket left by a killed run would make this start fail.
    std::filesystem::remove(templ + "/evoked.sock", ec);
  }
  auto p = std::unique_ptr<EvokedProcess>(new EvokedProcess());
  p->dir_ = templ;
  p->keep_dir_ = !options.dir.empty();
  p->socket_ = templ + "/evoked.sock";
  const std::string log = templ + "/evoked.log";
  std::vector<std::string> args = {binary,
                                   "--socket", p->socket_,
                                   "--data-dir", templ + "/data",
                                   "--pinned-bytes", options.pinned_bytes,
                                   absl::StrCat("--summary-layer=", options.summary_layer),
                                   "--worker-threads", absl::StrCat(options.worker_threads),
                                   "--lock-memory=false",
                                   "--log-level", "warning"};
  SpawnOptions spawn{.argv = args};
  spawn.stdout_path = spawn.stderr_path = log;
  // evoked goes when evoke-sim does, however it ends (kill -9 included).
  spawn.death_signal = SIGTERM;
  absl::StatusOr<Subprocess> process = Subprocess::Spawn(spawn);
  if (!process.ok()) {
    return absl::Status(process.status().code(),
                        absl::StrCat("evoked: ", process.status().message(),
                                     " (build the evoked target or pass --evoked)"));
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    int code = 0;
    absl::StatusOr<bool> exited = process->TryWait(&code);
    if (!exited.ok() || *exited) {
      return absl::UnavailableError(
          absl::StrCat("evoked (", binary, ") exited at start: ", Tail(log)));
    }
    if (::access(p->socket_.c_str(), F_OK) == 0) {
      absl::StatusOr<std::unique_ptr<Client>> c = p->Connect();
      if (c.ok() && (*c)->HealthCheck().ok()) {
        // Ours to stop from here on (the destructor: SIGTERM, then SIGKILL).
        p->pid_ = process->Release();
        return p;
      }
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::UnavailableError(absl::StrCat("evoked did not answer within 30 s: ", Tail(log)));
}

absl::StatusOr<std::unique_ptr<Client>> EvokedProcess::Connect() const {
  ClientOptions o;
  o.target = socket_;
  o.connect_timeout = absl::Seconds(5);
  return Client::Connect(o);
}

EvokedProcess::~EvokedProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    int status = 0;
    bool reaped = false;
    while (absl::Now() < deadline) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped = true;
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (!reaped) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
    }
  }
  if (!dir_.empty() && !keep_dir_) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

}  // namespace evoke::sim
