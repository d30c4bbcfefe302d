// What the bench tools share to draw their JSON as an SVG chart
// (scripts/bench-chart.py): the command line and date for the chart's title,
// JSON strings, and running the chart script.
#ifndef EVOKE_BENCH_CHART_H_
#define EVOKE_BENCH_CHART_H_

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "common/subprocess.h"

namespace evoke {

// JsonQuote: `s` as a JSON string literal.
inline std::string JsonQuote(absl::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// CommandLine: argv as one line a shell splits back the same way (an
// argument with anything but [A-Za-z0-9_./=:,+-] in it is single-quoted).
inline std::string CommandLine(int argc, char** argv) {
  std::vector<std::string> words;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    const bool plain =
        !a.empty() && a.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                          "0123456789_./=:,+-") == std::string::npos;
    words.push_back(plain ? a : absl::StrCat("'", absl::StrReplaceAll(a, {{"'", "'\\''"}}), "'"));
  }
  return absl::StrJoin(words, " ");
}

// UtcNow: the time now as 2026-12-01T22:52:32Z.
inline std::string UtcNow() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
}

// CheckChartFlags: what --chart needs, checked before the run rather than
// after it: the SVG's directory exists and the script is readable.
inline absl::Status CheckChartFlags(const std::string& svg, const std::string& script) {
  const std::filesystem::path dir = std::filesystem::path(svg).parent_path();
  std::error_code ec;
  if (!dir.empty() && !std::filesystem::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chart: directory ", dir.string(), " does not exist"));
  }
  if (access(script.c_str(), R_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("chart script ", script, " is not readable"));
  }
  return absl::OkStatus();
}

// DrawChart runs the chart script (`script JSON -o SVG`, Python 3) on `json`
// to write `svg`; the script prints its own error, this status names it.
inline absl::Status DrawChart(const std::string& script, const std::string& json,
                              const std::string& svg) {
  std::string python = "python3";  // From $PATH unless Debian's is there.
  if (access("/usr/bin/python3", X_OK) == 0) python = "/usr/bin/python3";
  EVOKE_ASSIGN_OR_RETURN(Subprocess child,
                         Subprocess::Spawn({.argv = {python, script, json, "-o", svg}}));
  EVOKE_ASSIGN_OR_RETURN(const int code, child.Wait(absl::Minutes(2)));
  if (code != 0) {
    return absl::InternalError(
        absl::StrCat("chart script ", script, " exited with ", code, " on ", json));
  }
  return absl::OkStatus();
}

}  // namespace evoke

#endif  // EVOKE_BENCH_CHART_H_
