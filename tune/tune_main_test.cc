// Runs the evoke-tune binary end to end on synthetic external fitness
// commands.
#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/layer_budgets.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

using ::evoke::testing::ReadFile;

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

// ShellQuote wraps `s` in single quotes for /bin/sh.
std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// RunTune runs evoke-tune with `args`, stderr to `stderr_path`; returns the
// exit status.
int RunTune(const std::string& args, const std::string& stderr_path) {
  const std::string cmd =
      std::string(EVOKE_TUNE_PATH) + " " + args + " > " + stderr_path + ".out 2> " + stderr_path;
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  return lines;
}

// f = 1000 - sum_i |k_i - (48 + 4 i)|: a peak at a known plan.
constexpr char kPeak[] =
    "sed 's/.*\"budgets\":\\[\\([^]]*\\)\\].*/\\1/' | tr ',' '\\n' | "
    "awk '{d = $1 - (48 + 4 * (NR - 1)); if (d < 0) d = -d; s += d} END {print 1000 - s}'";

TEST(EvokeTune, WritesACompletedPlanAndATrace) {
  evoke::testing::TempDir dir;
  const std::string out = dir.Join("budgets.json"), trace = dir.Join("trace.csv"),
                    err = dir.Join("stderr");
  const int rc = RunTune("--layers 8 --target 60 --group-size 4 --population 5 --generations 3 --seed 5 "
                         "--fitness-cmd " + ShellQuote(kPeak) + " --out " + out +
                             " --trace " + trace,
                         err);
  ASSERT_EQ(rc, 0) << ReadFile(err);
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> plan, evoke::policy::ReadBudgetsFile(out, 8));
  EXPECT_EQ(std::accumulate(plan.begin(), plan.end(), uint64_t{0}), 480u);
  EXPECT_THAT(ReadFile(out), HasSubstr("\"method\":\"evolkv\""));

  std::vector<std::string> rows = Lines(ReadFile(trace));
  ASSERT_EQ(rows.size(), 1u + 2u * 5u * 4u);  // header + groups x population x (1 + gens)
  EXPECT_EQ(rows[0],
            "group,generation,evaluation,objective,f,cache_score,mean_budget,k0,k1,k2,k3,k4,k5,"
            "k6,k7");
  std::vector<std::string> last = absl::StrSplit(rows.back(), ',');
  ASSERT_EQ(last.size(), 15u);
  EXPECT_EQ(last[0], "1");   // group
  EXPECT_EQ(last[1], "3");   // generation
  EXPECT_EQ(last[2], "39");  // evaluation
  EXPECT_THAT(ReadFile(err), HasSubstr("group 2/2 generation 3/3"));
  EXPECT_THAT(ReadFile(err + ".out"), HasSubstr("written to " + out));
}

TEST(EvokeTune, ABadCommandExitsNonZeroButKeepsTheTraceAndBestSoFar) {
  evoke::testing::TempDir dir;
  const std::string out = dir.Join("budgets.json"), trace = dir.Join("trace.csv"),
                    err = dir.Join("stderr"), count = dir.Join("count");
  // Succeeds 15 times (printing the call number), then fails.
  const std::string cmd = "n=$(cat " + count + " 2>/dev/null || echo 0); n=$((n + 1)); echo $n > " +
                          count + "; [ $n -le 15 ] || { echo 'engine died' >&2; exit 4; }; echo $n";
  const int rc = RunTune("--layers 8 --target 60 --fitness-cmd " + ShellQuote(cmd) + " --out " +
                             out + " --trace " + trace,
                         err);
  EXPECT_EQ(rc, 1);
  const std::string stderr_text = ReadFile(err);
  EXPECT_THAT(stderr_text, HasSubstr("exited with status 4"));
  EXPECT_THAT(stderr_text, HasSubstr("engine died"));
  EXPECT_THAT(stderr_text, HasSubstr("evaluation 15"));
  EXPECT_EQ(Lines(ReadFile(trace)).size(), 1u + 15u);
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> plan, evoke::policy::ReadBudgetsFile(out, 8));
  EXPECT_EQ(std::accumulate(plan.begin(), plan.end(), uint64_t{0}), 480u);
  EXPECT_THAT(ReadFile(out), HasSubstr("\"method\":\"evolkv-partial\""));
}

TEST(EvokeTune, AHangingCommandTimesOut) {
  evoke::testing::TempDir dir;
  const std::string out = dir.Join("budgets.json"), trace = dir.Join("trace.csv"),
                    err = dir.Join("stderr");
  const int rc = RunTune("--layers 4 --target 10 --timeout-s 0.5 --fitness-cmd 'sleep 20' --out " +
                             out + " --trace " + trace,
                         err);
  EXPECT_EQ(rc, 1);
  EXPECT_THAT(ReadFile(err), HasSubstr("did not finish within 0.5 s"));
  EXPECT_THAT(ReadFile(err), HasSubstr("not written"));
  EXPECT_FALSE(Exists(out));
  EXPECT_THAT(ReadFile(trace), StartsWith("group,generation,"));
}

TEST(EvokeTune, BadFlagsExitTwo) {
  evoke::testing::TempDir dir;
  const std::string err = dir.Join("stderr");
  EXPECT_EQ(RunTune("--layers 0 --target 10 --fitness-cmd 'echo 1' --out " + dir.Join("o"), err),
            2);
  EXPECT_THAT(ReadFile(err), HasSubstr("n_layers"));
  EXPECT_EQ(RunTune("--layers 4 --target 10 --gamma 2 --fitness-cmd 'echo 1' --out " +
                        dir.Join("o"),
                    err),
            2);
  EXPECT_THAT(ReadFile(err), HasSubstr("gamma"));
  EXPECT_EQ(RunTune("--layers 4 --target 10 --out " + dir.Join("o"), err), 2);
  EXPECT_THAT(ReadFile(err), HasSubstr("fitness-cmd"));
}

}  // namespace
