#include "tune/evolkv.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke::tune {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

uint64_t Sum(absl::Span<const uint32_t> v) {
  return std::accumulate(v.begin(), v.end(), uint64_t{0});
}

// --- CacheScore and Objective ----------------------------------------------

TEST(CacheScore, MatchesTheFormulaAtItsEdges) {
  const double c = 1024, gamma = 0.2;
  EXPECT_DOUBLE_EQ(CacheScore(c, c, gamma), 1.0);
  EXPECT_DOUBLE_EQ(CacheScore(2 * c, c, gamma), 0.0);
  EXPECT_DOUBLE_EQ(CacheScore(3 * c, c, gamma), 0.0);
  EXPECT_DOUBLE_EQ(CacheScore(100 * c, c, gamma), 0.0);
  EXPECT_DOUBLE_EQ(CacheScore(0, c, gamma), 1.0 - gamma);
  EXPECT_DOUBLE_EQ(CacheScore(0, c, 1.0), 0.0);
  // Between the edges: 1 - (kbar - c) / c above, 1 - gamma (1 - kbar / c) below.
  EXPECT_DOUBLE_EQ(CacheScore(1.5 * c, c, gamma), 0.5);
  EXPECT_DOUBLE_EQ(CacheScore(0.5 * c, c, gamma), 1.0 - gamma * 0.5);
  EXPECT_DOUBLE_EQ(CacheScore(0.25 * c, c, 0.6), 1.0 - 0.6 * 0.75);
}

TEST(CacheScore, IsContinuousAtTheTargetAndPeaksThere) {
  const double c = 512, gamma = 0.2;
  for (double eps : {1e-3, 1e-6, 1e-9}) {
    EXPECT_NEAR(CacheScore(c - eps, c, gamma), 1.0, 2 * eps);
    EXPECT_NEAR(CacheScore(c + eps, c, gamma), 1.0, 2 * eps / c + 1e-12);
    EXPECT_LT(CacheScore(c - eps, c, gamma), 1.0);
    EXPECT_LT(CacheScore(c + eps, c, gamma), 1.0);
  }
  // Monotone on each side.
  double prev = CacheScore(0, c, gamma);
  for (double k = 1; k <= c; k += 1) {
    EXPECT_GT(CacheScore(k, c, gamma), prev);
    prev = CacheScore(k, c, gamma);
  }
  for (double k = c + 1; k <= 2 * c; k += 1) {
    EXPECT_LT(CacheScore(k, c, gamma), prev);
    prev = CacheScore(k, c, gamma);
  }
}

TEST(Objective, IsFTimesOnePlusLambdaCacheScore) {
  EXPECT_DOUBLE_EQ(Objective(2.0, 150, 100, 0.3, 0.2), 2.0 * (1 + 0.3 * 0.5));
  EXPECT_DOUBLE_EQ(Objective(2.0, 100, 100, 0.3, 0.2), 2.0 * 1.3);
  EXPECT_DOUBLE_EQ(Objective(0.5, 0, 100, 0.3, 0.2), 0.5 * (1 + 0.3 * 0.8));
  EXPECT_DOUBLE_EQ(Objective(0.5, 500, 100, 0.3, 0.2), 0.5);
  EXPECT_DOUBLE_EQ(Objective(0.0, 100, 100, 0.3, 0.2), 0.0);
}

// --- CompleteBudgets -------------------------------------------------------

TEST(CompleteBudgets, Examples) {
  EXPECT_THAT(CompleteBudgets(std::vector<uint32_t>{1, 1, 2}, 8), ElementsAre(2u, 2u, 4u));
  // 10/3 each: the one unit left goes to the lowest layer (equal remainders).
  EXPECT_THAT(CompleteBudgets(std::vector<uint32_t>{1, 1, 1}, 10), ElementsAre(4u, 3u, 3u));
  // Largest remainder: 7 * 10/9 = 7.78, 2 * 10/9 = 2.22 -> 7 + 1, 2.
  EXPECT_THAT(CompleteBudgets(std::vector<uint32_t>{7, 2}, 10), ElementsAre(8u, 2u));
  // Shrinking works the same way.
  EXPECT_THAT(CompleteBudgets(std::vector<uint32_t>{300, 100}, 200), ElementsAre(150u, 50u));
  // Zeros stay zero when something is not.
  EXPECT_THAT(CompleteBudgets(std::vector<uint32_t>{0, 5, 0}, 9), ElementsAre(0u, 9u, 0u));
  // All zero: uniform, the first total % L layers one more.
  EXPECT_THAT(CompleteBudgets(std::vector<uint32_t>{0, 0, 0, 0}, 10),
              ElementsAre(3u, 3u, 2u, 2u));
  EXPECT_THAT(CompleteBudgets(std::vector<uint32_t>{42}, 7), ElementsAre(7u));
  EXPECT_THAT(CompleteBudgets(std::vector<uint32_t>{0}, 7), ElementsAre(7u));
  EXPECT_THAT(CompleteBudgets(std::vector<uint32_t>{3, 4}, 0), ElementsAre(0u, 0u));
  EXPECT_TRUE(CompleteBudgets(std::vector<uint32_t>{}, 7).empty());
}

TEST(CompleteBudgets, AlwaysSumsToTheTotalProportionally) {
  std::mt19937_64 rng(2024);
  std::uniform_int_distribution<uint32_t> length(1, 96);
  std::uniform_int_distribution<int> kind(0, 5);
  std::uniform_int_distribution<uint32_t> any(0, UINT32_MAX);
  std::uniform_int_distribution<uint32_t> small(0, 4096);
  std::uniform_int_distribution<uint32_t> tiny(0, 3);
  int checked = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const uint32_t n = trial % 50 == 0 ? 1 : length(rng);
    std::vector<uint32_t> k(n);
    const int mode = kind(rng);
    for (uint32_t& x : k) {
      switch (mode) {
        case 0: x = 0; break;                                     // all zero
        case 1: x = any(rng); break;                              // huge
        case 2: x = UINT32_MAX - tiny(rng); break;                // at the top
        case 3: x = tiny(rng) == 0 ? 0 : small(rng); break;       // zeros mixed in
        default: x = small(rng); break;
      }
    }
    uint32_t total;
    switch (trial % 4) {
      case 0: total = any(rng); break;
      case 1: total = UINT32_MAX; break;
      case 2: total = small(rng); break;
      default: total = n * 1024; break;
    }
    std::vector<uint32_t> out = CompleteBudgets(k, total);
    ASSERT_EQ(out.size(), n);
    ASSERT_EQ(Sum(out), total) << "trial " << trial << " mode " << mode;
    const uint64_t sum = Sum(k);
    for (uint32_t i = 0; i < n; ++i) {
      const long double exact =
          sum == 0 ? static_cast<long double>(total) / n
                   : static_cast<long double>(k[i]) * total / static_cast<long double>(sum);
      ASSERT_LT(std::fabs(static_cast<long double>(out[i]) - exact), 1.0L)
          << "trial " << trial << " layer " << i;
      if (sum != 0 && k[i] == 0) {
        ASSERT_EQ(out[i], 0u);
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 20000);
}

TEST(CompleteBudgets, AFloorKeepsEveryLayerAtOrAboveIt) {
  // Scaling [180, 360, 130, 130] down to 600 plainly gives 135, 270, 98, 97;
  // above a floor of 128: 128 + [52, 232, 2, 2] * 88 / 288, rounded.
  std::vector<uint32_t> k = {180, 360, 130, 130};
  EXPECT_THAT(CompleteBudgets(k, 600), ElementsAre(135u, 270u, 98u, 97u));
  EXPECT_THAT(CompleteBudgets(k, 600, 128), ElementsAre(144u, 199u, 129u, 128u));
  // Budgets below the floor count as the floor.
  EXPECT_THAT(CompleteBudgets(std::vector<uint32_t>{0, 10, 20}, 30, 10),
              ElementsAre(10u, 10u, 10u));
  EXPECT_THAT(CompleteBudgets(std::vector<uint32_t>{0, 10, 20}, 40, 10),
              ElementsAre(10u, 10u, 20u));
  // A floor that cannot hold is ignored.
  EXPECT_THAT(CompleteBudgets(std::vector<uint32_t>{1, 3}, 8, 5), ElementsAre(2u, 6u));

  std::mt19937_64 rng(99);
  std::uniform_int_distribution<uint32_t> length(1, 64), value(0, 5000), fl(0, 2000);
  for (int trial = 0; trial < 5000; ++trial) {
    std::vector<uint32_t> b(length(rng));
    for (uint32_t& x : b) x = value(rng);
    const uint32_t floor = fl(rng);
    const uint32_t total = static_cast<uint32_t>(b.size()) * (floor + value(rng) / 2);
    std::vector<uint32_t> out = CompleteBudgets(b, total, floor);
    ASSERT_EQ(Sum(out), total) << trial;
    for (uint32_t x : out) ASSERT_GE(x, floor) << trial;
  }
}

// --- TuneOptions ------------------------------------------------------------

TuneOptions Small() {
  TuneOptions o;
  o.n_layers = 16;
  o.target_budget = 64;
  return o;
}

TEST(TuneOptions, DefaultsAreEvolKVs) {
  TuneOptions o;
  EXPECT_EQ(o.group_size, 8u);
  EXPECT_EQ(o.population, 10u);
  EXPECT_DOUBLE_EQ(o.sigma0, 0.3);
  EXPECT_DOUBLE_EQ(o.lambda, 0.3);
  EXPECT_DOUBLE_EQ(o.gamma, 0.2);
  EXPECT_EQ(Small().EffectiveMaxBudget(), 128u);
  EXPECT_OK(Small().Validate());
}

TEST(TuneOptions, ValidateNamesTheBadField) {
  struct Case {
    void (*mutate)(TuneOptions&);
    const char* field;
  };
  const Case cases[] = {
      {[](TuneOptions& o) { o.n_layers = 0; }, "n_layers"},
      {[](TuneOptions& o) { o.target_budget = 0; }, "target_budget"},
      {[](TuneOptions& o) { o.target_budget = 1u << 30; }, "2^31"},
      {[](TuneOptions& o) { o.group_size = 0; }, "group_size"},
      {[](TuneOptions& o) { o.population = 4; }, "population"},
      {[](TuneOptions& o) { o.sigma0 = 0; }, "sigma0"},
      {[](TuneOptions& o) { o.sigma0 = std::nan(""); }, "sigma0"},
      {[](TuneOptions& o) { o.generations = 0; }, "generations"},
      {[](TuneOptions& o) { o.lambda = -1; }, "lambda"},
      {[](TuneOptions& o) { o.gamma = 0; }, "gamma"},
      {[](TuneOptions& o) { o.gamma = 1.5; }, "gamma"},
      {[](TuneOptions& o) { o.min_budget = 128; }, "min_budget"},
      {[](TuneOptions& o) { o.min_budget = 65; o.max_budget = 100; }, "target_budget"},
      {[](TuneOptions& o) { o.max_budget = 32; }, "target_budget"},
  };
  for (const Case& c : cases) {
    TuneOptions o = Small();
    c.mutate(o);
    EXPECT_THAT(o.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field)))
        << c.field;
    EXPECT_THAT(TuneLayerBudgets(o, [](absl::Span<const uint32_t>) { return 1.0; }),
                StatusIs(absl::StatusCode::kInvalidArgument));
  }
}

// --- TuneLayerBudgets -------------------------------------------------------

// A synthetic fitness peaking at `optimum`, a plan whose every group has mean
// c (so the CacheScore factor peaks there too): f = 1 / (1 + ||k - k*||^2 /
// (L * (c/4)^2)).
struct Synthetic {
  std::vector<uint32_t> optimum;
  double c;
  double operator()(absl::Span<const uint32_t> k) const {
    double d2 = 0;
    for (size_t i = 0; i < k.size(); ++i) {
      const double d = static_cast<double>(k[i]) - optimum[i];
      d2 += d * d;
    }
    return 1.0 / (1.0 + d2 / (k.size() * (c / 4) * (c / 4)));
  }
};

std::vector<uint32_t> KnownOptimum(uint32_t c) {
  // Per group of 8: offsets summing to 0, different in each group.
  const int offsets[2][8] = {{40, 25, 10, -5, -10, -15, -20, -25},
                             {-30, 30, -20, 20, -10, 10, 35, -35}};
  std::vector<uint32_t> k;
  for (const auto& group : offsets) {
    for (int o : group) k.push_back(static_cast<uint32_t>(static_cast<int>(c) + o));
  }
  return k;
}

TEST(TuneLayerBudgets, FindsAKnownOptimum) {
  TuneOptions o;
  o.n_layers = 16;
  o.target_budget = 64;
  o.group_size = 8;
  o.generations = 120;
  o.seed = 7;
  Synthetic fitness{KnownOptimum(64), 64};
  ASSERT_OK_AND_ASSIGN(TuneResult r, TuneLayerBudgets(o, std::ref(fitness)));

  ASSERT_EQ(r.best_budgets.size(), 16u);
  uint32_t worst = 0;
  for (size_t i = 0; i < 16; ++i) {
    const uint32_t d = r.best_budgets[i] > fitness.optimum[i]
                           ? r.best_budgets[i] - fitness.optimum[i]
                           : fitness.optimum[i] - r.best_budgets[i];
    worst = std::max(worst, d);
  }
  // Within 5% of c on every layer (the search starts up to 40 tokens away;
  // over seeds 1-40 the worst layer was at most 1 token off).
  EXPECT_LE(worst, 3u) << ::testing::PrintToString(r.best_budgets);
  EXPECT_GT(r.best_f, 0.99);
  // The completed plan sums to exactly c * L and stays near the optimum.
  EXPECT_EQ(Sum(r.completed_budgets), 16u * 64u);
  for (size_t i = 0; i < 16; ++i) {
    EXPECT_NEAR(r.completed_budgets[i], fitness.optimum[i], 8.0) << i;
  }
  // The completed plan was scored once more, after the search.
  EXPECT_DOUBLE_EQ(r.completed_f, fitness(r.completed_budgets));
  EXPECT_EQ(r.trace.size(), static_cast<size_t>(2 * (o.generations + 1) * o.population));
  // The uniform start is far worse than what was found.
  EXPECT_LT(fitness(std::vector<uint32_t>(16, 64)), 0.8);
}

TEST(TuneLayerBudgets, GroupsGoBottomUpWithEarlierGroupsFrozen) {
  TuneOptions o;
  o.n_layers = 20;  // groups of 8, 8 and 4
  o.target_budget = 64;
  o.group_size = 8;
  o.generations = 6;
  o.population = 7;
  std::vector<uint32_t> optimum = KnownOptimum(64);
  optimum.insert(optimum.end(), {90, 40, 70, 56});
  Synthetic fitness{optimum, 64};
  ASSERT_OK_AND_ASSIGN(TuneResult r, TuneLayerBudgets(o, std::ref(fitness)));

  const uint32_t begin[3] = {0, 8, 16}, end[3] = {8, 16, 20};
  ASSERT_EQ(r.trace.size(), 3u * 7u * 7u);  // groups x population x (1 + generations)
  std::vector<uint32_t> frozen(20, 64);     // the best plan when each group starts
  size_t row = 0;
  for (uint32_t g = 0; g < 3; ++g) {
    bool group_moved = false;
    const Evaluation* best = nullptr;
    for (uint32_t gen = 0; gen <= 6; ++gen) {
      for (uint32_t p = 0; p < 7; ++p, ++row) {
        const Evaluation& e = r.trace[row];
        ASSERT_EQ(e.group, g);
        ASSERT_EQ(e.generation, gen);
        ASSERT_EQ(e.index, row);
        ASSERT_EQ(e.budgets.size(), 20u);
        for (uint32_t i = 0; i < 20; ++i) {
          if (i < begin[g]) {
            ASSERT_EQ(e.budgets[i], frozen[i]) << "row " << row << " layer " << i;
          } else if (i >= end[g]) {
            ASSERT_EQ(e.budgets[i], 64u) << "row " << row << " layer " << i;
          } else {
            ASSERT_LE(e.budgets[i], 128u);
            if (e.budgets[i] != 64u) group_moved = true;
          }
        }
        // The trace's numbers are consistent with the formula.
        EXPECT_DOUBLE_EQ(e.f, fitness(e.budgets));
        EXPECT_DOUBLE_EQ(e.objective, Objective(e.f, e.mean_budget, 64, 0.3, 0.2));
        if (best == nullptr || e.objective > best->objective) best = &e;
      }
    }
    EXPECT_TRUE(group_moved) << "group " << g;
    // The first individual of each group is the plan it starts from.
    EXPECT_EQ(r.trace[g * 49].budgets, frozen) << "group " << g;
    // The next group starts from the best plan so far.
    const Evaluation* overall = &r.trace[0];
    for (size_t i = 0; i < row; ++i) {
      if (r.trace[i].objective > overall->objective) overall = &r.trace[i];
    }
    frozen = overall->budgets;
  }
  // The result is the global best of the whole trace.
  const Evaluation* overall = &r.trace[0];
  for (const Evaluation& e : r.trace) {
    if (e.objective > overall->objective) overall = &e;
  }
  EXPECT_EQ(r.best_budgets, overall->budgets);
  EXPECT_DOUBLE_EQ(r.best_objective, overall->objective);
  EXPECT_EQ(Sum(r.completed_budgets), 20u * 64u);
}

TEST(TuneLayerBudgets, IsDeterministicPerSeed) {
  TuneOptions o = Small();
  o.generations = 5;
  Synthetic fitness{KnownOptimum(64), 64};
  ASSERT_OK_AND_ASSIGN(TuneResult a, TuneLayerBudgets(o, std::ref(fitness)));
  ASSERT_OK_AND_ASSIGN(TuneResult b, TuneLayerBudgets(o, std::ref(fitness)));
  ASSERT_EQ(a.trace.size(), b.trace.size());
  for (size_t i = 0; i < a.trace.size(); ++i) {
    ASSERT_EQ(a.trace[i].budgets, b.trace[i].budgets) << i;
  }
  o.seed = 2;
  ASSERT_OK_AND_ASSIGN(TuneResult c, TuneLayerBudgets(o, std::ref(fitness)));
  ASSERT_EQ(c.trace.size(), a.trace.size());
  size_t differ = 0;
  for (size_t i = 0; i < a.trace.size(); ++i) differ += a.trace[i].budgets != c.trace[i].budgets;
  EXPECT_GT(differ, a.trace.size() / 2);
}

TEST(TuneLayerBudgets, RespectsTheBoundsAndOneLayerWorks) {
  TuneOptions o;
  o.n_layers = 1;
  o.target_budget = 100;
  o.min_budget = 90;
  o.max_budget = 130;
  o.generations = 8;
  // Wants as much as possible: the search must stop at max_budget.
  ASSERT_OK_AND_ASSIGN(TuneResult r,
                       TuneLayerBudgets(o, [](absl::Span<const uint32_t> k) {
                         return static_cast<double>(k[0]);
                       }));
  for (const Evaluation& e : r.trace) {
    ASSERT_GE(e.budgets[0], 90u);
    ASSERT_LE(e.budgets[0], 130u);
  }
  EXPECT_EQ(r.completed_budgets, std::vector<uint32_t>{100});

  // The completed plan keeps min_budget even when it is scaled down.
  TuneOptions m = Small();
  m.min_budget = 50;
  m.generations = 3;
  ASSERT_OK_AND_ASSIGN(TuneResult s, TuneLayerBudgets(m, [](absl::Span<const uint32_t> k) {
                         return static_cast<double>(k[1]) + static_cast<double>(k[9]);
                       }));
  EXPECT_EQ(Sum(s.completed_budgets), 16u * 64u);
  for (uint32_t k : s.completed_budgets) EXPECT_GE(k, 50u);
}

TEST(TuneLayerBudgets, AFitnessErrorStopsTheSearchAndKeepsTheStateSoFar) {
  TuneOptions o = Small();
  int calls = 0;
  auto failing = [&](absl::Span<const uint32_t>) -> absl::StatusOr<double> {
    if (++calls == 26) return absl::AbortedError("the benchmark crashed");
    return std::ldexp(1.0, calls);  // doubles each call: beats any CacheScore factor
  };
  TuneResult partial;
  EXPECT_THAT(TuneLayerBudgets(o, failing, &partial),
              StatusIs(absl::StatusCode::kAborted,
                       AllOf(HasSubstr("the benchmark crashed"), HasSubstr("evaluation 25"),
                             HasSubstr("group 0"), HasSubstr("generation 2"))));
  EXPECT_EQ(calls, 26);
  ASSERT_EQ(partial.trace.size(), 25u);
  EXPECT_EQ(partial.best_budgets, partial.trace[24].budgets);  // f grows with each call
  EXPECT_EQ(Sum(partial.completed_budgets), 16u * 64u);

  // Failing on the first evaluation: a trace, but no best plan.
  TuneResult none;
  EXPECT_THAT(TuneLayerBudgets(
                  o,
                  [](absl::Span<const uint32_t>) -> absl::StatusOr<double> {
                    return absl::DeadlineExceededError("too slow");
                  },
                  &none),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("too slow")));
  EXPECT_TRUE(none.trace.empty());
  EXPECT_TRUE(none.best_budgets.empty());
  EXPECT_TRUE(none.completed_budgets.empty());
}

TEST(TuneLayerBudgets, RefusesANonFiniteFitness) {
  TuneOptions o = Small();
  int calls = 0;
  EXPECT_THAT(TuneLayerBudgets(o,
                               [&](absl::Span<const uint32_t>) -> absl::StatusOr<double> {
                                 return ++calls == 3 ? std::nan("") : 1.0;
                               }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("not finite"), HasSubstr("evaluation 2"))));
}

TEST(TuneLayerBudgets, CallsOnEvaluationInOrder) {
  TuneOptions o = Small();
  o.generations = 2;
  std::vector<uint64_t> seen;
  o.on_evaluation = [&](const Evaluation& e) { seen.push_back(e.index); };
  ASSERT_OK_AND_ASSIGN(TuneResult r, TuneLayerBudgets(o, [](absl::Span<const uint32_t> k) {
                         return 1.0 / (1.0 + static_cast<double>(k[0]));
                       }));
  ASSERT_EQ(seen.size(), r.trace.size());
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], i);
}

}  // namespace
}  // namespace evoke::tune
