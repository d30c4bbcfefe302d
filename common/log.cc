#include "common/log.h"

#include <time.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace evoke {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
absl::Mutex g_program_mu;
std::string* g_program ABSL_GUARDED_BY(g_program_mu) = new std::string("evoke");

constexpr const char* kLevelNames[] = {"debug", "info", "warning", "error"};

bool NeedsQuotes(absl::string_view value) {
  if (value.empty()) return true;
  for (const char c : value) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f || c == '"' || c == '=' || c == '\\') return true;
  }
  return false;
}

void Write(const std::string& line) {
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

std::string Program() {
  absl::MutexLock lock(&g_program_mu);
  return *g_program;
}

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

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

std::string QuoteLogValue(absl::string_view value, bool always_quote) {
  if (!always_quote && !NeedsQuotes(value)) return std::string(value);
  std::string out;
  out.reserve(value.size() + 2);
  out.push_back('"');
  for (const char c : value) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          out += absl::StrFormat("\\x%02x", static_cast<unsigned char>(c));
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
  return out;
}

std::string FormatLogLine(LogLevel level, absl::string_view program, int64_t unix_ms,
                          absl::string_view message, std::initializer_list<LogField> fields,
                          uint64_t suppressed) {
  std::string line = absl::StrCat(
      "ts=", absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(unix_ms),
                              absl::UTCTimeZone()),
      " level=", kLevelNames[static_cast<int>(level)], " prog=", QuoteLogValue(program),
      " msg=", QuoteLogValue(message, /*always_quote=*/true));
  for (const LogField& f : fields) {
    absl::StrAppend(&line, " ", f.key, "=", QuoteLogValue(f.value));
  }
  if (suppressed > 0) absl::StrAppend(&line, " suppressed=", suppressed);
  return line;
}

void Log(LogLevel level, absl::string_view message) { Log(level, message, {}); }

void Log(LogLevel level, absl::string_view message, std::initializer_list<LogField> fields) {
  Write(absl::StrCat(FormatLogLine(level, Program(), absl::ToUnixMillis(absl::Now()), message,
                                   fields),
                     "\n"));
}

void LogWithSuppressed(LogLevel level, absl::string_view message, uint64_t suppressed) {
  Write(absl::StrCat(FormatLogLine(level, Program(), absl::ToUnixMillis(absl::Now()), message,
                                   {}, suppressed),
                     "\n"));
}

bool LogRateLimiter::Allow(uint64_t* suppressed) {
  const int64_t now = MonotonicNs();
  int64_t next = next_ns_.load(std::memory_order_relaxed);
  if (now >= next &&
      next_ns_.compare_exchange_strong(next, now + interval_ns_, std::memory_order_relaxed)) {
    *suppressed = suppressed_.exchange(0, std::memory_order_relaxed);
    return true;
  }
  suppressed_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

}  // namespace evoke
