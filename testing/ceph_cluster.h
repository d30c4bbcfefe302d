// CephCluster: a throwaway Ceph cluster on loopback for end-to-end tests of
// the remote tier (issue #14): 1 mon, 1 mgr, 3 memstore OSDs and the pool
// `evoke` (size 3, min_size 2), started by scripts/ceph-dev-cluster.sh in a
// test directory and stopped by pid. Also the drills the tests need (freeze
// the whole cluster, kill one OSD) and the `rados` CLI, so that a test can
// read and overwrite stored objects behind evoked's back.
//
//   TempDir dir;
//   absl::StatusOr<std::unique_ptr<CephCluster>> ceph = CephCluster::Start(dir.Join("ceph"));
//   if (!ceph.ok()) GTEST_SKIP() << ceph.status();   // see SkipOrFail below
//   ... evoked --remote-conf (*ceph)->conf_path() --remote-pool evoke ...
//
// Process ownership: the script starts every daemon in the foreground as a
// background job and exits, leaving them orphans. Start makes this process a
// child subreaper (PR_SET_CHILD_SUBREAPER), so the daemons become its children
// and are reaped here (by pid, never waitpid(-1): other Subprocess owners keep
// theirs) instead of staying zombies under an init that does not reap. A
// watchdog started by the script kills the cluster when this process is gone
// (a test killed by ctest's timeout leaves no daemons behind).
#ifndef EVOKE_TESTING_CEPH_CLUSTER_H_
#define EVOKE_TESTING_CEPH_CLUSTER_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace evoke::testing {

// ProcState: the state letter of /proc/PID/stat ('R', 'S', 'T' stopped,
// 'Z' zombie), or '-' when there is no such process.
char ProcState(pid_t pid);

class CephCluster {
 public:
  struct Options {
    int osds = 3;
    // RAM limit of each OSD's memstore (allocated only as objects are
    // written; x3 replicas). Enough for the tests' few MiB; benchmarks raise it.
    uint64_t memstore_bytes = 512ull << 20;
    // How long the script may take; it gives up by itself after 90 s.
    absl::Duration timeout = absl::Seconds(120);
  };

  // Start runs `scripts/ceph-dev-cluster.sh start dir` (the script is
  // $EVOKE_CEPH_DEV_CLUSTER when set). FAILED_PRECONDITION (saying how to
  // install Ceph) when the Ceph daemons are not installed; UNAVAILABLE with
  // the script's reason and log tails when the cluster does not come up.
  static absl::StatusOr<std::unique_ptr<CephCluster>> Start(const std::string& dir,
                                                            const Options& options);
  static absl::StatusOr<std::unique_ptr<CephCluster>> Start(const std::string& dir) {
    return Start(dir, Options());
  }
  // Installed: OK when ceph-mon, ceph-osd, ceph-mgr, ceph and rados are on
  // $PATH; FAILED_PRECONDITION naming the first missing one otherwise.
  static absl::Status Installed();
  // How to get Ceph so that the remote tests run (for skip messages).
  static constexpr absl::string_view kHowToRun =
      "the remote-tier tests need Ceph (Debian 12: scripts/setup-debian.sh, or apt-get "
      "install --no-install-recommends ceph-mon ceph-osd ceph-mgr ceph-common); "
      "EVOKE_REQUIRE_CEPH=1 turns this skip into a failure";
  // Whether a test must fail rather than skip when the cluster cannot start
  // ($EVOKE_REQUIRE_CEPH is set and not "0").
  static bool Required();

  // Stops the cluster (kill -9 of every daemon) if it still runs.
  ~CephCluster();
  CephCluster(const CephCluster&) = delete;
  CephCluster& operator=(const CephCluster&) = delete;

  const std::string& dir() const { return dir_; }
  const std::string& conf_path() const { return conf_path_; }
  const std::string& pool() const { return pool_; }
  // How long Start took.
  absl::Duration start_time() const { return start_time_; }

  // Freeze stops every daemon with SIGSTOP (the whole cluster unreachable:
  // clients time out, nothing is lost); Thaw resumes them with SIGCONT.
  absl::Status Freeze();
  absl::Status Thaw();
  // KillOsd kills OSD `id` with SIGKILL and reaps it. It stays down (a
  // memstore OSD restarted after kill -9 comes back empty and recovers slowly).
  absl::Status KillOsd(int id);
  // Stop kills every daemon and reaps them; later calls do nothing.
  absl::Status Stop();
  // Daemons: (name, pid) of every daemon started ("mon.a", "mgr.x", "osd.0"...).
  std::vector<std::pair<std::string, pid_t>> Daemons() const;
  // Status: the script's `status` output (daemons and `ceph -s`), for logs.
  std::string Status();

  // The rados CLI on the pool, in RADOS namespace `ns` ("" = the default).
  // RadosPut replaces the object's data (its xattrs stay); RadosGet returns
  // its data, NOT_FOUND when it does not exist. UNAVAILABLE with the CLI's
  // message otherwise (e.g. while frozen: every call is bounded to ~30 s).
  absl::Status RadosPut(const std::string& ns, const std::string& object,
                        absl::string_view bytes);
  absl::StatusOr<std::string> RadosGet(const std::string& ns, const std::string& object);
  // RadosList: the object names in namespace `ns`.
  absl::StatusOr<std::vector<std::string>> RadosList(const std::string& ns);
  // Rados runs `rados -c conf -p pool -N ns ARGS...` and returns its stdout.
  absl::StatusOr<std::string> Rados(const std::string& ns, const std::vector<std::string>& args);

 private:
  CephCluster() = default;
  // Runs the script with `args`; its stdout when it exits 0.
  absl::StatusOr<std::string> RunScript(const std::vector<std::string>& args,
                                        absl::Duration timeout);
  // Reaps whichever recorded daemons have exited (they are this process's
  // children through the subreaper); pids that are not our children are
  // left alone.
  void Reap();
  // PidFiles: (file name, pid) of every readable file in DIR/pids.
  std::vector<std::pair<std::string, pid_t>> PidFiles() const;

  std::string dir_;
  std::string conf_path_;
  std::string pool_ = "evoke";
  std::string script_;
  uint64_t memstore_bytes_ = 0;
  absl::Duration start_time_;
  bool stopped_ = false;
};

}  // namespace evoke::testing

#endif  // EVOKE_TESTING_CEPH_CLUSTER_H_
