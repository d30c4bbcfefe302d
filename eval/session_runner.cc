#include "eval/session_runner.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engines/llama/attention_capture.h"
#include "engines/llama/kv_adapter.h"
#include "engines/llama/policy_engine.h"
#include "engines/llama/random_model.h"
#include "common/status_macros.h"

namespace evoke::eval {
namespace {

using Clock = std::chrono::steady_clock;

int32_t Argmax(llama_context* ctx, int32_t n_vocab) {
  const float* l = llama_get_logits_ith(ctx, -1);
  return static_cast<int32_t>(std::max_element(l, l + n_vocab) - l);
}

llama_context_params ContextParams(uint32_t n_ctx, int threads) {
  llama_context_params p = llama_context_default_params();
  p.n_ctx = n_ctx;
  p.n_batch = 512;
  p.n_ubatch = 512;
  p.n_seq_max = 2;
  p.kv_unified = true;
  p.n_threads = threads;
  p.n_threads_batch = threads;
  p.type_k = GGML_TYPE_F16;
  p.type_v = GGML_TYPE_F16;
  // Without flash attention llama.cpp materialises the softmax'd scores and
  // AttentionCapture copies them; with it, the capture recomputes them from
  // Q and K, which made a decode step 3-5x slower here (perf: 33% of the
  // time in AttentionCapture::Take and f16 conversion).
  p.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  return p;
}

absl::StatusOr<SessionResult> RunFull(llama_model* model, const Session& s, int threads) {
  const auto start = Clock::now();
  const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  llama_context_params p = ContextParams(static_cast<uint32_t>(s.tokens.size()) + 16, threads);
  p.n_seq_max = 1;
  llama::ContextPtr ctx(llama_init_from_model(model, p));
  if (ctx == nullptr) return absl::InternalError("llama_init_from_model failed");
  SessionResult r;
  size_t cursor = 0;
  for (const Probe& probe : s.probes) {
    std::vector<llama_token> prompt(s.tokens.begin() + cursor, s.tokens.begin() + probe.answer_first);
    if (!llama::DecodeTokens(ctx.get(), prompt, static_cast<llama_pos>(cursor))) {
      return absl::InternalError(absl::StrCat("llama_decode failed before position ", probe.answer_first));
    }
    r.steps += prompt.size();
    ProbeResult pr;
    llama_pos pos = static_cast<llama_pos>(probe.answer_first);
    for (size_t i = 0; i < probe.answer.size(); ++i) {
      const int32_t t = Argmax(ctx.get(), n_vocab);
      pr.generated.push_back(t);
      if (!llama::DecodeTokens(ctx.get(), {t}, pos++)) {
        return absl::InternalError("llama_decode failed while generating");
      }
      ++r.steps;
    }
    pr.pass = pr.generated == probe.answer;
    r.passes += pr.pass;
    r.probes.push_back(std::move(pr));
    cursor = probe.answer_first + probe.answer.size();
  }
  r.max_cells = s.tokens.size();
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

// Which session token each cache position holds, and which tokens each
// evicted block took with it (through the engine's observer).
class TokenBooks {
 public:
  void Decoded(int64_t position, int64_t token_index) {
    if (static_cast<size_t>(position) >= by_position_.size()) {
      by_position_.resize(static_cast<size_t>(position) + 1, -1);
    }
    by_position_[static_cast<size_t>(position)] = token_index;
  }
  void Observe(policy::BlockHandle handle, int64_t first, uint32_t n, bool bring) {
    if (!bring) {
      std::vector<int64_t>& tokens = by_handle_[handle];
      tokens.clear();
      for (uint32_t i = 0; i < n; ++i) tokens.push_back(At(first + i));
      return;
    }
    auto it = by_handle_.find(handle);
    for (uint32_t i = 0; i < n; ++i) {
      Decoded(first + i, it == by_handle_.end() || i >= it->second.size() ? -1 : it->second[i]);
    }
  }
  int64_t At(int64_t position) const {
    return position >= 0 && static_cast<size_t>(position) < by_position_.size()
               ? by_position_[static_cast<size_t>(position)]
               : -1;
  }
  const absl::flat_hash_map<policy::BlockHandle, std::vector<int64_t>>& by_handle() const {
    return by_handle_;
  }

 private:
  std::vector<int64_t> by_position_;
  absl::flat_hash_map<policy::BlockHandle, std::vector<int64_t>> by_handle_;
};

bool Holds(const std::vector<int64_t>& tokens, uint32_t first, uint32_t last) {
  return std::any_of(tokens.begin(), tokens.end(),
                     [&](int64_t t) { return t >= first && t < last; });
}

}  // namespace

absl::StatusOr<SessionResult> RunSession(llama_model* model, Client* client,
                                         const Session& s, const RunOptions& o) {
  if (o.policy == kFullPolicy) return RunFull(model, s, o.threads);
  if (client == nullptr) return absl::InvalidArgumentError("client: required for a policy run");
  if (o.session_id.empty()) return absl::InvalidArgumentError("session_id: required");
  EVOKE_RETURN_IF_ERROR(policy::ValidateBudget(o.policy, o.params, o.budget_tokens));
  const auto start = Clock::now();
  const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  const uint32_t n_head = static_cast<uint32_t>(llama_model_n_head(model));

  llama::AttentionCapture capture(
      {.layers = {}, .query_layer = static_cast<int32_t>(o.summary_layer)});
  llama_context_params p = ContextParams(
      static_cast<uint32_t>(o.budget_tokens) + 3 * o.params.block_tokens + 64, o.threads);
  capture.Install(p);
  llama::ContextPtr ctx(llama_init_from_model(model, p));
  if (ctx == nullptr) return absl::InternalError("llama_init_from_model failed");
  llama::AdapterOptions ao;
  ao.ns = o.ns;
  ao.model_id = "evoke-eval";
  ao.session_id = o.session_id;
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<llama::KvAdapter> adapter,
                         llama::KvAdapter::Open(ctx.get(), p, client, ao));
  llama::SessionOptions so;
  so.policy = o.policy;
  so.params = o.params;
  so.budget_tokens = o.budget_tokens;
  so.summary_layer = o.summary_layer;
  so.prefetch = o.prefetch;
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<llama::LlamaPolicySession> session,
                         llama::LlamaPolicySession::Create(ctx.get(), &capture, adapter.get(),
                                                           client, o.ns, o.session_id, so));
  TokenBooks books;
  session->engine().set_observer(
      [&books](policy::BlockHandle h, int64_t first, uint32_t n, bool bring) {
        books.Observe(h, first, n, bring);
      });
  const bool recovers = session->policy_info().recovers;
  SessionResult r;
  auto decode = [&](llama_token t, int64_t token_index) -> absl::Status {
    const int64_t pos = session->next_position();
    EVOKE_RETURN_IF_ERROR(session->Decode(t));
    books.Decoded(pos, token_index);
    ++r.steps;
    return absl::OkStatus();
  };
  // The rank of the block holding [first, last) among Recover's candidates
  // for the engine's current query; -1 when a resident block holds it.
  auto fact_rank = [&](uint32_t first, uint32_t last) -> int32_t {
    for (int64_t pos = 0; pos < session->next_position(); ++pos) {
      const int64_t t = books.At(pos);
      if (t >= first && t < last) {
        // Positions are never reused (recoveries land at the tail), so the
        // token is resident iff a resident block or the pending tokens
        // cover its position.
        for (const policy::ResidentBlock& b : session->driver().resident()) {
          if (pos >= b.first_position && pos < b.first_position + b.n_tokens) return -1;
        }
        if (pos >= session->next_position() -
                       static_cast<int64_t>(session->driver().pending_tokens())) {
          return -1;
        }
      }
    }
    const std::vector<float>& q = capture.recovery_query();
    if (q.empty()) return 0;
    auto hits = adapter->Recover(q, n_head, o.summary_layer, kRankDepth);
    if (!hits.ok()) return 0;
    absl::flat_hash_map<BlockId, policy::BlockHandle> handle_of;
    for (const auto& [h, tokens] : books.by_handle()) {
      (void)tokens;
      if (auto id = session->engine().IdOf(h); id.has_value()) handle_of[*id] = h;
    }
    for (size_t i = 0; i < hits->size(); ++i) {
      auto id = BlockId::FromBytes((*hits)[i].id());
      if (!id.ok()) continue;
      auto it = handle_of.find(*id);
      if (it == handle_of.end()) continue;
      if (Holds(books.by_handle().at(it->second), first, last)) return static_cast<int32_t>(i + 1);
    }
    return 0;
  };

  size_t cursor = 0;
  for (const Probe& probe : s.probes) {
    for (; cursor + 1 < probe.answer_first; ++cursor) {
      EVOKE_RETURN_IF_ERROR(decode(s.tokens[cursor], static_cast<int64_t>(cursor)));
    }
    ProbeResult pr;
    // The answer's value tokens: the fact's last four are "D D D .".
    const uint32_t value_first = probe.fact_last - 1 - static_cast<uint32_t>(probe.answer.size());
    pr.fact_rank = recovers ? fact_rank(value_first, probe.fact_last - 1) : -1;
    EVOKE_RETURN_IF_ERROR(session->RecoverAtPromptEnd());
    EVOKE_RETURN_IF_ERROR(decode(s.tokens[cursor], static_cast<int64_t>(cursor)));
    ++cursor;
    for (size_t i = 0; i < probe.answer.size(); ++i) {
      const int32_t t = Argmax(ctx.get(), n_vocab);
      pr.generated.push_back(t);
      EVOKE_RETURN_IF_ERROR(decode(t, static_cast<int64_t>(cursor)));
      ++cursor;
    }
    pr.pass = pr.generated == probe.answer;
    r.passes += pr.pass;
    r.probes.push_back(std::move(pr));
  }
  const policy::DriverStats& d = session->driver_stats();
  r.blocks_saved = d.blocks_saved;
  r.blocks_recovered = d.blocks_recovered;
  r.recovery_failures = d.recovery_failures;
  r.recovery_points = d.recovery_points;
  r.max_cells = session->max_cells_used();
  const llama::EngineStats& e = session->engine_stats();
  r.bring_seconds = absl::ToDoubleSeconds(e.bring_time);
  r.brought_tier1 = e.brought_tier1;
  r.brought_tier2 = e.brought_tier2;
  r.prefetched = session->prefetched();
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  (void)client->DropSession(o.ns, o.session_id);
  return r;
}

}  // namespace evoke::eval
