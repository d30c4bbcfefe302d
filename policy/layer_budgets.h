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
// for malformed JSON, a missing or non-array "budgets", an element that is
// negative, not an integer (1.5, "3", true) or above 2^31, or, when
// `expected_layers` is not 0, a length other than `expected_layers`.
absl::StatusOr<std::vector<uint32_t>> ParseBudgetsJson(absl::string_view json,
                                                       uint32_t expected_layers = 0);

// ReadBudgetsFile reads and parses a budgets JSON file (NOT_FOUND when it
// cannot be opened; otherwise as ParseBudgetsJson).
absl::StatusOr<std::vector<uint32_t>> ReadBudgetsFile(const std::string& path,
                                                      uint32_t expected_layers = 0);

// BudgetsToJson writes the JSON form with "method" and "mean" members.
std::string BudgetsToJson(absl::Span<const uint32_t> budgets, absl::string_view method);

// UniformBudgets: every layer gets `mean`.
std::vector<uint32_t> UniformBudgets(uint32_t n_layers, uint32_t mean);

// PyramidBudgets (PyramidKV): budgets decrease linearly with depth, the top
// layer getting mean / beta and the bottom 2 * mean - mean / beta, rounded so
// that they sum to exactly n_layers * mean. beta defaults to PyramidKV's 20.
std::vector<uint32_t> PyramidBudgets(uint32_t n_layers, uint32_t mean, double beta = 20.0);

// MeanBudget: the mean of `budgets` (0 for none).
double MeanBudget(absl::Span<const uint32_t> budgets);

}  // namespace evoke::policy

#endif  // EVOKE_POLICY_LAYER_BUDGETS_H_
