// Helpers of the GPU tests (cuda_ipc_test): whether a device exists (tests
// skip with the reason when not), device buffers, and canonical-block
// element access for the kernels' CPU comparisons.
#ifndef EVOKE_GPU_CUDA_TEST_UTIL_H_
#define EVOKE_GPU_CUDA_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/fingerprint.h"
#include "common/half.h"
#include "evoke/v1/block.pb.h"
#include "gtest/gtest.h"

namespace evoke::testing {

// HaveCudaDevice says whether device 0 exists, and if not, why.
inline bool HaveCudaDevice(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    *why = std::string("no CUDA device: ") + cudaGetErrorString(e);
    return false;
  }
  if (count == 0) {
    *why = "no CUDA device";
    return false;
  }
  return true;
}

// Skips the test, with the reason, when there is no CUDA device.
#define EVOKE_REQUIRE_CUDA_DEVICE()                                       \
  do {                                                                    \
    std::string why_no_device;                                            \
    if (!::evoke::testing::HaveCudaDevice(&why_no_device)) {              \
      GTEST_SKIP() << why_no_device;                                      \
    }                                                                     \
  } while (0)

inline uint32_t DTypeSize(v1::DType d) { return d == v1::DTYPE_F32 ? 4 : 2; }

// An element of `d` at p (any alignment), widened to double.
inline double LoadAs(v1::DType d, const uint8_t* p) {
  if (d == v1::DTYPE_F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return d == v1::DTYPE_F16 ? HalfToFloat(h) : Bf16ToFloat(h);
}

inline void StoreAs(v1::DType d, uint8_t* p, float f) {
  if (d == v1::DTYPE_F32) {
    std::memcpy(p, &f, 4);
    return;
  }
  const uint16_t h = d == v1::DTYPE_F16 ? FloatToHalf(f) : FloatToBf16(f);
  std::memcpy(p, &h, 2);
}

// A canonical-v1 fingerprint with RoPE `type` (freq_base 10000).
inline v1::LayoutFingerprint CanonicalFingerprint(v1::RopeType type, v1::DType k, v1::DType v,
                                                  uint32_t n_layers, uint32_t n_heads,
                                                  uint32_t head_dim) {
  v1::LayoutFingerprint fp = MakeFingerprint(
      "test", "model",
      {.k_dtype = k, .v_dtype = v, .n_layers = n_layers, .n_kv_heads = n_heads,
       .head_dim = head_dim});
  fp.mutable_rope()->set_type(type);
  fp.mutable_rope()->set_freq_base(10000);
  return fp;
}

// Device memory holding a copy of `bytes` host bytes at byte `offset` of its
// allocation (offset != 0 exercises unaligned paths).
class DeviceBuffer {
 public:
  DeviceBuffer(const void* host, size_t bytes, size_t offset) : size_(bytes) {
    EXPECT_EQ(cudaMalloc(&base_, bytes + offset), cudaSuccess);
    ptr_ = static_cast<uint8_t*>(base_) + offset;
    EXPECT_EQ(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  DeviceBuffer(const std::vector<uint8_t>& host, size_t offset)
      : DeviceBuffer(host.data(), host.size(), offset) {}
  ~DeviceBuffer() { cudaFree(base_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() { return ptr_; }
  std::vector<uint8_t> Read() const {
    std::vector<uint8_t> out(size_);
    EXPECT_EQ(cudaMemcpy(out.data(), ptr_, size_, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  void* base_ = nullptr;
  uint8_t* ptr_ = nullptr;
  size_t size_;
};

}  // namespace evoke::testing

#endif  // EVOKE_GPU_CUDA_TEST_UTIL_H_
