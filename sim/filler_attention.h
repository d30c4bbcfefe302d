// evoke-sim's filler attention: where a decode step's attention goes when
// the token being decoded looks for nothing in particular. This is what H2O
// and SnapKV observe (policy::AttentionStats), so it is computed exactly,
// per key token, never per block: a block's mass is the sum of its tokens'
// and depends only on its keys and its distance from the tail, never on how
// long it has been resident.
#ifndef EVOKE_SIM_FILLER_ATTENTION_H_
#define EVOKE_SIM_FILLER_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace evoke::sim {

class FillerAttention {
 public:
  // `recency_per_token`: the logit bias per token of distance (> 0 favours
  // recent keys).
  FillerAttention(uint32_t head_dim, double recency_per_token)
      : d_(head_dim), recency_(recency_per_token) {}

  // Row computes, for each query (queries.size() / head_dim of them: the
  // query heads of one KV head's group) the softmax over n key tokens
  //   logit_i = q . k_i / sqrt(head_dim) - recency_per_token * (now - positions[i])
  // and writes into `weights` (n floats) the sum over the queries of each
  // token's mass, times `scale`. `keys` holds n x head_dim floats. The filler
  // query is isotropic, so it is not rotated: RoPE at any position leaves
  // its distribution unchanged.
  void Row(absl::Span<const float> queries, absl::Span<const float> keys,
           absl::Span<const int64_t> positions, int64_t now, float scale,
           std::vector<float>* weights);

 private:
  uint32_t d_;
  double recency_;
  std::vector<float> logits_;  // Scratch.
};

}  // namespace evoke::sim

#endif  // EVOKE_SIM_FILLER_ATTENTION_H_
