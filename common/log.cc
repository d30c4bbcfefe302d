#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace evoke {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
absl::Mutex g_program_mu;
std::string* g_program ABSL_GUARDED_BY(g_program_mu) = new std::string("evoke");

}  // namespace

void SetLogLevel(LogLevel level) { g_level = static_cast<int>(level); }

void SetLogProgram(absl::string_view program) {
  absl::MutexLock lock(&g_program_mu);
  *g_program = std::string(program);
}

bool ParseLogLevel(absl::string_view text, LogLevel* level) {
  if (text == "debug") {
    *level = LogLevel::kDebug;
  } else if (text == "info") {
    *level = LogLevel::kInfo;
  } else if (text == "warning") {
    *level = LogLevel::kWarning;
  } else if (text == "error") {
    *level = LogLevel::kError;
  } else {
    return false;
  }
  return true;
}

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level; }

void Log(LogLevel level, absl::string_view message) {
  static constexpr char kLetters[] = {'D', 'I', 'W', 'E'};
  std::string program;
  {
    absl::MutexLock lock(&g_program_mu);
    program = *g_program;
  }
  const std::string line = absl::StrCat(
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
      " ", std::string(1, kLetters[static_cast<int>(level)]), " ", program, "] ",
      message, "\n");
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

}  // namespace evoke
