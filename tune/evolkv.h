// EvolKV-style search for per-layer KV budgets (evoke-tune's library).
//
// The plan is k_1..k_L, tokens per layer, bottom layer first. Layers are cut
// into contiguous groups of `group_size`, optimised bottom-up: while group j
// is searched, the groups below it stay frozen at the best plan found so far
// and the groups above it stay at the target c. Each group gets a fresh
// CMA-ES (pagmo2) over its budgets, whose fitness is the objective
//
//   Objective(S) = f(S) * (1 + lambda * CacheScore(mean(S), c))
//
// where f is the caller's score of the plan (higher is better; meant to be
// non-negative, e.g. a pass rate or accuracy). The best plan over the whole
// run is kept, then completed proportionally to T = c * L tokens
// (CompleteBudgets) so that its mean is exactly c.
#ifndef EVOKE_TUNE_EVOLKV_H_
#define EVOKE_TUNE_EVOLKV_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace evoke::tune {

// FitnessFn scores one plan (L budgets, bottom layer first; each in
// [min_budget, max_budget], their mean not necessarily c). Higher is better.
// An error stops the search with that error.
using FitnessFn = std::function<absl::StatusOr<double>(absl::Span<const uint32_t>)>;

// Evaluation is one call of the fitness function, one row of the trace.
struct Evaluation {
  uint32_t group = 0;       // 0-based group being searched (bottom group is 0)
  uint32_t generation = 0;  // 0 = the group's initial population, then 1..G
  uint64_t index = 0;       // 0-based over the whole run
  double objective = 0;     // f * (1 + lambda * cache_score)
  double f = 0;             // what the fitness function returned
  double cache_score = 0;   // CacheScore(mean_budget, c, gamma)
  double mean_budget = 0;   // mean of `budgets`
  std::vector<uint32_t> budgets;  // the whole plan evaluated (L entries)
};

struct TuneOptions {
  // Number of layers L. Required (> 0).
  uint32_t n_layers = 0;

  // Target mean budget c, tokens per layer. Required (> 0). The completed
  // plan sums to exactly c * n_layers, which must be at most 2^31.
  uint32_t target_budget = 0;

  // Layers per group n_g (the last group takes what is left).
  // Default: 8 (EvolKV's best).
  uint32_t group_size = 8;

  // CMA-ES population (lambda in CMA-ES terms; pagmo needs at least 5).
  // Default: 10 (4 + floor(3 ln 8)).
  uint32_t population = 10;

  // Initial CMA-ES step size, relative to the width of the bounds
  // (max_budget - min_budget): pagmo scales its initial covariance by the
  // bounds. Default: 0.3.
  double sigma0 = 0.3;

  // CMA-ES generations per group; each evaluates `population` plans, after
  // the group's initial population (`population` plans: the current plan and
  // population - 1 uniform random ones). Default: 10.
  uint32_t generations = 10;

  // Weight of CacheScore in the objective. Default: 0.3.
  double lambda = 0.3;

  // CacheScore's penalty for a mean below c, in (0, 1]. Default: 0.2.
  double gamma = 0.2;

  // Seeds the initial populations and CMA-ES; the same seed, options and a
  // deterministic fitness give the same trace. Default: 1.
  uint64_t seed = 1;

  // Bounds of every budget during the search, tokens. max_budget 0 means
  // 2 * target_budget. min_budget <= target_budget <= max_budget <= 2^31 and
  // min_budget < max_budget. Defaults: 0 and 0 (= 2c). The completed plan is
  // scaled to sum to c * L: no layer goes below min_budget (only the part
  // above it is scaled), but a layer may go above max_budget.
  uint32_t min_budget = 0;
  uint32_t max_budget = 0;

  // Called after every evaluation, in order (progress, a trace written as
  // it grows). Default: none.
  std::function<void(const Evaluation&)> on_evaluation;

  // Validate: INVALID_ARGUMENT naming the first field out of range.
  absl::Status Validate() const;

  // EffectiveMaxBudget: max_budget, or 2 * target_budget when it is 0.
  uint32_t EffectiveMaxBudget() const;
};

struct TuneResult {
  // The best plan found (highest objective over the whole run), as
  // evaluated (not completed), its objective and f.
  std::vector<uint32_t> best_budgets;
  double best_objective = 0;
  double best_f = 0;

  // best_budgets completed to sum to exactly target_budget * n_layers, no
  // layer below min_budget (CompleteBudgets with floor = min_budget).
  std::vector<uint32_t> completed_budgets;
  // f of completed_budgets, evaluated once after the search: completion
  // moves the plan (to mean c exactly), and a fitness with a sharp threshold
  // can score the completed plan below the searched one. NaN in a partial
  // result.
  double completed_f = std::numeric_limits<double>::quiet_NaN();

  // Every evaluation in order.
  std::vector<Evaluation> trace;
};

// CacheScore: max(0, 1 - (mean - c) / c) when mean > c, otherwise
// 1 - gamma * (1 - mean / c). 1 at mean == c, 0 from mean == 2c on, 1 - gamma
// at mean == 0. `target` must be > 0.
double CacheScore(double mean_budget, double target, double gamma);

// Objective: f * (1 + lambda * CacheScore(mean_budget, target, gamma)).
double Objective(double f, double mean_budget, double target, double lambda, double gamma);

// CompleteBudgets scales `budgets` proportionally so that they sum to exactly
// `total`: k_i + k_i / sum(k) * (total - sum(k)) = k_i * total / sum(k),
// floored, the units left over going to the largest remainders (ties: the
// lower layer). All zero budgets become uniform (total / L, the first
// total % L layers one more). Never negative; empty in, empty out.
//
// With a `floor` > 0 (and floor * L <= total), only the part of each budget
// above the floor is scaled (budgets below it count as the floor), so that
// no layer ends below `floor`: k_i = floor + CompleteBudgets(k - floor,
// total - L * floor). When floor * L > total the floor is ignored.
std::vector<uint32_t> CompleteBudgets(absl::Span<const uint32_t> budgets, uint32_t total,
                                      uint32_t floor = 0);

// TuneLayerBudgets runs the search. Blocks for the whole run; calls `fitness`
// and options.on_evaluation on the calling thread only.
// INVALID_ARGUMENT when options.Validate() fails. When `fitness` returns an
// error, returns that error (its code, the message prefixed with the group,
// generation and evaluation index) and, when `partial` is not null, stores
// there the state so far: the trace and, when at least one evaluation
// succeeded, the best plan so far and its completion (otherwise those stay
// empty). INTERNAL (with `partial` filled the same way) if pagmo refuses
// the problem, which would be a bug here. On success `partial` is left
// alone.
absl::StatusOr<TuneResult> TuneLayerBudgets(const TuneOptions& options, const FitnessFn& fitness,
                                            TuneResult* partial = nullptr);

}  // namespace evoke::tune

#endif  // EVOKE_TUNE_EVOLKV_H_
