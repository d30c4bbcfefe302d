#include "tools/evokectl/progress.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace evoke::ctl {
namespace {

std::string Count(uint64_t n, const std::string& unit) {
  if (unit == "bytes") {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(n);
    int u = 0;
    while (v >= 1024 && u < 4) {
      v /= 1024;
      ++u;
    }
    return u == 0 ? absl::StrCat(n, " B") : absl::StrFormat("%.1f %s", v, units[u]);
  }
  return absl::StrCat(n);
}

std::string Eta(double seconds) {
  const int64_t s = static_cast<int64_t>(std::ceil(seconds));
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, s / 60 % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrCat(s, "s");
}

}  // namespace

std::string FormatProgress(const std::string& label, uint64_t done, uint64_t total,
                           const std::string& unit, absl::Duration elapsed, int bar_width) {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;
  std::string line = label;
  if (total > 0) {
    const double fraction = std::min(1.0, static_cast<double>(done) / static_cast<double>(total));
    const int full = static_cast<int>(fraction * bar_width);
    absl::StrAppend(&line, " [", std::string(full, '#'), std::string(bar_width - full, '.'),
                    "] ", absl::StrFormat("%3d%%", static_cast<int>(fraction * 100)), " ",
                    Count(done, unit), "/", Count(total, unit));
  } else {
    absl::StrAppend(&line, " ", Count(done, unit));
  }
  if (unit != "bytes") absl::StrAppend(&line, " ", unit);
  if (seconds > 0) {
    absl::StrAppend(&line, "  ",
                    unit == "bytes" ? absl::StrCat(Count(static_cast<uint64_t>(rate), unit), "/s")
                                    : absl::StrFormat("%.0f/s", rate));
  }
  if (total > 0 && done < total && rate > 0) {
    absl::StrAppend(&line, "  ETA ", Eta(static_cast<double>(total - done) / rate));
  } else {
    absl::StrAppend(&line, "  ", Eta(std::floor(seconds)));  // Time taken so far.
  }
  return line;
}

Progress::Progress(std::string label, uint64_t total, std::string unit, bool enabled, FILE* out)
    : label_(std::move(label)),
      total_(total),
      unit_(std::move(unit)),
      enabled_(enabled),
      out_(out),
      start_(absl::Now()) {
  Draw(true);
}

Progress::~Progress() { Finish(); }

void Progress::Add(uint64_t n) {
  done_ += n;
  Draw(false);
}

void Progress::Set(uint64_t done) {
  done_ = done;
  Draw(false);
}

void Progress::Draw(bool force) {
  if (!enabled_ || finished_) return;
  const absl::Time now = absl::Now();
  if (!force && now - last_draw_ < absl::Milliseconds(100)) return;
  last_draw_ = now;
  // \r and "erase to the end of the line": the bar redraws in place.
  std::fprintf(out_, "\r%s\x1b[K",
               FormatProgress(label_, done_, total_, unit_, now - start_).c_str());
  std::fflush(out_);
}

void Progress::Finish(bool erase) {
  if (!enabled_ || finished_) return;
  if (erase) {
    std::fprintf(out_, "\r\x1b[K");
  } else {
    Draw(true);
    std::fprintf(out_, "\n");
  }
  std::fflush(out_);
  finished_ = true;
}

}  // namespace evoke::ctl
