// Implementation of gpu/device.h for builds without CUDA.
#include "absl/status/status.h"
#include "gpu/device.h"

namespace evoke {

bool BuiltWithCuda() { return false; }

absl::StatusOr<std::vector<GpuDevice>> ListGpus() {
  return absl::UnavailableError("evoke was built without CUDA (nvcc not found)");
}

}  // namespace evoke
