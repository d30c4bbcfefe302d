// evoke-bench without CUDA: no CUDA cases.
#include "absl/status/status.h"
#include "bench/cuda_bench.h"

namespace evoke::bench {

bool CudaBenchAvailable() { return false; }
absl::StatusOr<std::unique_ptr<CudaPool>> CudaPool::Create(uint64_t, uint64_t) {
  return absl::UnavailableError("built without CUDA");
}
CudaPool::~CudaPool() = default;
absl::StatusOr<double> CudaMemcpyBaseline(uint64_t, int, int, int) {
  return absl::UnavailableError("built without CUDA");
}

}  // namespace evoke::bench
