#include "common/checksum.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <algorithm>
#include <cstring>

namespace evoke {

uint64_t PayloadChecksum(const void* data, size_t size) {
  return XXH3_64bits(data, size);
}

namespace {

// Chunks small enough to stay in L2 between the copy and the hash.
constexpr size_t kChunk = 64 * 1024;

template <bool kHashDestination>
uint64_t CopyHashing(void* dst, const void* src, size_t size) {
  if (size <= kChunk) {
    if (!kHashDestination) {
      const uint64_t h = XXH3_64bits(src, size);
      std::memcpy(dst, src, size);
      return h;
    }
    std::memcpy(dst, src, size);
    return XXH3_64bits(dst, size);
  }
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  for (size_t off = 0; off < size; off += kChunk) {
    const size_t n = std::min(kChunk, size - off);
    if (kHashDestination) {
      std::memcpy(d + off, s + off, n);
      XXH3_64bits_update(&state, d + off, n);
    } else {
      XXH3_64bits_update(&state, s + off, n);
      std::memcpy(d + off, s + off, n);
    }
  }
  return XXH3_64bits_digest(&state);
}

}  // namespace

uint64_t CopyHashingDestination(void* dst, const void* src, size_t size) {
  return CopyHashing<true>(dst, src, size);
}

uint64_t CopyHashingSource(void* dst, const void* src, size_t size) {
  return CopyHashing<false>(dst, src, size);
}

}  // namespace evoke
