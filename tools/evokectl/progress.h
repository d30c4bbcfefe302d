// Progress: a one-line progress bar on stderr for long evokectl operations
// (verify, export, import, flush): done/total, rate and ETA, redrawn at most
// ten times a second. Disabled (draws nothing) unless asked for, which
// evokectl does when stdout is a terminal (or --progress=always), so output
// captured by scripts and tests carries no bar.
#ifndef EVOKE_CLIENT_EVOKECTL_PROGRESS_H_
#define EVOKE_CLIENT_EVOKECTL_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/time/time.h"

namespace evoke::ctl {

// FormatProgress renders one progress line (no escape codes, no newline):
// `label`, a bar of `bar_width` cells when `total` is known (0: unknown),
// done[/total] `unit`, the rate over `elapsed` and the ETA. Pure, for tests.
std::string FormatProgress(const std::string& label, uint64_t done, uint64_t total,
                           const std::string& unit, absl::Duration elapsed,
                           int bar_width = 30);

class Progress {
 public:
  // Draws to `out` (stderr by default) when `enabled`.
  Progress(std::string label, uint64_t total, std::string unit, bool enabled,
           FILE* out = stderr);
  ~Progress();  // Finish() if not done.
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void set_total(uint64_t total) { total_ = total; }
  // Add counts `n` more units done and redraws if 100 ms passed.
  void Add(uint64_t n);
  // Set sets the units done.
  void Set(uint64_t done);
  // Finish draws the last line and ends it, or erases it when `erase`.
  void Finish(bool erase = false);

 private:
  void Draw(bool force);

  std::string label_;
  uint64_t total_;
  std::string unit_;
  bool enabled_;
  FILE* out_;
  uint64_t done_ = 0;
  absl::Time start_;
  absl::Time last_draw_ = absl::InfinitePast();
  bool finished_ = false;
};

}  // namespace evoke::ctl

#endif  // EVOKE_CLIENT_EVOKECTL_PROGRESS_H_
