#include "gpu/cuda_util.h"

#include "absl/strings/str_cat.h"

namespace evoke {

absl::Status CheckDeviceExists(int device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return CudaStatus(err, "cudaGetDeviceCount");
  if (device < 0 || device >= count) {
    return absl::UnavailableError(absl::StrCat(
        "device: CUDA device ", device, " does not exist (", count, " visible)"));
  }
  return absl::OkStatus();
}

GetAddressRangeFn AddressRangeFn() {
  static GetAddressRangeFn fn = []() -> GetAddressRangeFn {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &p, 12000,
                                         cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      return nullptr;
    }
    return reinterpret_cast<GetAddressRangeFn>(p);
  }();
  return fn;
}

absl::Status CheckDeviceMemory(const void* payload, uint64_t bytes, int device,
                                absl::string_view field) {
  cudaPointerAttributes attrs;
  const cudaError_t err = cudaPointerGetAttributes(&attrs, payload);
  if (err != cudaSuccess) {
    cudaGetLastError();  // Not sticky; clear it.
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": not CUDA memory (", cudaGetErrorName(err), ")"));
  }
  if (attrs.type != cudaMemoryTypeDevice && attrs.type != cudaMemoryTypeManaged) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": not device memory (host or unregistered memory)"));
  }
  if (attrs.type == cudaMemoryTypeDevice && attrs.device != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": memory of CUDA device ", attrs.device, ", not of device ",
        device));
  }
  if (GetAddressRangeFn range = AddressRangeFn(); range != nullptr) {
    CUdeviceptr base = 0;
    size_t alloc = 0;
    const CUdeviceptr ptr = reinterpret_cast<CUdeviceptr>(payload);
    if (range(&base, &alloc, ptr) == CUDA_SUCCESS && base + alloc - ptr < bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", bytes, " bytes run past the allocation (",
          base + alloc - ptr, " bytes left)"));
    }
  }
  return absl::OkStatus();
}


}  // namespace evoke
