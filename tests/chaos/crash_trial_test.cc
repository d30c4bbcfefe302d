// Crash trials against a real evoked (see crash_trial.h). Short forms run in
// CI; EVOKE_TRIAL_LONG=1 runs the long forms (>= 200 random kills, >= 10
// kills per failpoint). EVOKE_TRIAL_SEED=N repeats a run's plan.
//
//   EVOKE_TRIAL_SEED        the seed (default: from the clock; printed)
//   EVOKE_TRIAL_LONG=1      the long forms
//   EVOKE_TRIAL_KILLS=N     random kills (default 10, long 200)
//   EVOKE_TRIAL_FP_TRIALS=N trials per failpoint (default 1, long 10)
//   EVOKE_TRIAL_FAILPOINTS  comma-separated failpoint names (default: every
//                           known one that is compiled into evoked)
//   EVOKE_TRIAL_FLAGS       extra evoked flags, space-separated
//   EVOKE_EVOKED            the evoked to try (default: this build's)
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "testing/daemon_process.h"
#include "testing/temp_dir.h"
#include "tests/chaos/crash_trial.h"

namespace evoke::chaos {
namespace {

bool LongForm() {
  const char* v = std::getenv("EVOKE_TRIAL_LONG");
  return v != nullptr && std::string(v) == "1";
}

uint64_t EnvNumber(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  uint64_t n = 0;
  return v != nullptr && absl::SimpleAtoi(v, &n) ? n : fallback;
}

uint64_t Seed() {
  return EnvNumber("EVOKE_TRIAL_SEED",
                   static_cast<uint64_t>(absl::GetCurrentTimeNanos()) % 1000000007ull);
}

CrashTrialOptions BaseOptions(const testing::TempDir& dir) {
  CrashTrialOptions o;
  o.seed = Seed();
  o.dir = dir.path();
  if (const char* flags = std::getenv("EVOKE_TRIAL_FLAGS"); flags != nullptr) {
    o.extra_flags = absl::StrSplit(flags, ' ', absl::SkipWhitespace());
  }
  std::cerr << "crash trials: seed " << o.seed << " (EVOKE_TRIAL_SEED=" << o.seed
            << " repeats this plan)\n";
  ::testing::Test::RecordProperty("seed", std::to_string(o.seed));
  return o;
}

void ExpectNoViolations(const CrashTrialReport& r) {
  const std::string summary = r.Summary();
  std::cerr << summary << "\n";
  EXPECT_EQ(r.wrong_bytes, 0u) << summary;
  EXPECT_EQ(r.durable_lost, 0u) << summary;
  EXPECT_EQ(r.live_lost, 0u) << summary;
  EXPECT_EQ(r.resurrected, 0u) << summary;
  EXPECT_EQ(r.phantom, 0u) << summary;
  EXPECT_EQ(r.data_loss_errors, 0u) << summary;
  EXPECT_EQ(r.restarts_failed, 0u) << summary;
  EXPECT_EQ(r.checksum_failures, 0u) << summary;
  EXPECT_GT(r.blocks_checked, 0u) << summary;
}

TEST(CrashTrialTest, KillNineAtRandomMoments) {
  testing::TempDir dir;
  CrashTrialOptions o = BaseOptions(dir);
  o.random_kills = static_cast<int>(EnvNumber("EVOKE_TRIAL_KILLS", LongForm() ? 200 : 10));
  if (LongForm()) {
    o.min_traffic = absl::Seconds(1);
    o.max_traffic = absl::Seconds(8);
  } else {
    o.min_traffic = absl::Milliseconds(500);
    o.max_traffic = absl::Milliseconds(2500);
  }
  absl::StatusOr<CrashTrialReport> r = RunCrashTrials(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectNoViolations(*r);
  EXPECT_EQ(r->random_kills, o.random_kills);
  // The traffic did what the trial is about.
  EXPECT_GT(r->acked.count("save") + r->acked.count("save_durable"), 0u) << r->Summary();
}

TEST(CrashTrialTest, KillAtFailpoints) {
  std::vector<std::string> wanted = KnownFailpoints();
  if (const char* names = std::getenv("EVOKE_TRIAL_FAILPOINTS"); names != nullptr) {
    wanted = absl::StrSplit(names, ',', absl::SkipWhitespace());
  }
  const std::vector<std::string> present = FailpointsIn(testing::EvokedPath(), wanted);
  for (const std::string& name : wanted) {
    if (std::find(present.begin(), present.end(), name) == present.end()) {
      std::cerr << "failpoint " << name << " is not compiled into "
                << testing::EvokedPath() << ": skipped\n";
    }
  }
  if (present.empty()) GTEST_SKIP() << "no failpoint is compiled into evoked yet";
  testing::TempDir dir;
  CrashTrialOptions o = BaseOptions(dir);
  o.random_kills = 0;
  o.failpoints = present;
  o.trials_per_failpoint =
      static_cast<int>(EnvNumber("EVOKE_TRIAL_FP_TRIALS", LongForm() ? 10 : 1));
  o.failpoint_window = LongForm() ? absl::Seconds(8) : absl::Seconds(3);
  absl::StatusOr<CrashTrialReport> r = RunCrashTrials(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectNoViolations(*r);
  int fired = 0;
  for (const auto& [name, c] : r->failpoints) fired += c.fired;
  // Hit numbers are drawn below what a window's traffic reaches; most fire.
  EXPECT_GT(fired, 0) << r->Summary();
}

}  // namespace
}  // namespace evoke::chaos
