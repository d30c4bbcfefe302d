// Payload checksums, recorded at Save and verified on every read from any
// tier.
//
// Definition (v1), so that any client can compute it:
//   payload <= 1 MiB:  XXH3_64bits(payload)                (seed 0)
//   payload >  1 MiB:  XXH3_64bits(u64 total_length ||
//                                  XXH3_64bits(chunk_0) || ... ||
//                                  XXH3_64bits(chunk_k))
//     where chunk_i are consecutive 1 MiB pieces (the last may be shorter)
//     and every u64 is little endian.
// Chunking lets large payloads be copied and hashed on several threads.
#ifndef EVOKE_COMMON_CHECKSUM_H_
#define EVOKE_COMMON_CHECKSUM_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace evoke {

inline constexpr size_t kChecksumChunkBytes = 1 << 20;

// PayloadChecksum returns the checksum of `size` bytes at `data` (null when
// size is 0). Thread-safe.
uint64_t PayloadChecksum(const void* data, size_t size);

// ChunkChecksum is XXH3_64bits of one chunk (at most kChecksumChunkBytes).
uint64_t ChunkChecksum(const void* data, size_t size);

// CombineChunkChecksums turns the chunk checksums of a payload of
// `total_size` bytes into its checksum (for total_size <= 1 MiB, the one
// chunk's checksum).
uint64_t CombineChunkChecksums(absl::Span<const uint64_t> chunks, size_t total_size);

// PayloadHasher computes PayloadChecksum of a payload handed to it in
// order, in any number of Updates of any sizes (chunk boundaries are its
// business): for hashing a payload whose pieces arrive one after another.
class PayloadHasher {
 public:
  PayloadHasher();
  void Update(const void* data, size_t size);
  // PayloadChecksum of the bytes updated so far; the hasher is spent.
  uint64_t Finish();

 private:
  alignas(64) unsigned char state_[640];  // An XXH3_state_t (checked in the .cc).
  size_t total_ = 0;     // Bytes updated so far.
  size_t in_chunk_ = 0;  // Of which in the current chunk.
  std::vector<uint64_t> chunks_;  // Checksums of the chunks completed.
};

// CopyHashingDestination copies `size` bytes and returns the checksum of the
// destination, hashing each piece while it is still in cache, so the
// checksum costs little beyond the copy. Use it when the destination is
// private (what is stored is exactly what was hashed) and the source may
// change under us (client shared memory).
uint64_t CopyHashingDestination(void* dst, const void* src, size_t size);

// CopyHashingSource copies `size` bytes and returns the checksum of the
// source, hashing each piece right after copying it (still in cache). Use it
// to verify a private copy (tier 1, a RocksDB read) while handing it to
// memory the client can change: a mismatch means the bytes handed over are
// not the block's, and the caller must fail the read.
uint64_t CopyHashingSource(void* dst, const void* src, size_t size);

// The same, for one chunk (size <= kChecksumChunkBytes): returns
// ChunkChecksum of the hashed side. Building blocks of parallel copies.
uint64_t CopyHashingDestinationChunk(void* dst, const void* src, size_t size);
uint64_t CopyHashingSourceChunk(void* dst, const void* src, size_t size);

// Payloads held in several pieces, in order (bytes left in the buffers a
// transport received them in), without gathering them first:
//   PiecesChecksum is PayloadChecksum of the pieces' concatenation;
//   CopyPiecesHashingDestination copies the concatenation to `dst` (the sum
//     of the pieces' sizes) and returns PayloadChecksum of the copy, each
//     piece hashed from cache right after it is copied;
//   CopyPiecesHashingDestinationChunk does that for bytes [offset, offset +
//     size) of the concatenation (size <= kChecksumChunkBytes) and returns
//     ChunkChecksum of the copy: the building block of parallel copies.
size_t PiecesSize(absl::Span<const absl::string_view> pieces);  // The sum of their sizes.
uint64_t PiecesChecksum(absl::Span<const absl::string_view> pieces);
uint64_t CopyPiecesHashingDestination(void* dst, absl::Span<const absl::string_view> pieces);
uint64_t CopyPiecesHashingDestinationChunk(void* dst, absl::Span<const absl::string_view> pieces,
                                           size_t offset, size_t size);

}  // namespace evoke

#endif  // EVOKE_COMMON_CHECKSUM_H_
