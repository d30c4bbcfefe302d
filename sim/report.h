// evoke-sim's results: per (task, policy, recovery-query alignment, budget,
// layer-budget scheme) cell, the pass rate over sessions with a Wilson 95%
// interval over sessions (the headline), the pooled probe rate with its
// per-probe interval, and the engine counters; written as CSV, Markdown and
// a hand-written SVG chart, plus an optional per-probe log. Every file says
// first that no language model is involved.
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
// WilsonRate is the same for an observed rate in [0, 1] over n units: the
// interval over sessions takes each session's pass rate (a value in [0, 1])
// as one unit. A [0, 1] variable with mean p has variance at most p(1 - p),
// so this is at least as wide as if each session were one Bernoulli trial.
Interval WilsonRate(double rate, uint64_t n);

struct Cell {
  std::string task;
  std::string policy;
  double alignment = -1;        // Recovery-query alignment; < 0: not a recovering policy.
  uint32_t budget = 0;          // Mean tokens per layer.
  std::string layer_budgets;    // "uniform", "pyramid", or a file's method/name.
  uint64_t sessions = 0;        // Independent sessions (seeds x variants).
  double session_rate_sum = 0;  // Sum over sessions of passes / probes.
  uint64_t probes = 0;
  uint64_t passes = 0;
  uint64_t blocks_saved = 0;
  uint64_t blocks_recovered = 0;
  uint64_t blocks_verified = 0;
  uint64_t bytes_moved = 0;
  uint64_t decode_steps = 0;
  uint64_t recovery_failures = 0;
  double engine_seconds = 0;

  // The headline: the mean over sessions of each session's pass rate, with
  // a Wilson interval over sessions.
  double rate() const { return sessions == 0 ? 0 : session_rate_sum / static_cast<double>(sessions); }
  Interval interval() const { return WilsonRate(rate(), sessions); }
  // Pooled over probes (probes of one session are not independent).
  double probe_rate() const { return probes == 0 ? 0 : static_cast<double>(passes) / probes; }
  Interval probe_interval() const { return Wilson95(passes, probes); }
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
// per policy, alignment and scheme, with Wilson whiskers over sessions.
std::string ToSvg(absl::Span<const Cell> cells);

// Label names a cell's row: the policy, its recovery-query alignment
// ("evoke rho=0.50") and a non-uniform layer-budget scheme.
std::string Label(const Cell& cell);

// One probe of one session, as the probe log writes it.
struct ProbeRow {
  std::string task;
  uint32_t variant = 0;
  uint64_t seed = 0;
  std::string policy;
  double alignment = -1;
  uint32_t budget = 0;
  std::string layer_budgets;
  uint32_t probe = 0;      // Index of the probe in its session.
  int32_t fact = -1;
  double resident = 0;     // ProbeRecord's fields (sim/runner.h).
  double distance = 0;
  double mass = 0;
  uint32_t layers = 0;
  bool passed = false;
};
// ProbeLogCsv: the notice line, a header, one row per probe.
std::string ProbeLogCsv(absl::Span<const ProbeRow> rows);

}  // namespace evoke::sim

#endif  // EVOKE_SIM_REPORT_H_
