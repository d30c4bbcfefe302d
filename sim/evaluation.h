// evoke-sim's evaluation grid: tasks x policies (x recovery-query
// alignments for the recovering ones) x budgets x seeds, run on a pool of
// threads (each session -- task, variant, seed -- is built once and every
// configuration runs on it), aggregated into report cells in a fixed order
// (results do not depend on the thread count). A cell's headline is over
// sessions: each session's pass rate is one unit (sim/report.h).
#ifndef EVOKE_SIM_EVALUATION_H_
#define EVOKE_SIM_EVALUATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "policy/policy.h"
#include "sim/model.h"
#include "sim/report.h"

namespace evoke::sim {

class EvokedProcess;

// A layer-budget scheme: "uniform", "pyramid" (PyramidKV, beta 20), or
// fixed budgets from a file (then `budgets` is ignored; the cell's budget is
// the file's mean).
struct LayerBudgetScheme {
  std::string name = "uniform";
  std::vector<uint32_t> fixed;  // Set for a file.
};

struct GridSpec {
  std::vector<Task> tasks = AllTasks();
  std::vector<std::string> policies;
  std::vector<uint32_t> budgets = {512, 1024, 2048};
  std::vector<LayerBudgetScheme> schemes = {LayerBudgetScheme()};
  // Recovery-query alignments in [0, 1]: each recovering policy runs once
  // per value (recovery-less policies never query, and run once). Empty:
  // {params.query_alignment}.
  std::vector<double> alignments;
  uint64_t seed_begin = 0;
  uint64_t seed_end = 15;  // Exclusive.
  uint32_t threads = 1;
  SimParams params;
  policy::PolicyParams policy_params;
};

// LayerBudgets returns the per-layer budgets of `scheme` at mean `budget`.
std::vector<uint32_t> LayerBudgets(const LayerBudgetScheme& scheme, uint32_t n_layers,
                                   uint32_t budget);

// RunGrid runs the grid. `evoked` is needed when a recovering policy is in
// it (INVALID_ARGUMENT otherwise). The first failed run's error is returned
// (its task, policy, budget and seed in the message). INVALID_ARGUMENT for
// invalid params, a repeated task, policy, budget, scheme or alignment, or
// an alignment outside [0, 1]. `probe_log`, when set, gets one row per
// probe, in the cells' order.
absl::StatusOr<std::vector<Cell>> RunGrid(const GridSpec& spec, const EvokedProcess* evoked,
                                          std::vector<ProbeRow>* probe_log = nullptr);

}  // namespace evoke::sim

#endif  // EVOKE_SIM_EVALUATION_H_
