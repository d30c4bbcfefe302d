// evoke::policy::AttentionStats: the attention an engine observed, per
// resident block, per layer and KV head, as H2O, SnapKV and InfLLM need it.
//
// The engine feeds one row per (layer, KV head) and decode step: the softmax
// mass the step's query put on each cached key token (for grouped-query
// attention, summed over the query heads of the group first), with the block
// each key token belongs to. Per block it keeps
//   Cumulative  the mass received since the block entered the cache (H2O);
//   Window      the mass received over the last `window` steps, each step's
//               row max-pooled over tokens with `pool_kernel` first
//               (SnapKV's observation window; SnapKV pools the window's sum,
//               this pools each row, which differs only where a pooled peak
//               moves between steps);
//   TokenMass   per token and KV head, the mass received in `token_layer`
//               (what InfLLM's representative keys and evoked's REPR_KEYS
//               summaries are computed from).
// Not thread-safe.
#ifndef EVOKE_POLICY_ATTENTION_STATS_H_
#define EVOKE_POLICY_ATTENTION_STATS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "policy/policy.h"

namespace evoke::policy {

class AttentionStats {
 public:
  // A key token that belongs to no block (pending tokens).
  static constexpr BlockHandle kNoBlock = ~0ull;
  // Tokens per block at most (token_in_block must stay below it), and
  // layers x heads at most.
  static constexpr uint32_t kMaxBlockTokens = 1u << 16;
  static constexpr uint64_t kMaxRows = 1u << 20;

  // The constructor takes a count of 0 as 1 and an even pool_kernel as the
  // next odd one. SnapKV's policy parameters (PolicyParams::snapkv_window,
  // snapkv_pool_kernel) describe this object: configure it with them.
  struct Options {
    uint32_t n_layers = 1;
    uint32_t n_heads = 1;  // KV heads.
    uint32_t window = 32;  // Steps in the observation window (SnapKV).
    uint32_t pool_kernel = 5;  // Odd; 1 disables pooling.
    uint32_t token_layer = 0;  // Layer whose per-token mass is kept.
  };

  explicit AttentionStats(const Options& options);

  const Options& options() const { return options_; }

  // Observe adds one (layer, head) row of the current step: weights[i] is the
  // mass on key token i, which belongs to block_of_token[i] (kNoBlock for
  // none) and is token token_in_block[i] of it (may be empty when
  // token_layer's per-token mass is not wanted). INVALID_ARGUMENT for a layer
  // or head out of range or spans of different lengths.
  absl::Status Observe(uint32_t layer, uint32_t head, absl::Span<const BlockHandle> block_of_token,
                       absl::Span<const uint32_t> token_in_block,
                       absl::Span<const float> weights);

  // EndStep closes the current decode step (the observation window slides:
  // Window covers the step in progress and the window - 1 closed before it).
  void EndStep();

  // Forget drops a block's statistics (it left the cache; if it comes back
  // it starts afresh, as in H2O).
  void Forget(BlockHandle block);

  // Cumulative and Window for one layer and head, or summed over all of
  // them with CacheView::kAll. 0 for an unknown block.
  double Cumulative(BlockHandle block, int32_t layer, int32_t head) const;
  double Window(BlockHandle block, int32_t layer, int32_t head) const;

  // TokenMass returns n_tokens x n_heads floats (row t: mass token t received
  // per KV head in token_layer), or an empty span for an unknown block.
  absl::Span<const float> TokenMass(BlockHandle block) const;

  uint64_t steps() const { return steps_; }

 private:
  // Per block, every [layer][head] array has n_layers * n_heads entries.
  struct PerBlock {
    std::vector<double> cumulative;  // [layer][head]
    std::vector<double> window;      // [layer][head]: the sum of `ring`.
    // Ring of the last `window` steps: slot (step % window) x [layer][head]
    // pooled mass; slot of steps_ is the step in progress.
    std::vector<float> ring;
    double cumulative_all = 0;  // Sums over every layer and head.
    double window_all = 0;
    std::vector<float> ring_all;  // Per slot, the sum over layers and heads.
    std::vector<float> token_mass;  // [token][head] of token_layer.
    uint64_t last_step = 0;         // Last step observed (to skip idle blocks).
  };
  PerBlock& Block(BlockHandle block);
  double Sum(const std::vector<double>& v, double all, int32_t layer, int32_t head) const;

  Options options_;
  uint32_t rows_ = 1;  // n_layers * n_heads.
  uint64_t steps_ = 0;
  // unique_ptr: Observe keeps a pointer to the last block across inserts.
  absl::flat_hash_map<BlockHandle, std::unique_ptr<PerBlock>> blocks_;
  // MaxPool fills pooled_ with `w` max-pooled over pool_kernel tokens.
  void MaxPool(absl::Span<const float> w);
  std::vector<float> pooled_, prefix_, suffix_;  // Scratch rows.
};

}  // namespace evoke::policy

#endif  // EVOKE_POLICY_ATTENTION_STATS_H_
