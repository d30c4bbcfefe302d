// evoke-eval's results: one Cell per (task, policy, budget), with Wilson
// intervals, as JSON, a Markdown table and an SVG chart.
#ifndef EVOKE_EVAL_REPORT_H_
#define EVOKE_EVAL_REPORT_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "eval/session_runner.h"

namespace evoke::eval {

// Wilson95 is the Wilson score interval (z = 1.96) of `successes` out of
// `n`, in [0, 1]; {0, 1} when n == 0. `successes` may be fractional (a mean
// rate times n).
std::pair<double, double> Wilson95(double successes, double n);

struct Cell {
  std::string task;
  std::string policy;
  uint64_t budget = 0;  // 0 for "full".
  uint32_t context = 0;
  uint32_t passes = 0;   // Probes passed.
  uint32_t n = 0;        // Probes.
  uint32_t sessions = 0;
  std::vector<double> session_rates;  // Per session: its probes' pass rate.
  uint64_t blocks_saved = 0, blocks_recovered = 0, recovery_failures = 0, recovery_points = 0;
  uint64_t steps = 0;
  double seconds = 0;
  // Recovery's stall (SessionResult): seconds bringing blocks, their tiers.
  double bring_seconds = 0;
  uint64_t brought_tier1 = 0, brought_tier2 = 0, prefetched = 0;
  uint32_t errors = 0;      // Sessions that failed (their probes count as not passed).
  std::string first_error;
  // Recovering policies: where the needed block stood at each prompt's end:
  // "resident", "1", "2", ..., "not in top 64".
  std::map<std::string, uint32_t> fact_rank;

  void Add(const SessionResult& r);
  void AddError(uint32_t probes, const std::string& message);
  double rate() const { return n ? double(passes) / n : 0; }
  // Over sessions: the mean of the per-session rates, with a Wilson
  // interval for that mean over `sessions` trials (probes of one session
  // share its context and are not independent); over probes: passes of n.
  double session_mean() const;
  std::pair<double, double> wilson_sessions() const;
  std::pair<double, double> wilson_probes() const { return Wilson95(passes, n); }
  double ms_per_step() const { return steps ? 1000.0 * seconds / steps : 0; }
  double stall_us_per_step() const { return steps ? 1e6 * bring_seconds / steps : 0; }
};

std::string CellsToJson(absl::Span<const Cell> cells, const std::string& header_members);
std::string CellsToMarkdown(absl::Span<const Cell> cells);
// One panel per task: pass rate (mean over sessions) against budget, one
// line per policy with its interval over sessions; "full" as a dashed line.
std::string CellsToSvg(absl::Span<const Cell> cells, const std::string& title);

}  // namespace evoke::eval

#endif  // EVOKE_EVAL_REPORT_H_
