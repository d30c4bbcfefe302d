// Representative keys on the GPU: the device twin of common/summaries.h's
// ReprKeysSummary (InfLLM's representative keys), for an engine whose block
// and attention statistics are still in device memory. Same choice of tokens
// (most attention first, ties to the earlier token) and the same un-rotation
// (common/rope.h's angle table and numerics); gpu/repr_keys_test.cc compares
// it with the CPU.
#ifndef EVOKE_GPU_REPR_KEYS_H_
#define EVOKE_GPU_REPR_KEYS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "evoke/v1/block.pb.h"

namespace evoke {

// ReprKeysSummaryOnDevice returns the SUMMARY_REPR_KEYS summary of layer
// `layer` of the canonical-v1 block `meta`, whose payload (payload_bytes) is
// at `device_payload` and whose attention mass (n_tokens x n_kv_heads f32,
// row t: the mass token t received per KV head) is at `device_attention`,
// both in memory of CUDA device `device`. When `top_tokens` is set it also
// receives the chosen tokens, heads x r, best first (TopTokensPerHead's
// order). Blocks the calling thread until done, on a stream of its own;
// restores the thread's current device. Thread-safe.
//
// Cost: ranking is O(n_tokens^2 / 256) per KV head, fine for blocks of up to
// a few thousand tokens.
//
// Errors: as ReprKeysSummary (INVALID_ARGUMENT for the block, the layer, r
// outside [1, n_tokens], non-finite attention; FAILED_PRECONDITION for
// dynamic NTK); INVALID_ARGUMENT naming device_payload or device_attention
// for memory that is not `device`'s or is too short; UNAVAILABLE without a
// device or in a build without CUDA.
absl::StatusOr<v1::Summary> ReprKeysSummaryOnDevice(const v1::BlockMeta& meta,
                                                    const void* device_payload,
                                                    uint64_t payload_bytes, uint32_t layer,
                                                    const float* device_attention, uint32_t r,
                                                    int device,
                                                    std::vector<uint32_t>* top_tokens = nullptr);

}  // namespace evoke

#endif  // EVOKE_GPU_REPR_KEYS_H_
