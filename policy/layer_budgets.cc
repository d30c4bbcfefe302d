#include "policy/layer_budgets.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace evoke::policy {
namespace {

constexpr uint64_t kMaxBudget = uint64_t{1} << 31;

// ElementError returns the problem with budgets[i] (empty when it is a
// valid budget) and stores the value in `out`.
std::string CheckElement(const nlohmann::json& e, size_t i, uint32_t* out) {
  const std::string where = absl::StrCat("budgets[", i, "]");
  if (e.is_number_unsigned()) {
    const uint64_t v = e.get<uint64_t>();
    if (v > kMaxBudget) {
      return absl::StrCat(where, " = ", v, " is above 2^31 (", kMaxBudget, ")");
    }
    *out = static_cast<uint32_t>(v);
    return "";
  }
  if (e.is_number_integer()) {  // signed: only negatives land here
    const int64_t v = e.get<int64_t>();
    if (v < 0) return absl::StrCat(where, " = ", v, " is negative");
    if (static_cast<uint64_t>(v) > kMaxBudget) {
      return absl::StrCat(where, " = ", v, " is above 2^31 (", kMaxBudget, ")");
    }
    *out = static_cast<uint32_t>(v);
    return "";
  }
  if (e.is_number_float()) {
    const double v = e.get<double>();
    if (!std::isfinite(v)) return absl::StrCat(where, " is not a finite number");
    if (v < 0) return absl::StrCat(where, " = ", v, " is negative");
    if (v > static_cast<double>(kMaxBudget)) {
      return absl::StrCat(where, " = ", v, " is above 2^31 (", kMaxBudget, ")");
    }
    return absl::StrCat(where, " = ", e.dump(),
                        " is not an integer (write budgets without a fraction or exponent)");
  }
  return absl::StrCat(where, " = ", e.dump(), " is not an integer (it is a ",
                      e.type_name(), ")");
}

}  // namespace

absl::StatusOr<std::vector<uint32_t>> ParseBudgetsJson(absl::string_view json,
                                                       uint32_t expected_layers) {
  nlohmann::json doc =
      nlohmann::json::parse(json.begin(), json.end(), /*cb=*/nullptr,
                            /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError("budgets JSON: malformed JSON");
  }
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budgets JSON: the top level is a ", doc.type_name(),
        ", expected an object with a \"budgets\" array"));
  }
  auto it = doc.find("budgets");
  if (it == doc.end()) {
    return absl::InvalidArgumentError(
        "budgets JSON: missing the \"budgets\" member (an array of per-layer budgets)");
  }
  if (!it->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budgets JSON: \"budgets\" is a ", it->type_name(), ", expected an array"));
  }
  if (it->empty()) {
    return absl::InvalidArgumentError("budgets JSON: \"budgets\" is empty");
  }
  if (expected_layers != 0 && it->size() != expected_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budgets JSON: \"budgets\" has ", it->size(), " entries, expected ",
        expected_layers, " (one per layer)"));
  }
  std::vector<uint32_t> budgets(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    std::string problem = CheckElement((*it)[i], i, &budgets[i]);
    if (!problem.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("budgets JSON: ", problem));
    }
  }
  return budgets;
}

absl::StatusOr<std::vector<uint32_t>> ReadBudgetsFile(const std::string& path,
                                                      uint32_t expected_layers) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open budgets file ", path));
  }
  std::ostringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::vector<uint32_t>> budgets =
      ParseBudgetsJson(text.str(), expected_layers);
  if (!budgets.ok()) {
    return absl::Status(budgets.status().code(),
                        absl::StrCat(path, ": ", budgets.status().message()));
  }
  return budgets;
}

std::string BudgetsToJson(absl::Span<const uint32_t> budgets, absl::string_view method) {
  nlohmann::ordered_json doc;
  doc["method"] = std::string(method);
  const double mean = MeanBudget(budgets);
  if (mean == std::floor(mean)) {
    doc["mean"] = static_cast<uint64_t>(mean);
  } else {
    doc["mean"] = mean;
  }
  doc["budgets"] = std::vector<uint32_t>(budgets.begin(), budgets.end());
  return doc.dump() + "\n";
}

std::vector<uint32_t> UniformBudgets(uint32_t n_layers, uint32_t mean) {
  return std::vector<uint32_t>(n_layers, mean);
}

std::vector<uint32_t> PyramidBudgets(uint32_t n_layers, uint32_t mean, double beta) {
  if (n_layers == 0) return {};
  if (n_layers == 1) return {mean};
  if (!std::isfinite(beta) || beta < 1.0) beta = 1.0;
  const long double m = mean;
  const long double top = m / beta;
  const long double bottom = 2 * m - top;
  const uint64_t total = uint64_t{n_layers} * mean;

  // Linear from bottom (layer 0) to top (layer n-1); their sum is n * mean
  // exactly in real numbers. Floor them, then hand the remaining units to
  // the largest fractions (ties: lower layer first), which keeps the result
  // non-increasing with depth.
  std::vector<uint64_t> floors(n_layers);
  std::vector<std::pair<long double, uint32_t>> fractions(n_layers);
  uint64_t floor_sum = 0;
  for (uint32_t i = 0; i < n_layers; ++i) {
    long double r = bottom - (bottom - top) * i / (n_layers - 1);
    if (r < 0) r = 0;
    const long double f = std::floor(r);
    floors[i] = static_cast<uint64_t>(f);
    fractions[i] = {r - f, i};
    floor_sum += floors[i];
  }
  std::stable_sort(fractions.begin(), fractions.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  // Rounding error in long double can leave the floors a unit off either
  // way; the loops below absorb that (and terminate: each step moves the sum
  // one unit toward `total`).
  size_t k = 0;
  while (floor_sum < total) {
    ++floors[fractions[k % n_layers].second];
    ++floor_sum;
    ++k;
  }
  for (size_t j = n_layers; floor_sum > total; --j) {
    if (j == 0) j = n_layers;
    uint32_t i = fractions[j - 1].second;
    if (floors[i] > 0) {
      --floors[i];
      --floor_sum;
    }
  }
  std::vector<uint32_t> out(n_layers);
  for (uint32_t i = 0; i < n_layers; ++i) {
    out[i] = static_cast<uint32_t>(std::min<uint64_t>(floors[i], UINT32_MAX));
  }
  return out;
}

double MeanBudget(absl::Span<const uint32_t> budgets) {
  if (budgets.empty()) return 0.0;
  uint64_t sum = 0;
  for (uint32_t b : budgets) sum += b;
  return static_cast<double>(sum) / static_cast<double>(budgets.size());
}

}  // namespace evoke::policy
