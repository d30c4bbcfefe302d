// evoke-sim's results: per (task, policy, budget, layer-budget scheme) cell,
// the probes passed over every seed with a Wilson 95% interval, and the
// engine counters; written as CSV, Markdown and a hand-written SVG chart.
// Every file says first that no language model is involved.
#ifndef EVOKE_SIM_REPORT_H_
#define EVOKE_SIM_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace evoke::sim {

// The sentence every output starts with.
extern const char kNoModelNotice[];

struct Interval {
  double lo = 0;
  double hi = 0;
};

// Wilson95 is the Wilson score interval at z = 1.96 for `passes` of `n`
// ({0, 1} for n = 0).
Interval Wilson95(uint64_t passes, uint64_t n);

struct Cell {
  std::string task;
  std::string policy;
  uint32_t budget = 0;          // Mean tokens per layer.
  std::string layer_budgets;    // "uniform", "pyramid", or a file's method/name.
  uint64_t runs = 0;
  uint64_t probes = 0;
  uint64_t passes = 0;
  uint64_t blocks_saved = 0;
  uint64_t blocks_recovered = 0;
  uint64_t blocks_verified = 0;
  uint64_t bytes_moved = 0;
  uint64_t decode_steps = 0;
  uint64_t recovery_failures = 0;
  double engine_seconds = 0;

  double rate() const { return probes == 0 ? 0 : static_cast<double>(passes) / probes; }
  Interval interval() const { return Wilson95(passes, probes); }
  // Milliseconds in BlockEngine + Recover per decode step.
  double engine_ms_per_step() const {
    return decode_steps == 0 ? 0 : 1000.0 * engine_seconds / static_cast<double>(decode_steps);
  }
};

// CsvHeader names the columns of CsvRow, comma-separated.
std::string CsvHeader();
// ToCsv: a "# " notice line, the header, one row per cell. Numbers are
// written with fixed precision so that equal results give equal bytes;
// `timing` adds the (run-dependent) engine_ms_per_step column.
std::string ToCsv(absl::Span<const Cell> cells, bool timing = false);
// ToMarkdown: the notice, one table per task (rows: policy and layer-budget
// scheme; columns: budgets; "rate% [lo, hi]"), then the counters table.
// `command` and `params` (SimParams::Describe) are quoted when not empty.
// `timing` adds the engine milliseconds per decode step (run-dependent).
std::string ToMarkdown(absl::Span<const Cell> cells, const std::string& command,
                       const std::string& params, bool timing = false);
// ToSvg: one panel per task, pass rate (0-100%) against budget (log scale)
// per policy and scheme, with Wilson whiskers.
std::string ToSvg(absl::Span<const Cell> cells);

}  // namespace evoke::sim

#endif  // EVOKE_SIM_REPORT_H_
