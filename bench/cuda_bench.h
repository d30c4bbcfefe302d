// CUDA helpers of evoke-bench: a device pool exported by IPC handle (what an
// engine's KV pool is), and the in-process cudaMemcpyAsync baseline. Without
// CUDA, CudaBenchAvailable() is false and the factories fail.
#ifndef EVOKE_BENCH_CUDA_BENCH_H_
#define EVOKE_BENCH_CUDA_BENCH_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace evoke::bench {

bool CudaBenchAvailable();

// CudaPool: `bytes` of device memory on device 0, filled from `seed`, with its
// IPC handle. Freed on destruction.
class CudaPool {
 public:
  static absl::StatusOr<std::unique_ptr<CudaPool>> Create(uint64_t bytes, uint64_t seed);
  ~CudaPool();
  const std::string& ipc_handle() const { return handle_; }
  int device() const { return 0; }
  uint64_t size() const { return size_; }
  void* data() const { return ptr_; }

 private:
  CudaPool(void* ptr, uint64_t size, std::string handle)
      : ptr_(ptr), size_(size), handle_(std::move(handle)) {}
  void* ptr_;
  uint64_t size_;
  std::string handle_;
};

// CudaMemcpyBaseline returns the GB/s of plain cudaMemcpyAsync between a
// device buffer and pinned host memory in this process, for `blocks` blocks
// of `block_bytes` in batches of `batch` (one synchronize per batch), as
// device->host (mode 0), host->device (1) or both in turn (2): the median
// of 5 timed passes after a warm-up pass.
absl::StatusOr<double> CudaMemcpyBaseline(uint64_t block_bytes, int blocks, int batch,
                                          int mode);

}  // namespace evoke::bench

#endif  // EVOKE_BENCH_CUDA_BENCH_H_
