// evoke::llama::LlamaBlockEngine and LlamaPolicySession: any evoke policy
// (policy/policy.h) driving a llama.cpp context's KV cache through KvAdapter.
//
//   AttentionCapture capture({.query_layer = 0});   // evoked's --summary-layer
//   capture.Install(cparams);
//   llama_context* ctx = llama_init_from_model(model, cparams);
//   auto adapter = KvAdapter::Open(ctx, cparams, client, {...});
//   auto session = LlamaPolicySession::Create(ctx, &capture, adapter->get(), client,
//                                             "default", "chat-42",
//                                             {.policy = "evoke", .budget_tokens = 256});
//   for (...) {
//     (*session)->Decode(token);                    // room, decode, books, recovery
//     const float* logits = llama_get_logits_ith(ctx, -1);
//   }
//
// LlamaBlockEngine is the policy::BlockEngine of llama.cpp:
//   Evict, not stored  KvAdapter::Evict (saved to evoked, then removed), the
//                      block registered with the EvokedRecoverySource;
//   Evict, stored      a recovered block whose copy evoked still holds:
//                      llama_memory_seq_rm, nothing saved;
//   Bring              KvAdapter::Splice at the tail, K re-anchored by evoked.
// llama.cpp keeps ONE cache for all layers and heads, so a block is a range
// of positions in every layer and head at once: per-head or per-layer
// selections (SnapKV's, PyramidKV's) aggregate to whole blocks here (the
// attention statistics sum over layers and heads; see policy/policy.h).
//
// Daemon outages. Recovery degrades as SessionDriver documents (counted in
// DriverStats::recovery_failures). An eviction needs a save: with
// drop_unsaved_when_down (the default) a block that evoked cannot take
// (UNAVAILABLE) is removed unsaved so that decoding continues within the
// budget; it is lost for recovery and counted in EngineStats::blocks_lost
// (the driver counts it among blocks_saved). Without it Evict fails and the
// cache is left as it was (then Decode fails: the engine must not overrun
// its budget).
//
// Not thread-safe: drive it from the thread that drives the context.
#ifndef EVOKE_CLIENT_LLAMA_POLICY_ENGINE_H_
#define EVOKE_CLIENT_LLAMA_POLICY_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engines/llama/attention_capture.h"
#include "engines/llama/kv_adapter.h"
#include "policy/attention_stats.h"
#include "policy/evoked_source.h"
#include "policy/policy.h"
#include "policy/session_driver.h"

namespace evoke::llama {

struct EngineStats {
  uint64_t evicted_saved = 0;    // KvAdapter::Evict calls that succeeded.
  uint64_t evicted_dropped = 0;  // Stored blocks removed without a save.
  uint64_t blocks_lost = 0;      // Removed unsaved while evoked was down.
  uint64_t brought = 0;          // Splices that succeeded.
  uint64_t repr_summaries = 0;   // Blocks saved with a REPR_KEYS summary.
  // Where evoked served the brought blocks from, and the time the engine
  // spent bringing them (the decode loop's stall for recovery).
  uint64_t brought_tier1 = 0, brought_tier2 = 0, brought_remote = 0;
  absl::Duration bring_time;
};

struct EngineOptions {
  // Remove a block unsaved when evoked is unavailable (see above). Default: true.
  bool drop_unsaved_when_down = true;
  // InfLLM's representative keys: when > 0 and the engine has attention
  // statistics, each block saved carries a REPR_KEYS summary of `repr_layer`
  // (common/summaries.h ReprKeysSummary over the per-token mass the block
  // received, AttentionStats::TokenMass; the r most attended tokens' mean
  // un-rotated key per KV head). Blocks without statistics are saved without
  // it. Default: 0 (none).
  uint32_t repr_tokens = 0;
  uint32_t repr_layer = 0;
};

class LlamaBlockEngine final : public policy::BlockEngine {
 public:
  // Observer of each eviction and bring, for tests and tools: called with the
  // handle, the positions [first, first + n) involved and whether it was a
  // bring, before an eviction and after a bring.
  using Observer = std::function<void(policy::BlockHandle handle, int64_t first_position,
                                      uint32_t n_tokens, bool bring)>;

  // `ctx` (the adapter's context), `adapter`, `source` (may be null: then
  // nothing is registered) and `attention` (may be null: then no REPR_KEYS
  // summaries) must outlive the engine.
  LlamaBlockEngine(llama_context* ctx, KvAdapter* adapter, policy::EvokedRecoverySource* source,
                   EngineOptions options = {}, const policy::AttentionStats* attention = nullptr);

  absl::StatusOr<uint64_t> Evict(const policy::ResidentBlock& block, bool stored) override;
  absl::StatusOr<uint64_t> Bring(policy::BlockHandle handle, uint32_t n_tokens,
                                 int64_t first_position) override;

  // MeanKeys returns the resident block at [first_position, first_position +
  // n_tokens)'s summary for EVOKE's resident gate: per KV head the mean of
  // `layer`'s keys with RoPE removed (common/summaries.h MeanKeysSummary on
  // the canonical bytes KvAdapter::Read returns), n_kv_heads x head_dim
  // floats. Errors as KvAdapter::Read and MeanKeysSummary.
  absl::StatusOr<std::vector<float>> MeanKeys(int64_t first_position, uint32_t n_tokens,
                                              uint32_t layer);

  // ReprKeys is the REPR_KEYS summary of a resident block (see
  // EngineOptions). NOT_FOUND without per-token attention for it; errors of
  // KvAdapter::Read and ReprKeysSummary.
  absl::StatusOr<v1::Summary> ReprKeys(const policy::ResidentBlock& block);

  // AddPendingMass records the attention a new block's tokens received
  // while they were pending (n_tokens x n_kv_heads, summary layer), which
  // AttentionStats does not attribute to any block; ReprKeys adds it.
  void AddPendingMass(policy::BlockHandle handle, std::vector<float> mass) {
    pending_mass_[handle] = std::move(mass);
  }

  void set_observer(Observer observer) { observer_ = std::move(observer); }
  std::optional<BlockId> IdOf(policy::BlockHandle handle) const;
  const EngineStats& stats() const { return stats_; }
  // Bumped by every change to the cache (for CellPositions::Invalidate).
  uint64_t changes() const { return changes_; }

 private:
  llama_context* ctx_;
  KvAdapter* adapter_;
  policy::EvokedRecoverySource* source_;
  EngineOptions options_;
  const policy::AttentionStats* attention_;
  absl::flat_hash_map<policy::BlockHandle, BlockId> ids_;
  absl::flat_hash_map<policy::BlockHandle, std::vector<float>> pending_mass_;
  Observer observer_;
  EngineStats stats_;
  uint64_t changes_ = 0;
};

struct SessionOptions {
  std::string policy = "recency";  // One of policy::PolicyNames().
  policy::PolicyParams params;     // block_tokens, sink_tokens, ... as published.
  uint64_t budget_tokens = 0;      // Required: cells the session may use.
  // The layer evoked summarises (its --summary-layer): the recovery query
  // and the resident blocks' mean keys come from it. Default: 0.
  uint32_t summary_layer = 0;
  // InfLLM ranks stored blocks by representative keys (REPR_KEYS, r =
  // params.infllm_repr_tokens), which the engine computes from the attention
  // it captures; false: by evoked's mean keys. Default: true.
  bool infllm_repr_keys = true;
  // Tokens at least between recovery points (recovering policies); a
  // recovery point waits for the next block boundary (no pending tokens), so
  // that every block stays contiguous in positions. 0: block_tokens.
  uint32_t recovery_every_tokens = 0;
  // Preloading: after each recovery ranking, prefetch into evoked's tier 1
  // the next this many stored blocks of the ranking
  // (EvokedSourceOptions::prefetch). 0: none.
  uint32_t prefetch = 0;
  // The engine sequence may hold tokens when the session starts; the caller
  // then hands them to Adopt before anything else. false: it must be empty.
  bool adopt = false;
  EngineOptions engine;
};

class LlamaPolicySession {
 public:
  // Create checks the options (policy name, budget: policy::ValidateBudget)
  // and that `capture` is installed in `ctx`'s parameters when the policy
  // needs attention or recovers (it must capture all layers and the pre-RoPE
  // query of summary_layer). The session's scope in evoked is the adapter's.
  // All pointers must outlive the session. INVALID_ARGUMENT for bad options.
  static absl::StatusOr<std::unique_ptr<LlamaPolicySession>> Create(
      llama_context* ctx, AttentionCapture* capture, KvAdapter* adapter, Client* client,
      const std::string& ns, const std::string& session_id, SessionOptions options);

  // Decode decodes `token` at next_position(): a recovery point first when
  // one is due (recovering policies), then room for the token by policy,
  // llama_decode (logits of this token: llama_get_logits_ith(ctx, -1)), the
  // books, the attention statistics and, for each completed block, its mean
  // keys. Errors: RESOURCE_EXHAUSTED when the policy cannot make room,
  // INTERNAL when llama_decode fails, engine errors of evictions.
  // An error after llama_decode succeeded (keeping the books, the
  // statistics, the summaries) leaves the session's books behind the cache:
  // later calls return FAILED_PRECONDITION.
  absl::Status Decode(llama_token token);

  // DecodeMany decodes `tokens` as Decode would one by one, with the same
  // recovery points and the same evictions at the same tokens, but in one
  // llama_decode per run (logits of the last token only) for policies that
  // read no per-token attention: a run ends at the next block boundary, and
  // where the budget is full (one token then makes room). One by one for
  // the others.
  absl::Status DecodeMany(absl::Span<const llama_token> tokens);

  // RecoverAtPromptEnd is a recovery point at the end of a prompt, before
  // the engine generates from it (recovering policies; a no-op for the
  // others and before the first decode). It uses the query of the token
  // decoded last, and runs at the last block boundary so that every block
  // stays contiguous: the tokens decoded since that boundary (fewer than a
  // block) are removed from the cache, the recovery point brings blocks to
  // the tail, and those tokens are decoded again after them. So the
  // prompt's tail, whose logits the answer starts from, sees what was
  // recovered. The attention the removed tokens' steps gave is not taken
  // back (H2O-style statistics count those steps twice). Errors as Decode.
  absl::Status RecoverAtPromptEnd();

  // Adopt takes into the books `tokens`, which the engine sequence already
  // holds at positions [0, tokens.size()) (decoded, or loaded from evoked,
  // before the session began): each as if decoded now, the policy making
  // room as they come (evicting to evoked), mean keys for each completed
  // block. No recovery point runs and no attention is recorded for them
  // (attention-based policies see them with none). The session must be new
  // (FAILED_PRECONDITION otherwise). Errors as Decode's.
  absl::Status Adopt(absl::Span<const llama_token> tokens);

  // DropPending removes the tokens decoded since the last block boundary
  // from the cache and the books (so that a conversation can take another
  // turn from there) and returns how many. The next token goes right after
  // the last position the sequence still holds.
  absl::StatusOr<uint64_t> DropPending();
  uint64_t pending_tokens() const { return driver_->pending_tokens(); }

  int64_t next_position() const { return next_position_; }
  // Cells the sequence holds now (llama.cpp's count, from its positions).
  uint64_t cells_used() const;
  const policy::DriverStats& driver_stats() const { return driver_->stats(); }
  const EngineStats& engine_stats() const { return engine_->stats(); }
  policy::SessionDriver& driver() { return *driver_; }
  LlamaBlockEngine& engine() { return *engine_; }
  const policy::PolicyInfo& policy_info() const { return policy_->info(); }
  uint64_t max_cells_used() const { return max_cells_; }
  // Blocks sent to evoked's Prefetch (SessionOptions::prefetch).
  uint64_t prefetched() const { return source_ ? source_->prefetched() : 0; }

 private:
  LlamaPolicySession() = default;
  // FAILED_PRECONDITION once an earlier error left the books behind the cache.
  absl::Status CheckNotBroken() const;
  // Books, statistics and summaries for the token just decoded at `pos`.
  absl::Status AccountDecoded(llama_pos pos);
  // SetMeanKeys attaches its mean keys to the resident block `block` just
  // completed (EVOKE's resident gate, and scoring residents).
  absl::Status SetMeanKeys(policy::BlockHandle block);
  // A recovery point when one is due (recovering policies, block boundary).
  absl::Status RecoveryPointIfDue();
  // Decodes `run` (within one block) in one llama_decode, with its books.
  absl::Status DecodeRun(absl::Span<const llama_token> run);
  // The recovery query: the last token this session decoded (its own copy,
  // as other sequences may decode in the same context between its calls).
  policy::RecoveryQuery Query() const;

  llama_context* ctx_ = nullptr;
  AttentionCapture* capture_ = nullptr;
  KvAdapter* adapter_ = nullptr;
  SessionOptions options_;
  std::unique_ptr<policy::Policy> policy_;
  std::unique_ptr<policy::EvokedRecoverySource> source_;
  std::unique_ptr<policy::AttentionStats> stats_;
  std::unique_ptr<LlamaBlockEngine> engine_;
  std::unique_ptr<policy::SessionDriver> driver_;
  std::unique_ptr<CellPositions> cells_;
  int64_t next_position_ = 0;
  uint64_t since_recovery_ = 0;
  uint64_t seen_changes_ = 0;
  uint64_t max_cells_ = 0;
  uint32_t n_head_kv_ = 0;
  absl::Status broken_;  // Set by an error after a decode; see Decode.
  bool adopt_pending_ = false;  // SessionOptions::adopt, until Adopt.
  bool repr_keys_ = false;  // InfLLM with REPR_KEYS summaries.
  // Summary-layer mass per pending position, per KV head.
  absl::flat_hash_map<int32_t, std::vector<float>> pending_mass_;
  std::vector<std::pair<policy::BlockHandle, uint32_t>> block_of_;  // By position.
  std::vector<llama_token> pending_ids_;  // Tokens decoded since the last block boundary.
  std::vector<float> last_query_;  // capture_'s recovery query after this session's decode.
};

}  // namespace evoke::llama

#endif  // EVOKE_CLIENT_LLAMA_POLICY_ENGINE_H_
