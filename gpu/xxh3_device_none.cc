// Implementation of gpu/xxh3_device.h for builds without CUDA.
#include "absl/status/status.h"
#include "gpu/xxh3_device.h"

namespace evoke {

absl::Status DeviceChunkChecksums(int /*device*/, absl::Span<const DeviceRange> /*ranges*/,
                                  absl::Span<uint64_t> /*out*/) {
  return absl::UnavailableError("evoke was built without CUDA (nvcc not found)");
}

}  // namespace evoke
