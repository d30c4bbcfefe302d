#include "tools/evokectl/top.h"

#include <poll.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tools/evokectl/exit_codes.h"
#include "tools/evokectl/top_view.h"
#include "evoke/client.h"

namespace evoke::ctl {
namespace {

volatile std::sig_atomic_t g_stop = 0;
void OnStopSignal(int) { g_stop = 1; }
void OnWinch(int) {}  // Only interrupts the wait, so that the frame redraws.

// The terminal's mode while top runs: no line buffering, no echo (a key is
// read as it is pressed), no cursor, the alternate screen. Restored by the
// destructor, which runs on q, on SIGINT/SIGTERM (they end the loop) and on
// every return.
class TerminalGuard {
 public:
  explicit TerminalGuard(bool keys) {
    if (keys && ::tcgetattr(STDIN_FILENO, &saved_) == 0) {
      termios raw = saved_;
      raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
      raw.c_cc[VMIN] = 0;
      raw.c_cc[VTIME] = 0;
      raw_ = ::tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
    }
    std::fputs("\x1b[?1049h\x1b[?25l", stdout);
    std::fflush(stdout);
  }
  ~TerminalGuard() {
    std::fputs("\x1b[?25h\x1b[?1049l", stdout);
    std::fflush(stdout);
    if (raw_) ::tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  bool raw() const { return raw_; }

 private:
  termios saved_{};
  bool raw_ = false;
};

class SignalGuard {
 public:
  SignalGuard() {
    struct sigaction sa {};
    sa.sa_handler = OnStopSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // No SA_RESTART: a signal interrupts the wait.
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
    sa.sa_handler = OnWinch;
    ::sigaction(SIGWINCH, &sa, &old_winch_);
  }
  ~SignalGuard() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
    ::sigaction(SIGWINCH, &old_winch_, nullptr);
  }

 private:
  struct sigaction old_int_ {}, old_term_ {}, old_winch_ {};
};

// Waits until `deadline` or a stop (q, a signal); true to stop.
bool WaitForKeyOrDeadline(std::chrono::steady_clock::time_point deadline, bool keys) {
  for (;;) {
    if (g_stop) return true;
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) return false;
    const int ms = static_cast<int>(
        std::chrono::ceil<std::chrono::milliseconds>(left).count());
    pollfd fd{STDIN_FILENO, POLLIN, 0};
    const int r = ::poll(keys ? &fd : nullptr, keys ? 1 : 0, ms);
    if (r < 0) {
      if (g_stop) return true;
      return false;  // SIGWINCH (or another signal): redraw now.
    }
    if (r > 0 && keys) {
      char buf[64];
      const ssize_t n = ::read(STDIN_FILENO, buf, sizeof(buf));
      if (n == 0) keys = false;  // End of input: keys no longer come.
      for (ssize_t i = 0; i < n; ++i) {
        if (buf[i] == 'q' || buf[i] == 'Q') return true;
      }
    }
  }
}

}  // namespace

int RunTop(const TopOptions& options) {
  g_stop = 0;
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  const bool keys = tty && ::isatty(STDIN_FILENO) == 1;
  SignalGuard signals;
  std::optional<TerminalGuard> terminal;
  if (tty) terminal.emplace(keys);

  ClientOptions client_options;
  client_options.target = options.socket;
  client_options.call_timeout = absl::Seconds(options.timeout_seconds);
  client_options.connect_timeout = absl::Seconds(std::min(1.0, options.timeout_seconds));
  const std::string target = ResolveTarget(options.socket);
  const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::max(0.05, options.interval_seconds)));

  std::unique_ptr<Client> client;
  std::optional<v1::StatResponse> last;
  std::chrono::steady_clock::time_point last_at;
  bool reached = false;
  for (int64_t frame = 0;; ++frame) {
    const auto tick = std::chrono::steady_clock::now();
    std::string disconnected;
    std::optional<v1::StatResponse> cur;
    if (client == nullptr) {
      absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(client_options);
      if (c.ok()) {
        client = *std::move(c);
      } else {
        disconnected = std::string(c.status().message());
      }
    }
    if (client != nullptr) {
      absl::StatusOr<v1::StatResponse> s = client->Stat();
      if (s.ok()) {
        cur = *std::move(s);
      } else {
        disconnected = std::string(s.status().message());
        // A fresh channel for the next try: the daemon may come back as a
        // new process on a new socket file.
        if (ExitCodeFor(s.status()) == kExitUnavailable) client.reset();
      }
    }
    const auto now = std::chrono::steady_clock::now();
    int width = 120;
    int height = 0;
    if (tty) {
      winsize ws{};
      if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
        width = ws.ws_col;
        height = ws.ws_row;
      }
    }
    TopInput in;
    in.target = target;
    in.width = width;
    in.disconnected = disconnected;
    if (cur.has_value()) {
      reached = true;
      in.cur = &*cur;
      if (last.has_value()) {
        in.prev = &*last;
        in.elapsed_seconds = std::chrono::duration<double>(now - last_at).count();
      }
    } else if (last.has_value()) {
      in.cur = &*last;  // The last answer, under the notice.
    }
    std::vector<std::string> lines = RenderTop(in);
    if (tty) {
      lines.push_back("");
      lines.push_back(keys ? "q: quit" : "");
      if (height > 0 && static_cast<int>(lines.size()) > height) lines.resize(height);
      std::string screen = "\x1b[H";
      for (size_t i = 0; i < lines.size(); ++i) {
        absl::StrAppend(&screen, lines[i], "\x1b[K", i + 1 < lines.size() ? "\r\n" : "");
      }
      absl::StrAppend(&screen, "\x1b[J");
      std::fputs(screen.c_str(), stdout);
    } else {
      for (const std::string& l : lines) std::printf("%s\n", l.c_str());
      std::printf("\n");
    }
    std::fflush(stdout);
    if (cur.has_value()) {
      last = std::move(cur);
      last_at = now;
    }
    if (options.iterations > 0 && frame + 1 >= options.iterations) break;
    if (WaitForKeyOrDeadline(tick + interval, keys)) break;
  }
  terminal.reset();
  return reached || options.iterations == 0 ? kExitOk : kExitUnavailable;
}

}  // namespace evoke::ctl
