#include "common/checksum.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#if defined(__x86_64__)
// Debian's libxxhash carries runtime-dispatched XXH3 (SSE2, AVX2, AVX-512);
// this header routes XXH3_64bits and XXH3_64bits_update to it. Same hash
// values, faster on AVX2/AVX-512 machines.
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>
#include <cstring>
#include <vector>

namespace evoke {
namespace {

// Pieces small enough to stay in L2 between the copy and the hash. Both
// sides copy a piece first and hash it right after, from cache: hashing the
// source before copying it (the order until issue #26) read it from memory
// for the hash and left the copy slower, 8.9 against 12.7 GB/s at 1 MiB
// here (evoke_micro_bench BM_CopyHashingSource; memcpy 15.4).
constexpr size_t kPiece = 128 * 1024;

template <bool kHashDestination>
uint64_t CopyHashingChunkImpl(void* dst, const void* src, size_t size) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  // The hashed side: what is stored (the destination), or the private copy
  // being verified (the source, which nobody else writes).
  const uint8_t* hashed = kHashDestination ? d : s;
  if (size <= kPiece) {
    std::memcpy(d, s, size);
    return XXH3_64bits(hashed, size);
  }
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (size_t off = 0; off < size; off += kPiece) {
    const size_t n = std::min(kPiece, size - off);
    std::memcpy(d + off, s + off, n);
    XXH3_64bits_update(&state, hashed + off, n);
  }
  return XXH3_64bits_digest(&state);
}

template <bool kHashDestination>
uint64_t CopyHashingImpl(void* dst, const void* src, size_t size) {
  if (size <= kChecksumChunkBytes) {
    return CopyHashingChunkImpl<kHashDestination>(dst, src, size);
  }
  std::vector<uint64_t> chunks;
  chunks.reserve((size + kChecksumChunkBytes - 1) / kChecksumChunkBytes);
  for (size_t off = 0; off < size; off += kChecksumChunkBytes) {
    const size_t n = std::min(kChecksumChunkBytes, size - off);
    chunks.push_back(CopyHashingChunkImpl<kHashDestination>(
        static_cast<uint8_t*>(dst) + off, static_cast<const uint8_t*>(src) + off, n));
  }
  return CombineChunkChecksums(chunks, size);
}

// ForEachFragment calls fn(data, n) on bytes [offset, offset + size) of the
// concatenation of `pieces`, in order, at most kPiece bytes at a time.
template <typename Fn>
void ForEachFragment(absl::Span<const absl::string_view> pieces, size_t offset, size_t size,
                     Fn fn) {
  size_t at = 0;  // Where the current piece starts in the concatenation.
  for (absl::string_view piece : pieces) {
    if (size == 0) return;
    if (offset >= at + piece.size()) {
      at += piece.size();
      continue;
    }
    size_t begin = offset - at;
    const size_t end = begin + std::min(piece.size() - begin, size);
    offset += end - begin;
    size -= end - begin;
    for (; begin < end; begin += std::min(kPiece, end - begin)) {
      fn(reinterpret_cast<const uint8_t*>(piece.data()) + begin, std::min(kPiece, end - begin));
    }
    at += piece.size();
  }
}

}  // namespace

size_t PiecesSize(absl::Span<const absl::string_view> pieces) {
  size_t total = 0;
  for (absl::string_view piece : pieces) total += piece.size();
  return total;
}

uint64_t ChunkChecksum(const void* data, size_t size) { return XXH3_64bits(data, size); }

uint64_t CombineChunkChecksums(absl::Span<const uint64_t> chunks, size_t total_size) {
  if (total_size <= kChecksumChunkBytes) return chunks.empty() ? XXH3_64bits(nullptr, 0) : chunks[0];
  std::vector<uint64_t> words;
  words.reserve(chunks.size() + 1);
  words.push_back(total_size);  // Little endian on every supported host.
  words.insert(words.end(), chunks.begin(), chunks.end());
  return XXH3_64bits(words.data(), words.size() * sizeof(uint64_t));
}

uint64_t PayloadChecksum(const void* data, size_t size) {
  if (size <= kChecksumChunkBytes) return XXH3_64bits(data, size);
  std::vector<uint64_t> chunks;
  for (size_t off = 0; off < size; off += kChecksumChunkBytes) {
    chunks.push_back(XXH3_64bits(static_cast<const uint8_t*>(data) + off,
                                 std::min(kChecksumChunkBytes, size - off)));
  }
  return CombineChunkChecksums(chunks, size);
}

static_assert(sizeof(XXH3_state_t) <= 640 && alignof(XXH3_state_t) <= 64);

PayloadHasher::PayloadHasher() {
  XXH3_64bits_reset(reinterpret_cast<XXH3_state_t*>(state_));
}

void PayloadHasher::Update(const void* data, size_t size) {
  auto* state = reinterpret_cast<XXH3_state_t*>(state_);
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    if (in_chunk_ == kChecksumChunkBytes) {
      chunks_.push_back(XXH3_64bits_digest(state));
      XXH3_64bits_reset(state);
      in_chunk_ = 0;
    }
    const size_t n = std::min(size, kChecksumChunkBytes - in_chunk_);
    XXH3_64bits_update(state, p, n);
    p += n;
    size -= n;
    in_chunk_ += n;
    total_ += n;
  }
}

uint64_t PayloadHasher::Finish() {
  chunks_.push_back(XXH3_64bits_digest(reinterpret_cast<XXH3_state_t*>(state_)));
  return CombineChunkChecksums(chunks_, total_);
}

uint64_t CopyHashingDestination(void* dst, const void* src, size_t size) {
  return CopyHashingImpl<true>(dst, src, size);
}

uint64_t CopyHashingSource(void* dst, const void* src, size_t size) {
  return CopyHashingImpl<false>(dst, src, size);
}

uint64_t PiecesChecksum(absl::Span<const absl::string_view> pieces) {
  PayloadHasher hasher;
  for (absl::string_view piece : pieces) hasher.Update(piece.data(), piece.size());
  return hasher.Finish();
}

uint64_t CopyPiecesHashingDestinationChunk(void* dst, absl::Span<const absl::string_view> pieces,
                                           size_t offset, size_t size) {
  auto* d = static_cast<uint8_t*>(dst);
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  // The copy is hashed in steps of kPiece (still in cache), not per
  // fragment: a transport's pieces are often 16 KiB, and XXH3 pays for
  // each update.
  size_t filled = 0, hashed = 0;
  ForEachFragment(pieces, offset, size, [&](const uint8_t* p, size_t n) {
    std::memcpy(d + filled, p, n);
    filled += n;
    if (filled - hashed >= kPiece) {
      XXH3_64bits_update(&state, d + hashed, filled - hashed);
      hashed = filled;
    }
  });
  XXH3_64bits_update(&state, d + hashed, filled - hashed);
  return XXH3_64bits_digest(&state);
}

uint64_t CopyPiecesHashingDestination(void* dst, absl::Span<const absl::string_view> pieces) {
  // One pass over the pieces (a gather list may hold thousands), hashing
  // the copy in steps of kPiece, still in cache (PayloadHasher keeps the
  // chunk boundaries).
  auto* d = static_cast<uint8_t*>(dst);
  PayloadHasher hasher;
  size_t filled = 0, hashed = 0;
  for (absl::string_view piece : pieces) {
    for (size_t done = 0; done < piece.size();) {
      const size_t take = std::min(piece.size() - done, kPiece - (filled - hashed));
      std::memcpy(d + filled, piece.data() + done, take);
      done += take;
      filled += take;
      if (filled - hashed == kPiece) {
        hasher.Update(d + hashed, kPiece);
        hashed = filled;
      }
    }
  }
  hasher.Update(d + hashed, filled - hashed);
  return hasher.Finish();
}

uint64_t CopyHashingDestinationChunk(void* dst, const void* src, size_t size) {
  return CopyHashingChunkImpl<true>(dst, src, size);
}

uint64_t CopyHashingSourceChunk(void* dst, const void* src, size_t size) {
  return CopyHashingChunkImpl<false>(dst, src, size);
}

}  // namespace evoke
