// CUDA implementation of gpu/repr_keys.h: checks on the host (the same checks
// as the CPU path, common/summaries.h's LocateKeys), stages the angle table
// and positions, runs gpu/repr_keys_kernel.cu on a private stream and reads
// back heads x head_dim floats.
#include "gpu/repr_keys.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/summaries.h"
#include "gpu/cuda_status.h"
#include "gpu/cuda_util.h"

namespace evoke {

// Defined in gpu/repr_keys_kernel.cu.
extern "C++" cudaError_t LaunchReprKeys(const void* k_section, int k_dtype, uint32_t n_tokens,
                                        uint32_t n_heads, uint32_t head_dim,
                                        uint32_t rotary_dim, int rope_type,
                                        const double* omega, const int64_t* positions,
                                        const float* attention, uint32_t r, uint32_t* top,
                                        float* out, int* bad, cudaStream_t stream);

absl::StatusOr<v1::Summary> ReprKeysSummaryOnDevice(const v1::BlockMeta& meta,
                                                    const void* device_payload,
                                                    uint64_t payload_bytes, uint32_t layer,
                                                    const float* device_attention, uint32_t r,
                                                    int device,
                                                    std::vector<uint32_t>* top_tokens) {
  EVOKE_ASSIGN_OR_RETURN(const KeysOfLayer keys, LocateKeys(meta, payload_bytes, layer));
  const uint32_t n = keys.n_tokens, heads = keys.n_heads, dim = keys.head_dim;
  if (r == 0 || r > n) {
    return absl::InvalidArgumentError(absl::StrCat("r: ", r, " must be in [1, ", n, "]"));
  }
  EVOKE_RETURN_IF_ERROR(CheckDeviceExists(device));
  int previous = 0;
  EVOKE_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&previous), "cudaGetDevice"));
  CurrentDeviceRestorer restore(previous);
  EVOKE_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  EVOKE_RETURN_IF_ERROR(
      CheckDeviceMemory(device_payload, payload_bytes, device, "device_payload"));
  EVOKE_RETURN_IF_ERROR(CheckDeviceMemory(device_attention,
                                          static_cast<uint64_t>(n) * heads * sizeof(float),
                                          device, "device_attention"));

  // One device buffer: [omega | positions | bad | top | out].
  const size_t n_pairs = keys.plan.omega.size();
  const size_t omega_bytes = n_pairs * sizeof(double);
  const size_t pos_bytes = static_cast<size_t>(n) * sizeof(int64_t);
  const size_t bad_off = omega_bytes + pos_bytes;
  const size_t top_off = bad_off + 8;
  const size_t top_bytes = static_cast<size_t>(heads) * r * sizeof(uint32_t);
  const size_t out_off = (top_off + top_bytes + 7) / 8 * 8;
  const size_t out_bytes = static_cast<size_t>(heads) * dim * sizeof(float);
  std::vector<uint8_t> staging(top_off, 0);  // omega, positions, bad = 0.
  std::memcpy(staging.data(), keys.plan.omega.data(), omega_bytes);
  std::memcpy(staging.data() + omega_bytes, keys.positions.data(), pos_bytes);

  OwnedStream stream;
  EVOKE_RETURN_IF_ERROR(stream.Create());
  void* buffer = nullptr;
  EVOKE_RETURN_IF_ERROR(
      CudaStatus(cudaMallocAsync(&buffer, out_off + out_bytes, stream.get()), "cudaMallocAsync"));
  uint8_t* base = static_cast<uint8_t*>(buffer);
  std::vector<uint32_t> top(static_cast<size_t>(heads) * r);
  std::vector<float> out(static_cast<size_t>(heads) * dim);
  int bad = 0;
  absl::Status status = CudaStatus(
      cudaMemcpyAsync(base, staging.data(), staging.size(), cudaMemcpyHostToDevice, stream.get()),
      "cudaMemcpyAsync");
  if (status.ok()) {
    status = CudaStatus(
        LaunchReprKeys(static_cast<const uint8_t*>(device_payload) + keys.offset,
                       static_cast<int>(keys.k_dtype), n, heads, dim, keys.plan.rotary_dim,
                       static_cast<int>(keys.plan.type), reinterpret_cast<const double*>(base),
                       reinterpret_cast<const int64_t*>(base + omega_bytes), device_attention,
                       r, reinterpret_cast<uint32_t*>(base + top_off),
                       reinterpret_cast<float*>(base + out_off),
                       reinterpret_cast<int*>(base + bad_off), stream.get()),
        "repr keys kernel launch");
  }
  if (status.ok()) {
    status = CudaStatus(cudaMemcpyAsync(&bad, base + bad_off, sizeof(bad),
                                        cudaMemcpyDeviceToHost, stream.get()),
                        "cudaMemcpyAsync");
  }
  if (status.ok()) {
    status = CudaStatus(cudaMemcpyAsync(top.data(), base + top_off, top_bytes,
                                        cudaMemcpyDeviceToHost, stream.get()),
                        "cudaMemcpyAsync");
  }
  if (status.ok()) {
    status = CudaStatus(cudaMemcpyAsync(out.data(), base + out_off, out_bytes,
                                        cudaMemcpyDeviceToHost, stream.get()),
                        "cudaMemcpyAsync");
  }
  const cudaError_t free_err = cudaFreeAsync(buffer, stream.get());
  const cudaError_t sync_err = cudaStreamSynchronize(stream.get());
  if (status.ok()) status = CudaStatus(sync_err, "cudaStreamSynchronize");
  if (status.ok()) status = CudaStatus(free_err, "cudaFreeAsync");
  EVOKE_RETURN_IF_ERROR(status);
  if (bad != 0) return absl::InvalidArgumentError("attention: not all finite");

  v1::Summary s;
  s.set_kind(v1::SUMMARY_REPR_KEYS);
  s.set_layer(layer);
  s.set_heads(heads);
  s.set_dim(dim);
  s.set_r(r);
  s.mutable_values()->Assign(out.begin(), out.end());
  if (top_tokens != nullptr) *top_tokens = std::move(top);
  return s;
}

}  // namespace evoke
