// The C API of the policies (include/evoke/evoke_policy.h) over
// evoke::policy.
#include "evoke/evoke_policy.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/chain_hash.h"
#include "evoke/client.h"
#include "policy/attention_stats.h"
#include "policy/evoked_source.h"
#include "policy/policy.h"

struct evoke_policy {
  std::unique_ptr<evoke::policy::Policy> policy;
};

struct evoke_attention_stats {
  explicit evoke_attention_stats(const evoke::policy::AttentionStats::Options& o) : stats(o) {}
  evoke::policy::AttentionStats stats;
};

struct evoke_recovery_source {
  std::unique_ptr<evoke::policy::RecoverySource> source;
  // Connected sources only.
  std::unique_ptr<evoke::Client> client;
  evoke::policy::EvokedRecoverySource* evoked = nullptr;
  std::string ns;
  std::string session;
};

namespace {

namespace policy = evoke::policy;

thread_local std::string last_error;

evoke_status Fail(const absl::Status& s) {
  last_error = s.ok() ? "" : s.ToString();
  return static_cast<evoke_status>(s.code());
}

evoke_status Invalid(absl::string_view message) {
  return Fail(absl::InvalidArgumentError(message));
}

absl::StatusOr<policy::PolicyParams> Params(const char* spec) {
  policy::PolicyParams params;
  if (spec != nullptr) {
    if (absl::Status s = policy::ParsePolicyParams(spec, &params); !s.ok()) return s;
  }
  return params;
}

// A RecoverySource over a C callback.
class CallbackSource final : public policy::RecoverySource {
 public:
  CallbackSource(evoke_rank_fn rank, void* user) : rank_(rank), user_(user) {}
  absl::StatusOr<std::vector<policy::Candidate>> Rank(const policy::RecoveryQuery& query,
                                                      uint32_t k,
                                                      std::optional<float> min_score) override {
    std::vector<evoke_candidate> out(k);
    size_t n = 0;
    const uint32_t head_dim =
        query.n_query_heads == 0 ? 0 : static_cast<uint32_t>(query.queries.size() / query.n_query_heads);
    const float min = min_score.value_or(0.0f);
    const evoke_status st = rank_(user_, query.queries.data(), query.n_query_heads, head_dim, k,
                                  min_score.has_value() ? &min : nullptr, out.data(), &n);
    if (st != EVOKE_OK) {
      return absl::Status(static_cast<absl::StatusCode>(st),
                          absl::StrCat("recovery source callback returned ", static_cast<int>(st)));
    }
    if (n > k) return absl::InvalidArgumentError(absl::StrCat("n_out: ", n, " exceeds k ", k));
    std::vector<policy::Candidate> candidates;
    for (size_t i = 0; i < n; ++i) {
      candidates.push_back({out[i].handle, out[i].score, out[i].n_tokens});
    }
    return candidates;
  }

 private:
  evoke_rank_fn rank_;
  void* user_;
};

// The C++ view of a C view; `blocks` holds the converted blocks.
policy::CacheView ToView(const evoke_cache_view& v, std::vector<policy::ResidentBlock>* blocks) {
  blocks->resize(v.n_resident);
  for (size_t i = 0; i < v.n_resident; ++i) {
    const evoke_resident_block& r = v.resident[i];
    policy::ResidentBlock& b = (*blocks)[i];
    b.handle = r.handle;
    b.first_token = r.first_token;
    b.n_tokens = r.n_tokens;
    b.first_position = r.first_position;
    b.recovered = r.recovered != 0;
    b.summary = r.summary != nullptr ? absl::Span<const float>(r.summary, r.summary_len)
                                     : absl::Span<const float>();
  }
  policy::CacheView view;
  view.layer = v.layer;
  view.head = v.head;
  view.budget_tokens = v.budget_tokens;
  view.pending_tokens = v.pending_tokens;
  view.session_tokens = v.session_tokens;
  view.resident = *blocks;
  view.attention = v.attention != nullptr ? &v.attention->stats : nullptr;
  return view;
}

absl::Status CheckView(const evoke_cache_view* view) {
  if (view == nullptr) return absl::InvalidArgumentError("view: NULL");
  if (view->n_resident > 0 && view->resident == nullptr) {
    return absl::InvalidArgumentError("view.resident: NULL with n_resident > 0");
  }
  return absl::OkStatus();
}

}  // namespace

extern "C" {

const char* evoke_policy_last_error(void) { return last_error.c_str(); }

evoke_status evoke_policy_create(const char* name, const char* spec, evoke_policy** out) {
  if (name == nullptr) return Invalid("name: NULL");
  if (out == nullptr) return Invalid("out: NULL");
  absl::StatusOr<policy::PolicyParams> params = Params(spec);
  if (!params.ok()) return Fail(params.status());
  absl::StatusOr<std::unique_ptr<policy::Policy>> p = policy::MakePolicy(name, *params);
  if (!p.ok()) return Fail(p.status());
  *out = new evoke_policy{std::move(p).value()};
  return Fail(absl::OkStatus());
}

void evoke_policy_destroy(evoke_policy* policy) { delete policy; }

void evoke_policy_describe(const evoke_policy* policy, int* recovers, int* needs_attention) {
  if (policy == nullptr) return;
  if (recovers != nullptr) *recovers = policy->policy->info().recovers ? 1 : 0;
  if (needs_attention != nullptr) *needs_attention = policy->policy->info().needs_attention ? 1 : 0;
}

evoke_status evoke_policy_validate_budget(const char* name, const char* spec,
                                          uint64_t budget_tokens) {
  if (name == nullptr) return Invalid("name: NULL");
  absl::StatusOr<policy::PolicyParams> params = Params(spec);
  if (!params.ok()) return Fail(params.status());
  return Fail(policy::ValidateBudget(name, *params, budget_tokens));
}

evoke_status evoke_policy_choose_evictions(evoke_policy* policy, const evoke_cache_view* view,
                                           uint64_t incoming_tokens, uint64_t* out, size_t cap,
                                           size_t* n_out) {
  if (policy == nullptr) return Invalid("policy: NULL");
  if (absl::Status s = CheckView(view); !s.ok()) return Fail(s);
  if (n_out == nullptr) return Invalid("n_out: NULL");
  if (out == nullptr && cap > 0) return Invalid("out: NULL with cap > 0");
  std::vector<policy::ResidentBlock> blocks;
  const policy::CacheView v = ToView(*view, &blocks);
  absl::StatusOr<std::vector<policy::BlockHandle>> chosen =
      policy->policy->ChooseEvictions(v, incoming_tokens);
  if (!chosen.ok()) return Fail(chosen.status());
  *n_out = chosen->size();
  if (chosen->size() > cap) {
    return Fail(absl::ResourceExhaustedError(
        absl::StrCat("cap: ", cap, " entries, ", chosen->size(), " needed")));
  }
  std::copy(chosen->begin(), chosen->end(), out);
  return Fail(absl::OkStatus());
}

evoke_status evoke_policy_choose_recoveries(evoke_policy* policy, const evoke_cache_view* view,
                                            const float* queries, uint32_t n_query_heads,
                                            uint32_t head_dim, evoke_recovery_source* source,
                                            evoke_candidate* out, size_t cap, size_t* n_out) {
  if (policy == nullptr) return Invalid("policy: NULL");
  if (absl::Status s = CheckView(view); !s.ok()) return Fail(s);
  if (queries == nullptr) return Invalid("queries: NULL");
  if (n_query_heads == 0) return Invalid("n_query_heads: 0");
  if (head_dim == 0) return Invalid("head_dim: 0");
  if (source == nullptr) return Invalid("source: NULL");
  if (n_out == nullptr) return Invalid("n_out: NULL");
  if (out == nullptr && cap > 0) return Invalid("out: NULL with cap > 0");
  std::vector<policy::ResidentBlock> blocks;
  const policy::CacheView v = ToView(*view, &blocks);
  const policy::RecoveryQuery query{
      absl::Span<const float>(queries, static_cast<size_t>(n_query_heads) * head_dim),
      n_query_heads};
  absl::StatusOr<std::vector<policy::Candidate>> chosen =
      policy->policy->ChooseRecoveries(v, query, *source->source);
  if (!chosen.ok()) return Fail(chosen.status());
  *n_out = chosen->size();
  if (chosen->size() > cap) {
    return Fail(absl::ResourceExhaustedError(
        absl::StrCat("cap: ", cap, " entries, ", chosen->size(), " needed")));
  }
  for (size_t i = 0; i < chosen->size(); ++i) {
    out[i] = evoke_candidate{(*chosen)[i].handle, (*chosen)[i].score, (*chosen)[i].n_tokens};
  }
  return Fail(absl::OkStatus());
}

evoke_status evoke_attention_stats_create(uint32_t n_layers, uint32_t n_heads, uint32_t window,
                                          uint32_t pool_kernel, uint32_t token_layer,
                                          evoke_attention_stats** out) {
  if (out == nullptr) return Invalid("out: NULL");
  *out = nullptr;
  if (uint64_t{std::max(1u, n_layers)} * std::max(1u, n_heads) >
      policy::AttentionStats::kMaxRows) {
    return Invalid(absl::StrCat("n_layers, n_heads: ", n_layers, " x ", n_heads,
                                " rows is above ", policy::AttentionStats::kMaxRows));
  }
  *out = new evoke_attention_stats(policy::AttentionStats::Options{
      .n_layers = n_layers, .n_heads = n_heads, .window = window, .pool_kernel = pool_kernel,
      .token_layer = token_layer});
  return Fail(absl::OkStatus());
}

void evoke_attention_stats_destroy(evoke_attention_stats* stats) { delete stats; }

evoke_status evoke_attention_stats_observe(evoke_attention_stats* stats, uint32_t layer,
                                           uint32_t head, const uint64_t* block_of_token,
                                           const uint32_t* token_in_block, const float* weights,
                                           size_t n_tokens) {
  if (stats == nullptr) return Invalid("stats: NULL");
  if (n_tokens > 0 && (block_of_token == nullptr || weights == nullptr)) {
    return Invalid("block_of_token, weights: NULL with n_tokens > 0");
  }
  static_assert(sizeof(uint64_t) == sizeof(policy::BlockHandle));
  return Fail(stats->stats.Observe(
      layer, head, absl::Span<const policy::BlockHandle>(block_of_token, n_tokens),
      token_in_block != nullptr ? absl::Span<const uint32_t>(token_in_block, n_tokens)
                                : absl::Span<const uint32_t>(),
      absl::Span<const float>(weights, n_tokens)));
}

void evoke_attention_stats_end_step(evoke_attention_stats* stats) {
  if (stats != nullptr) stats->stats.EndStep();
}

void evoke_attention_stats_forget(evoke_attention_stats* stats, uint64_t block) {
  if (stats != nullptr) stats->stats.Forget(block);
}

double evoke_attention_stats_cumulative(const evoke_attention_stats* stats, uint64_t block,
                                        int32_t layer, int32_t head) {
  return stats == nullptr ? 0.0 : stats->stats.Cumulative(block, layer, head);
}

double evoke_attention_stats_window(const evoke_attention_stats* stats, uint64_t block,
                                    int32_t layer, int32_t head) {
  return stats == nullptr ? 0.0 : stats->stats.Window(block, layer, head);
}

evoke_status evoke_recovery_source_from_callback(evoke_rank_fn rank, void* user,
                                                 evoke_recovery_source** out) {
  if (rank == nullptr) return Invalid("rank: NULL");
  if (out == nullptr) return Invalid("out: NULL");
  auto* s = new evoke_recovery_source;
  s->source = std::make_unique<CallbackSource>(rank, user);
  *out = s;
  return Fail(absl::OkStatus());
}

evoke_status evoke_recovery_source_connect(const char* socket, const char* ns,
                                           const char* session, uint32_t layer,
                                           evoke_recovery_source** out) {
  if (ns == nullptr || *ns == '\0') return Invalid("ns: NULL or empty");
  if (session == nullptr || *session == '\0') return Invalid("session: NULL or empty");
  if (out == nullptr) return Invalid("out: NULL");
  evoke::ClientOptions options;
  options.target = socket != nullptr ? socket : "";
  absl::StatusOr<std::unique_ptr<evoke::Client>> client = evoke::Client::Connect(options);
  if (!client.ok()) return Fail(client.status());
  auto* s = new evoke_recovery_source;
  s->client = std::move(client).value();
  s->ns = ns;
  s->session = session;
  auto evoked = std::make_unique<policy::EvokedRecoverySource>(
      s->client.get(), policy::EvokedSourceOptions{.ns = ns, .session_id = session, .layer = layer});
  s->evoked = evoked.get();
  s->source = std::move(evoked);
  *out = s;
  return Fail(absl::OkStatus());
}

evoke_status evoke_recovery_source_register(evoke_recovery_source* source, uint64_t handle,
                                            uint64_t seq, uint32_t n_tokens) {
  if (source == nullptr) return Invalid("source: NULL");
  if (source->evoked == nullptr) {
    return Fail(absl::FailedPreconditionError("source: not a connected source"));
  }
  source->evoked->Register(handle, evoke::SessionBlockId(source->ns, source->session, seq),
                           n_tokens);
  return Fail(absl::OkStatus());
}

evoke_status evoke_recovery_source_set_resident(evoke_recovery_source* source, uint64_t handle,
                                                int resident) {
  if (source == nullptr) return Invalid("source: NULL");
  if (source->evoked == nullptr) {
    return Fail(absl::FailedPreconditionError("source: not a connected source"));
  }
  source->evoked->SetResident(handle, resident != 0);
  return Fail(absl::OkStatus());
}

evoke_status evoke_recovery_source_forget(evoke_recovery_source* source, uint64_t handle) {
  if (source == nullptr) return Invalid("source: NULL");
  if (source->evoked == nullptr) {
    return Fail(absl::FailedPreconditionError("source: not a connected source"));
  }
  source->evoked->Forget(handle);
  return Fail(absl::OkStatus());
}

void evoke_recovery_source_destroy(evoke_recovery_source* source) {
  if (source == nullptr) return;
  source->source.reset();  // Before the client it uses.
  delete source;
}

}  // extern "C"
