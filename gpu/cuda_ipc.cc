// CUDA implementation of gpu/cuda_ipc.h.
#include "gpu/cuda_ipc.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gpu/cuda_status.h"
#include "gpu/cuda_util.h"

namespace evoke {

absl::StatusOr<std::unique_ptr<CudaIpcMapping>> CudaIpcMapping::Open(
    absl::string_view handle, int device, uint64_t size) {
  if (handle.size() != kCudaIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ipc_handle: must be ", kCudaIpcHandleBytes, " bytes, got ", handle.size()));
  }
  if (size == 0) return absl::InvalidArgumentError("size: must be > 0");
  if (absl::Status s = CheckDeviceExists(device); !s.ok()) return s;
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return CudaStatus(e, "cudaSetDevice");
  }
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* ptr = nullptr;
  const cudaError_t err = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    cudaGetLastError();  // Clear the sticky-free error state.
    absl::Status s = CudaStatus(err, "cudaIpcOpenMemHandle");
    if (err == cudaErrorInvalidValue || err == cudaErrorMapBufferObjectFailed ||
        err == cudaErrorInvalidResourceHandle || err == cudaErrorInvalidDevicePointer ||
        err == cudaErrorUnknown) {
      return absl::InvalidArgumentError(
          absl::StrCat("ipc_handle: the driver rejected it (", s.message(), ")"));
    }
    return s;
  }
  // Bound the claimed size by the real allocation; refuse when the driver
  // cannot tell (the size was trusted then: issue #11).
  DeviceAddressRange range;
  if (GetAddressRangeFn query = AddressRangeFn(); query != nullptr) {
    CUdeviceptr base = 0;
    size_t alloc = 0;
    if (query(&base, &alloc, reinterpret_cast<CUdeviceptr>(ptr)) == CUDA_SUCCESS) {
      range = {true, static_cast<uint64_t>(base), static_cast<uint64_t>(alloc)};
    }
  }
  const absl::StatusOr<uint64_t> checked =
      CheckMappedRegion(reinterpret_cast<uint64_t>(ptr), size, range);
  if (!checked.ok()) {
    cudaIpcCloseMemHandle(ptr);
    return checked.status();
  }
  const uint64_t available = *checked;
  return std::unique_ptr<CudaIpcMapping>(new CudaIpcMapping(ptr, device, size, available));
}

CudaIpcMapping::~CudaIpcMapping() {
  cudaSetDevice(device_);
  cudaIpcCloseMemHandle(ptr_);
}

class DeviceCopier::Impl {
 public:
  int device;
  absl::Mutex mu;
  std::vector<cudaStream_t> free_streams ABSL_GUARDED_BY(mu);
  std::vector<cudaStream_t> all_streams;

  cudaStream_t Acquire() {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](std::vector<cudaStream_t>* v) { return !v->empty(); }, &free_streams));
    cudaStream_t s = free_streams.back();
    free_streams.pop_back();
    return s;
  }
  void Release(cudaStream_t s) {
    absl::MutexLock lock(&mu);
    free_streams.push_back(s);
  }

  absl::Status Copy(absl::Span<const CopyOp> ops, cudaMemcpyKind kind) {
    const std::vector<CopyOp> merged = CoalesceCopies(ops);
    if (merged.empty()) return absl::OkStatus();
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      return CudaStatus(e, "cudaSetDevice");
    }
    cudaStream_t stream = Acquire();
    absl::Status status;
    for (const CopyOp& op : merged) {
      const cudaError_t e = cudaMemcpyAsync(op.dst, op.src, op.bytes, kind, stream);
      if (e != cudaSuccess) {
        status = CudaStatus(e, "cudaMemcpyAsync");
        break;
      }
    }
    const cudaError_t sync = cudaStreamSynchronize(stream);
    if (status.ok() && sync != cudaSuccess) {
      status = CudaStatus(sync, "cudaStreamSynchronize");
    }
    Release(stream);
    return status;
  }
};

absl::StatusOr<std::unique_ptr<DeviceCopier>> DeviceCopier::Create(int device,
                                                                  int streams) {
  if (absl::Status s = CheckDeviceExists(device); !s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return CudaStatus(e, "cudaSetDevice");
  }
  for (int i = 0; i < streams; ++i) {
    cudaStream_t s;
    if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        e != cudaSuccess) {
      for (cudaStream_t t : impl->all_streams) cudaStreamDestroy(t);
      return CudaStatus(e, "cudaStreamCreate");
    }
    impl->all_streams.push_back(s);
  }
  {
    absl::MutexLock lock(&impl->mu);
    impl->free_streams = impl->all_streams;
  }
  return std::unique_ptr<DeviceCopier>(new DeviceCopier(device, std::move(impl)));
}

DeviceCopier::DeviceCopier(int device, std::unique_ptr<Impl> impl)
    : device_(device), impl_(std::move(impl)) {}

DeviceCopier::~DeviceCopier() {
  cudaSetDevice(device_);
  for (cudaStream_t s : impl_->all_streams) cudaStreamDestroy(s);
}

absl::Status DeviceCopier::DeviceToHost(absl::Span<const CopyOp> ops) {
  return impl_->Copy(ops, cudaMemcpyDeviceToHost);
}

absl::Status DeviceCopier::HostToDevice(absl::Span<const CopyOp> ops) {
  return impl_->Copy(ops, cudaMemcpyHostToDevice);
}

absl::StatusOr<std::unique_ptr<HostRegistration>> HostRegistration::Start(
    void* base, uint64_t size, uint64_t chunk_bytes) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return CudaStatus(err, "cudaGetDeviceCount");
  if (count == 0) return absl::UnavailableError("no CUDA device");
  std::unique_ptr<HostRegistration> r(new HostRegistration(base, size, chunk_bytes));
  r->thread_ = std::thread([p = r.get()] { p->Run(); });
  return r;
}

HostRegistration::HostRegistration(void* base, uint64_t size, uint64_t chunk)
    : base_(static_cast<uint8_t*>(base)), size_(size), chunk_(chunk) {}

void HostRegistration::Run() {
  const absl::Time start = absl::Now();
  for (uint64_t off = 0; off < size_ && !stop_.load(); off += chunk_) {
    const uint64_t n = std::min(chunk_, size_ - off);
    // Portable: usable from every device and context.
    const cudaError_t e = cudaHostRegister(base_ + off, n, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
      error_code_ = static_cast<int>(e);
      cudaGetLastError();
      break;
    }
    registered_ += n;
  }
  elapsed_ns_ = absl::ToInt64Nanoseconds(absl::Now() - start);
  done_ = true;
}

absl::Status HostRegistration::status() const {
  const int code = error_code_.load();
  if (code == 0) return absl::OkStatus();
  return CudaStatus(static_cast<cudaError_t>(code), "cudaHostRegister");
}

HostRegistration::~HostRegistration() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  const uint64_t done = registered_.load();
  for (uint64_t off = 0; off < done; off += chunk_) cudaHostUnregister(base_ + off);
}

}  // namespace evoke
