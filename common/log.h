// Minimal leveled logging to stderr. Debian's Abseil (20220623) predates
// absl/log, so evoke keeps this small facility. One line per event, in
// key=value form (logfmt), written with a single write(2) so that
// concurrent lines never interleave:
//
//   ts=2026-11-29T23:59:59.123Z level=warning prog=evoked msg="text" key=value
//
// msg is always quoted; other values are quoted when they hold a space, a
// quote, '=' or a control character (\" \\ \n \t \r and \xNN escapes), or
// are empty. Hot paths (anything that runs per request or per connection)
// log through EVOKE_LOG_EVERY_N_SEC, which writes at most one line per
// interval per call site and reports how many it held back as
// suppressed=N on the next one it writes. Never log secrets: bearer tokens,
// key material, whole lease ids (an 8-hex-digit prefix names a lease).
#ifndef EVOKE_COMMON_LOG_H_
#define EVOKE_COMMON_LOG_H_

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace evoke {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// SetLogLevel sets the minimum level written (default kInfo) and the program
// name shown on each line. Thread-safe.
void SetLogLevel(LogLevel level);
void SetLogProgram(absl::string_view program);
// ParseLogLevel accepts debug, info, warning, error. Returns false otherwise.
bool ParseLogLevel(absl::string_view text, LogLevel* level);
bool LogEnabled(LogLevel level);

// One key=value field of a line. Keys are fixed identifiers ([a-z0-9_]);
// values are anything StrCat takes.
struct LogField {
  template <typename T>
  LogField(absl::string_view k, const T& v) : key(k), value(absl::StrCat(v)) {}
  absl::string_view key;
  std::string value;
};

void Log(LogLevel level, absl::string_view message);
void Log(LogLevel level, absl::string_view message, std::initializer_list<LogField> fields);

// FormatLogLine is the line Log writes (without the trailing newline), at
// `unix_ms`. Exposed for tests.
std::string FormatLogLine(LogLevel level, absl::string_view program, int64_t unix_ms,
                          absl::string_view message, std::initializer_list<LogField> fields,
                          uint64_t suppressed = 0);
// QuoteLogValue returns `value` as it appears after "key=" (quoted and
// escaped when needed).
std::string QuoteLogValue(absl::string_view value, bool always_quote = false);

// LogRateLimiter lets one line through per `interval_s` seconds and counts
// the others. Lock-free; one per call site (EVOKE_LOG_EVERY_N_SEC).
class LogRateLimiter {
 public:
  explicit LogRateLimiter(double interval_s)
      : interval_ns_(static_cast<int64_t>(interval_s * 1e9)) {}
  // Allow returns true when a line may be written now, with the number of
  // lines held back since the last one written in `*suppressed`.
  bool Allow(uint64_t* suppressed);

 private:
  const int64_t interval_ns_;
  std::atomic<int64_t> next_ns_{INT64_MIN};
  std::atomic<uint64_t> suppressed_{0};
};

// LogWithSuppressed writes `message` with suppressed=N appended when N > 0.
void LogWithSuppressed(LogLevel level, absl::string_view message, uint64_t suppressed);

}  // namespace evoke

#define EVOKE_LOG_(level, ...)                                  \
  do {                                                          \
    if (::evoke::LogEnabled(level)) {                           \
      ::evoke::Log(level, ::absl::StrCat(__VA_ARGS__));         \
    }                                                           \
  } while (0)
#define EVOKE_LOG_DEBUG(...) EVOKE_LOG_(::evoke::LogLevel::kDebug, __VA_ARGS__)
#define EVOKE_LOG_INFO(...) EVOKE_LOG_(::evoke::LogLevel::kInfo, __VA_ARGS__)
#define EVOKE_LOG_WARNING(...) EVOKE_LOG_(::evoke::LogLevel::kWarning, __VA_ARGS__)
#define EVOKE_LOG_ERROR(...) EVOKE_LOG_(::evoke::LogLevel::kError, __VA_ARGS__)

// A line with key=value fields after msg:
//   EVOKE_LOG_FIELDS(::evoke::LogLevel::kInfo, "lease ended",
//                    ::evoke::LogField("client", name), ::evoke::LogField("pins", n));
#define EVOKE_LOG_FIELDS(level, message, ...)                   \
  do {                                                          \
    if (::evoke::LogEnabled(level)) {                           \
      ::evoke::Log(level, message, {__VA_ARGS__});              \
    }                                                           \
  } while (0)

// At most one line per `seconds` from this call site; the next line written
// carries suppressed=N, the lines held back meanwhile.
#define EVOKE_LOG_EVERY_N_SEC(level, seconds, ...)                                 \
  do {                                                                             \
    if (::evoke::LogEnabled(level)) {                                              \
      static ::evoke::LogRateLimiter evoke_log_limiter_(seconds);                  \
      uint64_t evoke_log_suppressed_ = 0;                                          \
      if (evoke_log_limiter_.Allow(&evoke_log_suppressed_)) {                      \
        ::evoke::LogWithSuppressed(level, ::absl::StrCat(__VA_ARGS__),             \
                                   evoke_log_suppressed_);                         \
      }                                                                            \
    }                                                                              \
  } while (0)
#define EVOKE_LOG_WARNING_EVERY_N_SEC(seconds, ...) \
  EVOKE_LOG_EVERY_N_SEC(::evoke::LogLevel::kWarning, seconds, __VA_ARGS__)
#define EVOKE_LOG_ERROR_EVERY_N_SEC(seconds, ...) \
  EVOKE_LOG_EVERY_N_SEC(::evoke::LogLevel::kError, seconds, __VA_ARGS__)

#endif  // EVOKE_COMMON_LOG_H_
