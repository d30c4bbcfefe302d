// Block ids: the prefix token-hash chain and session block addressing.
//
// Both are xxHash3-128 over a documented byte encoding (little-endian
// integers, length-prefixed strings, a domain string first), so every client
// language can reproduce them:
//   PrefixBlockId  = H("evoke/prefix/v1", parent[16], fingerprint digest[16],
//                      u64 n_tokens, tokens as i32...)
//   SessionBlockId = H("evoke/session/v1", u64 len, namespace, u64 len,
//                      session_id, u64 sequence)
//
// Public header of the client library (installed as <evoke/chain_hash.h>); it
// stands alone. evoke's own code reaches it as common/chain_hash.h, which
// includes this file.
#ifndef EVOKE_PUBLIC_CHAIN_HASH_H_
#define EVOKE_PUBLIC_CHAIN_HASH_H_

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "evoke/hash128.h"

namespace evoke {

// PrefixBlockId returns id_i = H(id_{i-1}, tokens_i, fingerprint). The first
// block of a sequence has parent = BlockId() (all zeros). Thread-safe.
BlockId PrefixBlockId(const BlockId& parent, absl::Span<const int32_t> tokens,
                      const FingerprintDigest& fingerprint);

// PrefixChain returns the ids of consecutive blocks of `block_tokens` tokens
// covering `tokens`; a trailing partial block is not included (it is not
// shareable until full). block_tokens must be > 0.
std::vector<BlockId> PrefixChain(absl::Span<const int32_t> tokens,
                                 size_t block_tokens,
                                 const FingerprintDigest& fingerprint,
                                 const BlockId& root = BlockId());

// SessionBlockId returns the id of block `sequence` of session `session_id`
// in namespace `ns`. Thread-safe.
BlockId SessionBlockId(absl::string_view ns, absl::string_view session_id,
                       uint64_t sequence);

}  // namespace evoke

#endif  // EVOKE_PUBLIC_CHAIN_HASH_H_
