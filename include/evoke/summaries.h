// Key summaries an engine attaches to the blocks it saves, so that Recover
// can find them (the Summary message of evoke/v1/block.proto).
//
// Two kinds matter to an engine:
//   SUMMARY_MEAN_KEYS  per KV head, the mean un-rotated key of a layer over
//                      the block's tokens. The daemon computes it itself for
//                      canonical blocks saved without a summary.
//   SUMMARY_REPR_KEYS  InfLLM's representative keys: per KV head, the mean
//                      un-rotated key of the r tokens that received the most
//                      attention. It needs the attention mass that only the
//                      engine sees, so the engine computes it here, on the
//                      CPU or, while the block is still on the GPU, with a
//                      CUDA kernel, and adds it to the block's metadata
//                      before Save:
//
//   evoke::BlockToSave block(meta, payload);
//   absl::StatusOr<evoke::v1::Summary> s = evoke::ReprKeysSummary(
//       block.meta, payload_ptr, payload_bytes, layer, attention, /*r=*/4);
//   if (s.ok()) *block.meta.add_summaries() = *std::move(s);
//
// The CPU and GPU functions choose the same tokens and give, to within one
// f32 rounding of a sin/cos, the same values.
//
// "Un-rotated" means RoPE removed: each token's key rotated back by minus
// its original position, with the angles of the block's layout fingerprint,
// so that keys saved at different positions compare.
//
// These are the library's definitions (the same functions the daemon uses);
// this header only declares them, so that it stands alone.
#ifndef EVOKE_CLIENT_SUMMARIES_H_
#define EVOKE_CLIENT_SUMMARIES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "evoke/v1/block.pb.h"

namespace evoke {

// UnrotatedKeys returns layer `layer`'s keys of a canonical-v1 block as f32
// [n_tokens][n_kv_heads][head_dim], with RoPE removed. INVALID_ARGUMENT for
// a non-canonical block, a layer outside the block or a payload of the wrong
// size; FAILED_PRECONDITION for RoPE that cannot be undone (dynamic NTK).
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
// INVALID_ARGUMENT for an attention of the wrong size or non-finite values,
// or r outside [1, n_tokens]; other errors as UnrotatedKeys.
absl::StatusOr<v1::Summary> ReprKeysSummary(const v1::BlockMeta& meta, const uint8_t* payload,
                                            uint64_t payload_bytes, uint32_t layer,
                                            absl::Span<const float> attention, uint32_t r);

// TopTokensPerHead returns, per head, the indices of the r tokens with the
// most attention (descending, ties to the earlier token): heads x r indices.
std::vector<uint32_t> TopTokensPerHead(absl::Span<const float> attention, uint32_t n_tokens,
                                       uint32_t n_heads, uint32_t r);

// ReprKeysSummaryOnDevice is ReprKeysSummary on the GPU, for a block whose
// payload (payload_bytes at `device_payload`) and attention mass (n_tokens x
// n_kv_heads f32 at `device_attention`) are in memory of CUDA device
// `device`. When `top_tokens` is not null it also receives the chosen
// tokens, heads x r, best first (TopTokensPerHead's order). Blocks the
// calling thread until done, on a stream of its own; restores the thread's
// current device. Thread-safe. Ranking costs O(n_tokens^2 / 256) per KV
// head, fine for blocks of up to a few thousand tokens.
//
// Errors: as ReprKeysSummary; INVALID_ARGUMENT naming device_payload or
// device_attention for memory that is not `device`'s or is too short;
// UNAVAILABLE without a device or in a library built without CUDA.
//
// (Pass top_tokens explicitly, nullptr when not wanted: this declaration
// has no default argument so that it can sit next to the library's own.)
absl::StatusOr<v1::Summary> ReprKeysSummaryOnDevice(const v1::BlockMeta& meta,
                                                    const void* device_payload,
                                                    uint64_t payload_bytes, uint32_t layer,
                                                    const float* device_attention, uint32_t r,
                                                    int device,
                                                    std::vector<uint32_t>* top_tokens);

}  // namespace evoke

#endif  // EVOKE_CLIENT_SUMMARIES_H_
