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

}  // namespace evoke

#endif  // EVOKE_COMMON_CHECKSUM_H_
