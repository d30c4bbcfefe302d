#include "tune/evolkv.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "pagmo/algorithms/cmaes.hpp"
#include "pagmo/population.hpp"
#include "pagmo/problem.hpp"
#include "pagmo/types.hpp"

namespace evoke::tune {
namespace {

constexpr uint64_t kMaxBudget = uint64_t{1} << 31;

// SplitMix64: derives independent, reproducible seeds from (seed, group).
uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// FitnessFailed carries a fitness error out of pagmo (which only knows
// exceptions) back to TuneLayerBudgets; it never leaves this file.
struct FitnessFailed {};

// SearchState is shared by every copy pagmo makes of the problem.
struct SearchState {
  const TuneOptions* options = nullptr;
  const FitnessFn* fitness = nullptr;
  uint32_t max_budget = 0;

  std::vector<uint32_t> plan;  // the best plan so far (the frozen context)
  uint32_t group = 0;
  uint32_t group_begin = 0;
  uint32_t group_end = 0;
  uint32_t generation = 0;

  bool have_best = false;
  double best_objective = 0;
  double best_f = 0;
  std::vector<uint32_t> best_plan;

  std::vector<Evaluation> trace;
  absl::Status error;

  // Evaluate scores the plan with the group's entries set from `x`.
  double Evaluate(const pagmo::vector_double& x) {
    std::vector<uint32_t> candidate = plan;
    for (uint32_t i = group_begin; i < group_end; ++i) {
      double v = std::round(x[i - group_begin]);
      v = std::clamp(v, static_cast<double>(options->min_budget),
                     static_cast<double>(max_budget));
      candidate[i] = static_cast<uint32_t>(v);
    }
    Evaluation e;
    e.group = group;
    e.generation = generation;
    e.index = trace.size();
    absl::StatusOr<double> f = (*fitness)(candidate);
    if (f.ok() && !std::isfinite(*f)) {
      f = absl::InvalidArgumentError(absl::StrCat("the fitness is not finite (", *f, ")"));
    }
    if (!f.ok()) {
      error = absl::Status(
          f.status().code(),
          absl::StrCat("evaluation ", e.index, " (group ", group, ", generation ", generation,
                       "): ", f.status().message()));
      throw FitnessFailed{};
    }
    e.f = *f;
    e.mean_budget = std::accumulate(candidate.begin(), candidate.end(), 0.0) /
                    static_cast<double>(candidate.size());
    const double c = options->target_budget;
    e.cache_score = CacheScore(e.mean_budget, c, options->gamma);
    e.objective = Objective(e.f, e.mean_budget, c, options->lambda, options->gamma);
    e.budgets = std::move(candidate);
    if (!have_best || e.objective > best_objective) {
      have_best = true;
      best_objective = e.objective;
      best_f = e.f;
      best_plan = e.budgets;
    }
    trace.push_back(e);
    if (options->on_evaluation) options->on_evaluation(trace.back());
    return e.objective;
  }
};

// GroupProblem is the pagmo UDP for one group: its budgets are the decision
// vector; pagmo minimises, so the fitness is -objective.
class GroupProblem {
 public:
  GroupProblem() = default;
  explicit GroupProblem(SearchState* state) : state_(state) {}

  pagmo::vector_double fitness(const pagmo::vector_double& x) const {
    return {-state_->Evaluate(x)};
  }

  std::pair<pagmo::vector_double, pagmo::vector_double> get_bounds() const {
    const size_t n = state_->group_end - state_->group_begin;
    return {pagmo::vector_double(n, state_->options->min_budget),
            pagmo::vector_double(n, state_->max_budget)};
  }

 private:
  SearchState* state_ = nullptr;
};

void FillResult(const SearchState& state, TuneResult* result) {
  result->trace = state.trace;
  if (state.have_best) {
    result->best_budgets = state.best_plan;
    result->best_objective = state.best_objective;
    result->best_f = state.best_f;
    result->completed_budgets =
        CompleteBudgets(state.best_plan, state.options->target_budget * state.options->n_layers,
                        state.options->min_budget);
  }
}

}  // namespace

uint32_t TuneOptions::EffectiveMaxBudget() const {
  if (max_budget != 0) return max_budget;
  const uint64_t twice = uint64_t{2} * target_budget;
  return static_cast<uint32_t>(std::min<uint64_t>(twice, UINT32_MAX));
}

absl::Status TuneOptions::Validate() const {
  if (n_layers == 0) return absl::InvalidArgumentError("n_layers must be > 0");
  if (target_budget == 0) return absl::InvalidArgumentError("target_budget must be > 0");
  if (uint64_t{target_budget} * n_layers > kMaxBudget) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target_budget * n_layers = ", uint64_t{target_budget} * n_layers,
        " is above 2^31"));
  }
  if (group_size == 0) return absl::InvalidArgumentError("group_size must be > 0");
  if (population < 5) {
    return absl::InvalidArgumentError(
        absl::StrCat("population must be >= 5 (pagmo's CMA-ES), got ", population));
  }
  if (!std::isfinite(sigma0) || sigma0 <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("sigma0 must be > 0, got ", sigma0));
  }
  if (generations == 0) return absl::InvalidArgumentError("generations must be > 0");
  if (!std::isfinite(lambda) || lambda < 0) {
    return absl::InvalidArgumentError(absl::StrCat("lambda must be >= 0, got ", lambda));
  }
  if (!std::isfinite(gamma) || gamma <= 0 || gamma > 1) {
    return absl::InvalidArgumentError(absl::StrCat("gamma must be in (0, 1], got ", gamma));
  }
  const uint32_t max = EffectiveMaxBudget();
  if (max > kMaxBudget) {
    return absl::InvalidArgumentError(absl::StrCat("max_budget ", max, " is above 2^31"));
  }
  if (min_budget >= max) {
    return absl::InvalidArgumentError(absl::StrCat("min_budget ", min_budget,
                                                   " must be below max_budget ", max));
  }
  if (target_budget < min_budget || target_budget > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("target_budget ", target_budget, " must be within [min_budget ",
                     min_budget, ", max_budget ", max, "]"));
  }
  return absl::OkStatus();
}

double CacheScore(double mean_budget, double target, double gamma) {
  if (mean_budget > target) return std::max(0.0, 1.0 - (mean_budget - target) / target);
  return 1.0 - gamma * (1.0 - mean_budget / target);
}

double Objective(double f, double mean_budget, double target, double lambda, double gamma) {
  return f * (1.0 + lambda * CacheScore(mean_budget, target, gamma));
}

std::vector<uint32_t> CompleteBudgets(absl::Span<const uint32_t> budgets, uint32_t total,
                                      uint32_t floor) {
  const size_t n = budgets.size();
  std::vector<uint32_t> out(n);
  if (n == 0) return out;
  if (floor > 0 && uint64_t{floor} * n <= total) {
    std::vector<uint32_t> above(n);
    for (size_t i = 0; i < n; ++i) above[i] = budgets[i] > floor ? budgets[i] - floor : 0;
    out = CompleteBudgets(above, static_cast<uint32_t>(total - uint64_t{floor} * n));
    for (uint32_t& k : out) k += floor;  // <= total - (n - 1) * floor: no overflow
    return out;
  }
  const uint64_t sum = std::accumulate(budgets.begin(), budgets.end(), uint64_t{0});
  if (sum == 0) {
    for (size_t i = 0; i < n; ++i) {
      out[i] = static_cast<uint32_t>(total / n + (i < total % n ? 1 : 0));
    }
    return out;
  }
  // k_i * total / sum exactly: the quotient and remainder of a 128-bit
  // product, so neither rounding nor overflow can move the sum off `total`.
  std::vector<uint64_t> remainder(n);
  uint64_t assigned = 0;
  for (size_t i = 0; i < n; ++i) {
    const unsigned __int128 p = static_cast<unsigned __int128>(budgets[i]) * total;
    out[i] = static_cast<uint32_t>(p / sum);  // <= total
    remainder[i] = static_cast<uint64_t>(p % sum);
    assigned += out[i];
  }
  // sum(floor) > total - n, so fewer than n units are left.
  uint64_t left = total - assigned;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return remainder[a] > remainder[b]; });
  for (size_t j = 0; left > 0; ++j, --left) ++out[order[j]];
  return out;
}

absl::StatusOr<TuneResult> TuneLayerBudgets(const TuneOptions& options, const FitnessFn& fitness,
                                            TuneResult* partial) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (!fitness) return absl::InvalidArgumentError("no fitness function");

  auto state = std::make_unique<SearchState>();
  state->options = &options;
  state->fitness = &fitness;
  state->max_budget = options.EffectiveMaxBudget();
  state->plan.assign(options.n_layers, options.target_budget);

  const uint32_t n_groups = (options.n_layers + options.group_size - 1) / options.group_size;
  try {
    for (uint32_t g = 0; g < n_groups; ++g) {
      state->group = g;
      state->group_begin = g * options.group_size;
      state->group_end = std::min(options.n_layers, state->group_begin + options.group_size);
      state->generation = 0;
      const size_t dim = state->group_end - state->group_begin;
      const uint64_t group_seed = SplitMix64(options.seed ^ SplitMix64(g + 1));

      pagmo::problem problem{GroupProblem(state.get())};
      pagmo::population pop(problem, 0u, static_cast<unsigned>(group_seed));
      // The first individual is the current plan (this group at c); the
      // others are uniform in the bounds. CMA-ES starts its mean at the best.
      std::mt19937_64 rng(group_seed);
      std::uniform_real_distribution<double> uniform(options.min_budget, state->max_budget);
      pagmo::vector_double x(dim);
      for (size_t i = 0; i < dim; ++i) x[i] = state->plan[state->group_begin + i];
      pop.push_back(x);
      for (uint32_t p = 1; p < options.population; ++p) {
        for (double& v : x) v = uniform(rng);
        pop.push_back(x);
      }
      // One generation per evolve() call, with memory, so that the trace
      // knows the generation; tolerances 0 so a flat (integer-rounded)
      // population never ends a group early.
      pagmo::cmaes cmaes(/*gen=*/1, /*cc=*/-1, /*cs=*/-1, /*c1=*/-1, /*cmu=*/-1, options.sigma0,
                         /*ftol=*/0, /*xtol=*/0, /*memory=*/true, /*force_bounds=*/true,
                         static_cast<unsigned>(group_seed >> 32));
      for (uint32_t gen = 1; gen <= options.generations; ++gen) {
        state->generation = gen;
        pop = cmaes.evolve(pop);
      }
      // Freeze this group at the best plan so far (which differs from the
      // plan this group started from only inside this group).
      state->plan = state->best_plan;
    }
  } catch (const FitnessFailed&) {
    if (partial != nullptr) FillResult(*state, partial);
    return state->error;
  } catch (const std::exception& e) {  // pagmo refusing something: a bug here
    if (partial != nullptr) FillResult(*state, partial);
    return absl::InternalError(absl::StrCat("pagmo: ", e.what()));
  }
  TuneResult result;
  FillResult(*state, &result);
  absl::StatusOr<double> completed_f = fitness(result.completed_budgets);
  if (!completed_f.ok()) {
    if (partial != nullptr) *partial = result;
    return absl::Status(completed_f.status().code(),
                        absl::StrCat("scoring the completed plan: ", completed_f.status().message()));
  }
  result.completed_f = *completed_f;
  return result;
}

}  // namespace evoke::tune
