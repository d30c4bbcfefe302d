// Minimal leveled logging to stderr. Debian's Abseil (20220623) predates
// absl/log, so evoke keeps this small facility: one line per message,
// "2026-11-29T23:59:59.123Z I evoked] text", written with a single write(2)
// so concurrent lines never interleave.
#ifndef EVOKE_COMMON_LOG_H_
#define EVOKE_COMMON_LOG_H_

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
void Log(LogLevel level, absl::string_view message);

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

#endif  // EVOKE_COMMON_LOG_H_
