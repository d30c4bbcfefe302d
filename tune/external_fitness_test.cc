#include "tune/external_fitness.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "tune/evolkv.h"

namespace evoke::tune {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Sums the "budgets" array of the JSON on stdin (or in a file): sed cuts
// the array out, tr puts one number a line, awk adds them up.
constexpr char kSumBudgets[] =
    "sed 's/.*\"budgets\":\\[\\([^]]*\\)\\].*/\\1/' | tr ',' '\\n' | "
    "awk '{s += $1} END {print s}'";

ExternalFitnessOptions Command(std::string command, double timeout_s = 10) {
  ExternalFitnessOptions o;
  o.command = std::move(command);
  o.timeout_s = timeout_s;
  return o;
}

const std::vector<uint32_t> kBudgets = {1, 2, 3, 40};

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

using ::evoke::testing::ReadFile;

// GroupGone: whether no process is left in process group `pgid` within 5 s
// (killed members linger as zombies until their new parent reaps them).
bool GroupGone(pid_t pgid) {
  const auto start = std::chrono::steady_clock::now();
  while (SecondsSince(start) < 5.0) {
    if (::kill(-pgid, 0) != 0 && errno == ESRCH) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(RunFitnessCommand, ReturnsTheNumberPrinted) {
  ASSERT_OK_AND_ASSIGN(double v, RunFitnessCommand(Command("echo 0.5"), kBudgets));
  EXPECT_DOUBLE_EQ(v, 0.5);
  ASSERT_OK_AND_ASSIGN(v, RunFitnessCommand(Command("echo -3e2"), kBudgets));
  EXPECT_DOUBLE_EQ(v, -300);
}

TEST(RunFitnessCommand, TakesTheLastNonEmptyLine) {
  ASSERT_OK_AND_ASSIGN(
      double v, RunFitnessCommand(Command("echo running; echo 12; printf '  0.25  \\n\\n\\n'"),
                                  kBudgets));
  EXPECT_DOUBLE_EQ(v, 0.25);
}

TEST(RunFitnessCommand, ReadsTheBudgetsFromStdin) {
  ASSERT_OK_AND_ASSIGN(double v, RunFitnessCommand(Command(kSumBudgets), kBudgets));
  EXPECT_DOUBLE_EQ(v, 46);
  std::vector<uint32_t> many(300, 7);
  ASSERT_OK_AND_ASSIGN(v, RunFitnessCommand(Command(kSumBudgets), many));
  EXPECT_DOUBLE_EQ(v, 2100);
}

TEST(RunFitnessCommand, PutsTheBudgetsInAFileThatIsRemovedAfterwards) {
  evoke::testing::TempDir dir;
  ExternalFitnessOptions o =
      Command(std::string("test -r \"$EVOKE_BUDGETS_FILE\" && echo \"$EVOKE_BUDGETS_FILE\" > ") +
              dir.Join("seen") + " && cat \"$EVOKE_BUDGETS_FILE\" | " + kSumBudgets);
  o.temp_dir = dir.Join("tmp");
  ASSERT_EQ(::mkdir(o.temp_dir.c_str(), 0700), 0);
  ASSERT_OK_AND_ASSIGN(double v, RunFitnessCommand(o, kBudgets));
  EXPECT_DOUBLE_EQ(v, 46);
  EXPECT_THAT(ReadFile(dir.Join("seen")), HasSubstr(o.temp_dir + "/evoke-budgets-"));
  // The temp dir is empty again.
  DIR* d = ::opendir(o.temp_dir.c_str());
  ASSERT_NE(d, nullptr);
  int entries = 0;
  while (dirent* e = ::readdir(d)) entries += std::string(e->d_name) != "." &&
                                              std::string(e->d_name) != "..";
  ::closedir(d);
  EXPECT_EQ(entries, 0);
}

TEST(RunFitnessCommand, AFailingCommandIsAClearError) {
  EXPECT_THAT(RunFitnessCommand(Command("echo 0.9; echo 'model not found' >&2; exit 3"),
                                kBudgets),
              StatusIs(absl::StatusCode::kAborted,
                       AllOf(HasSubstr("exit 3`"), HasSubstr("exited with status 3"),
                             HasSubstr("model not found"))));
  EXPECT_THAT(RunFitnessCommand(Command("no-such-command-evoke-xyz"), kBudgets),
              StatusIs(absl::StatusCode::kAborted,
                       AllOf(HasSubstr("no-such-command-evoke-xyz"),
                             HasSubstr("status 127"))));
  EXPECT_THAT(RunFitnessCommand(Command("kill -9 $$"), kBudgets),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("killed by signal 9")));
}

TEST(RunFitnessCommand, AHangingCommandIsKilledAtTheTimeout) {
  evoke::testing::TempDir dir;
  const std::string pid_file = dir.Join("pid");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(
      RunFitnessCommand(Command("echo $$ > " + pid_file + "; sleep 30; echo 1", 1.0), kBudgets),
      StatusIs(absl::StatusCode::kDeadlineExceeded,
               AllOf(HasSubstr("sleep 30"), HasSubstr("within 1 s"), HasSubstr("killed"))));
  const double took = SecondsSince(start);
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 5.0);
  const pid_t pgid = std::stoi(ReadFile(pid_file));
  EXPECT_TRUE(GroupGone(pgid)) << "process group " << pgid << " survived";
}

TEST(RunFitnessCommand, ACommandThatClosesItsOutputButHangsStillTimesOut) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(RunFitnessCommand(Command("exec >&- 2>&-; sleep 30", 0.5), kBudgets),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_LT(SecondsSince(start), 5.0);
}

TEST(RunFitnessCommand, BackgroundChildrenDoNotHoldItUpAndAreKilled) {
  evoke::testing::TempDir dir;
  const std::string pid_file = dir.Join("pid");
  const auto start = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(
      double v, RunFitnessCommand(Command("echo $$ > " + pid_file + "; sleep 30 & echo 0.75"),
                                  kBudgets));
  EXPECT_DOUBLE_EQ(v, 0.75);
  EXPECT_LT(SecondsSince(start), 5.0);
  const pid_t pgid = std::stoi(ReadFile(pid_file));
  EXPECT_TRUE(GroupGone(pgid)) << "process group " << pgid << " survived";
}

TEST(RunFitnessCommand, GarbageIsAClearError) {
  EXPECT_THAT(RunFitnessCommand(Command("echo 0.5; echo 'accuracy: high'"), kBudgets),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("printed no number"), HasSubstr("accuracy: high"))));
  EXPECT_THAT(RunFitnessCommand(Command("true"), kBudgets),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("`true`"), HasSubstr("stdout is empty"))));
  EXPECT_THAT(RunFitnessCommand(Command("printf '\\n  \\n'"), kBudgets),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stdout is empty")));
  for (const char* bad : {"nan", "inf", "-inf", "0.5x", "1,5", "0x"}) {
    EXPECT_THAT(RunFitnessCommand(Command(std::string("echo '") + bad + "'"), kBudgets),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("printed no number")))
        << bad;
  }
  // Binary junk is quoted escaped, not dumped raw.
  EXPECT_THAT(RunFitnessCommand(Command("printf '\\001\\002\\377'"), kBudgets),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\\001\\002\\377")));
}

TEST(RunFitnessCommand, ACommandThatIgnoresItsStdinIsFine) {
  // 2 MiB of JSON, more than any socket buffer, to a command that never
  // reads it: no SIGPIPE, no hang.
  std::vector<uint32_t> huge(1 << 18, 1234567);
  ASSERT_OK_AND_ASSIGN(double v, RunFitnessCommand(Command("echo 2"), huge));
  EXPECT_DOUBLE_EQ(v, 2);
}

TEST(RunFitnessCommand, RefusesBadOptions) {
  EXPECT_THAT(RunFitnessCommand(Command(""), kBudgets),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty command")));
  EXPECT_THAT(RunFitnessCommand(Command("echo 1", 0), kBudgets),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeout_s")));
  // A timeout whose deadline would overflow the clock is refused, not
  // taken for an immediate deadline.
  EXPECT_THAT(RunFitnessCommand(Command("echo 1", 1e12), kBudgets),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeout_s")));
  ExternalFitnessOptions o = Command("echo 1");
  o.temp_dir = "/nonexistent-evoke-dir";
  EXPECT_THAT(RunFitnessCommand(o, kBudgets),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("/nonexistent-evoke-dir")));
}

TEST(MakeExternalFitness, DrivesTheTuner) {
  // f = -|sum - 4 * 48| / 100: best when the plan's mean is 48 (below c = 64,
  // so CacheScore pulls the other way a little).
  ExternalFitnessOptions o = Command(
      std::string(kSumBudgets) + " | awk '{d = $1 - 192; if (d < 0) d = -d; print 2 - d / 100}'");
  TuneOptions t;
  t.n_layers = 4;
  t.target_budget = 64;
  t.group_size = 4;
  t.population = 5;
  t.generations = 3;
  ASSERT_OK_AND_ASSIGN(TuneResult r, TuneLayerBudgets(t, MakeExternalFitness(o)));
  ASSERT_EQ(r.trace.size(), 20u);
  for (const Evaluation& e : r.trace) {
    double sum = 0;
    for (uint32_t k : e.budgets) sum += k;
    const double d = sum > 192 ? sum - 192 : 192 - sum;
    EXPECT_NEAR(e.f, 2 - d / 100, 1e-4);
  }
  uint64_t total = 0;
  for (uint32_t k : r.completed_budgets) total += k;
  EXPECT_EQ(total, 256u);
}

}  // namespace
}  // namespace evoke::tune
