#include "bench/cuda_bench.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace evoke::bench {
namespace {
absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}
}  // namespace

bool CudaBenchAvailable() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

absl::StatusOr<std::unique_ptr<CudaPool>> CudaPool::Create(uint64_t bytes, uint64_t seed) {
  void* p = nullptr;
  if (absl::Status s = Cuda(cudaMalloc(&p, bytes), "cudaMalloc"); !s.ok()) return s;
  cudaMemset(p, static_cast<int>(seed & 0xff) | 1, bytes);
  cudaDeviceSynchronize();
  cudaIpcMemHandle_t h;
  if (absl::Status s = Cuda(cudaIpcGetMemHandle(&h, p), "cudaIpcGetMemHandle"); !s.ok()) {
    cudaFree(p);
    return s;
  }
  return std::unique_ptr<CudaPool>(
      new CudaPool(p, bytes, std::string(reinterpret_cast<const char*>(&h), sizeof(h))));
}

CudaPool::~CudaPool() { cudaFree(ptr_); }

absl::StatusOr<double> CudaMemcpyBaseline(uint64_t block_bytes, int blocks, int batch,
                                          int mode) {
  const uint64_t total = block_bytes * blocks;
  void* dev = nullptr;
  void* host = nullptr;
  if (absl::Status s = Cuda(cudaMalloc(&dev, total), "cudaMalloc"); !s.ok()) return s;
  if (absl::Status s = Cuda(cudaHostAlloc(&host, total, cudaHostAllocDefault), "cudaHostAlloc");
      !s.ok()) {
    cudaFree(dev);
    return s;
  }
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  auto run = [&]() {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < blocks; i += batch) {
      for (int k = i; k < i + batch && k < blocks; ++k) {
        char* d = static_cast<char*>(dev) + k * block_bytes;
        char* h = static_cast<char*>(host) + k * block_bytes;
        if (mode == 0 || mode == 2) cudaMemcpyAsync(h, d, block_bytes, cudaMemcpyDeviceToHost, stream);
        if (mode == 1 || mode == 2) cudaMemcpyAsync(d, h, block_bytes, cudaMemcpyHostToDevice, stream);
      }
      cudaStreamSynchronize(stream);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // A warm-up, then the median of 5: one run of a few milliseconds is at
  // the mercy of the first touch and of the machine's noise, and every goal
  // of issue #12 is a ratio to this number.
  run();
  std::vector<double> times;
  for (int r = 0; r < 5; ++r) times.push_back(run());
  std::sort(times.begin(), times.end());
  const double seconds = times[times.size() / 2];
  cudaStreamDestroy(stream);
  cudaFreeHost(host);
  cudaFree(dev);
  return total / seconds / 1e9;
}

}  // namespace evoke::bench
