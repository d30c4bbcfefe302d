// CUDA kernel of RoPE re-anchoring (gpu/rope_device.h); CPU reference:
// common/rope.cc's RotateKeys / ReanchorCanonicalBlock.
//
// One thread per (token, rotary pair) of every layer: it computes the pair's
// angle delta[t] * omega[i] in double, sincos in double, casts to float, and
// rotates that pair in each KV head of the token, in f32 with explicit
// round-to-nearest operations (no fused multiply-add), as the CPU does.
// Tokens with delta 0 are not read or written. Kept free of Abseil and
// protobuf headers: the host wrapper (rope_device.cc) validates and
// translates errors.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/half.h"
#include "gpu/kernel_enums.h"

namespace evoke {
namespace {

using kernel::kDTypeBf16;
using kernel::kDTypeF16;
using kernel::kDTypeF32;
using kernel::kRopeNeox;
using kernel::kRopeNorm;

constexpr int kThreadsPerBlock = 256;

template <int kDType>
struct DTypeSize {
  static constexpr uint32_t kBytes = kDType == kDTypeF32 ? 4 : 2;
};

// Loads the raw little-endian bits of one element; kAligned when the element
// address is a multiple of its size, else byte by byte.
template <int kDType, bool kAligned>
__device__ __forceinline__ uint32_t LoadBits(const uint8_t* p) {
  constexpr uint32_t kBytes = DTypeSize<kDType>::kBytes;
  if constexpr (kAligned) {
    if constexpr (kBytes == 4) {
      return *reinterpret_cast<const uint32_t*>(p);
    } else {
      return *reinterpret_cast<const uint16_t*>(p);
    }
  } else {
    uint32_t v = 0;
#pragma unroll
    for (uint32_t b = 0; b < kBytes; ++b) v |= static_cast<uint32_t>(p[b]) << (8 * b);
    return v;
  }
}

template <int kDType, bool kAligned>
__device__ __forceinline__ void StoreBits(uint8_t* p, uint32_t v) {
  constexpr uint32_t kBytes = DTypeSize<kDType>::kBytes;
  if constexpr (kAligned) {
    if constexpr (kBytes == 4) {
      *reinterpret_cast<uint32_t*>(p) = v;
    } else {
      *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(v);
    }
  } else {
#pragma unroll
    for (uint32_t b = 0; b < kBytes; ++b) p[b] = static_cast<uint8_t>(v >> (8 * b));
  }
}

template <int kDType>
__device__ __forceinline__ float Widen(uint32_t bits) {
  if constexpr (kDType == kDTypeF16) {
    return HalfToFloat(static_cast<uint16_t>(bits));
  } else if constexpr (kDType == kDTypeBf16) {
    return Bf16ToFloat(static_cast<uint16_t>(bits));
  } else {
    return BitsFloat(bits);
  }
}

template <int kDType>
__device__ __forceinline__ uint32_t Narrow(float f) {
  if constexpr (kDType == kDTypeF16) {
    return FloatToHalf(f);
  } else if constexpr (kDType == kDTypeBf16) {
    return FloatToBf16(f);
  } else {
    return FloatBits(f);
  }
}

// Grid: x covers n_tokens * n_pairs threads, y the layers.
template <int kDType, bool kAligned, bool kNeox>
__global__ void __launch_bounds__(kThreadsPerBlock)
    ReanchorKernel(uint8_t* payload, uint64_t layer_stride_bytes, uint32_t n_tokens,
                   uint32_t n_heads, uint32_t head_dim, uint32_t n_pairs,
                   const double* __restrict__ omega, const int64_t* __restrict__ delta) {
  constexpr uint32_t kBytes = DTypeSize<kDType>::kBytes;
  const uint64_t idx = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<uint64_t>(n_tokens) * n_pairs) return;
  const uint32_t t = static_cast<uint32_t>(idx / n_pairs);
  const uint32_t i = static_cast<uint32_t>(idx % n_pairs);
  const int64_t d = delta[t];
  if (d == 0) return;
  double s, c;
  sincos(static_cast<double>(d) * omega[i], &s, &c);
  const float cf = static_cast<float>(c);
  const float sf = static_cast<float>(s);
  const uint32_t j0 = kNeox ? i : 2 * i;
  const uint32_t j1 = kNeox ? i + n_pairs : 2 * i + 1;
  uint8_t* row = payload + blockIdx.y * layer_stride_bytes +
                 static_cast<uint64_t>(t) * n_heads * head_dim * kBytes;
  for (uint32_t h = 0; h < n_heads; ++h) {
    uint8_t* p0 = row + (static_cast<uint64_t>(h) * head_dim + j0) * kBytes;
    uint8_t* p1 = row + (static_cast<uint64_t>(h) * head_dim + j1) * kBytes;
    const float x0 = Widen<kDType>(LoadBits<kDType, kAligned>(p0));
    const float x1 = Widen<kDType>(LoadBits<kDType, kAligned>(p1));
    const float y0 = __fsub_rn(__fmul_rn(x0, cf), __fmul_rn(x1, sf));
    const float y1 = __fadd_rn(__fmul_rn(x0, sf), __fmul_rn(x1, cf));
    StoreBits<kDType, kAligned>(p0, Narrow<kDType>(y0));
    StoreBits<kDType, kAligned>(p1, Narrow<kDType>(y1));
  }
}

template <int kDType, bool kAligned>
cudaError_t LaunchTyped(bool neox, dim3 grid, cudaStream_t stream, uint8_t* payload,
                        uint64_t layer_stride_bytes, uint32_t n_tokens, uint32_t n_heads,
                        uint32_t head_dim, uint32_t n_pairs, const double* omega,
                        const int64_t* delta) {
  if (neox) {
    ReanchorKernel<kDType, kAligned, true><<<grid, kThreadsPerBlock, 0, stream>>>(
        payload, layer_stride_bytes, n_tokens, n_heads, head_dim, n_pairs, omega, delta);
  } else {
    ReanchorKernel<kDType, kAligned, false><<<grid, kThreadsPerBlock, 0, stream>>>(
        payload, layer_stride_bytes, n_tokens, n_heads, head_dim, n_pairs, omega, delta);
  }
  return cudaGetLastError();
}

template <int kDType>
cudaError_t LaunchForDType(bool neox, dim3 grid, cudaStream_t stream, uint8_t* payload,
                           uint64_t layer_stride_bytes, uint32_t n_tokens,
                           uint32_t n_heads, uint32_t head_dim, uint32_t n_pairs,
                           const double* omega, const int64_t* delta) {
  constexpr uint32_t kBytes = DTypeSize<kDType>::kBytes;
  // Every K element sits at payload + layer * stride + a multiple of kBytes.
  const bool aligned = reinterpret_cast<uintptr_t>(payload) % kBytes == 0 &&
                       layer_stride_bytes % kBytes == 0;
  if (aligned) {
    return LaunchTyped<kDType, true>(neox, grid, stream, payload, layer_stride_bytes,
                                     n_tokens, n_heads, head_dim, n_pairs, omega, delta);
  }
  return LaunchTyped<kDType, false>(neox, grid, stream, payload, layer_stride_bytes,
                                    n_tokens, n_heads, head_dim, n_pairs, omega, delta);
}

}  // namespace

// LaunchRopeReanchor enqueues the rotation of every layer's K section of a
// canonical-v1 payload on `stream` (declared in rope_device.cc). `omega`
// (rotary_dim / 2 doubles) and `delta` (n_tokens int64) are device memory.
// rope_type is v1::RopeType (NORM or NEOX), k_dtype v1::DType (F16, BF16,
// F32). Returns the launch's error (cudaErrorInvalidValue for other types).
extern "C++" cudaError_t LaunchRopeReanchor(void* payload, uint64_t layer_stride_bytes,
                                            uint32_t n_layers, uint32_t n_tokens,
                                            uint32_t n_heads, uint32_t head_dim,
                                            uint32_t rotary_dim, int rope_type,
                                            int k_dtype, const double* omega,
                                            const int64_t* delta, cudaStream_t stream) {
  if (rope_type != kRopeNorm && rope_type != kRopeNeox) return cudaErrorInvalidValue;
  const uint32_t n_pairs = rotary_dim / 2;
  const uint64_t threads = static_cast<uint64_t>(n_tokens) * n_pairs;
  if (threads == 0 || n_layers == 0 || n_heads == 0) return cudaSuccess;
  const uint64_t blocks = (threads + kThreadsPerBlock - 1) / kThreadsPerBlock;
  if (blocks > 0x7fffffffu || n_layers > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(blocks), n_layers);
  const bool neox = rope_type == kRopeNeox;
  uint8_t* p = static_cast<uint8_t*>(payload);
  switch (k_dtype) {
    case kDTypeF16:
      return LaunchForDType<kDTypeF16>(neox, grid, stream, p, layer_stride_bytes, n_tokens,
                                       n_heads, head_dim, n_pairs, omega, delta);
    case kDTypeBf16:
      return LaunchForDType<kDTypeBf16>(neox, grid, stream, p, layer_stride_bytes,
                                        n_tokens, n_heads, head_dim, n_pairs, omega, delta);
    case kDTypeF32:
      return LaunchForDType<kDTypeF32>(neox, grid, stream, p, layer_stride_bytes, n_tokens,
                                       n_heads, head_dim, n_pairs, omega, delta);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace evoke
