#include "sim/runner.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/half.h"
#include "common/status_macros.h"
#include "policy/attention_stats.h"
#include "policy/evoked_source.h"
#include "policy/session_driver.h"
#include "sim/filler_attention.h"

namespace evoke::sim {
namespace {

using policy::BlockHandle;

// V element of (token, layer, head, dim): a fixed hash mapped to [-1, 1).
uint16_t ValueHalf(uint64_t token, uint32_t layer, uint32_t head, uint32_t dim) {
  uint64_t x = token * 0x9e3779b97f4a7c15ull ^ (static_cast<uint64_t>(layer) << 48) ^
               (static_cast<uint64_t>(head) << 32) ^ dim;
  x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  const float v = static_cast<float>(x >> 40) / static_cast<float>(1ull << 23) - 1.0f;
  return FloatToHalf(v);
}

float RoundHalf(float x) { return HalfToFloat(FloatToHalf(x)); }

// Rotates `n_vectors` head_dim vectors (any layer/head mix) at `position`
// with common/rope.h's angle table (plan.omega) and RotateKeys' numerics:
// angle in double, cos and sin cast to float, the rotation in float. The
// cos/sin of one position are computed once for all vectors.
void Rotate(const RopePlan& plan, float* data, uint32_t n_vectors, int64_t position) {
  const uint32_t half = plan.rotary_dim / 2;
  if (half == 0) return;
  float cs[256], sn[256];
  for (uint32_t i = 0; i < half && i < 256; ++i) {
    const double angle = static_cast<double>(position) * plan.omega[i];
    cs[i] = static_cast<float>(std::cos(angle));
    sn[i] = static_cast<float>(std::sin(angle));
  }
  for (uint32_t v = 0; v < n_vectors; ++v) {
    float* x = data + static_cast<size_t>(v) * plan.head_dim;
    for (uint32_t i = 0; i < half; ++i) {
      const uint32_t a = plan.type == v1::ROPE_NEOX ? i : 2 * i;
      const uint32_t b = plan.type == v1::ROPE_NEOX ? i + half : 2 * i + 1;
      const float x0 = x[a], x1 = x[b];
      x[a] = x0 * cs[i] - x1 * sn[i];
      x[b] = x0 * sn[i] + x1 * cs[i];
    }
  }
}

struct CachedBlock {
  uint64_t first_token = 0;
  uint32_t n = 0;
  int64_t first_position = 0;
  // Each token's position: a block is gapped when a recovery point placed
  // blocks at the tail while it was pending.
  std::vector<int64_t> positions;
  std::vector<float> keys;  // [token][pair][dim], post-RoPE, f16 values.
};

class Run;

struct Scope {
  std::vector<uint32_t> pairs;  // layer * n_kv_heads + head
  uint64_t budget = 0;
  bool recovering = false;
  std::unique_ptr<policy::Policy> policy;
  std::unique_ptr<policy::AttentionStats> stats;
  std::unique_ptr<policy::BlockEngine> engine;
  std::unique_ptr<policy::EvokedRecoverySource> source;
  std::unique_ptr<policy::SessionDriver> driver;
  absl::flat_hash_map<BlockHandle, CachedBlock> blocks;
  // Pending tokens (not yet in a block).
  std::vector<uint64_t> pend_tokens;
  std::vector<int64_t> pend_positions;
  std::vector<float> pend_keys;  // [token][pair][dim]
  int64_t pend_first_position = 0;
  int64_t next_position = 0;
  // Original extent of each block (for Bring).
  absl::flat_hash_map<BlockHandle, std::pair<uint64_t, uint32_t>> origin;
};

class Run {
 public:
  Run(const Session& session, const RunConfig& config, const EvokedLink* link)
      : s_(session),
        p_(session.params()),
        config_(config),
        link_(link),
        filler_(session.params().head_dim, session.params().recency_per_1k_tokens / 1000.0) {}

  absl::StatusOr<RunResult> Go();

  // BlockEngine of a recovering scope.
  absl::StatusOr<uint64_t> Evict(Scope& scope, const policy::ResidentBlock& block, bool stored);
  absl::StatusOr<uint64_t> Bring(Scope& scope, BlockHandle handle, uint32_t n_tokens,
                                 int64_t first_position);

 private:
  absl::Status Setup();
  absl::Status DecodeToken(uint64_t token, int32_t reference_fact, uint32_t query_index);
  absl::Status ObserveFiller(Scope& scope, const std::vector<float>& query);
  absl::Status ObserveReference(Scope& scope, const std::vector<float>& query);
  absl::Status RecoveryPoint(int32_t fact, uint32_t query_index);
  absl::Status Probe(int32_t fact, uint32_t query_index);
  // Post-RoPE f16-rounded keys of `token` at `position`, all pairs.
  const std::vector<float>& KeysAt(uint64_t token, int64_t position);

  const Session& s_;
  const SimParams& p_;
  RunConfig config_;
  const EvokedLink* link_;
  RopePlan plan_;
  v1::LayoutFingerprint fp_;
  std::vector<std::unique_ptr<Scope>> scopes_;
  std::vector<std::pair<Scope*, uint32_t>> scope_of_pair_;  // pair -> (scope, index)
  std::unique_ptr<SharedRegion> region_;
  std::vector<float> keys_at_;
  uint64_t keys_at_token_ = ~0ull;
  int64_t keys_at_position_ = -1;
  absl::Status verify_error_;
  RunResult result_;
  FillerAttention filler_;
  double alignment_ = 0;  // Of recovery queries.
  // Scratch.
  std::vector<float> logits_;
  std::vector<float> row_keys_;
  std::vector<int64_t> row_positions_;
  std::vector<BlockHandle> row_blocks_;
  std::vector<uint32_t> row_tokens_;
  std::vector<float> row_weights_;
};

class ScopeEngine final : public policy::BlockEngine {
 public:
  ScopeEngine(Run* run, Scope* scope) : run_(run), scope_(scope) {}
  absl::StatusOr<uint64_t> Evict(const policy::ResidentBlock& block, bool stored) override {
    return run_->Evict(*scope_, block, stored);
  }
  absl::StatusOr<uint64_t> Bring(BlockHandle handle, uint32_t n_tokens,
                                 int64_t first_position) override {
    return run_->Bring(*scope_, handle, n_tokens, first_position);
  }

 private:
  Run* run_;
  Scope* scope_;
};

const std::vector<float>& Run::KeysAt(uint64_t token, int64_t position) {
  if (token == keys_at_token_ && position == keys_at_position_) return keys_at_;
  absl::Span<const float> pre = s_.PreKeys(token);
  keys_at_.assign(pre.begin(), pre.end());
  Rotate(plan_, keys_at_.data(), p_.n_layers * p_.n_kv_heads, position);
  for (float& x : keys_at_) x = RoundHalf(x);
  keys_at_token_ = token;
  keys_at_position_ = position;
  return keys_at_;
}

absl::Status Run::Setup() {
  EVOKE_RETURN_IF_ERROR(p_.Validate());
  alignment_ = config_.query_alignment.value_or(p_.query_alignment);
  if (!(alignment_ >= 0 && alignment_ <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("query_alignment: ", alignment_, " not in [0, 1]"));
  }
  EVOKE_ASSIGN_OR_RETURN(plan_, SimRopePlan(p_));
  fp_ = SimFingerprint(p_);
  if (config_.layer_budgets.size() != p_.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer_budgets: ", config_.layer_budgets.size(),
                                                   " entries for ", p_.n_layers, " layers"));
  }
  config_.policy_params.block_tokens = p_.block_tokens;
  config_.policy_params.sink_tokens = p_.sink_tokens;
  const uint32_t n_pairs = p_.n_layers * p_.n_kv_heads;
  scope_of_pair_.assign(n_pairs, {nullptr, 0});
  const bool recovering = IsRecovering(config_.policy);
  // Probe the policy once for its info.
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<policy::Policy> probe,
                         policy::MakePolicy(config_.policy, config_.policy_params));
  const bool per_head = probe->info().needs_attention;
  // The smallest budget the policy accepts (streaming_llm: sinks + one
  // block; h2o and snapkv: the recent guard + one block).
  EVOKE_ASSIGN_OR_RETURN(const uint64_t floor,
                         policy::MinBudget(config_.policy, config_.policy_params));
  auto budget_of = [&](uint64_t wanted) -> absl::StatusOr<uint64_t> {
    uint64_t b = wanted;
    if (b < floor) {
      b = floor;
      ++result_.budget_raised_layers;
    }
    EVOKE_RETURN_IF_ERROR(policy::ValidateBudget(config_.policy, config_.policy_params, b));
    return b;
  };
  std::vector<std::vector<uint32_t>> groups;
  std::vector<uint64_t> budgets;
  if (recovering) {
    std::vector<uint32_t> all(n_pairs);
    for (uint32_t i = 0; i < n_pairs; ++i) all[i] = i;
    groups.push_back(all);
    uint64_t sum = 0;
    for (uint32_t b : config_.layer_budgets) sum += b;
    budgets.push_back((sum + p_.n_layers / 2) / p_.n_layers);
  } else {
    for (uint32_t l = 0; l < p_.n_layers; ++l) {
      if (per_head) {
        for (uint32_t h = 0; h < p_.n_kv_heads; ++h) {
          groups.push_back({l * p_.n_kv_heads + h});
          budgets.push_back(config_.layer_budgets[l]);
        }
      } else {
        std::vector<uint32_t> g;
        for (uint32_t h = 0; h < p_.n_kv_heads; ++h) g.push_back(l * p_.n_kv_heads + h);
        groups.push_back(g);
        budgets.push_back(config_.layer_budgets[l]);
      }
    }
  }
  if (recovering && (link_ == nullptr || link_->client == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy ", config_.policy, " recovers and needs a running evoked"));
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    auto scope = std::make_unique<Scope>();
    scope->pairs = groups[g];
    EVOKE_ASSIGN_OR_RETURN(scope->budget, budget_of(budgets[g]));
    scope->recovering = recovering;
    EVOKE_ASSIGN_OR_RETURN(scope->policy,
                           policy::MakePolicy(config_.policy, config_.policy_params));
    if (scope->policy->info().needs_attention) {
      policy::AttentionStats::Options o;
      o.n_layers = 1;
      o.n_heads = 1;
      o.window = config_.policy_params.snapkv_window;
      o.pool_kernel = config_.policy_params.snapkv_pool_kernel;  // Rows are per token.
      o.token_layer = 0;
      scope->stats = std::make_unique<policy::AttentionStats>(o);
    }
    scope->engine = std::make_unique<ScopeEngine>(this, scope.get());
    if (recovering) {
      policy::EvokedSourceOptions so;
      so.ns = fp_.namespace_();
      so.session_id = link_->session_id;
      so.layer = p_.recovery_layer;
      so.kind = v1::SUMMARY_MEAN_KEYS;
      scope->source = std::make_unique<policy::EvokedRecoverySource>(link_->client, so);
    }
    policy::DriverOptions d;
    d.budget_tokens = scope->budget;
    d.block_tokens = p_.block_tokens;
    d.sink_tokens = p_.sink_tokens;
    scope->driver = std::make_unique<policy::SessionDriver>(
        scope->policy.get(), scope->engine.get(), scope->source.get(), scope->stats.get(), d);
    for (uint32_t i = 0; i < scope->pairs.size(); ++i) {
      scope_of_pair_[scope->pairs[i]] = {scope.get(), i};
    }
    scopes_.push_back(std::move(scope));
  }
  if (recovering) {
    EVOKE_RETURN_IF_ERROR(link_->client->OpenLease("evoke-sim"));
    EVOKE_ASSIGN_OR_RETURN(region_,
                           link_->client->CreateSharedRegion(PayloadBytes(p_, p_.block_tokens)));
  }
  return absl::OkStatus();
}

absl::Status Run::ObserveFiller(Scope& scope, const std::vector<float>& query) {
  // Exact per-token softmax of the step's filler query (sim/filler_attention.h),
  // each row counted filler_sample_every times (only every
  // filler_sample_every-th step is observed).
  const uint32_t d = p_.head_dim;
  const uint32_t group = p_.kv_group();
  const size_t stride = scope.pairs.size() * d;
  row_blocks_.clear();
  row_tokens_.clear();
  for (const policy::ResidentBlock& rb : scope.driver->resident()) {
    for (uint32_t t = 0; t < rb.n_tokens; ++t) {
      row_blocks_.push_back(rb.handle);
      row_tokens_.push_back(t);
    }
  }
  for (uint32_t t = 0; t < scope.pend_tokens.size(); ++t) {
    row_blocks_.push_back(policy::AttentionStats::kNoBlock);
    row_tokens_.push_back(0);
  }
  for (uint32_t j = 0; j < scope.pairs.size(); ++j) {
    const uint32_t pair = scope.pairs[j];
    const uint32_t l = pair / p_.n_kv_heads;
    const uint32_t h = pair % p_.n_kv_heads;
    row_keys_.clear();
    row_positions_.clear();
    for (const policy::ResidentBlock& rb : scope.driver->resident()) {
      const CachedBlock& b = scope.blocks.at(rb.handle);
      for (uint32_t t = 0; t < b.n; ++t) {
        const float* k = b.keys.data() + t * stride + static_cast<size_t>(j) * d;
        row_keys_.insert(row_keys_.end(), k, k + d);
        row_positions_.push_back(b.positions[t]);
      }
    }
    for (uint32_t t = 0; t < scope.pend_tokens.size(); ++t) {
      const float* k = scope.pend_keys.data() + t * stride + static_cast<size_t>(j) * d;
      row_keys_.insert(row_keys_.end(), k, k + d);
      row_positions_.push_back(scope.pend_positions[t]);
    }
    const float* q = query.data() + (static_cast<size_t>(l) * p_.n_query_heads + h * group) * d;
    filler_.Row(absl::MakeConstSpan(q, static_cast<size_t>(group) * d), row_keys_,
                row_positions_, scope.next_position, static_cast<float>(p_.filler_sample_every),
                &row_weights_);
    EVOKE_RETURN_IF_ERROR(scope.stats->Observe(0, 0, row_blocks_, row_tokens_, row_weights_));
  }
  return absl::OkStatus();
}

absl::Status Run::ObserveReference(Scope& scope, const std::vector<float>& query) {
  const uint32_t d = p_.head_dim;
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(d));
  const uint32_t group = p_.kv_group();
  std::vector<float> q(d);
  for (uint32_t j = 0; j < scope.pairs.size(); ++j) {
    const uint32_t pair = scope.pairs[j];
    const uint32_t l = pair / p_.n_kv_heads;
    const uint32_t h = pair % p_.n_kv_heads;
    row_blocks_.clear();
    row_tokens_.clear();
    for (const policy::ResidentBlock& rb : scope.driver->resident()) {
      for (uint32_t t = 0; t < rb.n_tokens; ++t) {
        row_blocks_.push_back(rb.handle);
        row_tokens_.push_back(t);
      }
    }
    for (uint32_t t = 0; t < scope.pend_tokens.size(); ++t) {
      row_blocks_.push_back(policy::AttentionStats::kNoBlock);
      row_tokens_.push_back(0);
    }
    row_weights_.assign(row_blocks_.size(), 0.0f);
    for (uint32_t g = 0; g < group; ++g) {
      const uint32_t qh = h * group + g;
      const float* src = query.data() + (static_cast<size_t>(l) * p_.n_query_heads + qh) * d;
      q.assign(src, src + d);
      Rotate(plan_, q.data(), 1, scope.next_position);
      logits_.clear();
      const size_t stride = scope.pairs.size() * d;
      for (const policy::ResidentBlock& rb : scope.driver->resident()) {
        const CachedBlock& b = scope.blocks.at(rb.handle);
        for (uint32_t t = 0; t < b.n; ++t) {
          const float* k = b.keys.data() + t * stride + static_cast<size_t>(j) * d;
          float dot = 0;
          for (uint32_t i = 0; i < d; ++i) dot += q[i] * k[i];
          logits_.push_back(dot * inv_sqrt_d);
        }
      }
      for (uint32_t t = 0; t < scope.pend_tokens.size(); ++t) {
        const float* k = scope.pend_keys.data() + t * stride + static_cast<size_t>(j) * d;
        float dot = 0;
        for (uint32_t i = 0; i < d; ++i) dot += q[i] * k[i];
        logits_.push_back(dot * inv_sqrt_d);
      }
      if (logits_.empty()) continue;
      const float m = *std::max_element(logits_.begin(), logits_.end());
      double total = 0;
      for (float& x : logits_) {
        x = std::exp(x - m);
        total += x;
      }
      for (size_t i = 0; i < logits_.size(); ++i) {
        row_weights_[i] += static_cast<float>(logits_[i] / total);
      }
    }
    EVOKE_RETURN_IF_ERROR(scope.stats->Observe(0, 0, row_blocks_, row_tokens_, row_weights_));
  }
  return absl::OkStatus();
}

absl::Status Run::DecodeToken(uint64_t token, int32_t reference_fact, uint32_t query_index) {
  std::vector<float> ref_query, filler_query;
  if (reference_fact >= 0) ref_query = s_.EventQuery(query_index, reference_fact);
  const bool sampled = reference_fact < 0 && token % p_.filler_sample_every == 0;
  const uint32_t d = p_.head_dim;
  for (auto& sp : scopes_) {
    Scope& scope = *sp;
    if (scope.stats != nullptr) {
      if (reference_fact >= 0) {
        EVOKE_RETURN_IF_ERROR(ObserveReference(scope, ref_query));
      } else if (sampled) {
        if (filler_query.empty()) filler_query = s_.FillerQuery(token);
        EVOKE_RETURN_IF_ERROR(ObserveFiller(scope, filler_query));
      }
      scope.stats->EndStep();
    }
    EVOKE_RETURN_IF_ERROR(scope.driver->MakeRoom(1));
    const std::vector<float>& keys = KeysAt(token, scope.next_position);
    if (scope.pend_tokens.empty()) scope.pend_first_position = scope.next_position;
    scope.pend_tokens.push_back(token);
    scope.pend_positions.push_back(scope.next_position);
    for (uint32_t j = 0; j < scope.pairs.size(); ++j) {
      const float* k = keys.data() + static_cast<size_t>(scope.pairs[j]) * d;
      scope.pend_keys.insert(scope.pend_keys.end(), k, k + d);
    }
    EVOKE_ASSIGN_OR_RETURN(std::optional<BlockHandle> made,
                           scope.driver->TokenDecoded(scope.next_position));
    ++scope.next_position;
    if (!made.has_value()) continue;
    const policy::ResidentBlock& rb = scope.driver->resident().back();
    if (rb.handle != *made || rb.n_tokens != scope.pend_tokens.size()) {
      return absl::InternalError(absl::StrCat("block ", *made, " of ", rb.n_tokens,
                                              " tokens, but ", scope.pend_tokens.size(),
                                              " pending"));
    }
    CachedBlock b;
    b.first_token = scope.pend_tokens.front();
    b.n = rb.n_tokens;
    b.first_position = scope.pend_first_position;
    b.positions = std::move(scope.pend_positions);
    scope.pend_positions.clear();
    b.keys = std::move(scope.pend_keys);
    scope.pend_keys.clear();
    scope.pend_tokens.clear();
    scope.origin[*made] = {b.first_token, b.n};
    if (scope.recovering) {
      // Pre-RoPE mean keys of the recovery layer, per KV head.
      std::vector<float> summary(static_cast<size_t>(p_.n_kv_heads) * d, 0.0f);
      for (uint32_t t = 0; t < b.n; ++t) {
        absl::Span<const float> pre = s_.PreKeys(b.first_token + t);
        const float* src = pre.data() + static_cast<size_t>(p_.recovery_layer) * p_.n_kv_heads * d;
        for (size_t i = 0; i < summary.size(); ++i) summary[i] += src[i];
      }
      for (float& x : summary) x /= static_cast<float>(b.n);
      EVOKE_RETURN_IF_ERROR(scope.driver->SetSummary(*made, std::move(summary)));
    }
    scope.blocks[*made] = std::move(b);
  }
  return absl::OkStatus();
}

absl::Status Run::RecoveryPoint(int32_t fact, uint32_t query_index) {
  std::vector<float> q = s_.EventQuery(query_index, fact, alignment_);
  const size_t per_layer = static_cast<size_t>(p_.n_query_heads) * p_.head_dim;
  policy::RecoveryQuery rq;
  rq.queries = absl::MakeConstSpan(q.data() + p_.recovery_layer * per_layer, per_layer);
  rq.n_query_heads = p_.n_query_heads;
  for (auto& sp : scopes_) {
    if (!sp->recovering) continue;
    EVOKE_RETURN_IF_ERROR(sp->driver->RecoveryPoint(rq, &sp->next_position));
    if (!verify_error_.ok()) return verify_error_;
  }
  return absl::OkStatus();
}

absl::Status Run::Probe(int32_t fact, uint32_t query_index) {
  std::vector<float> query = s_.EventQuery(query_index, fact);
  const uint32_t d = p_.head_dim;
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<float> q(d);
  uint32_t retrieving = 0;
  double mass_sum = 0;
  // Residency of the fact's tokens, counted once per (retrieval layer, KV head).
  uint64_t fact_seen = 0;
  double fact_distance = 0;
  for (uint32_t l : p_.retrieval_layers) {
    double layer_mass = 0;
    for (uint32_t qh = 0; qh < p_.n_query_heads; ++qh) {
      const uint32_t h = qh / p_.kv_group();
      const bool count_residency = qh % p_.kv_group() == 0;
      auto [scope, j] = scope_of_pair_[l * p_.n_kv_heads + h];
      const float* src = query.data() + (static_cast<size_t>(l) * p_.n_query_heads + qh) * d;
      q.assign(src, src + d);
      Rotate(plan_, q.data(), 1, scope->next_position);
      const size_t stride = scope->pairs.size() * d;
      logits_.clear();
      row_tokens_.clear();  // 1 when the token is of `fact`.
      auto add = [&](const float* k, uint64_t token, int64_t position) {
        float dot = 0;
        for (uint32_t i = 0; i < d; ++i) dot += q[i] * k[i];
        logits_.push_back(dot * inv_sqrt_d);
        const bool of_fact = s_.FactOf(token) == fact;
        row_tokens_.push_back(of_fact ? 1 : 0);
        if (of_fact && count_residency) {
          ++fact_seen;
          fact_distance += static_cast<double>(scope->next_position - position);
        }
      };
      for (const policy::ResidentBlock& rb : scope->driver->resident()) {
        const CachedBlock& b = scope->blocks.at(rb.handle);
        for (uint32_t t = 0; t < b.n; ++t) {
          add(b.keys.data() + t * stride + static_cast<size_t>(j) * d, b.first_token + t,
              b.positions[t]);
        }
      }
      for (uint32_t t = 0; t < scope->pend_tokens.size(); ++t) {
        add(scope->pend_keys.data() + t * stride + static_cast<size_t>(j) * d,
            scope->pend_tokens[t], scope->pend_positions[t]);
      }
      if (logits_.empty()) continue;
      const float m = *std::max_element(logits_.begin(), logits_.end());
      double total = 0, on_fact = 0;
      for (size_t i = 0; i < logits_.size(); ++i) {
        const double e = std::exp(static_cast<double>(logits_[i] - m));
        total += e;
        if (row_tokens_[i] != 0) on_fact += e;
      }
      layer_mass += on_fact / total;
    }
    layer_mass /= p_.n_query_heads;
    mass_sum += layer_mass;
    if (layer_mass >= p_.pass_threshold) ++retrieving;
  }
  const bool pass = retrieving >= p_.min_layers;
  ++result_.probes;
  if (pass) ++result_.passes;
  ProbeRecord rec;
  rec.fact = fact;
  const double slots = static_cast<double>(p_.retrieval_layers.size()) * p_.n_kv_heads *
                       p_.fact_tokens;
  rec.resident = static_cast<double>(fact_seen) / slots;
  rec.distance = fact_seen == 0 ? 0 : fact_distance / static_cast<double>(fact_seen);
  rec.mass = mass_sum / static_cast<double>(p_.retrieval_layers.size());
  rec.layers = retrieving;
  rec.passed = pass;
  result_.probe_passed.push_back(pass);
  result_.probe_mass.push_back(rec.mass);
  result_.probe_records.push_back(rec);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Run::Evict(Scope& scope, const policy::ResidentBlock& block,
                                    bool stored) {
  uint64_t moved = 0;
  if (scope.recovering) {
    if (stored) {
      scope.source->SetResident(block.handle, false);
    } else {
      const uint64_t bytes = PayloadBytes(p_, block.n_tokens);
      auto it = scope.blocks.find(block.handle);
      if (it == scope.blocks.end()) return absl::InternalError("evicting an unknown block");
      const CachedBlock& b = it->second;
      // The payload of what the cache holds: the K it holds (f16 values,
      // rotated at the block's positions) and its V.
      uint8_t* out = region_->data();
      const uint32_t d = p_.head_dim;
      const uint64_t section = static_cast<uint64_t>(b.n) * p_.n_kv_heads * d * 2;
      for (uint32_t l = 0; l < p_.n_layers; ++l) {
        uint16_t* k = reinterpret_cast<uint16_t*>(out + l * 2 * section);
        uint16_t* v = reinterpret_cast<uint16_t*>(out + l * 2 * section + section);
        for (uint32_t t = 0; t < b.n; ++t) {
          for (uint32_t h = 0; h < p_.n_kv_heads; ++h) {
            const float* src = b.keys.data() +
                               (static_cast<size_t>(t) * p_.n_layers * p_.n_kv_heads +
                                l * p_.n_kv_heads + h) * d;
            const size_t at = (static_cast<size_t>(t) * p_.n_kv_heads + h) * d;
            for (uint32_t i = 0; i < d; ++i) {
              k[at + i] = FloatToHalf(src[i]);
              v[at + i] = ValueHalf(b.first_token + t, l, h, i);
            }
          }
        }
      }
      v1::BlockMeta meta = SessionBlockMeta(fp_, link_->session_id, block.handle, b.n, 0,
                                            p_.n_layers, static_cast<int32_t>(b.first_position));
      meta.set_token_offset(b.first_token);
      if (b.positions.back() - b.positions.front() + 1 != static_cast<int64_t>(b.n)) {
        for (int64_t pos : b.positions) meta.add_positions(static_cast<int32_t>(pos));
      }
      EVOKE_RETURN_IF_ERROR(
          link_->client->Save({BlockToSave(meta, region_->Slice(0, bytes))}).status());
      scope.source->Register(block.handle, BlockIdOf(meta), b.n);
      moved = bytes;
    }
  }
  scope.blocks.erase(block.handle);
  return moved;
}

absl::StatusOr<uint64_t> Run::Bring(Scope& scope, BlockHandle handle, uint32_t n_tokens,
                                    int64_t first_position) {
  std::optional<BlockId> id = scope.source->IdOf(handle);
  auto origin = scope.origin.find(handle);
  if (!id.has_value() || origin == scope.origin.end()) {
    return absl::InternalError(absl::StrCat("Bring of unknown block ", handle));
  }
  const int32_t at = static_cast<int32_t>(first_position);
  EVOKE_ASSIGN_OR_RETURN(std::vector<LoadedBlock> loaded,
                         link_->client->LoadReanchored({*id}, fp_, absl::MakeConstSpan(&at, 1)));
  if (loaded.size() != 1) return absl::InternalError("LoadReanchored returned no block");
  const std::string& payload = loaded[0].payload;
  const uint64_t first_token = origin->second.first;
  absl::Status check = CheckRecoveredBlock(
      s_, plan_, first_token, n_tokens, first_position,
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(payload.data()), payload.size()));
  if (!check.ok()) {
    // A hard error of the run (the driver would only count a failed Bring).
    verify_error_ = check;
    return check;
  }
  ++result_.blocks_verified;
  // Install what evoked returned.
  const uint32_t d = p_.head_dim;
  const uint32_t pairs = p_.n_layers * p_.n_kv_heads;
  CachedBlock b;
  b.first_token = first_token;
  b.n = n_tokens;
  b.first_position = first_position;
  for (uint32_t t = 0; t < n_tokens; ++t) b.positions.push_back(first_position + t);
  b.keys.resize(static_cast<size_t>(n_tokens) * pairs * d);
  const uint64_t section = static_cast<uint64_t>(n_tokens) * p_.n_kv_heads * d * 2;
  for (uint32_t l = 0; l < p_.n_layers; ++l) {
    const uint16_t* k = reinterpret_cast<const uint16_t*>(payload.data() + l * 2 * section);
    for (uint32_t t = 0; t < n_tokens; ++t) {
      for (uint32_t h = 0; h < p_.n_kv_heads; ++h) {
        const uint32_t pair = l * p_.n_kv_heads + h;
        float* dst = b.keys.data() + (static_cast<size_t>(t) * pairs + pair) * d;
        const uint16_t* src = k + (static_cast<size_t>(t) * p_.n_kv_heads + h) * d;
        for (uint32_t i = 0; i < d; ++i) dst[i] = HalfToFloat(src[i]);
      }
    }
  }
  scope.blocks[handle] = std::move(b);
  scope.source->SetResident(handle, true);
  return static_cast<uint64_t>(payload.size());
}

absl::StatusOr<RunResult> Run::Go() {
  EVOKE_RETURN_IF_ERROR(Setup());
  uint64_t token = 0;
  uint32_t query_index = 0;
  for (const Event& e : s_.script().events) {
    switch (e.kind) {
      case Event::Kind::kFiller:
      case Event::Kind::kFact:
        for (uint32_t i = 0; i < e.count; ++i) {
          EVOKE_RETURN_IF_ERROR(DecodeToken(token++, -1, 0));
        }
        break;
      case Event::Kind::kReference:
        for (uint32_t i = 0; i < e.count; ++i) {
          EVOKE_RETURN_IF_ERROR(DecodeToken(token++, e.fact, query_index++));
        }
        break;
      case Event::Kind::kRecovery:
        EVOKE_RETURN_IF_ERROR(RecoveryPoint(e.fact, query_index++));
        break;
      case Event::Kind::kProbe:
        EVOKE_RETURN_IF_ERROR(Probe(e.fact, query_index++));
        break;
    }
  }
  result_.decode_steps = token;
  for (const auto& sp : scopes_) {
    const policy::DriverStats& st = sp->driver->stats();
    // Recovery-less scopes drop what they evict: nothing is saved.
    if (sp->recovering) result_.blocks_saved += st.blocks_saved;
    result_.blocks_recovered += st.blocks_recovered;
    result_.bytes_moved += st.bytes_moved;
    result_.recovery_failures += st.recovery_failures;
    result_.engine_seconds += absl::ToDoubleSeconds(st.engine_time);
  }
  if (IsRecovering(config_.policy) && link_ != nullptr && link_->client != nullptr) {
    if (region_ != nullptr) {
      (void)link_->client->UnregisterRegion(region_->id());
      region_.reset();
    }
    (void)link_->client->DropSession(fp_.namespace_(), link_->session_id);
  }
  return result_;
}

}  // namespace

bool IsRecovering(const std::string& policy) { return policy == "infllm" || policy == "evoke"; }

absl::StatusOr<RunResult> RunSession(const Session& session, const RunConfig& config,
                                     const EvokedLink* link) {
  Run run(session, config, link);
  return run.Go();
}

uint64_t PayloadBytes(const SimParams& params, uint32_t n_tokens) {
  return static_cast<uint64_t>(params.n_layers) * n_tokens * params.n_kv_heads *
         params.head_dim * 2 * 2;
}

void CanonicalPayload(const Session& session, const RopePlan& plan, uint64_t first_token,
                      uint32_t n_tokens, int64_t first_position, uint8_t* out) {
  const SimParams& p = session.params();
  const uint32_t d = p.head_dim;
  const uint64_t section = static_cast<uint64_t>(n_tokens) * p.n_kv_heads * d * 2;
  std::vector<float> keys;
  for (uint32_t t = 0; t < n_tokens; ++t) {
    absl::Span<const float> pre = session.PreKeys(first_token + t);
    keys.assign(pre.begin(), pre.end());
    Rotate(plan, keys.data(), p.n_layers * p.n_kv_heads, first_position + t);
    for (uint32_t l = 0; l < p.n_layers; ++l) {
      uint16_t* k = reinterpret_cast<uint16_t*>(out + l * 2 * section);
      uint16_t* v = reinterpret_cast<uint16_t*>(out + l * 2 * section + section);
      for (uint32_t h = 0; h < p.n_kv_heads; ++h) {
        const size_t at = (static_cast<size_t>(t) * p.n_kv_heads + h) * d;
        const float* src = keys.data() + (static_cast<size_t>(l) * p.n_kv_heads + h) * d;
        for (uint32_t i = 0; i < d; ++i) {
          k[at + i] = FloatToHalf(src[i]);
          v[at + i] = ValueHalf(first_token + t, l, h, i);
        }
      }
    }
  }
}

absl::Status CheckRecoveredBlock(const Session& session, const RopePlan& plan,
                                 uint64_t first_token, uint32_t n_tokens,
                                 int64_t new_first_position, absl::Span<const uint8_t> payload) {
  const SimParams& p = session.params();
  if (payload.size() != PayloadBytes(p, n_tokens)) {
    return absl::InvalidArgumentError(absl::StrCat("payload: ", payload.size(), " bytes, expected ",
                                                   PayloadBytes(p, n_tokens)));
  }
  const uint32_t d = p.head_dim;
  const uint64_t section = static_cast<uint64_t>(n_tokens) * p.n_kv_heads * d * 2;
  // Partner of each dimension in its rotation pair (itself outside rotary).
  std::vector<uint32_t> partner(d);
  const uint32_t half = plan.rotary_dim / 2;
  for (uint32_t i = 0; i < d; ++i) {
    partner[i] = i;
    if (i < plan.rotary_dim) {
      if (plan.type == v1::ROPE_NEOX) {
        partner[i] = i < half ? i + half : i - half;
      } else if (plan.type == v1::ROPE_NORM) {
        partner[i] = i ^ 1u;
      }
    }
  }
  std::vector<float> expect;
  for (uint32_t t = 0; t < n_tokens; ++t) {
    absl::Span<const float> pre = session.PreKeys(first_token + t);
    expect.assign(pre.begin(), pre.end());
    Rotate(plan, expect.data(), p.n_layers * p.n_kv_heads, new_first_position + t);
    for (uint32_t l = 0; l < p.n_layers; ++l) {
      const uint16_t* k = reinterpret_cast<const uint16_t*>(payload.data() + l * 2 * section);
      const uint16_t* v =
          reinterpret_cast<const uint16_t*>(payload.data() + l * 2 * section + section);
      for (uint32_t h = 0; h < p.n_kv_heads; ++h) {
        const size_t at = (static_cast<size_t>(t) * p.n_kv_heads + h) * d;
        const float* e = expect.data() + (static_cast<size_t>(l) * p.n_kv_heads + h) * d;
        for (uint32_t i = 0; i < d; ++i) {
          uint16_t kb, vb;
          std::memcpy(&kb, k + at + i, 2);
          std::memcpy(&vb, v + at + i, 2);
          const float got = HalfToFloat(kb);
          const float pair_norm = std::hypot(e[i], e[partner[i]]);
          const float tol = 4e-3f * pair_norm + 1e-3f;
          if (!(std::fabs(got - e[i]) <= tol)) {
            return absl::InternalError(absl::StrCat(
                "recovered K differs from RoPE(pre-RoPE key, new position): token ",
                first_token + t, " layer ", l, " head ", h, " dim ", i, ": got ", got,
                ", expected ", e[i], " at position ", new_first_position + t));
          }
          if (vb != ValueHalf(first_token + t, l, h, i)) {
            return absl::InternalError(absl::StrCat("recovered V differs: token ", first_token + t,
                                                    " layer ", l, " head ", h, " dim ", i));
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace evoke::sim
