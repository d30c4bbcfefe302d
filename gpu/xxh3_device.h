// Payload chunk checksums computed on the GPU, where the payload already is
// (a client's CUDA IPC allocation, say), so that copies to the host tier do
// not wait for the CPU to hash them. Bit-exact with the host: each result is
// ChunkChecksum (common/checksum.h), i.e. XXH3_64bits with seed 0.
//
// The kernel (gpu/xxh3_kernel.cu) follows the decomposition in
// gpu/xxh3_parallel.h, whose host reference is tested against libxxhash.
// Builds without CUDA too: then every call returns UNAVAILABLE.
#ifndef EVOKE_GPU_XXH3_DEVICE_H_
#define EVOKE_GPU_XXH3_DEVICE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace evoke {

// One range of device memory to hash.
struct DeviceRange {
  const void* ptr = nullptr;  // device pointer, any alignment
  uint64_t bytes = 0;
};

// Shortest range DeviceChunkChecksums takes; shorter ones take XXH3's short
// paths, which are cheap on the host (hash those there).
inline constexpr uint64_t kDeviceChecksumMinBytes = 241;

// DeviceChunkChecksums computes ChunkChecksum (== XXH3_64bits, seed 0) of
// each device range, from kDeviceChecksumMinBytes to kChecksumChunkBytes
// (1 MiB) bytes, on `device`, with one kernel launch for the whole batch, and
// blocks until the results are in `out` (out[i] for ranges[i]).
//
// The ranges must lie in memory that `device` can read (its own
// allocations, CUDA IPC mappings opened on it, peer memory it may access)
// and must not be written while the call runs; the call reads them and keeps
// no reference afterwards. A range outside mapped memory is a device fault,
// reported as the CUDA error (and CUDA leaves the process's context on that
// device unusable), so pass only ranges the daemon has bounds-checked.
//
// Returns OK; INVALID_ARGUMENT when out.size() != ranges.size(), a range is
// null, shorter than kDeviceChecksumMinBytes or longer than 1 MiB;
// UNAVAILABLE when evoke was built without CUDA, there is no CUDA device or
// no device `device`; RESOURCE_EXHAUSTED when device or pinned memory for
// the batch's descriptors cannot be allocated; UNAVAILABLE or INTERNAL for
// other CUDA failures (gpu/cuda_status.h). An empty batch is OK and touches
// no device.
//
// Thread-safe: concurrent calls use separate streams and buffers (a small
// per-device pool kept for the life of the process). Changes the calling
// thread's current CUDA device to `device`.
absl::Status DeviceChunkChecksums(int device, absl::Span<const DeviceRange> ranges,
                                  absl::Span<uint64_t> out);

// CheckChecksumRanges validates a DeviceChunkChecksums batch without touching
// a device (the INVALID_ARGUMENT cases above), for every implementation of
// device checksums (CUDA, and the host-memory fake in testing/).
absl::Status CheckChecksumRanges(absl::Span<const DeviceRange> ranges, size_t out_slots);

}  // namespace evoke

#endif  // EVOKE_GPU_XXH3_DEVICE_H_
