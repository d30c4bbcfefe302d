#include "testing/blocks.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/block_validation.h"
#include "common/chain_hash.h"
#include "common/fingerprint.h"

namespace evoke::testing {

v1::LayoutFingerprint OpaqueFingerprint(absl::string_view ns, absl::string_view model_id) {
  return MakeFingerprint(ns, model_id,
                         {.k_dtype = v1::DTYPE_OPAQUE,
                          .v_dtype = v1::DTYPE_OPAQUE,
                          .n_layers = 1,
                          .n_kv_heads = 1,
                          .head_dim = 1,
                          .layout = v1::LAYOUT_OPAQUE});
}

v1::LayoutFingerprint CanonicalFingerprint(absl::string_view ns, absl::string_view model_id,
                                           uint32_t n_layers, uint32_t n_kv_heads,
                                           uint32_t head_dim, v1::DType dtype) {
  return MakeFingerprint(ns, model_id,
                         {.k_dtype = dtype,
                          .v_dtype = dtype,
                          .n_layers = n_layers,
                          .n_kv_heads = n_kv_heads,
                          .head_dim = head_dim,
                          .layout = v1::LAYOUT_CANONICAL_V1});
}

v1::LayoutFingerprint WithRope(v1::LayoutFingerprint fp, v1::RopeType type, double freq_base) {
  fp.mutable_rope()->set_type(type);
  fp.mutable_rope()->set_freq_base(freq_base);
  return fp;
}

v1::LayoutFingerprint SmallFingerprint(absl::string_view ns) {
  v1::LayoutFingerprint fp = WithRope(
      CanonicalFingerprint(ns, "test/tiny-llama", 4, 2, 64, v1::DTYPE_F16), v1::ROPE_NEOX, 10000);
  fp.set_model_revision("r1");
  return fp;
}

v1::BlockMeta SessionMeta(const v1::LayoutFingerprint& fp, absl::string_view session,
                          uint64_t sequence, uint32_t n_tokens, uint32_t layer_begin,
                          uint32_t layer_end, int32_t first_position) {
  v1::BlockMeta meta;
  *meta.mutable_fingerprint() = fp;
  meta.set_kind(v1::BLOCK_KIND_SESSION);
  meta.set_session_id(std::string(session));
  meta.set_sequence(sequence);
  meta.set_id(SessionBlockId(fp.namespace_(), session, sequence).ToBytes());
  meta.set_n_tokens(n_tokens);
  meta.set_layer_begin(layer_begin);
  meta.set_layer_end(layer_end);
  meta.set_first_position(first_position);
  return meta;
}

v1::BlockMeta SessionMeta(const v1::LayoutFingerprint& fp, absl::string_view session,
                          uint64_t sequence, uint32_t n_tokens) {
  return SessionMeta(fp, session, sequence, n_tokens, 0, fp.n_layers(),
                     static_cast<int32_t>(sequence * n_tokens));
}

v1::BlockMeta PrefixMeta(const v1::LayoutFingerprint& fp, const BlockId& parent,
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

std::vector<v1::BlockMeta> PrefixChainMetas(const v1::LayoutFingerprint& fp,
                                            absl::Span<const int32_t> tokens,
                                            size_t block_tokens) {
  std::vector<v1::BlockMeta> metas;
  BlockId parent;
  for (size_t at = 0; block_tokens > 0 && at + block_tokens <= tokens.size();
       at += block_tokens) {
    metas.push_back(PrefixMeta(fp, parent, tokens.subspan(at, block_tokens), 0, fp.n_layers(),
                               static_cast<int32_t>(at)));
    parent = IdOf(metas.back());
  }
  return metas;
}

BlockId IdOf(const v1::BlockMeta& meta) {
  absl::StatusOr<BlockId> id = BlockId::FromBytes(meta.id());
  return id.ok() ? *id : BlockId();
}

void FillPayload(uint64_t seed, void* data, uint64_t size) {
  auto* out = static_cast<uint8_t*>(data);
  uint64_t x = 0x9e3779b97f4a7c15ULL ^ (seed * 0xbf58476d1ce4e5b9ULL) ^ size;
  for (uint64_t i = 0; i < size; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(out + i, &x, std::min<uint64_t>(8, size - i));
  }
}

std::string Payload(uint64_t seed, uint64_t size) {
  std::string s(size, '\0');
  FillPayload(seed, s.data(), size);
  return s;
}

std::string CanonicalPayload(const v1::BlockMeta& meta, uint64_t seed) {
  absl::StatusOr<uint64_t> size = CanonicalPayloadBytes(
      meta.fingerprint(), meta.n_tokens(), meta.layer_end() - meta.layer_begin());
  return size.ok() ? Payload(seed, *size) : std::string();
}

TestBlock SessionBlock(const std::string& session, uint64_t seq, uint32_t n_tokens,
                       const v1::LayoutFingerprint& fp) {
  TestBlock b;
  b.meta = SessionMeta(fp, session, seq, n_tokens);
  b.payload = CanonicalPayload(b.meta, seq * 7919 + std::hash<std::string>()(session));
  return b;
}

bool WaitUntil(absl::FunctionRef<bool()> done, absl::Duration timeout,
               absl::Duration interval) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    if (done()) return true;
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    absl::SleepFor(std::min(interval, deadline - now));
  }
}

::testing::AssertionResult Eventually(absl::FunctionRef<bool()> done, absl::string_view what,
                                      absl::Duration timeout, absl::Duration interval) {
  if (WaitUntil(done, timeout, interval)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": still false after " << absl::FormatDuration(timeout);
}

}  // namespace evoke::testing
