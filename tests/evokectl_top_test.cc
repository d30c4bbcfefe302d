// `evokectl top` (and progress bars) in a real terminal: tmux (a private server on a socket in
// the test's directory) runs top against a real evoked while this test
// drives a workload with the C++ client, reads the screen with
// `capture-pane`, and checks that the figures follow the workload, that the
// daemon going away and coming back is shown and survived, and that q ends
// top with status 0 and the terminal's mode restored.
#include <signal.h>
#include <sys/stat.h>

#include <cstdlib>
#include <functional>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "tests/e2e_fixture.h"

namespace evoke::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::vector<std::string> Lines(const std::string& screen) {
  return absl::StrSplit(screen, '\n');
}

std::string LineStartingWith(const std::string& screen, const std::string& prefix) {
  for (const std::string& l : Lines(screen)) {
    if (absl::StartsWith(l, prefix)) return l;
  }
  return "";
}

std::vector<std::string> Words(const std::string& line) {
  return absl::StrSplit(line, absl::ByAnyChar(" ;"), absl::SkipEmpty());
}

// The number after `word` in `line` ("loads 200" -> 200); -1 when absent.
int64_t NumberAfter(const std::string& line, const std::string& word) {
  const std::vector<std::string> w = Words(line);
  for (size_t i = 0; i + 1 < w.size(); ++i) {
    int64_t v;
    if (w[i] == word && absl::SimpleAtoi(w[i + 1], &v)) return v;
  }
  return -1;
}

class TopTest : public E2eTest {
 protected:
  void SetUp() override {
    CommandResult which = RunCommand({"/bin/sh", "-c", "command -v tmux"});
    ASSERT_EQ(which.exit_code, 0)
        << "tmux is needed to test `evokectl top` in a terminal (scripts/setup-debian.sh "
           "installs it)";
    StartDaemon();
    tmux_socket_ = dir_.Join("tmux.sock");
  }
  void TearDown() override { Tmux({"kill-server"}); }

  CommandResult Tmux(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"tmux", "-S", tmux_socket_};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, {"TERM=xterm"});
  }
  std::string Screen() { return Tmux({"capture-pane", "-p", "-t", "top"}).out; }
  // Waits until the screen satisfies `pred`; returns the last screen.
  std::string WaitForScreen(const std::function<bool(const std::string&)>& pred,
                            const std::string& what, absl::Duration timeout = absl::Seconds(20)) {
    std::string screen;
    const bool ok = WaitUntil(
        [&] {
          screen = Screen();
          return pred(screen);
        },
        timeout, absl::Milliseconds(100));
    EXPECT_TRUE(ok) << what << "; the screen:\n" << screen;
    return screen;
  }
  // The pane's terminal mode flags ("icanon", "-echo", ...).
  std::set<std::string> TerminalFlags() {
    const std::string tty = Tmux({"display-message", "-p", "-t", "top", "#{pane_tty}"}).out;
    CommandResult r = RunCommand({"stty", "-a", "-F", std::string(absl::StripAsciiWhitespace(tty))});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const std::vector<std::string> w = Words(absl::StrCat(r.out));
    return {w.begin(), w.end()};
  }
  // Starts top in a 120x40 pane; the pane's shell prints top's exit status
  // when it ends and stays, so that the status and the mode can be read.
  void StartTop() {
    const std::string script = dir_.Join("run_top.sh");
    std::ofstream(script) << "#!/bin/sh\n"
                          << "echo $$ > '" << dir_.Join("shell.pid") << "'\n"
                          << "'" << EvokectlPath() << "' --socket '" << daemon_->socket()
                          << "' top --interval 0.3\n"
                          << "echo \"top-exit=$?\"\n"
                          << "exec sleep 600\n";
    ::chmod(script.c_str(), 0755);
    CommandResult r = Tmux({"new-session", "-d", "-s", "top", "-x", "120", "-y", "40", script});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }

  std::string tmux_socket_;
};

TEST_F(TopTest, ShowsTheWorkloadSurvivesARestartAndQuitsCleanly) {
  ASSERT_NO_FATAL_FAILURE(StartTop());
  std::string screen = WaitForScreen(
      [](const std::string& s) {
        return absl::StrContains(s, "1 pinned host") && absl::StrContains(s, "q: quit");
      },
      "top draws its screen");
  EXPECT_THAT(screen, HasSubstr("2 spill (disk)"));
  EXPECT_THAT(screen, HasSubstr("HIT RATE"));
  EXPECT_THAT(screen, HasSubstr("THROUGHPUT"));
  // Per-RPC figures, or the line that says the daemon has none.
  EXPECT_TRUE(absl::StrContains(screen, "RPC LATENCY: n/a") ||
              absl::StrContains(screen, "calls/s"))
      << screen;
  EXPECT_THAT(screen, Not(HasSubstr("\x1b")));  // tmux rendered every escape code.
  EXPECT_EQ(NumberAfter(LineStartingWith(screen, "1 pinned host"), "host"), 0) << screen;
  // While top runs, the terminal is raw: keys arrive one by one, unechoed.
  std::set<std::string> flags = TerminalFlags();
  EXPECT_TRUE(flags.count("-icanon") && flags.count("-echo")) << "raw mode while top runs";

  // Saves: the tier line counts them.
  std::vector<TestBlock> blocks;
  for (int i = 0; i < 20; ++i) blocks.push_back(SessionBlock("top", i, 64));
  ASSERT_OK(SaveBlocks(*client_, blocks));
  screen = WaitForScreen(
      [](const std::string& s) {
        return NumberAfter(LineStartingWith(s, "1 pinned host"), "host") == 20;
      },
      "the tier line shows the 20 saved blocks");
  EXPECT_THAT(screen, HasSubstr("totals: saves 20 "));

  // Loads for a while: a frame shows them per second, and at the end the
  // total matches what was loaded, all from tier 1.
  std::vector<BlockId> ids;
  for (const TestBlock& b : blocks) ids.push_back(b.id());
  int64_t loaded = 0, load_calls = 0;
  bool saw_rate = false;
  const absl::Time until = absl::Now() + absl::Seconds(4);
  while (absl::Now() < until) {
    ASSERT_OK(client_->Load(ids, SmallFingerprint()).status());
    loaded += ids.size();
    ++load_calls;
    absl::SleepFor(absl::Milliseconds(50));
    const std::string s = Screen();
    for (const std::string& l : Lines(s)) {
      const std::vector<std::string> w = Words(l);
      // "last 0.3s  saves/s dedups/s loads/s ...": loads/s is the 5th word.
      double loads_per_s = 0;
      if (w.size() >= 5 && w[0] == "last" && absl::StrContains(s, "THROUGHPUT") &&
          l.find('%') == std::string::npos && absl::SimpleAtod(w[4], &loads_per_s) &&
          loads_per_s > 0) {
        saw_rate = true;
      }
    }
  }
  EXPECT_TRUE(saw_rate) << "no frame showed loads/s > 0 during the loads:\n" << Screen();
  screen = WaitForScreen(
      [&](const std::string& s) {
        return NumberAfter(LineStartingWith(s, "totals:"), "loads") == loaded;
      },
      absl::StrCat("the totals show the ", loaded, " loaded blocks"));
  // evoked reports per-RPC figures: a Load row whose call count (the last
  // column) is at least the Load calls made (one RPC each).
  EXPECT_THAT(screen, Not(HasSubstr("RPC LATENCY: n/a")));
  {
    const std::vector<std::string> row = Words(LineStartingWith(screen, "Load "));
    double calls = 0;
    ASSERT_FALSE(row.empty()) << "no Load latency row:\n" << screen;
    ASSERT_TRUE(absl::SimpleAtod(row.back(), &calls)) << screen;
    EXPECT_GE(calls, static_cast<double>(load_calls)) << screen;
  }
  const std::string since = LineStartingWith(screen, "since start");
  EXPECT_THAT(since, HasSubstr("100.0%")) << "every load was a tier-1 hit";
  EXPECT_THAT(since, HasSubstr(absl::StrCat(" ", loaded)));

  // The daemon goes away: top says so and keeps trying; it comes back (a new
  // process on the same socket): top shows it again.
  const std::string old_pid = absl::StrCat("pid ", daemon_->pid(), " ");
  EXPECT_THAT(screen, HasSubstr(old_pid));
  daemon_->KillHard();
  WaitForScreen(
      [](const std::string& s) { return absl::StrContains(s, "disconnected, retrying"); },
      "top notices that evoked is gone");
  ASSERT_NO_FATAL_FAILURE(Restart());
  const std::string new_pid = absl::StrCat("pid ", daemon_->pid(), " ");
  screen = WaitForScreen(
      [&](const std::string& s) {
        return absl::StrContains(s, new_pid) && !absl::StrContains(s, "disconnected");
      },
      "top reconnects to the new evoked");
  EXPECT_THAT(screen, HasSubstr("1 pinned host"));

  // q quits: status 0, the terminal's mode as it was.
  ASSERT_EQ(Tmux({"send-keys", "-t", "top", "q"}).exit_code, 0);
  screen = WaitForScreen(
      [](const std::string& s) { return absl::StrContains(s, "top-exit="); },
      "top exits on q", absl::Seconds(10));
  EXPECT_THAT(screen, HasSubstr("top-exit=0"));
  EXPECT_THAT(screen, Not(HasSubstr("1 pinned host")));  // The alternate screen is gone.
  flags = TerminalFlags();
  EXPECT_TRUE(flags.count("icanon") && flags.count("echo"))
      << "canonical mode and echo restored after q";
}

TEST_F(TopTest, SigtermRestoresTheTerminal) {
  ASSERT_NO_FATAL_FAILURE(StartTop());
  WaitForScreen([](const std::string& s) { return absl::StrContains(s, "1 pinned host"); },
                "top draws its screen");
  // The script's shell wrote its pid; top is its only child.
  const std::string shell(absl::StripAsciiWhitespace(ReadFile(dir_.Join("shell.pid"))));
  const std::string children =
      ReadFile(absl::StrCat("/proc/", shell, "/task/", shell, "/children"));
  int top_pid = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(children), &top_pid))
      << "children of " << shell << ": '" << children << "'";
  ASSERT_EQ(::kill(top_pid, SIGTERM), 0);
  const std::string screen = WaitForScreen(
      [](const std::string& s) { return absl::StrContains(s, "top-exit="); },
      "top exits on SIGTERM", absl::Seconds(10));
  EXPECT_THAT(screen, HasSubstr("top-exit=0"));
  const std::set<std::string> flags = TerminalFlags();
  EXPECT_TRUE(flags.count("icanon") && flags.count("echo"))
      << "canonical mode and echo restored after SIGTERM";
}

// Progress bars are drawn when stdout is a terminal without being asked
// (--progress auto), and end on a complete line.
TEST_F(TopTest, ProgressBarsOnATerminal) {
  std::vector<TestBlock> blocks;
  for (int i = 0; i < 12; ++i) blocks.push_back(SessionBlock("bar", i, 16));
  ASSERT_OK(SaveBlocks(*client_, blocks));
  const std::string script = dir_.Join("run_verify.sh");
  const std::string ctl = "'" + EvokectlPath() + "' --socket '" + daemon_->socket() + "' ";
  std::ofstream(script) << "#!/bin/sh\n"
                        << ctl << "verify\n"
                        << "echo \"verify-exit=$?\"\n"
                        << ctl << "export --namespace test -o '" << dir_.Join("t.evks") << "'\n"
                        << "echo \"export-exit=$?\"\n"
                        << "exec sleep 600\n";
  ::chmod(script.c_str(), 0755);
  ASSERT_EQ(
      Tmux({"new-session", "-d", "-s", "top", "-x", "120", "-y", "40", script}).exit_code, 0);
  const std::string screen = WaitForScreen(
      [](const std::string& s) { return absl::StrContains(s, "export-exit="); },
      "verify and export end");
  EXPECT_THAT(screen, HasSubstr("verify [##############################] 100% 12/12 blocks"));
  EXPECT_THAT(screen, HasSubstr("checked 12 blocks, 12 copies: 12 ok"));
  EXPECT_THAT(screen, HasSubstr("verify-exit=0"));
  EXPECT_THAT(screen, HasSubstr("export [##############################] 100% 12/12 blocks"));
  EXPECT_THAT(screen, HasSubstr("exported 12 blocks"));
  EXPECT_THAT(screen, HasSubstr("export-exit=0"));
}

}  // namespace
}  // namespace evoke::testing
