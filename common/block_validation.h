// Validation of block metadata and payload shape. Shared by the daemon (which
// must reject bad requests with INVALID_ARGUMENT naming the field) and the
// client library (which can fail early with the same messages).
#ifndef EVOKE_COMMON_BLOCK_VALIDATION_H_
#define EVOKE_COMMON_BLOCK_VALIDATION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "evoke/v1/block.pb.h"

namespace evoke {

// Limits on what a block may be. Defaults match the daemon's defaults.
struct BlockLimits {
  uint64_t max_block_bytes = 64ull << 20;
  uint32_t max_tokens = 1u << 20;
  uint32_t max_layers = 1024;
  uint32_t max_kv_heads = 1024;
  uint32_t max_head_dim = 4096;
};

// DTypeBytes returns the element size of f16/bf16 (2) and f32 (4); 0 for
// anything else.
uint32_t DTypeBytes(int dtype);

// CanonicalPayloadBytes returns the exact payload length of a canonical-v1
// block: n_layers * n_tokens * n_kv_heads * head_dim * (|k| + |v|).
// INVALID_ARGUMENT if a dtype has no fixed size or the product overflows.
absl::StatusOr<uint64_t> CanonicalPayloadBytes(
    const v1::LayoutFingerprint& fp, uint32_t n_tokens, uint32_t n_layers);

// ValidateFingerprint checks every field of a fingerprint against `limits`.
// Returns INVALID_ARGUMENT "<field>.<name>: <problem>" on the first problem,
// where <field> is the caller's path to the fingerprint (e.g.
// "blocks[2].meta.fingerprint").
absl::Status ValidateFingerprint(const v1::LayoutFingerprint& fp,
                                 const BlockLimits& limits,
                                 absl::string_view field);

// ValidateBlockForSave checks a block's metadata (identity, shape, layers,
// positions, fingerprint) and its payload length `payload_bytes`.
// Returns INVALID_ARGUMENT naming the field under `field` (e.g. "blocks[2]"):
// "blocks[2].meta.n_tokens: ...", "blocks[2].payload: ...".
absl::Status ValidateBlockForSave(const v1::BlockMeta& meta,
                                  uint64_t payload_bytes,
                                  const BlockLimits& limits,
                                  absl::string_view field);

// ValidateStoredBlock is ValidateBlockForSave without the summaries: what a
// record read back at start must satisfy to be served (a summary that
// cannot be scored is the RecoveryIndex's to refuse; the block stays good).
absl::Status ValidateStoredBlock(const v1::BlockMeta& meta, uint64_t payload_bytes,
                                 const BlockLimits& limits, absl::string_view field);

}  // namespace evoke

#endif  // EVOKE_COMMON_BLOCK_VALIDATION_H_
