// Per-layer KV budgets (tokens per layer): uniform, PyramidKV, or tuned by
// evoke-tune (EvolKV), and their JSON form.
//
// JSON: an object whose "budgets" member is an array of non-negative
// integers, one per layer, bottom layer first. Other members are kept for
// people ("method", "mean", "source") and ignored:
//   {"method": "evolkv", "mean": 1024, "budgets": [1400, 1210, ..., 512]}
#ifndef EVOKE_POLICY_LAYER_BUDGETS_H_
#define EVOKE_POLICY_LAYER_BUDGETS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace evoke::policy {

// ParseBudgetsJson parses the JSON form. INVALID_ARGUMENT naming the problem
// (and the index of a bad element) for malformed JSON, a top level that is
// not an object, a missing, non-array or empty "budgets", an element that is
// negative, not an integer (1.5, 3.0, 1e3, "3", true, null) or above 2^31,
// or, when `expected_layers` is not 0, a length other than `expected_layers`.
absl::StatusOr<std::vector<uint32_t>> ParseBudgetsJson(absl::string_view json,
                                                       uint32_t expected_layers = 0);

// ReadBudgetsFile reads and parses a budgets JSON file (NOT_FOUND when it
// cannot be opened; otherwise as ParseBudgetsJson).
absl::StatusOr<std::vector<uint32_t>> ReadBudgetsFile(const std::string& path,
                                                      uint32_t expected_layers = 0);

// BudgetsToJson writes the JSON form on one line ending in a newline, members
// in the order "method", "mean" (an integer when the mean is one), "budgets".
// ParseBudgetsJson(BudgetsToJson(b, m)) gives back b for any non-empty b with
// elements up to 2^31.
std::string BudgetsToJson(absl::Span<const uint32_t> budgets, absl::string_view method);

// UniformBudgets: every layer gets `mean`.
std::vector<uint32_t> UniformBudgets(uint32_t n_layers, uint32_t mean);

// PyramidBudgets (PyramidKV): budgets decrease linearly with depth, the top
// layer getting mean / beta and the bottom 2 * mean - mean / beta, rounded so
// that they sum to exactly n_layers * mean and never increase with depth
// (strictly decrease when the bottom-to-top drop is at least n_layers - 1).
// beta defaults to PyramidKV's 20; a beta below 1 (or not finite) is taken as
// 1, which is uniform. One layer gets `mean`; zero layers, nothing. `mean` up
// to 2^31.
std::vector<uint32_t> PyramidBudgets(uint32_t n_layers, uint32_t mean, double beta = 20.0);

// MeanBudget: the mean of `budgets` (0 for none).
double MeanBudget(absl::Span<const uint32_t> budgets);

}  // namespace evoke::policy

#endif  // EVOKE_POLICY_LAYER_BUDGETS_H_
