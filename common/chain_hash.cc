#include "common/chain_hash.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <bit>
#include <string>

namespace evoke {
namespace {

static_assert(std::endian::native == std::endian::little,
              "chain ids hash integers in their little-endian encoding");

class Hasher {
 public:
  explicit Hasher(absl::string_view domain) {
    XXH3_128bits_reset(&state_);
    Bytes(domain);
  }
  void Bytes(absl::string_view b) {
    XXH3_128bits_update(&state_, b.data(), b.size());
  }
  void U64(uint64_t v) { XXH3_128bits_update(&state_, &v, sizeof(v)); }
  void Sized(absl::string_view b) {
    U64(b.size());
    Bytes(b);
  }
  Hash128 Finish() {
    const XXH128_hash_t h = XXH3_128bits_digest(&state_);
    return Hash128(h.high64, h.low64);
  }

 private:
  XXH3_state_t state_;
};

}  // namespace

BlockId PrefixBlockId(const BlockId& parent, absl::Span<const int32_t> tokens,
                      const FingerprintDigest& fingerprint) {
  Hasher h("evoke/prefix/v1");
  h.Bytes(parent.ToBytes());
  h.Bytes(fingerprint.ToBytes());
  h.U64(tokens.size());
  h.Bytes(absl::string_view(reinterpret_cast<const char*>(tokens.data()),
                            tokens.size() * sizeof(int32_t)));
  return h.Finish();
}

std::vector<BlockId> PrefixChain(absl::Span<const int32_t> tokens,
                                 size_t block_tokens,
                                 const FingerprintDigest& fingerprint,
                                 const BlockId& root) {
  std::vector<BlockId> ids;
  if (block_tokens == 0) return ids;
  ids.reserve(tokens.size() / block_tokens);
  BlockId parent = root;
  for (size_t begin = 0; begin + block_tokens <= tokens.size();
       begin += block_tokens) {
    parent = PrefixBlockId(parent, tokens.subspan(begin, block_tokens),
                           fingerprint);
    ids.push_back(parent);
  }
  return ids;
}

BlockId SessionBlockId(absl::string_view ns, absl::string_view session_id,
                       uint64_t sequence) {
  Hasher h("evoke/session/v1");
  h.Sized(ns);
  h.Sized(session_id);
  h.U64(sequence);
  return h.Finish();
}

}  // namespace evoke
