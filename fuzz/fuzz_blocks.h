// Blocks for the fuzz targets and their seeds: metadata built as the client
// builds it, small payloads of the matching size, checksums.
#ifndef EVOKE_FUZZ_FUZZ_BLOCKS_H_
#define EVOKE_FUZZ_FUZZ_BLOCKS_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/checksum.h"
#include "evoke/chain_hash.h"
#include "evoke/fingerprint.h"
#include "evoke/v1/block.pb.h"

namespace evoke::fuzz {

// As evoke::SessionBlockMeta and PrefixBlockMeta (client/client.cc), which
// would pull the gRPC client into this program.
inline v1::BlockMeta SessionBlockMeta(const v1::LayoutFingerprint& fp, absl::string_view session_id,
                               uint64_t sequence, uint32_t n_tokens, uint32_t layer_begin,
                               uint32_t layer_end, int32_t first_position) {
  v1::BlockMeta meta;
  *meta.mutable_fingerprint() = fp;
  meta.set_kind(v1::BLOCK_KIND_SESSION);
  meta.set_session_id(std::string(session_id));
  meta.set_sequence(sequence);
  meta.set_id(SessionBlockId(fp.namespace_(), session_id, sequence).ToBytes());
  meta.set_n_tokens(n_tokens);
  meta.set_layer_begin(layer_begin);
  meta.set_layer_end(layer_end);
  meta.set_first_position(first_position);
  return meta;
}

inline v1::BlockMeta PrefixBlockMeta(const v1::LayoutFingerprint& fp, const BlockId& parent,
                              absl::Span<const int32_t> tokens, uint32_t layer_begin,
                              uint32_t layer_end, int32_t first_position) {
  v1::BlockMeta meta;
  *meta.mutable_fingerprint() = fp;
  meta.set_kind(v1::BLOCK_KIND_PREFIX);
  if (!parent.IsZero()) meta.set_parent_id(parent.ToBytes());
  meta.mutable_tokens()->Add(tokens.begin(), tokens.end());
  meta.set_id(PrefixBlockId(parent, tokens, DigestFingerprint(fp)).ToBytes());
  meta.set_n_tokens(static_cast<uint32_t>(tokens.size()));
  meta.set_layer_begin(layer_begin);
  meta.set_layer_end(layer_end);
  meta.set_first_position(first_position);
  return meta;
}

// The shape fuzz_request_validation's Recover index uses (2 layers, 2 KV
// heads of 8 dims, f16), optionally with RoPE.
inline v1::LayoutFingerprint Fp(bool rope) {
  CacheShape shape;
  shape.n_layers = 2;
  shape.n_kv_heads = 2;
  shape.head_dim = 8;
  v1::LayoutFingerprint fp = MakeFingerprint("ns", "model", shape);
  if (rope) {
    fp.mutable_rope()->set_type(v1::ROPE_NEOX);
    fp.mutable_rope()->set_freq_base(10000);
  }
  return fp;
}

// n_tokens tokens of f16 keys and values, all layers: 2 x 4 x 2 x 8 x 4.
inline std::string Payload(uint32_t n_tokens, uint32_t seed) {
  std::string p(2ull * n_tokens * 2 * 8 * 4, '\0');
  for (size_t i = 0; i < p.size(); i += 2) {
    // Small f16 values: exponent 0x3c (~1.0) with varying mantissa.
    p[i] = static_cast<char>((i * 7 + seed) & 0xff);
    p[i + 1] = static_cast<char>(0x38 + ((i / 2 + seed) % 8));
  }
  return p;
}

inline v1::BlockMeta WithChecksum(v1::BlockMeta meta, const std::string& payload) {
  meta.set_payload_bytes(payload.size());
  meta.set_checksum(PayloadChecksum(payload.data(), payload.size()));
  return meta;
}

}  // namespace evoke::fuzz

#endif  // EVOKE_FUZZ_FUZZ_BLOCKS_H_
