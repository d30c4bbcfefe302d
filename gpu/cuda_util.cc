#include "gpu/cuda_util.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gpu/cuda_ipc.h"

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
  // Bound `bytes` by the allocation the driver reports; when it cannot
  // report one, refuse rather than trust the size (issue #11: a kernel
  // running past the allocation touches foreign memory or faults the
  // context of the whole process). Zero bytes touch nothing.
  if (bytes == 0) return absl::OkStatus();
  const uint64_t ptr = reinterpret_cast<uint64_t>(payload);
  DeviceAddressRange range;
  if (GetAddressRangeFn query = AddressRangeFn(); query != nullptr) {
    CUdeviceptr base = 0;
    size_t alloc = 0;
    if (query(&base, &alloc, static_cast<CUdeviceptr>(ptr)) == CUDA_SUCCESS) {
      range = {true, static_cast<uint64_t>(base), static_cast<uint64_t>(alloc)};
    }
  }
  if (const absl::StatusOr<uint64_t> checked = CheckMappedRegion(ptr, bytes, range);
      !checked.ok()) {
    // CheckMappedRegion names its field "size"; this check's is `field`.
    absl::string_view why = checked.status().message();
    absl::ConsumePrefix(&why, "size: ");
    return absl::Status(checked.status().code(), absl::StrCat(field, ": ", why));
  }
  return absl::OkStatus();
}

}  // namespace evoke
