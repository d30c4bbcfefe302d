#include "testing/ceph_cluster.h"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"
#include "testing/temp_dir.h"

namespace evoke::testing {
namespace {

bool OnPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  for (absl::string_view d : absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
    if (d.empty()) continue;
    if (access(absl::StrCat(d, "/", program).c_str(), X_OK) == 0) return true;
  }
  return false;
}

std::atomic<int> g_counter{0};

struct Run {
  absl::Status status;  // OK when it exited 0.
  std::string out;
  std::string err;
};

// RunBounded runs argv with `env`, stdout/stderr to files under `dir`, and
// kills it after `timeout`.
Run RunBounded(const std::string& dir, const std::vector<std::string>& argv,
               const std::vector<std::string>& env, absl::Duration timeout) {
  const std::string base = absl::StrCat(dir, "/cmd-", getpid(), "-", g_counter++);
  SpawnOptions options{.argv = argv, .env = env};
  options.stdin_path = "/dev/null";
  options.stdout_path = base + ".out";
  options.stderr_path = base + ".err";
  Run run;
  absl::StatusOr<Subprocess> process = Subprocess::Spawn(options);
  if (!process.ok()) {
    run.status = process.status();
    return run;
  }
  absl::StatusOr<int> code = process->Wait(timeout);
  if (absl::IsDeadlineExceeded(code.status())) {
    process->Kill().IgnoreError();
    run.status = absl::DeadlineExceededError(
        absl::StrCat(argv[0], " did not finish within ", absl::FormatDuration(timeout)));
  } else if (!code.ok()) {
    run.status = code.status();
  } else if (*code != 0) {
    run.status = absl::UnknownError(absl::StrCat(argv[0], " exited with ", *code));
  }
  run.out = ReadFile(options.stdout_path);
  run.err = ReadFile(options.stderr_path);
  unlink(options.stdout_path.c_str());
  unlink(options.stderr_path.c_str());
  return run;
}

}  // namespace

char ProcState(pid_t pid) {
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  if (stat.empty()) return '-';
  const size_t paren = stat.rfind(") ");
  return paren == std::string::npos || paren + 2 >= stat.size() ? '?' : stat[paren + 2];
}

absl::Status CephCluster::Installed() {
  for (const char* p : {"ceph-mon", "ceph-osd", "ceph-mgr", "ceph", "rados", "monmaptool"}) {
    if (!OnPath(p)) {
      return absl::FailedPreconditionError(absl::StrCat(p, " is not installed: ", kHowToRun));
    }
  }
  return absl::OkStatus();
}

bool CephCluster::Required() {
  const char* v = std::getenv("EVOKE_REQUIRE_CEPH");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

absl::StatusOr<std::unique_ptr<CephCluster>> CephCluster::Start(const std::string& dir,
                                                                const Options& options) {
  if (absl::Status s = Installed(); !s.ok()) return s;
  std::unique_ptr<CephCluster> c(new CephCluster());
  const char* script = std::getenv("EVOKE_CEPH_DEV_CLUSTER");
  c->script_ = script != nullptr && *script != '\0' ? script : EVOKE_CEPH_DEV_CLUSTER_SCRIPT;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  c->dir_ = std::filesystem::absolute(dir).string();
  c->memstore_bytes_ = options.memstore_bytes;
  // The daemons outlive the script: as our children (not init's) they can be
  // reaped here. Process-wide; harmless for other children (each reaped by
  // its own pid).
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    return absl::InternalError(absl::StrCat("prctl(PR_SET_CHILD_SUBREAPER): errno ", errno));
  }
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::string> out =
      c->RunScript({"start", c->dir_, absl::StrCat(options.osds)}, options.timeout);
  c->start_time_ = absl::Now() - t0;
  if (!out.ok()) {
    c->Stop().IgnoreError();
    return absl::UnavailableError(absl::StrCat("the Ceph dev cluster did not start in ",
                                               c->dir_, ": ", out.status().message()));
  }
  // The script prints the conf path as its last line.
  std::vector<std::string> lines =
      absl::StrSplit(absl::StripTrailingAsciiWhitespace(*out), '\n');
  c->conf_path_ = lines.empty() ? "" : lines.back();
  if (c->conf_path_.empty() || access(c->conf_path_.c_str(), R_OK) != 0) {
    c->Stop().IgnoreError();
    return absl::UnavailableError(
        absl::StrCat("ceph-dev-cluster.sh printed no readable conf path: '", *out, "'"));
  }
  return c;
}

CephCluster::~CephCluster() { Stop().IgnoreError(); }

absl::StatusOr<std::string> CephCluster::RunScript(const std::vector<std::string>& args,
                                                   absl::Duration timeout) {
  std::vector<std::string> argv = {"bash", script_};
  argv.insert(argv.end(), args.begin(), args.end());
  Run run = RunBounded(
      dir_, argv,
      {absl::StrCat("CEPH_DEV_OWNER_PID=", getpid()),
       absl::StrCat("MEMSTORE_BYTES=", memstore_bytes_)},
      timeout);
  Reap();
  if (!run.status.ok()) {
    return absl::Status(run.status.code(),
                        absl::StrCat("ceph-dev-cluster.sh ", args.empty() ? "" : args[0], ": ",
                                     run.status.message(), "\n", run.err));
  }
  return run.out;
}

std::vector<std::pair<std::string, pid_t>> CephCluster::PidFiles() const {
  std::vector<std::pair<std::string, pid_t>> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_ + "/pids", ec)) {
    int pid = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(entry.path().string())), &pid) ||
        pid <= 0) {
      continue;
    }
    files.emplace_back(entry.path().filename().string(), pid);
  }
  return files;
}

std::vector<std::pair<std::string, pid_t>> CephCluster::Daemons() const {
  std::vector<std::pair<std::string, pid_t>> daemons;
  for (const auto& [file, pid] : PidFiles()) {
    absl::string_view name = file;
    if (!absl::ConsumeSuffix(&name, ".pid")) continue;  // The watchdog.
    daemons.emplace_back(std::string(name), pid);
  }
  return daemons;
}

void CephCluster::Reap() {
  // A killed multi-threaded daemon shows 'Z' as soon as its main thread is
  // dead, but waitpid reports it only once every thread has exited: such a
  // pid is waited for (briefly) rather than left a zombie.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (const auto& [file, pid] : PidFiles()) {
    int status = 0;
    for (;;) {
      const pid_t r = waitpid(pid, &status, WNOHANG);
      if (r < 0 && errno == EINTR) continue;
      // Reaped, or not our child (ECHILD: a stranger's pid is left alone).
      if (r != 0) break;
      // A live daemon is left alone; a dying one is waited for.
      if (ProcState(pid) != 'Z' || absl::Now() >= deadline) break;
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
}

absl::Status CephCluster::Freeze() {
  if (stopped_) return absl::FailedPreconditionError("the cluster is stopped");
  return RunScript({"freeze", dir_}, absl::Seconds(30)).status();
}

absl::Status CephCluster::Thaw() {
  if (stopped_) return absl::FailedPreconditionError("the cluster is stopped");
  return RunScript({"thaw", dir_}, absl::Seconds(30)).status();
}

absl::Status CephCluster::KillOsd(int id) {
  if (stopped_) return absl::FailedPreconditionError("the cluster is stopped");
  return RunScript({"kill-osd", dir_, absl::StrCat(id)}, absl::Seconds(30)).status();
}

absl::Status CephCluster::Stop() {
  if (stopped_ || dir_.empty()) return absl::OkStatus();
  stopped_ = true;
  absl::Status s = RunScript({"stop", dir_}, absl::Seconds(30)).status();
  Reap();
  return s;
}

std::string CephCluster::Status() {
  absl::StatusOr<std::string> out = RunScript({"status", dir_}, absl::Seconds(30));
  return out.ok() ? *out : out.status().ToString();
}

absl::StatusOr<std::string> CephCluster::Rados(const std::string& ns,
                                               const std::vector<std::string>& args) {
  // Bounded: the CLI's defaults wait forever for a frozen cluster.
  std::vector<std::string> argv = {"rados", "-c", conf_path_, "-p", pool_,
                                   "--rados-osd-op-timeout", "20", "--rados-mon-op-timeout",
                                   "20", "--client-mount-timeout", "20"};
  if (!ns.empty()) {
    argv.push_back("-N");
    argv.push_back(ns);
  }
  argv.insert(argv.end(), args.begin(), args.end());
  Run run = RunBounded(dir_, argv, {}, absl::Seconds(30));
  if (run.status.ok()) return run.out;
  if (absl::StrContains(run.err, "No such file or directory")) {
    return absl::NotFoundError(absl::StrCat("rados: ", run.err));
  }
  return absl::UnavailableError(absl::StrCat("rados ", absl::StrJoin(args, " "), ": ",
                                             run.status.message(), ": ", run.err));
}

absl::Status CephCluster::RadosPut(const std::string& ns, const std::string& object,
                                   absl::string_view bytes) {
  const std::string path = absl::StrCat(dir_, "/put-", getpid(), "-", g_counter++);
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  absl::Status s = Rados(ns, {"put", object, path}).status();
  unlink(path.c_str());
  return s;
}

absl::StatusOr<std::string> CephCluster::RadosGet(const std::string& ns,
                                                  const std::string& object) {
  const std::string path = absl::StrCat(dir_, "/get-", getpid(), "-", g_counter++);
  absl::StatusOr<std::string> out = Rados(ns, {"get", object, path});
  std::string bytes = ReadFile(path);
  unlink(path.c_str());
  if (!out.ok()) return out.status();
  return bytes;
}

absl::StatusOr<std::vector<std::string>> CephCluster::RadosList(const std::string& ns) {
  absl::StatusOr<std::string> out = Rados(ns, {"ls"});
  if (!out.ok()) return out.status();
  return std::vector<std::string>(absl::StrSplit(*out, '\n', absl::SkipEmpty()));
}

}  // namespace evoke::testing
