// Validation of block metadata and payload shape. Shared by the daemon (which
// must reject bad requests with INVALID_ARGUMENT naming the field) and the
// client library (which can fail early with the same messages).
#ifndef EVOKE_COMMON_BLOCK_VALIDATION_H_
#define EVOKE_COMMON_BLOCK_VALIDATION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/hash128.h"
#include "evoke/v1/block.pb.h"

namespace evoke {

// Limits on what a block may be. Defaults match the daemon's defaults.
struct BlockLimits {
  uint64_t max_block_bytes = 64ull << 20;
  uint32_t max_tokens = 1u << 20;
  uint32_t max_layers = 1024;
  uint32_t max_kv_heads = 1024;
  uint32_t max_head_dim = 4096;

  // Metadata a Save may bring per block, in the bytes it takes in memory
  // (4 per token, position or summary value), checked by ValidateBlockForSave
  // only (records already stored are not refused for them). Without them one
  // block could carry 8 summaries of 1024 heads x 4096 dims, 128 MiB of
  // floats, for a 1-byte payload (issue #11: 8 such Saves grew RSS by
  // 517 MiB).
  // Summaries: the sum over a block's summaries of their values. One
  // MEAN_KEYS or REPR_KEYS summary is n_kv_heads x head_dim floats: 4 KiB for
  // Llama-3-8B/70B (8 x 128), 32 KiB for a 64-head MHA model, 96 KiB for
  // DeepSeek-V2 in llama.cpp (128 x 192); an embedding at most 32 KiB. 512 KiB
  // holds the 8 summaries a block may have at 64 KiB each.
  uint64_t max_summary_bytes = 512ull << 10;
  // Tokens and positions: 262144 each. A block's payload (<= 64 MiB) already
  // limits real models to a few thousand tokens per block (one layer of
  // 8 x 128 f16 K and V is 4 KiB a token: 16384 tokens); this leaves 16x.
  uint64_t max_token_bytes = 1ull << 20;
  uint64_t max_position_bytes = 1ull << 20;
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
// RoPE (unless its type is NONE): rotary_dim even and <= head_dim;
// freq_base finite and > 0; freq_scale finite and >= 0 (0 means 1);
// freq_factors empty or rotary_dim / 2 finite values > 0; the YaRN fields
// finite whatever the scaling (they are part of the fingerprint's identity).
// With ROPE_SCALING_YARN:
//   yarn_ext_factor >= 0. A negative value is llama.cpp's "not set", which
//     llama.cpp resolves before computing anything (1.0 when the scaling is
//     YaRN, else 0): send the resolved value, so that one model has one
//     fingerprint;
//   yarn_attn_factor >= 0 (magnitude only, never part of a re-anchor);
//   when yarn_ext_factor > 0 (the ramp is used): yarn_beta_fast and
//     yarn_beta_slow > 0, n_ctx_orig > 0 (llama.cpp resolves 0 to the
//     model's training context: send that), and freq_base != 1 (the ramp
//     divides by ln(freq_base)).
// Returns INVALID_ARGUMENT "<field>.<name>: <problem>" on the first problem,
// where <field> is the caller's path to the fingerprint (e.g.
// "blocks[2].meta.fingerprint").
absl::Status ValidateFingerprint(const v1::LayoutFingerprint& fp,
                                 const BlockLimits& limits,
                                 absl::string_view field);

// ValidateBlockForSave checks a block's metadata (identity, shape, layers,
// positions, fingerprint, summaries, and the per-block metadata caps of
// `limits`) and its payload length `payload_bytes`.
// Returns INVALID_ARGUMENT naming the field under `field` (e.g. "blocks[2]"):
// "blocks[2].meta.n_tokens: ...", "blocks[2].payload: ...".
absl::Status ValidateBlockForSave(const v1::BlockMeta& meta,
                                  uint64_t payload_bytes,
                                  const BlockLimits& limits,
                                  absl::string_view field);

// ValidateStoredBlock is ValidateBlockForSave without the summaries and
// without the metadata caps: what a record read back at start must satisfy
// to be served (a summary that cannot be scored is the RecoveryIndex's to
// refuse; the block stays good; a record saved under larger caps stays).
absl::Status ValidateStoredBlock(const v1::BlockMeta& meta, uint64_t payload_bytes,
                                 const BlockLimits& limits, absl::string_view field);

// CheckRecordIdentity checks what every host checks the same way about a
// stored record found under `id`, whatever its limits: the record names
// `id`, carries a checksum, and its id is the one its own content gives (a
// prefix block's PrefixBlockId over its tokens, which must be there; a
// session block's SessionBlockId). DATA_LOSS naming the field otherwise.
absl::Status CheckRecordIdentity(const BlockId& id, const v1::BlockMeta& meta);

}  // namespace evoke

#endif  // EVOKE_COMMON_BLOCK_VALIDATION_H_
