#include "policy/policy.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "policy/policies_internal.h"

namespace evoke::policy {
namespace {

constexpr uint32_t kMaxTopK = 1024;  // evoked's Recover accepts k in 1..1024.

// One settable field of PolicyParams.
struct Field {
  const char* name;
  enum Kind { kUint, kDouble, kBool } kind;
  uint32_t PolicyParams::*u = nullptr;
  double PolicyParams::*d = nullptr;
  bool PolicyParams::*b = nullptr;
};

const std::vector<Field>& Fields() {
  static const auto* fields = new std::vector<Field>{
      {"block_tokens", Field::kUint, &PolicyParams::block_tokens},
      {"sink_tokens", Field::kUint, &PolicyParams::sink_tokens},
      {"h2o_recent_share", Field::kDouble, nullptr, &PolicyParams::h2o_recent_share},
      {"snapkv_window", Field::kUint, &PolicyParams::snapkv_window},
      {"snapkv_pool_kernel", Field::kUint, &PolicyParams::snapkv_pool_kernel},
      {"snapkv_recent_share", Field::kDouble, nullptr, &PolicyParams::snapkv_recent_share},
      {"infllm_topk", Field::kUint, &PolicyParams::infllm_topk},
      {"infllm_repr_tokens", Field::kUint, &PolicyParams::infllm_repr_tokens},
      {"evoke_topk", Field::kUint, &PolicyParams::evoke_topk},
      {"evoke_resident_gate", Field::kBool, nullptr, nullptr, &PolicyParams::evoke_resident_gate},
  };
  return *fields;
}

// FindField resolves a key: a full field name, or a field name without its
// policy prefix ("window" for snapkv_window) when only one field ends so.
absl::StatusOr<const Field*> FindField(absl::string_view key) {
  std::vector<const Field*> suffix_matches;
  for (const Field& f : Fields()) {
    const absl::string_view name = f.name;
    if (name == key) return &f;
    if (name.size() > key.size() && absl::EndsWith(name, key) &&
        name[name.size() - key.size() - 1] == '_') {
      suffix_matches.push_back(&f);
    }
  }
  if (suffix_matches.size() == 1) return suffix_matches[0];
  std::vector<std::string> names;
  if (suffix_matches.empty()) {
    for (const Field& f : Fields()) names.push_back(f.name);
    return absl::InvalidArgumentError(absl::StrCat("policy parameter \"", key,
                                                   "\": unknown; known: ",
                                                   absl::StrJoin(names, ", ")));
  }
  for (const Field* f : suffix_matches) names.push_back(f->name);
  return absl::InvalidArgumentError(absl::StrCat("policy parameter \"", key,
                                                 "\": ambiguous, say one of ",
                                                 absl::StrJoin(names, ", ")));
}

absl::Status CheckShare(const char* name, double v) {
  if (!(v >= 0.0 && v < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", v, " is outside [0, 1)"));
  }
  return absl::OkStatus();
}

absl::Status CheckTopK(const char* name, uint32_t v) {
  if (v < 1 || v > kMaxTopK) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", v, " is outside 1..", kMaxTopK));
  }
  return absl::OkStatus();
}

// ValidateParams checks every field's range (all policies' fields, so that a
// spec is refused the same way whichever policy reads it).
absl::Status ValidateParams(const PolicyParams& p) {
  if (p.block_tokens == 0) return absl::InvalidArgumentError("block_tokens: must be at least 1");
  EVOKE_RETURN_IF_ERROR(CheckShare("h2o_recent_share", p.h2o_recent_share));
  EVOKE_RETURN_IF_ERROR(CheckShare("snapkv_recent_share", p.snapkv_recent_share));
  if (p.snapkv_window == 0) return absl::InvalidArgumentError("snapkv_window: must be at least 1");
  if (p.snapkv_pool_kernel == 0 || p.snapkv_pool_kernel % 2 == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "snapkv_pool_kernel: ", p.snapkv_pool_kernel, " must be odd (1 disables pooling)"));
  }
  EVOKE_RETURN_IF_ERROR(CheckTopK("infllm_topk", p.infllm_topk));
  if (p.infllm_repr_tokens == 0) {
    return absl::InvalidArgumentError("infllm_repr_tokens: must be at least 1");
  }
  EVOKE_RETURN_IF_ERROR(CheckTopK("evoke_topk", p.evoke_topk));
  return absl::OkStatus();
}

bool UsesSinks(absl::string_view name) {
  return name == "streaming_llm" || name == "infllm" || name == "evoke";
}

}  // namespace

std::optional<float> ScoreSummary(const RecoveryQuery& query, absl::Span<const float> summary) {
  return internal::SummaryScorer(query).Score(summary);
}

namespace internal {

std::optional<float> SummaryScorer::Score(absl::Span<const float> summary) {
  const uint64_t n_q = query_.n_query_heads;
  if (n_q == 0 || query_.queries.empty() || query_.queries.size() % n_q != 0) return std::nullopt;
  const uint64_t dim = query_.queries.size() / n_q;
  if (summary.empty() || summary.size() % dim != 0) return std::nullopt;
  const uint64_t n_kv = summary.size() / dim;
  if (n_q % n_kv != 0) return std::nullopt;
  if (n_kv != n_kv_) {
    const uint64_t group = n_q / n_kv;
    mean_.assign(n_kv * dim, 0.0f);
    for (uint64_t h = 0; h < n_kv; ++h) {
      for (uint64_t i = 0; i < dim; ++i) {
        double sum = 0;
        for (uint64_t g = 0; g < group; ++g) sum += query_.queries[(h * group + g) * dim + i];
        mean_[h * dim + i] = static_cast<float>(sum / static_cast<double>(n_q));
      }
    }
    n_kv_ = n_kv;
  }
  // Eight independent partial sums: the loop pipelines without reassociating
  // one chain.
  const size_t n = mean_.size();
  const float* a = mean_.data();
  const float* b = summary.data();
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  double total = 0;
  for (; i < n; ++i) total += static_cast<double>(a[i]) * b[i];
  for (float x : acc) total += x;
  return static_cast<float>(total);
}

}  // namespace internal

std::vector<std::string> PolicyNames() {
  return {"recency", "streaming_llm", "h2o", "snapkv", "infllm", "evoke"};
}

absl::Status ParsePolicyParams(absl::string_view spec, PolicyParams* params) {
  PolicyParams out = *params;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    const size_t eq = item.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("policy parameter \"", item, "\": expected key=value"));
    }
    const absl::string_view key = absl::StripAsciiWhitespace(item.substr(0, eq));
    const absl::string_view value = absl::StripAsciiWhitespace(item.substr(eq + 1));
    EVOKE_ASSIGN_OR_RETURN(const Field* field, FindField(key));
    auto malformed = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(field->name, ": \"", value, "\" is not ", what));
    };
    switch (field->kind) {
      case Field::kUint: {
        uint32_t v = 0;
        if (!absl::SimpleAtoi(value, &v)) return malformed("a non-negative 32-bit integer");
        out.*(field->u) = v;
        break;
      }
      case Field::kDouble: {
        double v = 0;
        if (!absl::SimpleAtod(value, &v) || !std::isfinite(v)) return malformed("a number");
        out.*(field->d) = v;
        break;
      }
      case Field::kBool: {
        bool v = false;
        if (!absl::SimpleAtob(value, &v)) return malformed("a boolean (true/false/1/0)");
        out.*(field->b) = v;
        break;
      }
    }
  }
  EVOKE_RETURN_IF_ERROR(ValidateParams(out));
  *params = out;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(absl::string_view name,
                                                   const PolicyParams& params) {
  EVOKE_RETURN_IF_ERROR(ValidateParams(params));
  if (name == "recency") return internal::NewRecencyPolicy(params, /*sinks=*/false);
  if (name == "streaming_llm") return internal::NewRecencyPolicy(params, /*sinks=*/true);
  if (name == "h2o") return internal::NewH2OPolicy(params);
  if (name == "snapkv") return internal::NewSnapKVPolicy(params);
  if (name == "infllm") return internal::NewInfLLMPolicy(params);
  if (name == "evoke") return internal::NewEvokePolicy(params);
  return absl::InvalidArgumentError(absl::StrCat("policy \"", name, "\": unknown; known: ",
                                                 absl::StrJoin(PolicyNames(), ", ")));
}

namespace {

// What ValidateBudget checks once `name` and `params` are known good.
absl::Status CheckBudget(absl::string_view name, const PolicyParams& params,
                         uint64_t budget_tokens) {
  uint64_t protect = 0;
  std::string what;
  if (UsesSinks(name)) {
    protect = params.sink_tokens;
    what = absl::StrCat("sink_tokens (", params.sink_tokens, ")");
  } else if (name == "h2o" || name == "snapkv") {
    const double share = name == "h2o" ? params.h2o_recent_share : params.snapkv_recent_share;
    const uint64_t blocks =
        internal::RecentGuardBlocks(share, budget_tokens, params.block_tokens);
    protect = blocks * params.block_tokens;
    what = absl::StrCat("the recent guard (", blocks, " block(s))");
  }
  const uint64_t need = protect + params.block_tokens;
  if (budget_tokens < need) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budget_tokens: ", budget_tokens, " is below what ", name, " needs: ",
        what.empty() ? "" : absl::StrCat(what, " + "), "one block (", params.block_tokens,
        ") = ", need));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateBudget(absl::string_view name, const PolicyParams& params,
                            uint64_t budget_tokens) {
  // MakePolicy names an unknown policy or a bad parameter.
  EVOKE_RETURN_IF_ERROR(MakePolicy(name, params).status());
  return CheckBudget(name, params, budget_tokens);
}

absl::StatusOr<uint64_t> MinBudget(absl::string_view name, const PolicyParams& params) {
  EVOKE_RETURN_IF_ERROR(MakePolicy(name, params).status());
  // The accepted budgets need not be one upward-closed range (h2o's recent
  // guard is rounded up to whole blocks, so with a recent share above 1/3
  // some budgets above the least accepted one are refused): scan upwards.
  constexpr uint64_t kLimit = uint64_t{1} << 24;
  for (uint64_t budget = 1; budget <= kLimit; ++budget) {
    if (CheckBudget(name, params, budget).ok()) return budget;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": no budget up to ", kLimit, " tokens fits its parameters"));
}

}  // namespace evoke::policy
