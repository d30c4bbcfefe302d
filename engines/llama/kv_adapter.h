// evoke::llama::KvAdapter: a llama.cpp context evicts token ranges to evoked
// and splices them back, with upstream llama.cpp calls only.
//
//   llama_context_params cparams = llama_context_default_params();
//   cparams.kv_unified = true;          // one KV stream (required)
//   cparams.n_seq_max = 2;              // the engine's sequence + a scratch one
//   llama_context* ctx = llama_init_from_model(model, cparams);
//   auto adapter = KvAdapter::Open(ctx, cparams, client.get(),
//                                  {.model_id = "llama-3.2-1b", .session_id = "chat-42"});
//   auto block = (*adapter)->Evict(0, 256);          // K/V of [0, 256) -> evoked
//   ...
//   // query: QueryCapture's, for the layer evoked summarises (--summary-layer)
//   auto hits = (*adapter)->Recover(query, n_head, summary_layer, /*k=*/4);
//   (*adapter)->Splice(block->id, /*new_first_position=*/n_past);  // back at the tail
//
// How a range leaves the cache (Evict): llama_memory_seq_cp copies the range
// of the engine's sequence to the scratch sequence (cell metadata only),
// llama_state_seq_get_data reads the scratch sequence, and the bytes are
// converted to evoke's canonical layout (engines/llama/seq_state.h), straight
// into a shared-memory region, and saved as a session block; only once the
// daemon acknowledged it is the range removed with llama_memory_seq_rm. A
// failed save leaves the cache as it was.
//
// How it comes back (Splice / Restore): the block is loaded, either
// re-anchored by evoked (K rotated once to the new positions) or at its
// original positions followed by llama_memory_seq_add (llama.cpp rotates K in
// its next llama_decode), written into the scratch sequence with
// llama_state_seq_set_data, and copied into the engine's sequence.
//
// Supported: attention-only models (no recurrent, hybrid or sliding-window
// caches), RoPE NORM / NEOX / none without YaRN or LongRoPE, f16, bf16 and f32
// caches, one unified KV stream. Everything else is refused at Open with
// FAILED_PRECONDITION naming the reason. Not thread-safe: call it from the
// thread that drives the context, between llama_decode calls.
#ifndef EVOKE_CLIENT_LLAMA_KV_ADAPTER_H_
#define EVOKE_CLIENT_LLAMA_KV_ADAPTER_H_

#include <cstdint>
#include <map>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engines/llama/seq_state.h"
#include "common/hash128.h"
#include "evoke/client.h"
#include "llama.h"

namespace evoke::llama {

struct AdapterOptions {
  std::string ns = "default";  // evoke namespace.
  std::string model_id;        // Required: the model's identity.
  std::string model_revision;  // Weights hash or revision, if known.
  std::string session_id;      // Required: the session blocks belong to.
  llama_seq_id seq = 0;        // The engine's sequence.
  // A sequence the engine never uses, for moving ranges in and out. -1: the
  // context's last one (llama_n_seq_max - 1).
  llama_seq_id scratch_seq = -1;
  // Per-pair RoPE frequency factors (Llama 3.1's rope_freqs tensor), which
  // llama.h does not expose: pass them for models that have them, or use
  // SpliceMode::kShiftInEngine only.
  std::vector<float> rope_freq_factors;
  // Save blocks durably (on disk before acknowledgement).
  bool durable = false;
  // Move block bytes through a shared-memory region (a lease and a sealed
  // memfd, sized to the largest block so far) instead of inside gRPC
  // messages. When the region fails (the daemon restarted, say), that
  // transfer is retried inline and the next one makes a new region.
  bool shared_memory = true;
};

// How block bytes travelled (for tests and monitoring).
struct TransferStats {
  uint64_t shm_transfers = 0;     // Saves and loads tried through the region.
  uint64_t shm_fallbacks = 0;     // Of those, retried inline.
  uint64_t inline_transfers = 0;  // Saves and loads inside gRPC messages.
};

// How Splice moves a block to new positions.
enum class SpliceMode {
  // evoked re-anchors K (one rotation by the position delta) and the block
  // is written at the new positions.
  kReanchorInDaemon,
  // The block is written at its original positions and llama.cpp shifts it
  // (llama_memory_seq_add; applied in the next llama_decode).
  kShiftInEngine,
};

struct EvictedBlock {
  BlockId id;
  uint64_t sequence = 0;          // The block's number in the session.
  std::vector<int32_t> positions;  // Original positions, ascending.
  uint64_t payload_bytes = 0;
};

// Prefix blocks saved or loaded by SavePrefix / LoadLongestPrefix.
struct PrefixResult {
  uint32_t blocks = 0;       // Blocks saved (SavePrefix) or loaded.
  uint32_t tokens = 0;       // Tokens they hold (loaded: the prefix now in the cache).
  uint32_t present = 0;      // SavePrefix: blocks evoked held already (not saved again).
  uint64_t payload_bytes = 0;
};

struct SplicedBlock {
  BlockId id;
  std::vector<int32_t> positions;  // Where the tokens now are.
  v1::Tier served_from = v1::TIER_UNSPECIFIED;
};

class KvAdapter {
 public:
  // Open checks that `ctx` (created with `cparams`) can be served and derives
  // the layout fingerprint from the model. `client` must outlive the adapter.
  // The session's next block sequence number continues after the highest one
  // already stored for it, so a restarted engine never overwrites its blocks.
  static absl::StatusOr<std::unique_ptr<KvAdapter>> Open(llama_context* ctx,
                                                         const llama_context_params& cparams,
                                                         Client* client, AdapterOptions options);
  // Unregisters its shared region from the daemon (the daemon would keep it,
  // and its lease's count of regions, until the lease ends).
  ~KvAdapter();
  KvAdapter(const KvAdapter&) = delete;
  KvAdapter& operator=(const KvAdapter&) = delete;

  // Read returns the K/V of the engine sequence's cells in [p0, p1) in
  // canonical layout without changing the cache. NOT_FOUND when there are
  // none.
  absl::StatusOr<CanonicalRange> Read(llama_pos p0, llama_pos p1);

  // Evict saves the cells of [p0, p1) as one session block, with
  // `summaries` in its metadata (e.g. a REPR_KEYS summary the engine computed
  // from the attention it observed; evoked computes MEAN_KEYS itself), then
  // removes them from the cache.
  absl::StatusOr<EvictedBlock> Evict(llama_pos p0, llama_pos p1,
                                     absl::Span<const v1::Summary> summaries = {});

  // Recover asks evoked which of this session's blocks best match `queries`
  // (n_query_heads x head_dim floats, before RoPE, e.g. from QueryCapture)
  // on `layer`'s mean-key summaries, excluding `exclude`. `layer` must be the
  // one evoked summarises (its --summary-layer; default the middle layer):
  // NOT_FOUND otherwise.
  absl::StatusOr<std::vector<v1::RecoveredBlock>> Recover(absl::Span<const float> queries,
                                                          uint32_t n_query_heads, uint32_t layer,
                                                          uint32_t k,
                                                          absl::Span<const BlockId> exclude = {});

  // Splice loads block `id` so that its first token sits at
  // `new_first_position` (the others follow: contiguously with
  // kReanchorInDaemon, keeping their gaps with kShiftInEngine), replacing
  // whatever the engine sequence held at those positions.
  absl::StatusOr<SplicedBlock> Splice(const BlockId& id, llama_pos new_first_position,
                                      SpliceMode mode = SpliceMode::kReanchorInDaemon);

  // Restore loads block `id` back at its original positions, unrotated.
  absl::StatusOr<SplicedBlock> Restore(const BlockId& id);

  // Shared prefixes between engines. A prompt's full blocks of
  // `block_tokens` tokens are content-addressed prefix blocks
  // (PrefixBlockMeta: the id chains the parent's id, the block's tokens and
  // the layout fingerprint), so any engine with the same model and layout
  // finds them by its own prompt.
  //
  // SavePrefix saves the full blocks of `tokens`, which the engine sequence
  // holds at positions [0, tokens.size()), skipping the leading blocks evoked
  // has already (Lookup). INVALID_ARGUMENT for block_tokens 0; NOT_FOUND when
  // the sequence lacks a block's positions; errors of Save as they come
  // (blocks saved before the failing request stay stored).
  absl::StatusOr<PrefixResult> SavePrefix(absl::Span<const llama_token> tokens,
                                          uint32_t block_tokens);
  // LoadLongestPrefix finds the longest chain of stored prefix blocks that
  // begins `tokens` (Lookup; breadcrumbs end it) and writes them into the
  // engine sequence at positions [0, n), replacing what it held there; the
  // caller then decodes tokens[n...] only, which holds at least the last
  // token (whose logits are the next token's: a prompt of whole blocks loads
  // all but its last block). Returns n in `tokens` (0 when no block is
  // stored: then nothing changed). INVALID_ARGUMENT for
  // block_tokens 0; errors of Lookup and Load; RESOURCE_EXHAUSTED when the
  // cache cannot take the blocks (blocks written before stay). At most
  // `max_tokens` tokens are loaded (whole blocks).
  absl::StatusOr<PrefixResult> LoadLongestPrefix(
      absl::Span<const llama_token> tokens, uint32_t block_tokens,
      uint32_t max_tokens = std::numeric_limits<uint32_t>::max());

  const v1::LayoutFingerprint& fingerprint() const { return fingerprint_; }
  const TransferStats& transfer_stats() const { return stats_; }
  const CacheFormat& format() const { return format_; }
  llama_seq_id seq() const { return options_.seq; }
  llama_seq_id scratch_seq() const { return scratch_; }

 private:
  KvAdapter(llama_context* ctx, Client* client, AdapterOptions options)
      : ctx_(ctx), client_(client), options_(std::move(options)) {}
  // Copies [p0, p1) of seq() through the scratch sequence into state_buf_
  // and parses it (`state` views state_buf_ until its next use).
  absl::Status ReadState(llama_pos p0, llama_pos p1, SeqState* state);
  // The shared region when it holds `bytes` (made or remade as needed), or
  // null for inline transfers.
  SharedRegion* RegionFor(uint64_t bytes);
  void DropRegion();
  // Loads `id` (re-anchored by the daemon when asked) and writes it.
  absl::StatusOr<SplicedBlock> Bring(const BlockId& id, std::optional<llama_pos> new_first_position,
                                     bool reanchor_in_daemon);
  // The prefix-block chain of tokens' full blocks (metas without payload).
  std::vector<v1::BlockMeta> PrefixChain(absl::Span<const llama_token> tokens,
                                         uint32_t block_tokens) const;
  // A prefix chain and how much of it evoked holds.
  struct StoredPrefix {
    std::vector<v1::BlockMeta> chain;
    std::vector<BlockId> ids;  // Of chain.
    size_t present = 0;        // Leading blocks stored with their bytes.
  };
  // Validates block_tokens, builds the chain of tokens' full blocks and
  // looks it up (no lookup for an empty chain).
  absl::StatusOr<StoredPrefix> LookupPrefix(absl::Span<const llama_token> tokens,
                                            uint32_t block_tokens);
  // Writes a canonical payload into the scratch sequence, shifts it by
  // `shift` positions and moves it into seq().
  absl::StatusOr<SplicedBlock> Write(const v1::BlockMeta& meta, absl::string_view payload,
                                     v1::Tier served_from, int32_t shift);

  llama_context* ctx_;
  Client* client_;
  AdapterOptions options_;
  llama_seq_id scratch_ = -1;
  v1::LayoutFingerprint fingerprint_;
  CacheFormat format_;
  bool v_trans_known_ = false;
  uint64_t next_sequence_ = 0;
  // llama.cpp state blobs, read or written; kept (at the largest block's
  // size) because fresh pages for every block cost more than the copies.
  std::string state_buf_;
  std::string inline_buf_;  // Canonical bytes of inline saves, kept likewise.
  std::unique_ptr<SharedRegion> region_;
  std::map<BlockId, uint64_t> known_bytes_;  // Payload sizes, to size loads.
  TransferStats stats_;
};

// QueryCapture records, during llama_decode, the query vectors of one layer
// before RoPE (llama.cpp's "Qcur-<layer>" tensor) for the batch's last token:
// what Recover needs. Install it in the context parameters before creating
// the context:
//   QueryCapture capture(/*layer=*/0);
//   capture.Install(cparams);
// The context then splits its graph at that tensor, which costs a little.
class QueryCapture {
 public:
  explicit QueryCapture(int layer) : name_("Qcur-" + std::to_string(layer)) {}
  void Install(llama_context_params& cparams) {
    cparams.cb_eval = &QueryCapture::Callback;
    cparams.cb_eval_user_data = this;
  }
  // n_head x head_dim floats of the last decoded token; empty before the
  // first llama_decode.
  const std::vector<float>& last_query() const { return query_; }

  static bool Callback(struct ggml_tensor* t, bool ask, void* user_data);

 private:
  std::string name_;
  std::vector<float> query_;
};

}  // namespace evoke::llama

#endif  // EVOKE_CLIENT_LLAMA_KV_ADAPTER_H_
