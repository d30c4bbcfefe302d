// CUDA implementation of gpu/rope_device.h: validates on the host, stages the
// angle table and the deltas, launches gpu/rope_kernel.cu on a private
// stream and waits for it.
#include "gpu/rope_device.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gpu/cuda_status.h"
#include "gpu/cuda_util.h"
#include "gpu/kernel_enums.h"

namespace evoke {

static_assert(kernel::kDTypeF16 == v1::DTYPE_F16 && kernel::kDTypeBf16 == v1::DTYPE_BF16 &&
              kernel::kDTypeF32 == v1::DTYPE_F32);
static_assert(kernel::kRopeNorm == v1::ROPE_NORM && kernel::kRopeNeox == v1::ROPE_NEOX);

// Defined in gpu/rope_kernel.cu (which stays free of Abseil and protobuf).
extern "C++" cudaError_t LaunchRopeReanchor(void* payload, uint64_t layer_stride_bytes,
                                            uint32_t n_layers, uint32_t n_tokens,
                                            uint32_t n_heads, uint32_t head_dim,
                                            uint32_t rotary_dim, int rope_type,
                                            int k_dtype, const double* omega,
                                            const int64_t* delta, cudaStream_t stream);

absl::Status ReanchorCanonicalBlockOnDevice(const RopePlan& plan,
                                            const v1::BlockMeta& meta,
                                            void* device_payload,
                                            uint64_t payload_bytes,
                                            absl::Span<const int64_t> delta,
                                            int device) {
  const DeviceReanchorJob job{&plan, &meta, device_payload, payload_bytes, delta};
  return ReanchorCanonicalBlocksOnDevice(absl::MakeConstSpan(&job, 1), device);
}

absl::Status ReanchorCanonicalBlocksOnDevice(absl::Span<const DeviceReanchorJob> jobs,
                                             int device) {
  struct Ready {
    const DeviceReanchorJob* job;
    CanonicalKSections sections;
    size_t table_offset;  // In the staging buffer, bytes.
  };
  std::vector<Ready> ready;
  std::vector<uint8_t> staging;
  for (const DeviceReanchorJob& job : jobs) {
    EVOKE_ASSIGN_OR_RETURN(
        const CanonicalKSections s,
        CheckCanonicalReanchor(*job.plan, *job.meta, job.payload_bytes, job.delta));
    if (job.plan->type == v1::ROPE_NONE ||
        std::all_of(job.delta.begin(), job.delta.end(), [](int64_t d) { return d == 0; })) {
      continue;
    }
    if (job.device_payload == nullptr) {
      return absl::InvalidArgumentError("device_payload: is null");
    }
    const size_t offset = staging.size();
    const size_t n_pairs = job.plan->omega.size();
    staging.resize(offset + (n_pairs + job.delta.size()) * 8);
    std::memcpy(staging.data() + offset, job.plan->omega.data(), n_pairs * 8);
    std::memcpy(staging.data() + offset + n_pairs * 8, job.delta.data(), job.delta.size() * 8);
    ready.push_back(Ready{&job, s, offset});
  }
  if (ready.empty()) return absl::OkStatus();
  EVOKE_RETURN_IF_ERROR(CheckDeviceExists(device));
  int previous = 0;
  EVOKE_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&previous), "cudaGetDevice"));
  CurrentDeviceRestorer restore(previous);
  EVOKE_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  for (const Ready& r : ready) {
    EVOKE_RETURN_IF_ERROR(
        CheckDeviceMemory(r.job->device_payload, r.job->payload_bytes, device,
                          "device_payload"));
  }
  OwnedStream stream;
  EVOKE_RETURN_IF_ERROR(stream.Create());
  void* table = nullptr;
  cudaError_t err = cudaMallocAsync(&table, staging.size(), stream.get());
  if (err != cudaSuccess) return CudaStatus(err, "cudaMallocAsync");
  absl::Status status = CudaStatus(
      cudaMemcpyAsync(table, staging.data(), staging.size(), cudaMemcpyHostToDevice,
                      stream.get()),
      "cudaMemcpyAsync");
  for (size_t i = 0; i < ready.size() && status.ok(); ++i) {
    const Ready& r = ready[i];
    const uint8_t* base = static_cast<uint8_t*>(table) + r.table_offset;
    const double* omega = reinterpret_cast<const double*>(base);
    const int64_t* d = reinterpret_cast<const int64_t*>(base + r.job->plan->omega.size() * 8);
    status = CudaStatus(
        LaunchRopeReanchor(r.job->device_payload, r.sections.layer_stride_bytes,
                           r.sections.n_layers, r.sections.n_tokens, r.sections.n_heads,
                           r.sections.head_dim, r.job->plan->rotary_dim,
                           static_cast<int>(r.job->plan->type),
                           static_cast<int>(r.sections.k_dtype), omega, d, stream.get()),
        "rope re-anchor kernel launch");
  }
  const cudaError_t free_err = cudaFreeAsync(table, stream.get());
  const cudaError_t sync_err = cudaStreamSynchronize(stream.get());
  if (status.ok()) status = CudaStatus(sync_err, "cudaStreamSynchronize");
  if (status.ok()) status = CudaStatus(free_err, "cudaFreeAsync");
  return status;
}

}  // namespace evoke
