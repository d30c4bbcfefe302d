// GPU discovery. evoke builds with CUDA whenever nvcc is found and runs
// without a GPU everywhere: every caller must handle "no GPU".
#ifndef EVOKE_GPU_DEVICE_H_
#define EVOKE_GPU_DEVICE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace evoke {

struct GpuDevice {
  int ordinal = 0;
  std::string name;
  uint64_t total_memory_bytes = 0;
  int compute_major = 0;
  int compute_minor = 0;
};

// BuiltWithCuda reports whether this binary contains the CUDA
// implementations.
bool BuiltWithCuda();

// ListGpus returns the visible CUDA devices. UNAVAILABLE, with the reason,
// when the build has no CUDA, no driver is loaded, or no device exists.
// Thread-safe.
absl::StatusOr<std::vector<GpuDevice>> ListGpus();

}  // namespace evoke

#endif  // EVOKE_GPU_DEVICE_H_
