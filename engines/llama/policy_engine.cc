#include "engines/llama/policy_engine.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/block_validation.h"
#include "common/status_macros.h"
#include "common/summaries.h"
#include "engines/llama/random_model.h"
#include "evoke/client.h"

namespace evoke::llama {

LlamaBlockEngine::LlamaBlockEngine(llama_context* ctx, KvAdapter* adapter,
                                   policy::EvokedRecoverySource* source, EngineOptions options,
                                   const policy::AttentionStats* attention)
    : ctx_(ctx), adapter_(adapter), source_(source), options_(options), attention_(attention) {}

std::optional<BlockId> LlamaBlockEngine::IdOf(policy::BlockHandle handle) const {
  auto it = ids_.find(handle);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<uint64_t> LlamaBlockEngine::Evict(const policy::ResidentBlock& block,
                                                 bool stored) {
  const llama_pos p0 = static_cast<llama_pos>(block.first_position);
  const llama_pos p1 = p0 + static_cast<llama_pos>(block.n_tokens);
  if (observer_) observer_(block.handle, block.first_position, block.n_tokens, false);
  if (stored && ids_.contains(block.handle)) {
    // evoked holds it already: just let the cells go.
    if (!llama_memory_seq_rm(llama_get_memory(ctx_), adapter_->seq(), p0, p1)) {
      return absl::InternalError(
          absl::StrCat("llama_memory_seq_rm refused [", p0, ", ", p1, ")"));
    }
    if (source_ != nullptr) source_->SetResident(block.handle, false);
    pending_mass_.erase(block.handle);
    ++stats_.evicted_dropped;
    ++changes_;
    return uint64_t{0};
  }
  std::vector<v1::Summary> summaries;
  if (options_.repr_tokens > 0 && attention_ != nullptr) {
    absl::StatusOr<v1::Summary> repr = ReprKeys(block);
    if (repr.ok()) {
      summaries.push_back(*std::move(repr));
      ++stats_.repr_summaries;
    }
  }
  absl::StatusOr<EvictedBlock> evicted = adapter_->Evict(p0, p1, summaries);
  if (!evicted.ok()) {
    if (evicted.status().code() != absl::StatusCode::kUnavailable ||
        !options_.drop_unsaved_when_down) {
      return evicted.status();
    }
    // evoked is down: the block is lost, decoding goes on within budget.
    if (!llama_memory_seq_rm(llama_get_memory(ctx_), adapter_->seq(), p0, p1)) {
      return absl::InternalError(
          absl::StrCat("llama_memory_seq_rm refused [", p0, ", ", p1, ")"));
    }
    ++stats_.blocks_lost;
    ++changes_;
    return uint64_t{0};
  }
  pending_mass_.erase(block.handle);
  ids_[block.handle] = evicted->id;
  if (source_ != nullptr) source_->Register(block.handle, evicted->id, block.n_tokens, false);
  ++stats_.evicted_saved;
  ++changes_;
  return evicted->payload_bytes;
}

absl::StatusOr<uint64_t> LlamaBlockEngine::Bring(policy::BlockHandle handle, uint32_t n_tokens,
                                                 int64_t first_position) {
  auto it = ids_.find(handle);
  if (it == ids_.end()) {
    return absl::NotFoundError(absl::StrCat("block ", handle, " was never saved by this engine"));
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<SplicedBlock> spliced =
      adapter_->Splice(it->second, static_cast<llama_pos>(first_position));
  stats_.bring_time += absl::Now() - start;
  if (!spliced.ok()) return spliced.status();
  switch (spliced->served_from) {
    case v1::TIER_PINNED_HOST: ++stats_.brought_tier1; break;
    case v1::TIER_SPILL: ++stats_.brought_tier2; break;
    default: ++stats_.brought_remote; break;
  }
  ++changes_;
  if (spliced->positions.size() != n_tokens) {
    return absl::InternalError(absl::StrCat("block ", handle, " came back with ",
                                            spliced->positions.size(), " tokens, expected ",
                                            n_tokens));
  }
  if (source_ != nullptr) source_->SetResident(handle, true);
  ++stats_.brought;
  if (observer_) observer_(handle, first_position, n_tokens, true);
  return CanonicalPayloadBytes(adapter_->fingerprint(), n_tokens, adapter_->format().n_layer);
}

absl::StatusOr<v1::Summary> LlamaBlockEngine::ReprKeys(const policy::ResidentBlock& block) {
  const CacheFormat& f = adapter_->format();
  const size_t n = size_t{block.n_tokens} * f.n_kv_heads;
  // The mass the block received as a block, plus what its tokens received
  // while they were pending (AddPendingMass).
  std::vector<float> mass(n, 0.0f);
  bool any = false;
  if (const absl::Span<const float> m = attention_->TokenMass(block.handle); !m.empty()) {
    for (size_t i = 0; i < std::min(n, m.size()); ++i) mass[i] += m[i];
    any = true;
  }
  if (auto it = pending_mass_.find(block.handle); it != pending_mass_.end()) {
    for (size_t i = 0; i < std::min(n, it->second.size()); ++i) mass[i] += it->second[i];
    any = true;
  }
  if (!any) return absl::NotFoundError("no per-token attention for the block");
  const llama_pos p0 = static_cast<llama_pos>(block.first_position);
  EVOKE_ASSIGN_OR_RETURN(CanonicalRange range,
                         adapter_->Read(p0, p0 + static_cast<llama_pos>(block.n_tokens)));
  if (range.positions.size() != block.n_tokens) {
    return absl::FailedPreconditionError("the block's cells are not all in the cache");
  }
  v1::BlockMeta meta = SessionBlockMeta(adapter_->fingerprint(), "summary", 0, block.n_tokens, 0,
                                        f.n_layer, range.positions.front());
  return ReprKeysSummary(meta, reinterpret_cast<const uint8_t*>(range.payload.data()),
                         range.payload.size(), options_.repr_layer, mass,
                         std::min(options_.repr_tokens, block.n_tokens));
}

absl::StatusOr<std::vector<float>> LlamaBlockEngine::MeanKeys(int64_t first_position,
                                                              uint32_t n_tokens, uint32_t layer) {
  const llama_pos p0 = static_cast<llama_pos>(first_position);
  EVOKE_ASSIGN_OR_RETURN(CanonicalRange range,
                         adapter_->Read(p0, p0 + static_cast<llama_pos>(n_tokens)));
  const CacheFormat& f = adapter_->format();
  v1::BlockMeta meta = SessionBlockMeta(adapter_->fingerprint(), "summary", 0,
                                        static_cast<uint32_t>(range.positions.size()), 0,
                                        f.n_layer, range.positions.front());
  if (range.positions.back() - range.positions.front() + 1 !=
      static_cast<int32_t>(range.positions.size())) {
    for (int32_t p : range.positions) meta.add_positions(p);
  }
  EVOKE_ASSIGN_OR_RETURN(
      v1::Summary summary,
      MeanKeysSummary(meta, reinterpret_cast<const uint8_t*>(range.payload.data()),
                      range.payload.size(), layer));
  return std::vector<float>(summary.values().begin(), summary.values().end());
}

absl::StatusOr<std::unique_ptr<LlamaPolicySession>> LlamaPolicySession::Create(
    llama_context* ctx, AttentionCapture* capture, KvAdapter* adapter, Client* client,
    const std::string& ns, const std::string& session_id, SessionOptions options) {
  if (ctx == nullptr || adapter == nullptr || client == nullptr) {
    return absl::InvalidArgumentError("ctx, adapter and client are required");
  }
  EVOKE_RETURN_IF_ERROR(
      policy::ValidateBudget(options.policy, options.params, options.budget_tokens));
  auto s = std::unique_ptr<LlamaPolicySession>(new LlamaPolicySession());
  s->ctx_ = ctx;
  s->capture_ = capture;
  s->adapter_ = adapter;
  s->options_ = std::move(options);
  const SessionOptions& o = s->options_;
  EVOKE_ASSIGN_OR_RETURN(s->policy_, policy::MakePolicy(o.policy, o.params));
  const policy::PolicyInfo& info = s->policy_->info();
  if ((info.needs_attention || info.recovers) && capture == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy ", info.name, " needs an AttentionCapture installed in the context"));
  }
  const llama_model* model = llama_get_model(ctx);
  s->n_head_kv_ = static_cast<uint32_t>(llama_model_n_head_kv(model));
  const bool repr_keys = info.name == "infllm" && o.infllm_repr_keys;
  // What the capture must record: the recovery query of the summary layer
  // (recovering policies), and that layer's attention (representative keys).
  if (capture != nullptr) {
    const AttentionCaptureOptions& co = capture->options();
    const int32_t summary = static_cast<int32_t>(o.summary_layer);
    if (info.recovers && co.query_layer != summary) {
      return absl::InvalidArgumentError(absl::StrCat(
          "capture: query_layer is ", co.query_layer, ", but policy ", info.name,
          " recovers with the query of summary_layer ", summary));
    }
    const bool all_layers = co.layers.empty();
    if (repr_keys && !all_layers &&
        std::find(co.layers.begin(), co.layers.end(), summary) == co.layers.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "capture: layers leave out summary_layer ", summary,
          ", whose attention infllm's representative keys need"));
    }
  }
  if (info.needs_attention || repr_keys) {
    policy::AttentionStats::Options ao;
    ao.n_layers = static_cast<uint32_t>(llama_model_n_layer(model));
    ao.n_heads = s->n_head_kv_;
    ao.window = o.params.snapkv_window;
    ao.pool_kernel = o.params.snapkv_pool_kernel;
    ao.token_layer = o.summary_layer;
    s->stats_ = std::make_unique<policy::AttentionStats>(ao);
  }
  if (info.recovers) {
    policy::EvokedSourceOptions so;
    so.ns = ns;
    so.session_id = session_id;
    so.layer = o.summary_layer;
    so.prefetch = o.prefetch;
    if (repr_keys) so.kind = v1::SUMMARY_REPR_KEYS;
    s->source_ = std::make_unique<policy::EvokedRecoverySource>(client, so);
  }
  s->repr_keys_ = repr_keys;
  EngineOptions eo = o.engine;
  if (repr_keys) {
    eo.repr_tokens = o.params.infllm_repr_tokens;
    eo.repr_layer = o.summary_layer;
  }
  s->engine_ = std::make_unique<LlamaBlockEngine>(ctx, adapter, s->source_.get(), eo,
                                                  s->stats_.get());
  policy::DriverOptions d;
  d.budget_tokens = o.budget_tokens;
  d.block_tokens = o.params.block_tokens;
  d.sink_tokens = o.params.sink_tokens;
  s->driver_ = std::make_unique<policy::SessionDriver>(s->policy_.get(), s->engine_.get(),
                                                       s->source_.get(), s->stats_.get(), d);
  s->cells_ = std::make_unique<CellPositions>(ctx, adapter->seq());
  const bool empty = llama_memory_seq_pos_max(llama_get_memory(ctx), adapter->seq()) < 0;
  if (!empty && !s->options_.adopt) {
    return absl::FailedPreconditionError(
        "the engine sequence must be empty when the session starts (its books start at 0)");
  }
  s->adopt_pending_ = s->options_.adopt;
  return s;
}

uint64_t LlamaPolicySession::cells_used() const {
  if (capture_ != nullptr && !capture_->visible().empty()) {
    const absl::Span<const uint8_t> v = capture_->visible();
    return static_cast<uint64_t>(std::count(v.begin(), v.end(), uint8_t{1}));
  }
  return driver_->resident_tokens();
}

absl::Status LlamaPolicySession::CheckNotBroken() const {
  if (adopt_pending_) {
    return absl::FailedPreconditionError("the session adopts its sequence first (Adopt)");
  }
  if (broken_.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the session's books no longer match llama.cpp's cache after an earlier error (",
      broken_.message(), "); start a new session"));
}

absl::Status LlamaPolicySession::RecoveryPointIfDue() {
  const uint32_t every =
      options_.recovery_every_tokens > 0 ? options_.recovery_every_tokens
                                         : options_.params.block_tokens;
  // A recovery point, with the query of the token decoded last, at a block
  // boundary only: recovered blocks land at the tail, and a block's tokens
  // must stay contiguous in positions (pending tokens would be split).
  if (policy_->info().recovers && since_recovery_ >= every &&
      driver_->pending_tokens() == 0 && !last_query_.empty()) {
    since_recovery_ = 0;
    const policy::RecoveryQuery query = Query();
    EVOKE_RETURN_IF_ERROR(driver_->RecoveryPoint(query, &next_position_));
  }
  return absl::OkStatus();
}

absl::Status LlamaPolicySession::Decode(llama_token token) {
  return DecodeRun(absl::MakeConstSpan(&token, 1));
}

absl::Status LlamaPolicySession::DecodeMany(absl::Span<const llama_token> tokens) {
  const bool per_token = policy_->info().needs_attention || repr_keys_;
  while (!tokens.empty()) {
    // A run ends at the next block boundary, and where the budget is full:
    // there a run of one token makes room, so that evictions happen at the
    // token where Decode's would (a run that made room for all of its tokens
    // at once would evict earlier than needed, and hold less context).
    const uint64_t resident = driver_->resident_tokens();
    const uint64_t fit = options_.budget_tokens > resident ? options_.budget_tokens - resident : 0;
    const size_t n = per_token || fit == 0
                         ? 1
                         : static_cast<size_t>(std::min<uint64_t>(
                               {tokens.size(), driver_->tokens_to_boundary(), fit}));
    EVOKE_RETURN_IF_ERROR(DecodeRun(tokens.subspan(0, n)));
    tokens.remove_prefix(n);
  }
  return absl::OkStatus();
}

absl::Status LlamaPolicySession::DecodeRun(absl::Span<const llama_token> run) {
  EVOKE_RETURN_IF_ERROR(CheckNotBroken());
  EVOKE_RETURN_IF_ERROR(RecoveryPointIfDue());
  EVOKE_RETURN_IF_ERROR(driver_->MakeRoom(run.size()));
  if (engine_->changes() != seen_changes_) {
    cells_->Invalidate();
    seen_changes_ = engine_->changes();
  }
  const llama_pos first = static_cast<llama_pos>(next_position_);
  if (capture_ != nullptr) capture_->BeginStep();
  if (!DecodeTokens(ctx_, run, first, adapter_->seq())) {
    return absl::InternalError(absl::StrCat("llama_decode failed at position ", first));
  }
  if (capture_ != nullptr) last_query_ = capture_->recovery_query();
  // The tokens are in the cache now: an error while accounting for them
  // leaves the books behind the cache, so the session refuses further
  // decoding.
  for (size_t i = 0; i < run.size(); ++i) {
    ++next_position_;
    ++since_recovery_;
    pending_ids_.push_back(run[i]);
    absl::Status accounted = AccountDecoded(first + static_cast<llama_pos>(i));
    if (!accounted.ok()) {
      broken_ = accounted;
      return accounted;
    }
    if (driver_->pending_tokens() == 0) pending_ids_.clear();
  }
  return absl::OkStatus();
}

policy::RecoveryQuery LlamaPolicySession::Query() const {
  const uint32_t head_dim = adapter_->format().head_dim;
  return policy::RecoveryQuery{last_query_, static_cast<uint32_t>(last_query_.size() / head_dim)};
}

absl::StatusOr<uint64_t> LlamaPolicySession::DropPending() {
  EVOKE_RETURN_IF_ERROR(CheckNotBroken());
  const uint64_t m = driver_->pending_tokens();
  if (m != pending_ids_.size()) {
    return absl::InternalError(absl::StrCat("books: ", m, " pending tokens, ",
                                            pending_ids_.size(), " recorded"));
  }
  if (m == 0) return m;
  const llama_pos first = static_cast<llama_pos>(next_position_ - static_cast<int64_t>(m));
  if (!llama_memory_seq_rm(llama_get_memory(ctx_), adapter_->seq(), first, -1)) {
    return absl::InternalError(absl::StrCat("llama_memory_seq_rm refused [", first, ", end)"));
  }
  driver_->DropPendingTokens();
  for (llama_pos p = first; p < static_cast<llama_pos>(next_position_); ++p) {
    pending_mass_.erase(p);
  }
  // llama.cpp takes a sequence's next token only right after its last
  // position. When the policy evicted the block before the tail (a budget
  // of about sinks and two blocks), that is before `first`.
  next_position_ = std::min<int64_t>(
      first, int64_t{llama_memory_seq_pos_max(llama_get_memory(ctx_), adapter_->seq())} + 1);
  pending_ids_.clear();
  cells_->Invalidate();
  return m;
}

absl::Status LlamaPolicySession::RecoverAtPromptEnd() {
  EVOKE_RETURN_IF_ERROR(CheckNotBroken());
  if (!policy_->info().recovers || last_query_.empty()) return absl::OkStatus();
  const policy::RecoveryQuery query = Query();  // Before the tail goes.
  const std::vector<llama_token> tail = pending_ids_;
  EVOKE_RETURN_IF_ERROR(DropPending().status());
  since_recovery_ = 0;
  absl::Status recovered = driver_->RecoveryPoint(query, &next_position_);
  if (!recovered.ok()) {
    broken_ = recovered;
    return recovered;
  }
  return DecodeMany(tail);
}

absl::Status LlamaPolicySession::Adopt(absl::Span<const llama_token> tokens) {
  if (!broken_.ok()) return CheckNotBroken();
  adopt_pending_ = false;
  if (next_position_ != 0 || driver_->resident_tokens() != 0) {
    return absl::FailedPreconditionError("Adopt: the session has decoded already");
  }
  const llama_pos held = llama_memory_seq_pos_max(llama_get_memory(ctx_), adapter_->seq());
  if (static_cast<int64_t>(held) + 1 != static_cast<int64_t>(tokens.size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("Adopt: the sequence holds positions up to ", held, ", not ",
                     tokens.size(), " tokens"));
  }
  const bool recovers = policy_->info().recovers;
  // Each token as Decode takes it in, without the decode: room first, then
  // the books, and mean keys for a completed block (recovering policies).
  auto take = [&](llama_token t) -> absl::Status {
    EVOKE_RETURN_IF_ERROR(driver_->MakeRoom(1));
    EVOKE_ASSIGN_OR_RETURN(std::optional<policy::BlockHandle> done,
                           driver_->TokenDecoded(static_cast<llama_pos>(next_position_)));
    ++next_position_;
    pending_ids_.push_back(t);
    if (driver_->pending_tokens() == 0) pending_ids_.clear();
    if (done.has_value() && recovers) return SetMeanKeys(*done);
    return absl::OkStatus();
  };
  cells_->Invalidate();
  for (llama_token t : tokens) {
    if (absl::Status s = take(t); !s.ok()) {
      broken_ = s;  // Part of the sequence is in the books, part not.
      return s;
    }
  }
  cells_->Invalidate();
  max_cells_ = std::max(max_cells_, driver_->resident_tokens());
  return absl::OkStatus();
}

absl::Status LlamaPolicySession::AccountDecoded(llama_pos pos) {
  const policy::PolicyInfo& info = policy_->info();
  max_cells_ = std::max(max_cells_, cells_used());
  if (stats_ != nullptr) {
    EVOKE_RETURN_IF_ERROR(cells_->Update(capture_->visible(), 1, pos));
    block_of_.assign(static_cast<size_t>(next_position_),
                     {policy::AttentionStats::kNoBlock, 0});
    for (const policy::ResidentBlock& b : driver_->resident()) {
      for (uint32_t i = 0; i < b.n_tokens; ++i) {
        const int64_t p = b.first_position + i;
        if (p >= 0 && p < next_position_) block_of_[static_cast<size_t>(p)] = {b.handle, i};
      }
    }
    auto block_of = [this](int32_t p) -> std::pair<policy::BlockHandle, uint32_t> {
      if (p < 0 || static_cast<size_t>(p) >= block_of_.size()) {
        return {policy::AttentionStats::kNoBlock, 0};
      }
      return block_of_[static_cast<size_t>(p)];
    };
    EVOKE_RETURN_IF_ERROR(ObserveStep(*capture_, *cells_, n_head_kv_, block_of, stats_.get()));
    // Pending tokens belong to no block yet: keep their mass by position
    // (summary layer, per KV head) for the block they will form.
    const LayerAttention* la = capture_->layer(static_cast<int32_t>(options_.summary_layer));
    if (repr_keys_ && la != nullptr && n_head_kv_ > 0 && la->n_head % n_head_kv_ == 0) {
      const uint32_t group = la->n_head / n_head_kv_;
      const absl::Span<const int32_t> cell_pos = cells_->positions();
      for (uint32_t c = 0; c < la->n_kv && c < cell_pos.size(); ++c) {
        const int32_t p = cell_pos[c];
        if (!la->visible[c] || p < 0 || block_of(p).first != policy::AttentionStats::kNoBlock) {
          continue;
        }
        std::vector<float>& m = pending_mass_[p];
        m.resize(n_head_kv_, 0.0f);
        for (uint32_t h = 0; h < la->n_head; ++h) m[h / group] += la->weights[size_t{h} * la->n_kv + c];
      }
    }
  }
  EVOKE_ASSIGN_OR_RETURN(std::optional<policy::BlockHandle> done, driver_->TokenDecoded(pos));
  if (done.has_value() && repr_keys_) {
    for (const policy::ResidentBlock& b : driver_->resident()) {
      if (b.handle != *done) continue;
      std::vector<float> mass(size_t{b.n_tokens} * n_head_kv_, 0.0f);
      for (uint32_t i = 0; i < b.n_tokens; ++i) {
        auto it = pending_mass_.find(static_cast<int32_t>(b.first_position + i));
        if (it == pending_mass_.end()) continue;
        std::copy(it->second.begin(), it->second.end(), mass.begin() + size_t{i} * n_head_kv_);
        pending_mass_.erase(it);
      }
      engine_->AddPendingMass(b.handle, std::move(mass));
      break;
    }
  }
  if (done.has_value() && info.recovers) return SetMeanKeys(*done);
  return absl::OkStatus();
}

absl::Status LlamaPolicySession::SetMeanKeys(policy::BlockHandle block) {
  for (const policy::ResidentBlock& b : driver_->resident()) {
    if (b.handle != block) continue;
    EVOKE_ASSIGN_OR_RETURN(std::vector<float> mean,
                           engine_->MeanKeys(b.first_position, b.n_tokens,
                                             options_.summary_layer));
    return driver_->SetSummary(block, std::move(mean));
  }
  return absl::OkStatus();
}

}  // namespace evoke::llama
