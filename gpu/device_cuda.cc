// CUDA implementation of gpu/device.h (built when EVOKE_CUDA is ON).
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gpu/cuda_status.h"
#include "gpu/device.h"

namespace evoke {

bool BuiltWithCuda() { return true; }

absl::StatusOr<std::vector<GpuDevice>> ListGpus() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return CudaStatus(err, "cudaGetDeviceCount");
  if (count == 0) return absl::UnavailableError("no CUDA device is visible");
  std::vector<GpuDevice> out;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    const cudaError_t e = cudaGetDeviceProperties(&prop, i);
    if (e != cudaSuccess) return CudaStatus(e, absl::StrCat("cudaGetDeviceProperties(", i, ")"));
    out.push_back(GpuDevice{i, prop.name, prop.totalGlobalMem, prop.major, prop.minor});
  }
  return out;
}

}  // namespace evoke
