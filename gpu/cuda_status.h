// CudaStatus: cudaError_t -> absl::Status, translated once, at the gpu/ edge.
// Only included by files compiled with the CUDA toolkit.
#ifndef EVOKE_GPU_CUDA_STATUS_H_
#define EVOKE_GPU_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace evoke {

// Device, driver and resource problems are UNAVAILABLE or RESOURCE_EXHAUSTED
// (the daemon keeps serving on the CPU paths); bad handles and arguments are
// INVALID_ARGUMENT; anything else is INTERNAL.
inline absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", cudaGetErrorName(err), " (",
                                       cudaGetErrorString(err), ")");
  switch (err) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorStubLibrary:
      return absl::UnavailableError(msg);
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorMapBufferObjectFailed:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace evoke

#endif  // EVOKE_GPU_CUDA_STATUS_H_
