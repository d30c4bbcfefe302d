// Key summaries of canonical blocks, for Recover: computed by the daemon
// (MEAN_KEYS for blocks saved without one) and by the client library
// (REPR_KEYS, from the attention mass the engine observed).
#ifndef EVOKE_COMMON_SUMMARIES_H_
#define EVOKE_COMMON_SUMMARIES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/rope.h"
#include "evoke/v1/block.pb.h"

namespace evoke {

// Where one layer's keys sit in a canonical-v1 payload, and how to un-rotate
// them: what UnrotatedKeys reads, for other implementations (the GPU's).
struct KeysOfLayer {
  RopePlan plan;
  v1::DType k_dtype = v1::DTYPE_UNSPECIFIED;
  uint32_t n_tokens = 0;
  uint32_t n_heads = 0;
  uint32_t head_dim = 0;
  uint64_t offset = 0;             // Of the layer's K section in the payload.
  std::vector<int64_t> positions;  // Each token's original position.
};

// LocateKeys checks a block as UnrotatedKeys does (same errors) and says where
// layer `layer`'s keys are.
absl::StatusOr<KeysOfLayer> LocateKeys(const v1::BlockMeta& meta, uint64_t payload_bytes,
                                       uint32_t layer);

// UnrotatedKeys returns layer `layer`'s keys of a canonical-v1 block as f32
// [n_tokens][n_kv_heads][head_dim], with RoPE removed: each token rotated by
// minus its original position (common/rope.h's angles), so that keys of
// different positions compare. INVALID_ARGUMENT for a non-canonical block, a
// layer outside the block or a payload of the wrong size;
// FAILED_PRECONDITION for RoPE that cannot be undone (dynamic NTK).
absl::StatusOr<std::vector<float>> UnrotatedKeys(const v1::BlockMeta& meta,
                                                 const uint8_t* payload,
                                                 uint64_t payload_bytes, uint32_t layer);

// DefaultSummaryLayer is the layer the daemon summarizes: the middle of the
// block's layers.
uint32_t DefaultSummaryLayer(const v1::BlockMeta& meta);

// MeanKeysSummary is a SUMMARY_MEAN_KEYS summary: per KV head, the mean over
// the block's tokens of layer `layer`'s un-rotated keys. Errors as
// UnrotatedKeys.
absl::StatusOr<v1::Summary> MeanKeysSummary(const v1::BlockMeta& meta, const uint8_t* payload,
                                            uint64_t payload_bytes, uint32_t layer);

// ReprKeysSummary is a SUMMARY_REPR_KEYS summary (InfLLM's representative
// keys): per KV head, the mean of the un-rotated keys of the `r` tokens that
// received the most attention. `attention` holds n_tokens x n_kv_heads
// floats (row t: the mass token t received, per KV head; sum over the query
// heads of a GQA group beforehand). Ties go to the earlier token.
// INVALID_ARGUMENT for an attention of the wrong size or r outside
// [1, n_tokens]; other errors as UnrotatedKeys.
absl::StatusOr<v1::Summary> ReprKeysSummary(const v1::BlockMeta& meta, const uint8_t* payload,
                                            uint64_t payload_bytes, uint32_t layer,
                                            absl::Span<const float> attention, uint32_t r);

// TopTokensPerHead returns, per head, the indices of the r tokens with the
// most attention (descending, ties to the earlier token): heads x r indices.
// The CPU reference of the GPU kernel in gpu/repr_keys.h.
std::vector<uint32_t> TopTokensPerHead(absl::Span<const float> attention, uint32_t n_tokens,
                                       uint32_t n_heads, uint32_t r);

}  // namespace evoke

#endif  // EVOKE_COMMON_SUMMARIES_H_
