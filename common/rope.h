// RoPE re-anchoring: moving a KV block to new positions without recompute.
//
// A canonical block stores K post-RoPE: each K head's first rotary_dim
// dimensions were rotated, pair by pair, by the angle position * omega_i.
// Because every angle is linear in the position, rotating the stored K by
// delta * omega_i (delta = new_position - original_position, per token) gives
// exactly the K the model would have computed at the new position, up to
// rounding. V carries no position and is never touched.
//
// The angle table (one definition, shared by the CPU path here and the CUDA
// kernel in gpu/rope_kernel.cu) follows llama.cpp's ggml rope / rope_yarn,
// for pair i (dimension index i0 = 2i) of a rotary_dim-dimensional rotation:
//   base_i  = freq_base ^ (-2i / rotary_dim)
//   base_i /= freq_factors[i]                     (when freq_factors is set)
//   NONE, LINEAR, LLAMA3:  omega_i = freq_scale * base_i
//   YARN:  theta_interp = freq_scale * base_i, theta_extrap = base_i;
//          with yarn_ext_factor != 0:
//            ramp_mix = rope_yarn_ramp(corr_low, corr_high, i0) * ext_factor
//            omega_i  = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix
//          else omega_i = theta_interp;
//          (corr_low, corr_high) = ggml_rope_yarn_corr_dims(rotary_dim,
//            n_ctx_orig, freq_base, beta_fast, beta_slow), in float as ggml
//            (they are integers); the ramp and the mix in double, as the
//            rest of omega, so that delta * omega stays exact to double
//            rounding at any shift.
//   DYNAMIC_NTK: angles depend on the sequence length; no plan.
// freq_scale is the normalized one (0 -> 1) and applies whatever the scaling
// type, as in ggml (which takes freq_scale independently of the type).
// YaRN's magnitude scale (mscale, attn_factor) is not part of the angle: a
// re-anchor is a pure rotation, norms are preserved.
#ifndef EVOKE_COMMON_ROPE_H_
#define EVOKE_COMMON_ROPE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "evoke/v1/block.pb.h"

namespace evoke {

// A RopePlan is everything needed to rotate one block's K: per-pair angular
// frequency omega[i] (radians per position), i in [0, rotary_dim / 2).
// Plain data: copyable, immutable once built, safe to share across threads.
struct RopePlan {
  v1::RopeType type = v1::ROPE_NONE;  // ROPE_NONE, ROPE_NORM or ROPE_NEOX
  uint32_t head_dim = 0;
  uint32_t rotary_dim = 0;            // normalized (0 -> head_dim); 0 for NONE
  std::vector<double> omega;          // rotary_dim / 2 entries; empty for NONE
};

// MakeRopePlan builds the plan of fingerprint `fp` (normalized first, see
// NormalizeFingerprint). Only head_dim and rope matter; the other fields are
// not looked at. Returns:
//   INVALID_ARGUMENT    "fingerprint.<field>: ..." when head_dim or the rope
//                       parameters break common/block_validation.h's rules, or
//                       when the parameters give a non-finite angle table
//                       (e.g. YaRN with freq_base 1);
//   FAILED_PRECONDITION "fingerprint.rope.scaling: ..." for
//                       ROPE_SCALING_DYNAMIC_NTK (its angles depend on the
//                       sequence length, so a block cannot be re-anchored).
// A fingerprint without RoPE gives a ROPE_NONE plan, under which every
// rotation is a no-op.
absl::StatusOr<RopePlan> MakeRopePlan(const v1::LayoutFingerprint& fp);

// RotateKeys rotates in place one K section: n_tokens rows of
// n_heads * head_dim elements of `dtype` (DTYPE_F16, DTYPE_BF16 or DTYPE_F32,
// little endian, any alignment) at `k`. Token t is rotated by the angle
// delta[t] * omega[i] for pair i (a negative delta un-rotates). ROPE_NORM pairs
// dims (2i, 2i+1), ROPE_NEOX pairs (i, i + rotary_dim / 2); dims >= rotary_dim
// are not touched. A token with delta 0 is left byte-identical (not even
// converted). Under a ROPE_NONE plan this is a no-op.
// Numerics: the angle delta * omega in double, cos and sin in double cast to
// float, the rotation in float (x0*c - x1*s, x0*s + x1*c, no fused
// multiply-add intended), rounded back to the dtype to nearest even.
// Preconditions (asserted in debug builds, the caller checks): `plan` comes
// from MakeRopePlan, delta.size() == n_tokens, dtype is one of the three, `k`
// holds the whole section. Thread-safe for disjoint sections.
void RotateKeys(const RopePlan& plan, v1::DType dtype, void* k, uint32_t n_tokens,
                uint32_t n_heads, absl::Span<const int64_t> delta);

// Where the K sections of a canonical-v1 payload lie, as checked by
// CheckCanonicalReanchor. Layer l's K section (k_section_bytes) starts at
// byte l * layer_stride_bytes; its V section follows it.
struct CanonicalKSections {
  uint32_t n_layers = 0;  // layer_end - layer_begin
  uint32_t n_tokens = 0;
  uint32_t n_heads = 0;   // n_kv_heads
  uint32_t head_dim = 0;
  v1::DType k_dtype = v1::DTYPE_UNSPECIFIED;
  uint64_t k_section_bytes = 0;     // n_tokens * n_heads * head_dim * |k_dtype|
  uint64_t layer_stride_bytes = 0;  // K section + V section
};

// CheckCanonicalReanchor checks everything ReanchorCanonicalBlock (and its
// device twin, gpu/rope_device.h) needs before touching a byte, and returns
// the shape of the K sections. Returns INVALID_ARGUMENT when:
//   the fingerprint's layout is not LAYOUT_CANONICAL_V1 or a dtype has no
//   fixed size; layers [layer_begin, layer_end) are empty or past n_layers;
//   payload_bytes does not match the canonical layout; delta.size() !=
//   n_tokens; or `plan` is not consistent (omega size, rotary_dim, or a
//   head_dim other than the block's for a rotating plan).
absl::StatusOr<CanonicalKSections> CheckCanonicalReanchor(
    const RopePlan& plan, const v1::BlockMeta& meta, uint64_t payload_bytes,
    absl::Span<const int64_t> delta);

// ReanchorCanonicalBlock applies RotateKeys to every layer's K section of the
// canonical-v1 payload of block `meta` (its fingerprint, n_tokens,
// layer_begin and layer_end), in place; the V sections stay byte-identical.
// `delta` holds n_tokens position offsets (new - original). The caller keeps
// ownership of `payload` (payload_bytes bytes, host memory). Returns
// INVALID_ARGUMENT as CheckCanonicalReanchor (then nothing is written); OK
// otherwise. Blocks the calling thread for the duration (no threads of its
// own). The caller should update meta's positions itself.
absl::Status ReanchorCanonicalBlock(const RopePlan& plan, const v1::BlockMeta& meta,
                                    uint8_t* payload, uint64_t payload_bytes,
                                    absl::Span<const int64_t> delta);

// OriginalPositions returns each token's original position: meta.positions
// when it is set, else first_position + t, for t in [0, n_tokens).
std::vector<int64_t> OriginalPositions(const v1::BlockMeta& meta);

}  // namespace evoke

#endif  // EVOKE_COMMON_ROPE_H_
