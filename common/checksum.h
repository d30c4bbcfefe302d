// Payload checksums: xxHash3-64, recorded at Save and verified on every read
// from any tier.
#ifndef EVOKE_COMMON_CHECKSUM_H_
#define EVOKE_COMMON_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

namespace evoke {

// PayloadChecksum returns the xxHash3-64 (seed 0) of `size` bytes at `data`.
// `data` may be null when size is 0. Thread-safe; reads the bytes once at
// memory speed (tens of GB/s).
uint64_t PayloadChecksum(const void* data, size_t size);

// CopyHashingDestination copies `size` bytes and returns the checksum of the
// destination, computed chunk by chunk while each chunk is still in cache, so
// the checksum costs little beyond the copy. Use it when the destination is
// private (what is stored is exactly what was hashed) and the source may
// change under us (client shared memory).
uint64_t CopyHashingDestination(void* dst, const void* src, size_t size);

// CopyHashingSource copies `size` bytes and returns the checksum of the
// source, hashing each chunk before copying it. Use it to verify a private
// copy (tier 1, a RocksDB read) while handing it to memory the client can
// change.
uint64_t CopyHashingSource(void* dst, const void* src, size_t size);

}  // namespace evoke

#endif  // EVOKE_COMMON_CHECKSUM_H_
