#include "common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/blocks.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke {
namespace {

using ::evoke::testing::Eventually;
using ::evoke::testing::IsOkAndHolds;
using ::evoke::testing::StatusIs;
using ::testing::HasSubstr;

using ::evoke::testing::ReadFile;

SpawnOptions Shell(const std::string& script) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", script};
  return o;
}

TEST(SubprocessTest, ReportsTheExitCode) {
  ASSERT_OK_AND_ASSIGN(Subprocess ok, Subprocess::Spawn(Shell("exit 0")));
  EXPECT_GT(ok.pid(), 0);
  EXPECT_THAT(ok.Wait(absl::Seconds(30)), IsOkAndHolds(0));
  EXPECT_FALSE(ok.running());
  ASSERT_OK_AND_ASSIGN(Subprocess three, Subprocess::Spawn(Shell("exit 3")));
  EXPECT_THAT(three.Wait(), IsOkAndHolds(3));
  // Waiting again: there is nothing left to wait for.
  EXPECT_THAT(three.Wait(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(SubprocessTest, ReportsTheKillingSignal) {
  ASSERT_OK_AND_ASSIGN(Subprocess p, Subprocess::Spawn(Shell("kill -TERM $$; sleep 30")));
  EXPECT_THAT(p.Wait(absl::Seconds(30)), IsOkAndHolds(-SIGTERM));
}

TEST(SubprocessTest, TimeoutLeavesItRunningThenKillEndsIt) {
  ASSERT_OK_AND_ASSIGN(Subprocess p, Subprocess::Spawn({.argv = {"sleep", "30"}}));
  const absl::Time start = absl::Now();
  EXPECT_THAT(p.Wait(absl::Milliseconds(100)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("did not exit")));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_TRUE(p.running());
  EXPECT_FALSE(p.Exited());
  int code = 0;
  EXPECT_THAT(p.TryWait(&code), IsOkAndHolds(false));
  EXPECT_THAT(p.Kill(), IsOkAndHolds(-SIGKILL));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_FALSE(p.running());
}

TEST(SubprocessTest, StopTermsThenKillsWhatIgnoresTerm) {
  ASSERT_OK_AND_ASSIGN(Subprocess polite, Subprocess::Spawn({.argv = {"sleep", "30"}}));
  EXPECT_THAT(polite.Stop(absl::Seconds(20)), IsOkAndHolds(-SIGTERM));
  // A shell that traps TERM: Stop falls back to SIGKILL after the grace.
  evoke::testing::TempDir dir;
  SpawnOptions o = Shell(absl::StrCat("trap '' TERM; touch ", dir.Join("ready"),
                                      "; while :; do sleep 0.01; done"));
  ASSERT_OK_AND_ASSIGN(Subprocess stubborn, Subprocess::Spawn(o));
  ASSERT_TRUE(Eventually([&] { return access(dir.Join("ready").c_str(), F_OK) == 0; },
                         "the shell traps TERM", absl::Seconds(30)));
  EXPECT_THAT(stubborn.Stop(absl::Milliseconds(200)), IsOkAndHolds(-SIGKILL));
}

TEST(SubprocessTest, CapturesStdoutAndStderrInFiles) {
  evoke::testing::TempDir dir;
  SpawnOptions o = Shell("echo out; echo err >&2; exit 0");
  o.stdout_path = dir.Join("out");
  o.stderr_path = dir.Join("err");
  ASSERT_OK_AND_ASSIGN(Subprocess p, Subprocess::Spawn(o));
  EXPECT_THAT(p.Wait(), IsOkAndHolds(0));
  EXPECT_EQ(ReadFile(dir.Join("out")), "out\n");
  EXPECT_EQ(ReadFile(dir.Join("err")), "err\n");
  // Truncated by default, appended on request.
  o.argv = {"/bin/sh", "-c", "echo again; echo more >&2"};
  o.stderr_append = true;
  ASSERT_OK_AND_ASSIGN(Subprocess q, Subprocess::Spawn(o));
  EXPECT_THAT(q.Wait(), IsOkAndHolds(0));
  EXPECT_EQ(ReadFile(dir.Join("out")), "again\n");
  EXPECT_EQ(ReadFile(dir.Join("err")), "err\nmore\n");
}

TEST(SubprocessTest, OneFileForBothStreamsKeepsTheirOrder) {
  evoke::testing::TempDir dir;
  SpawnOptions o = Shell("echo 1; echo 2 >&2; echo 3; echo 4 >&2");
  o.stdout_path = o.stderr_path = dir.Join("log");
  ASSERT_OK_AND_ASSIGN(Subprocess p, Subprocess::Spawn(o));
  EXPECT_THAT(p.Wait(), IsOkAndHolds(0));
  EXPECT_EQ(ReadFile(dir.Join("log")), "1\n2\n3\n4\n");
}

TEST(SubprocessTest, StreamsFromDescriptorsAndStdinFromAFile) {
  evoke::testing::TempDir dir;
  std::ofstream(dir.Join("in")) << "from stdin\n";
  int pipefd[2];
  ASSERT_EQ(pipe2(pipefd, O_CLOEXEC), 0);
  SpawnOptions o = Shell("cat; echo done");
  o.stdin_path = dir.Join("in");
  o.stdout_fd = pipefd[1];
  ASSERT_OK_AND_ASSIGN(Subprocess p, Subprocess::Spawn(o));
  close(pipefd[1]);  // The child holds its own copy.
  std::string out;
  char buf[256];
  for (ssize_t n; (n = read(pipefd[0], buf, sizeof(buf))) > 0;) out.append(buf, n);
  close(pipefd[0]);
  EXPECT_EQ(out, "from stdin\ndone\n");
  EXPECT_THAT(p.Wait(), IsOkAndHolds(0));
}

TEST(SubprocessTest, EnvironmentIsAddedAndOverridden) {
  evoke::testing::TempDir dir;
  setenv("EVOKE_SUBPROCESS_TEST_OLD", "old", 1);
  SpawnOptions o = Shell(
      "echo \"$EVOKE_SUBPROCESS_TEST_NEW $EVOKE_SUBPROCESS_TEST_OLD\"; "
      "env | grep -c '^EVOKE_SUBPROCESS_TEST_OLD='");
  o.env = {"EVOKE_SUBPROCESS_TEST_NEW=new", "EVOKE_SUBPROCESS_TEST_OLD=replaced"};
  o.stdout_path = dir.Join("out");
  ASSERT_OK_AND_ASSIGN(Subprocess p, Subprocess::Spawn(o));
  EXPECT_THAT(p.Wait(), IsOkAndHolds(0));
  unsetenv("EVOKE_SUBPROCESS_TEST_OLD");
  EXPECT_EQ(ReadFile(dir.Join("out")), "new replaced\n1\n");
}

TEST(SubprocessTest, FindsProgramsOnPath) {
  evoke::testing::TempDir dir;
  SpawnOptions o{.argv = {"sh", "-c", "echo found"}};
  o.stdout_path = dir.Join("out");
  ASSERT_OK_AND_ASSIGN(Subprocess p, Subprocess::Spawn(o));
  EXPECT_THAT(p.Wait(), IsOkAndHolds(0));
  EXPECT_EQ(ReadFile(dir.Join("out")), "found\n");
}

TEST(SubprocessTest, MissingOrUnrunnableBinariesAreErrors) {
  evoke::testing::TempDir dir;
  EXPECT_THAT(Subprocess::Spawn({.argv = {dir.Join("no-such-binary")}}),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("exec " + dir.Join("no-such-binary") + ": No such file")));
  EXPECT_THAT(Subprocess::Spawn({.argv = {"evoke-no-such-program-on-path"}}),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("evoke-no-such-program-on-path: not found on $PATH")));
  std::ofstream(dir.Join("not-executable")) << "#!/bin/sh\n";
  chmod(dir.Join("not-executable").c_str(), 0644);
  if (geteuid() != 0) {  // root may execute anything with an x bit; none here.
    EXPECT_THAT(Subprocess::Spawn({.argv = {dir.Join("not-executable")}}),
                StatusIs(absl::StatusCode::kPermissionDenied));
  }
  EXPECT_THAT(Subprocess::Spawn({}), StatusIs(absl::StatusCode::kInvalidArgument));
  SpawnOptions bad_redirect = Shell("exit 0");
  bad_redirect.stdout_path = dir.Join("no-such-dir/out");
  EXPECT_THAT(Subprocess::Spawn(bad_redirect),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("for stdout")));
}

TEST(SubprocessTest, DeathSignalFollowsTheSpawningThread) {
  Subprocess child;
  std::thread spawner([&] {
    SpawnOptions o{.argv = {"sleep", "30"}};
    o.death_signal = SIGTERM;
    absl::StatusOr<Subprocess> p = Subprocess::Spawn(o);
    ASSERT_OK(p);
    child = std::move(p).value();
  });
  spawner.join();  // The thread is gone: the child gets SIGTERM.
  ASSERT_TRUE(child.running());
  EXPECT_THAT(child.Wait(absl::Seconds(20)), IsOkAndHolds(-SIGTERM));
}

TEST(SubprocessTest, KillGroupReachesGrandchildren) {
  evoke::testing::TempDir dir;
  SpawnOptions o = Shell(absl::StrCat("sleep 30 & echo $! > ", dir.Join("pid"), "; wait"));
  o.new_process_group = true;
  ASSERT_OK_AND_ASSIGN(Subprocess p, Subprocess::Spawn(o));
  EXPECT_EQ(getpgid(p.pid()), p.pid());
  std::string grandchild;
  ASSERT_TRUE(Eventually(
      [&] {
        grandchild = ReadFile(dir.Join("pid"));
        return !grandchild.empty() && grandchild.back() == '\n';
      },
      "the grandchild's pid is written", absl::Seconds(30)));
  const pid_t g = std::stoi(grandchild);
  EXPECT_EQ(getpgid(g), p.pid());
  p.KillGroup(SIGKILL);
  EXPECT_THAT(p.Wait(absl::Seconds(20)), IsOkAndHolds(-SIGKILL));
  // The grandchild is dead too: gone, or a zombie that its new parent (init,
  // or a container's first process that never reaps) has not reaped yet.
  auto dead = [g] {
    if (kill(g, 0) != 0) return true;
    const std::string stat = ReadFile(absl::StrCat("/proc/", g, "/stat"));
    const size_t paren = stat.rfind(')');
    return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
  };
  EXPECT_TRUE(Eventually(dead, "the grandchild dies", absl::Seconds(20)));
}

TEST(SubprocessTest, DestructionKillsARunningChild) {
  pid_t pid = -1;
  {
    ASSERT_OK_AND_ASSIGN(Subprocess p, Subprocess::Spawn({.argv = {"sleep", "30"}}));
    pid = p.pid();
    ASSERT_EQ(kill(pid, 0), 0);
  }
  EXPECT_NE(kill(pid, 0), 0);  // Killed and reaped: no such process.
}

TEST(SubprocessTest, MovedFromOwnsNothing) {
  ASSERT_OK_AND_ASSIGN(Subprocess p, Subprocess::Spawn({.argv = {"sleep", "30"}}));
  const pid_t pid = p.pid();
  Subprocess q = std::move(p);
  EXPECT_FALSE(p.running());
  EXPECT_EQ(q.pid(), pid);
  EXPECT_THAT(q.Kill(), IsOkAndHolds(-SIGKILL));
}

TEST(SubprocessTest, ReleasedProcessIsTheCallers) {
  pid_t pid = -1;
  {
    ASSERT_OK_AND_ASSIGN(Subprocess p, Subprocess::Spawn({.argv = {"sleep", "30"}}));
    pid = p.Release();
    EXPECT_FALSE(p.running());
    EXPECT_EQ(p.Release(), -1);
  }
  EXPECT_EQ(kill(pid, 0), 0);  // Still running: destruction left it alone.
  kill(pid, SIGKILL);
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_EQ(DecodeWaitStatus(status), -SIGKILL);
}

}  // namespace
}  // namespace evoke
