// evoke::llama::AttentionCapture: the attention weights llama.cpp computes,
// per layer, through its public eval callback (llama_context_params::cb_eval),
// with no change to llama.cpp.
//
//   AttentionCapture capture({.query_layer = 0});
//   capture.Install(cparams);                  // before llama_init_from_model
//   llama_context* ctx = llama_init_from_model(model, cparams);
//   CellPositions cells(ctx, /*seq=*/0);
//   llama_decode(ctx, batch);                  // one token at position p
//   cells.Update(capture.visible(), 1, p);     // which cell holds which position
//   const LayerAttention* l0 = capture.layer(0);  // l0->weights: [n_head][n_kv]
//
// Where the weights come from, in the pinned llama.cpp (src/llama-graph.cpp,
// build_attn_mha):
//   flash attention OFF  the graph materialises the softmax'd scores as the
//                        node "kq_soft_max-<layer>" ([n_kv, n_tokens, n_head]
//                        f32): copied as they are.
//   flash attention ON   no score tensor exists. At each GGML_OP_FLASH_ATTN_EXT
//                        node the callback reads its inputs, which are computed
//                        by then: Q (a view of the post-RoPE "Qcur-<layer>"),
//                        K (the view of the cache tensor "cache_k_l<layer>"
//                        that the kernel reads, in cell order, f16/bf16/f32)
//                        and the KQ mask, and computes
//                          softmax(scale * q . k + mask)
//                        in double, scale being the node's own (1/sqrt(head_dim)
//                        for Llama). K is read in the callback rather than
//                        through KvAdapter::Read because it is exactly what the
//                        kernel sees, cell for cell, with no second copy of the
//                        cache; Q is rounded to the K type by the kernel, not
//                        here, so the two paths agree closely (within 1e-5 on weights of ~1e-2
//                        in the tests), not bitwise.
// Either way weights cover the cache cells [0, n_kv) that the step attends
// over; masked cells (other sequences, free cells, the future) weigh 0.
// Only the batch's LAST token is kept (a one-token decode step: that token).
// Grouped-query attention: query head h reads KV head h / (n_head / n_head_kv).
//
// Cells are not positions. CellPositions maps them: after each decode, the
// cells visible to the last token are the sequence's cells holding positions
// <= its position, and llama_state_seq_get_data lists the sequence's cells in
// cell order with their positions; zipping the two gives the map. That read
// costs a copy of the sequence's KV, so CellPositions does it only when the
// cache changed other than by the decoded token (Invalidate after an
// eviction or a splice) and otherwise assigns the one new visible cell to
// the decoded position.
//
// The callback makes llama.cpp split its graph at each captured node, which
// costs a little. Not thread-safe: one context, one decode loop.
#ifndef EVOKE_CLIENT_LLAMA_ATTENTION_CAPTURE_H_
#define EVOKE_CLIENT_LLAMA_ATTENTION_CAPTURE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "llama.h"
#include "policy/attention_stats.h"

struct ggml_tensor;

namespace evoke::llama {

// One layer's attention in the last decode step.
struct LayerAttention {
  int32_t layer = -1;
  uint32_t n_head = 0;     // Query heads.
  uint32_t n_head_kv = 0;  // KV heads (0 when unknown: flash attention off).
  uint32_t head_dim = 0;   // 0 when the post-RoPE query was not seen.
  uint32_t n_kv = 0;       // Cells attended over: [0, n_kv).
  // [n_head][n_kv], the last token's softmax weights per cell (rows sum to 1
  // over visible cells; masked cells are 0).
  std::vector<float> weights;
  // [n_kv]: 1 where the mask lets the last token see the cell.
  std::vector<uint8_t> visible;
  // [n_head][head_dim]: the last token's post-RoPE query ("Qcur-<layer>").
  std::vector<float> query;
  bool from_flash_attn = false;  // Computed from Q, K and the mask.
  uint64_t step = 0;             // AttentionCapture::steps() when written.
};

struct AttentionCaptureOptions {
  // Layers to capture; empty: all.
  std::vector<int32_t> layers;
  // Also keep the PRE-RoPE query of this layer (what KvAdapter::Recover and
  // evoked's summaries compare; QueryCapture's job), or -1 for none.
  int32_t query_layer = -1;
};

class AttentionCapture {
 public:
  explicit AttentionCapture(AttentionCaptureOptions options = {});

  // Install sets cparams.cb_eval and cb_eval_user_data (replacing any other
  // callback). The capture must outlive the context.
  void Install(llama_context_params& cparams);

  const AttentionCaptureOptions& options() const { return options_; }

  // BeginStep marks the start of a llama_decode: layer() then returns only
  // what that decode wrote. Optional (without it, the latest values stay).
  void BeginStep() { ++steps_; }
  uint64_t steps() const { return steps_; }

  // layer returns what was captured for `layer` in the current step (since
  // the last BeginStep), or null.
  const LayerAttention* layer(int32_t layer) const;
  // Every layer captured in the current step, ascending.
  std::vector<const LayerAttention*> layers() const;
  // The last token's visible cells, from any layer captured in the current
  // step (all layers share the mask); empty when none was.
  absl::Span<const uint8_t> visible() const;
  // The pre-RoPE query of options.query_layer, n_head x head_dim floats of
  // the last token; empty before the first decode.
  const std::vector<float>& recovery_query() const { return recovery_query_; }

  static bool Callback(struct ggml_tensor* t, bool ask, void* user_data);

 private:
  bool Wants(int32_t layer) const;
  bool Ask(const ggml_tensor* t) const;
  void Take(const ggml_tensor* t);
  LayerAttention& Slot(int32_t layer);

  AttentionCaptureOptions options_;
  std::string query_name_;
  uint64_t steps_ = 1;
  std::vector<LayerAttention> by_layer_;
  std::vector<float> recovery_query_;
  std::vector<char> scratch_;
};

// Which cache cell holds which position of one sequence (see above).
class CellPositions {
 public:
  CellPositions(llama_context* ctx, llama_seq_id seq) : ctx_(ctx), seq_(seq) {}

  // Update takes the visible cells of a decode step whose batch had
  // `n_batch_tokens` tokens, the last at `last_position`. FAILED_PRECONDITION
  // when llama.cpp's state disagrees with the mask (a cell count that does
  // not match), INTERNAL when the state cannot be read.
  absl::Status Update(absl::Span<const uint8_t> visible, uint32_t n_batch_tokens,
                      llama_pos last_position);
  // Invalidate forces a full read at the next Update: call it after anything
  // but a decode changed the sequence (evictions, splices, seq_rm/add).
  void Invalidate() { valid_ = false; }

  // positions()[cell]: the position the cell holds, or -1 (not visible).
  absl::Span<const int32_t> positions() const { return positions_; }
  uint64_t full_reads() const { return full_reads_; }

 private:
  absl::Status Resync(absl::Span<const uint8_t> visible, llama_pos last_position);

  llama_context* ctx_;
  llama_seq_id seq_;
  bool valid_ = false;
  std::vector<int32_t> positions_;
  std::string blob_;
  uint64_t full_reads_ = 0;
};

// Where a position's token belongs: its block and index in it, or
// {policy::AttentionStats::kNoBlock, 0} (pending tokens).
using BlockOfPosition = std::function<std::pair<policy::BlockHandle, uint32_t>(int32_t)>;

// ObserveStep feeds one decode step to `stats`: for each layer captured in
// the current step and each KV head g, the sum over the query heads of g's
// group of the weights each visible cell got, with the cell's block from
// `block_of`. Then closes the step (stats->EndStep()). llama.cpp's KV head
// count comes from `n_head_kv` (llama_model_n_head_kv). INVALID_ARGUMENT when
// the layer or head counts do not fit `stats` or n_head is not a multiple of
// n_head_kv; FAILED_PRECONDITION when `cells` does not cover the weights.
absl::Status ObserveStep(const AttentionCapture& capture, const CellPositions& cells,
                         uint32_t n_head_kv, const BlockOfPosition& block_of,
                         policy::AttentionStats* stats);

}  // namespace evoke::llama

#endif  // EVOKE_CLIENT_LLAMA_ATTENTION_CAPTURE_H_
