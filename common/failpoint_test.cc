#include "common/failpoint.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::HasSubstr;

class FailpointTest : public ::testing::Test {
 protected:
  void TearDown() override { ASSERT_TRUE(SetFailpoints("").ok()); }
};

TEST_F(FailpointTest, UnarmedPassesAndCountsNothing) {
  for (int i = 0; i < 1000; ++i) EVOKE_FAILPOINT("test.unarmed");
  EXPECT_EQ(FailpointHits("test.unarmed"), 0u);
}

TEST_F(FailpointTest, CountsHitsOfArmedNamesOnly) {
  ASSERT_TRUE(SetFailpoints("test.a=5, test.b=0.000000001").ok());
  for (int i = 0; i < 4; ++i) EVOKE_FAILPOINT("test.a");
  EVOKE_FAILPOINT("test.other");
  EXPECT_EQ(FailpointHits("test.a"), 4u);
  EXPECT_EQ(FailpointHits("test.other"), 0u);
  // Re-arming resets the counts.
  ASSERT_TRUE(SetFailpoints("test.a=5").ok());
  EXPECT_EQ(FailpointHits("test.a"), 0u);
}

TEST_F(FailpointTest, BadSpecsAreRefusedAndKeepTheArmedSet) {
  ASSERT_TRUE(SetFailpoints("test.keep=3").ok());
  for (const char* bad : {"=3", "a b", "x=0", "x=-1", "x=two", "x=0.0", "x=1.5",
                          "x=nan.", "x,x", "x=1=2"}) {
    EXPECT_THAT(SetFailpoints(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
  EVOKE_FAILPOINT("test.keep");
  EXPECT_EQ(FailpointHits("test.keep"), 1u);
}

TEST_F(FailpointTest, EmptySpecDisarms) {
  ASSERT_TRUE(SetFailpoints("test.x").ok());
  ASSERT_TRUE(SetFailpoints(" , ").ok());
  EVOKE_FAILPOINT("test.x");  // Would kill if still armed.
  EXPECT_EQ(FailpointHits("test.x"), 0u);
}

using FailpointDeathTest = FailpointTest;

TEST_F(FailpointDeathTest, FirstHitKillsWithSigkill) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        if (!SetFailpoints("test.first").ok()) std::exit(1);
        EVOKE_FAILPOINT("test.other");
        EVOKE_FAILPOINT("test.first");
        std::exit(0);  // Not reached when the failpoint works.
      },
      ::testing::KilledBySignal(SIGKILL), "evoke failpoint test.first fired \\(hit 1\\)");
}

TEST_F(FailpointDeathTest, NthHitKills) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        if (!SetFailpoints("test.nth=3").ok()) std::exit(1);
        EVOKE_FAILPOINT("test.nth");
        EVOKE_FAILPOINT("test.nth");
        if (FailpointHits("test.nth") != 2) std::exit(2);
        EVOKE_FAILPOINT("test.nth");
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGKILL), "fired \\(hit 3\\)");
}

TEST_F(FailpointDeathTest, ProbabilityOneKillsAtOnce) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        if (!SetFailpoints("test.p=1.0").ok()) std::exit(1);
        EVOKE_FAILPOINT("test.p");
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGKILL), "test.p fired");
}

// The environment arms failpoints before main(): run this binary again with
// EVOKE_FAILPOINTS set, selecting only the child test below.
std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct ChildRun {
  int exit_code = 0;
  std::string err;
};

ChildRun RunChild(const std::string& spec) {
  evoke::testing::TempDir dir;
  SpawnOptions options{.argv = {"/proc/self/exe", "--gtest_filter=FailpointEnvChild.*"},
                       .env = {"EVOKE_FAILPOINT_TEST_CHILD=1",
                               "EVOKE_FAILPOINTS=" + spec}};
  options.stdin_path = "/dev/null";
  options.stdout_path = "/dev/null";
  options.stderr_path = dir.Join("err");
  ChildRun run;
  absl::StatusOr<Subprocess> child = Subprocess::Spawn(options);
  EXPECT_TRUE(child.ok()) << child.status();
  if (!child.ok()) return run;
  absl::StatusOr<int> code = child->Wait(absl::Seconds(60));
  EXPECT_TRUE(code.ok()) << code.status();
  run.exit_code = code.ok() ? *code : 0;
  run.err = ReadAll(dir.Join("err"));
  return run;
}

TEST(FailpointEnvChild, HitsTestEnvTwice) {
  if (std::getenv("EVOKE_FAILPOINT_TEST_CHILD") == nullptr) {
    GTEST_SKIP() << "runs only as the child of FailpointEnvTest";
  }
  EVOKE_FAILPOINT("test.env");
  EVOKE_FAILPOINT("test.env");
}

TEST(FailpointEnvTest, EnvironmentArmsBeforeMain) {
  const ChildRun run = RunChild("test.env=2");
  EXPECT_EQ(run.exit_code, -SIGKILL) << run.err;
  EXPECT_THAT(run.err, HasSubstr("failpoints armed: test.env=2"));
  EXPECT_THAT(run.err, HasSubstr("evoke failpoint test.env fired (hit 2)"));
}

TEST(FailpointEnvTest, UnreachedCountPasses) {
  const ChildRun run = RunChild("test.env=3");
  EXPECT_EQ(run.exit_code, 0) << run.err;
}

TEST(FailpointEnvTest, BadEnvironmentSpecIsIgnoredNotFatal) {
  const ChildRun run = RunChild("test.env=zero");
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.err, HasSubstr("EVOKE_FAILPOINTS ignored"));
}

}  // namespace
}  // namespace evoke
