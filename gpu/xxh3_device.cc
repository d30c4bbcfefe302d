// CUDA implementation of gpu/xxh3_device.h (built when EVOKE_CUDA is ON): it
// checks the batch, then hands it to the kernel's launcher in
// gpu/xxh3_kernel.cu and translates its cudaError_t.
#include "gpu/xxh3_device.h"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "gpu/cuda_status.h"
#include "gpu/xxh3_parallel.h"

namespace evoke {
namespace xxh3 {

// Defined in gpu/xxh3_kernel.cu (no absl there, so no shared header).
cudaError_t LaunchChunkChecksums(const ChunkDesc* host_descs, size_t n, uint64_t* host_out,
                                 int device);

}  // namespace xxh3

static_assert(kDeviceChecksumMinBytes == xxh3::kShortestLong);

absl::Status DeviceChunkChecksums(int device, absl::Span<const DeviceRange> ranges,
                                  absl::Span<uint64_t> out) {
  if (absl::Status s = CheckChecksumRanges(ranges, out.size()); !s.ok()) return s;
  if (ranges.empty()) return absl::OkStatus();
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();  // Not sticky: clear it for the thread's next call.
    return CudaStatus(e, "DeviceChunkChecksums: cudaGetDeviceCount");
  }
  if (count == 0) return absl::UnavailableError("DeviceChunkChecksums: no CUDA device is visible");
  if (device < 0 || device >= count) {
    return absl::UnavailableError(absl::StrCat("DeviceChunkChecksums: CUDA device ", device,
                                               " does not exist (", count, " visible)"));
  }
  std::vector<xxh3::ChunkDesc> descs(ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) descs[i] = {ranges[i].ptr, ranges[i].bytes};
  return CudaStatus(xxh3::LaunchChunkChecksums(descs.data(), descs.size(), out.data(), device),
                    "DeviceChunkChecksums");
}

}  // namespace evoke
