// Layout fingerprints: what must match for stored KV bytes to be meaningful.
//
// Identity is fail-closed: every block carries the fingerprint of the layout
// it was saved with; a reader presents its own, and any difference refuses the
// load. Two fingerprints that mean the same thing (e.g. freq_scale 0 and 1)
// compare equal: comparison and digests work on the normalized form.
//
// Public header of the client library (installed as <evoke/fingerprint.h>); it
// stands alone. evoke's own code reaches it as common/fingerprint.h, which
// includes this file.
#ifndef EVOKE_PUBLIC_FINGERPRINT_H_
#define EVOKE_PUBLIC_FINGERPRINT_H_

#include <string>

#include "absl/strings/string_view.h"
#include "evoke/hash128.h"
#include "evoke/v1/block.pb.h"

namespace evoke {

// The shape of a KV cache: what every fingerprint must say.
struct CacheShape {
  v1::DType k_dtype = v1::DTYPE_F16;
  v1::DType v_dtype = v1::DTYPE_F16;
  uint32_t n_layers = 1;
  uint32_t n_kv_heads = 1;
  uint32_t head_dim = 1;
  v1::Layout layout = v1::LAYOUT_CANONICAL_V1;
};

// MakeFingerprint returns a fingerprint of namespace `ns`, model `model_id`
// and `shape`; RoPE, revision and tensor parallelism are left unset.
v1::LayoutFingerprint MakeFingerprint(absl::string_view ns, absl::string_view model_id,
                                      const CacheShape& shape);

// NormalizeFingerprint returns `fp` with implied defaults made explicit:
// rope.type UNSPECIFIED -> NONE, rope.freq_scale 0 -> 1, rope.rotary_dim 0 ->
// head_dim (0 when rope is NONE, with all other rope fields cleared),
// tp_size 0 -> 1. It does not validate.
v1::LayoutFingerprint NormalizeFingerprint(const v1::LayoutFingerprint& fp);

// DigestFingerprint returns the 128-bit digest of the normalized fingerprint
// (xxHash3-128 over a documented field-by-field encoding, not over protobuf
// serialization, so that any language can reproduce it).
FingerprintDigest DigestFingerprint(const v1::LayoutFingerprint& fp);

// FingerprintMismatch compares two fingerprints after normalization. Returns
// "" when equal, else a message naming the first differing field, e.g.
// "model_revision: stored \"r1\", requested \"r2\"".
std::string FingerprintMismatch(const v1::LayoutFingerprint& stored,
                                const v1::LayoutFingerprint& requested);

// DescribeFingerprint renders a one-line summary for logs and evokectl, e.g.
// "ns=prod model=llama@r1 k=f16 v=f16 layers=32 kv_heads=8 head_dim=128
// layout=canonical_v1 rope=neox tp=0/1".
std::string DescribeFingerprint(const v1::LayoutFingerprint& fp);

// DTypeName returns "f16", "bf16", "f32", "opaque" or "unspecified(N)".
std::string DTypeName(int dtype);

}  // namespace evoke

#endif  // EVOKE_PUBLIC_FINGERPRINT_H_
