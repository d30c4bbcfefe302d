// Small CUDA helpers shared by the kernels' host wrappers (CUDA builds only).
#ifndef EVOKE_GPU_CUDA_UTIL_H_
#define EVOKE_GPU_CUDA_UTIL_H_

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "gpu/cuda_status.h"

namespace evoke {

// Restores the calling thread's current device when it goes out of scope.
class CurrentDeviceRestorer {
 public:
  explicit CurrentDeviceRestorer(int previous) : previous_(previous) {}
  CurrentDeviceRestorer(const CurrentDeviceRestorer&) = delete;
  CurrentDeviceRestorer& operator=(const CurrentDeviceRestorer&) = delete;
  ~CurrentDeviceRestorer() { cudaSetDevice(previous_); }

 private:
  int previous_;
};

// A non-blocking stream of the current device, destroyed with its owner.
class OwnedStream {
 public:
  OwnedStream() = default;
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  ~OwnedStream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  absl::Status Create() {
    return CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                      "cudaStreamCreateWithFlags");
  }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// CheckDeviceExists: UNAVAILABLE "device: CUDA device N does not exist (M
// visible)" unless `device` is a visible CUDA device.
absl::Status CheckDeviceExists(int device);

// The driver's cuMemGetAddressRange, reached through the runtime (no link
// against libcuda, which build machines do not have). Null if unavailable.
using GetAddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
GetAddressRangeFn AddressRangeFn();

// CheckDeviceMemory refuses (INVALID_ARGUMENT naming `field`) a pointer that
// is not device or managed memory of `device`, or whose `bytes` run past its
// allocation: a kernel that touched host or foreign memory would leave the
// context unusable for the whole process.
absl::Status CheckDeviceMemory(const void* p, uint64_t bytes, int device,
                               absl::string_view field);

}  // namespace evoke

#endif  // EVOKE_GPU_CUDA_UTIL_H_
