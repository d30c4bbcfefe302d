// Test blocks: the one place where tests and benchmarks build layout
// fingerprints, block metadata (ids from common/chain_hash.h, as the daemon
// computes them) and deterministic payloads, and wait for something to
// become true. Nothing here talks to a daemon; evoke_testing has it.
#ifndef EVOKE_TESTING_BLOCKS_H_
#define EVOKE_TESTING_BLOCKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/hash128.h"
#include "evoke/v1/block.pb.h"
#include "gtest/gtest.h"

namespace evoke::testing {

// ---------------------------------------------------------------------------
// Fingerprints.

// OpaqueFingerprint: an opaque layout (k/v dtype and layout OPAQUE; 1 layer,
// 1 KV head, head_dim 1), so that a payload of any size is valid.
v1::LayoutFingerprint OpaqueFingerprint(absl::string_view ns = "ns",
                                        absl::string_view model_id = "model");

// CanonicalFingerprint: the canonical-v1 layout of `n_layers` x `n_kv_heads`
// x `head_dim`, K and V both `dtype`; no RoPE, revision or parallelism.
v1::LayoutFingerprint CanonicalFingerprint(absl::string_view ns, absl::string_view model_id,
                                           uint32_t n_layers, uint32_t n_kv_heads,
                                           uint32_t head_dim,
                                           v1::DType dtype = v1::DTYPE_F16);

// WithRope returns `fp` with RoPE of `type` and `freq_base` (other RoPE
// fields unset).
v1::LayoutFingerprint WithRope(v1::LayoutFingerprint fp, v1::RopeType type,
                               double freq_base);

// SmallFingerprint: the end-to-end tests' small Llama-shaped layout: model
// "test/tiny-llama" revision "r1", 4 layers, 2 KV heads, head_dim 64, f16,
// canonical, NEOX RoPE with base 10000. One token over all layers is
// 4 * 2 * 64 * (2 + 2) = 2 KiB.
v1::LayoutFingerprint SmallFingerprint(absl::string_view ns = "test");

// ---------------------------------------------------------------------------
// Block metadata. Session ids are SessionBlockId(fp.namespace_(), session,
// sequence); prefix ids chain PrefixBlockId over the fingerprint's digest.

// SessionMeta: block `sequence` of `session`, `n_tokens` tokens over layers
// [layer_begin, layer_end), contiguous positions from `first_position`.
v1::BlockMeta SessionMeta(const v1::LayoutFingerprint& fp, absl::string_view session,
                          uint64_t sequence, uint32_t n_tokens, uint32_t layer_begin,
                          uint32_t layer_end, int32_t first_position);
// SessionMeta over all of fp's layers, at positions sequence * n_tokens on
// (the blocks of one session laid end to end).
v1::BlockMeta SessionMeta(const v1::LayoutFingerprint& fp, absl::string_view session,
                          uint64_t sequence, uint32_t n_tokens);

// PrefixMeta: a prefix block holding `tokens` after `parent` (BlockId() for
// the first), over layers [layer_begin, layer_end), positions from
// `first_position`; the tokens are included so that the chain can be checked.
v1::BlockMeta PrefixMeta(const v1::LayoutFingerprint& fp, const BlockId& parent,
                         absl::Span<const int32_t> tokens, uint32_t layer_begin,
                         uint32_t layer_end, int32_t first_position);

// PrefixChainMetas: the prefix blocks of `block_tokens` tokens each covering
// `tokens` (a trailing partial block is left out), over all of fp's layers,
// chained from the root; their ids are PrefixChain(tokens, block_tokens,
// DigestFingerprint(fp)).
std::vector<v1::BlockMeta> PrefixChainMetas(const v1::LayoutFingerprint& fp,
                                            absl::Span<const int32_t> tokens,
                                            size_t block_tokens);

// IdOf returns the id of a block's metadata (BlockId() when meta.id() is not
// 16 bytes).
BlockId IdOf(const v1::BlockMeta& meta);

// ---------------------------------------------------------------------------
// Payloads.

// Payload returns `size` deterministic bytes for (seed, size): the same on
// every run and machine, different for different seeds (xorshift64).
std::string Payload(uint64_t seed, uint64_t size);
// FillPayload writes Payload(seed, size) into `data`.
void FillPayload(uint64_t seed, void* data, uint64_t size);
// CanonicalPayload: Payload(seed, n) where n is the canonical size of the
// block `meta` describes (CanonicalPayloadBytes); "" when it has none.
std::string CanonicalPayload(const v1::BlockMeta& meta, uint64_t seed);

// A block with its payload.
struct TestBlock {
  v1::BlockMeta meta;
  std::string payload;
  BlockId id() const { return IdOf(meta); }
};

// SessionBlock: SessionMeta(fp, session, seq, n_tokens) with its canonical
// payload, seeded by the session and sequence.
TestBlock SessionBlock(const std::string& session, uint64_t seq, uint32_t n_tokens,
                       const v1::LayoutFingerprint& fp = SmallFingerprint());

// ---------------------------------------------------------------------------
// Waiting.

// WaitUntil polls `done` every `interval` until it returns true (true) or
// `timeout` has passed (false, after one last poll at the deadline).
bool WaitUntil(absl::FunctionRef<bool()> done, absl::Duration timeout = absl::Seconds(10),
               absl::Duration interval = absl::Milliseconds(10));

// Eventually is WaitUntil as an assertion:
//   EXPECT_TRUE(Eventually([&] { return Stat().leases().leases() == 1; },
//                          "the lease ends"));
// fails with "the lease ends: still false after 10s".
::testing::AssertionResult Eventually(absl::FunctionRef<bool()> done, absl::string_view what,
                                      absl::Duration timeout = absl::Seconds(10),
                                      absl::Duration interval = absl::Milliseconds(10));

}  // namespace evoke::testing

#endif  // EVOKE_TESTING_BLOCKS_H_
