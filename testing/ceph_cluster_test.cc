// The throwaway Ceph cluster itself (scripts/ceph-dev-cluster.sh through
// CephCluster): it starts, the rados CLI writes and reads objects in a
// namespace, freeze/thaw stop and resume every daemon, kill-osd kills one,
// and Stop leaves no process behind, not even a zombie. Needs Ceph installed;
// skips (with how to install it) otherwise.
#include "testing/ceph_cluster.h"

#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "testing/blocks.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke::testing {
namespace {

TEST(CephClusterTest, StartsServesFreezesKillsAndStopsWithoutLeftovers) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<CephCluster>> started = CephCluster::Start(dir.Join("ceph"));
  if (!started.ok()) {
    if (CephCluster::Required()) FAIL() << started.status();
    GTEST_SKIP() << started.status().message() << "\n" << CephCluster::kHowToRun;
  }
  CephCluster& ceph = **started;
  std::cerr << "cluster up in " << absl::FormatDuration(ceph.start_time()) << "\n";
  const auto daemons = ceph.Daemons();
  ASSERT_EQ(daemons.size(), 5u) << "mon, mgr, 3 OSDs";

  // Objects by namespace: the same name in two namespaces is two objects.
  const std::string bytes = Payload(7, 100000);
  ASSERT_OK(ceph.RadosPut("ns-a", "b.0001", bytes));
  ASSERT_OK(ceph.RadosPut("ns-b", "b.0001", "other"));
  absl::StatusOr<std::string> got = ceph.RadosGet("ns-a", "b.0001");
  ASSERT_OK(got.status());
  EXPECT_TRUE(*got == bytes);
  got = ceph.RadosGet("ns-b", "b.0001");
  ASSERT_OK(got.status());
  EXPECT_EQ(*got, "other");
  EXPECT_EQ(ceph.RadosGet("ns-a", "b.0002").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::vector<std::string>> names = ceph.RadosList("ns-a");
  ASSERT_OK(names.status());
  EXPECT_EQ(*names, std::vector<std::string>{"b.0001"});

  // Freeze: every daemon stopped; thaw: running again and serving.
  ASSERT_OK(ceph.Freeze());
  for (const auto& [name, pid] : daemons) EXPECT_EQ(ProcState(pid), 'T') << name;
  ASSERT_OK(ceph.Thaw());
  for (const auto& [name, pid] : daemons) {
    EXPECT_NE(ProcState(pid), 'T') << name;
    EXPECT_NE(ProcState(pid), '-') << name;
  }
  got = ceph.RadosGet("ns-a", "b.0001");
  ASSERT_OK(got.status());
  EXPECT_TRUE(*got == bytes);

  // One OSD killed: it is gone and reaped (no zombie); with size 3 / min_size
  // 2 the pool still takes writes and serves reads.
  pid_t osd1 = 0;
  for (const auto& [name, pid] : daemons) {
    if (name == "osd.1") osd1 = pid;
  }
  ASSERT_GT(osd1, 0);
  ASSERT_OK(ceph.KillOsd(1));
  EXPECT_EQ(ProcState(osd1), '-') << "osd.1 is not reaped";
  ASSERT_OK(ceph.RadosPut("ns-a", "b.0003", "after the kill"));
  got = ceph.RadosGet("ns-a", "b.0001");
  ASSERT_OK(got.status());
  EXPECT_TRUE(*got == bytes);

  // Stop: nothing left, not even zombies (this process is their subreaper).
  ASSERT_OK(ceph.Stop());
  for (const auto& [name, pid] : daemons) EXPECT_EQ(ProcState(pid), '-') << name;
}

TEST(CephClusterTest, MissingCephIsAReasonToSkip) {
  // With an empty PATH nothing is installed: Start says so and how to fix it.
  const char* old = getenv("PATH");
  const std::string saved = old != nullptr ? old : "";
  setenv("PATH", "/nonexistent", 1);
  TempDir dir;
  absl::StatusOr<std::unique_ptr<CephCluster>> started = CephCluster::Start(dir.Join("ceph"));
  setenv("PATH", saved.c_str(), 1);
  ASSERT_FALSE(started.ok());
  EXPECT_EQ(started.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(started.status().message().find("ceph-mon is not installed"), std::string::npos)
      << started.status();
  EXPECT_NE(started.status().message().find("setup-debian.sh"), std::string::npos);
}

}  // namespace
}  // namespace evoke::testing
