// CUDA kernel of representative keys (gpu/repr_keys.h); CPU reference:
// common/summaries.cc's TopTokensPerHead + ReprKeysSummary.
//
// One thread block per KV head. Phase 1 ranks every token by the attention
// mass it received (rank = tokens with more mass, or as much and an earlier
// index: the CPU's order, ties to the earlier token) and writes the tokens of
// rank < r to top[head][rank]. Phase 2, one thread per dimension: for each of
// those tokens, in rank order, the key is widened to f32, un-rotated by minus
// its original position (angle in double, sincos in double cast to float, the
// rotation in f32 with round-to-nearest operations, no fused multiply-add:
// common/rope.h's numerics) and summed in double; the mean is cast to float.
// Non-finite attention sets *bad and leaves the output undefined.
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

constexpr int kThreads = 256;

__device__ __forceinline__ float LoadKey(const uint8_t* p, int dtype) {
  if (dtype == kDTypeF32) {
    uint32_t bits = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) bits |= static_cast<uint32_t>(p[b]) << (8 * b);
    return BitsFloat(bits);
  }
  const uint16_t bits = static_cast<uint16_t>(p[0] | (p[1] << 8));
  return dtype == kDTypeF16 ? HalfToFloat(bits) : Bf16ToFloat(bits);
}

__global__ void __launch_bounds__(kThreads)
    ReprKeysKernel(const uint8_t* __restrict__ k_section, int k_dtype, uint32_t n_tokens,
                   uint32_t n_heads, uint32_t head_dim, uint32_t n_pairs, bool neox,
                   const double* __restrict__ omega, const int64_t* __restrict__ positions,
                   const float* __restrict__ attention, uint32_t r,
                   uint32_t* __restrict__ top, float* __restrict__ out, int* bad) {
  const uint32_t h = blockIdx.x;
  uint32_t* my_top = top + static_cast<uint64_t>(h) * r;
  for (uint32_t t = threadIdx.x; t < n_tokens; t += blockDim.x) {
    const float a = attention[static_cast<uint64_t>(t) * n_heads + h];
    if (!isfinite(a)) {
      atomicExch(bad, 1);
      continue;
    }
    uint32_t rank = 0;
    for (uint32_t u = 0; u < n_tokens && rank < r; ++u) {
      const float b = attention[static_cast<uint64_t>(u) * n_heads + h];
      rank += (b > a) || (b == a && u < t);
    }
    if (rank < r) my_top[rank] = t;
  }
  __syncthreads();
  if (*static_cast<volatile int*>(bad) != 0) return;  // No top list to read.

  const uint32_t kb = k_dtype == kDTypeF32 ? 4 : 2;
  const uint64_t row_bytes = static_cast<uint64_t>(n_heads) * head_dim * kb;
  for (uint32_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    // The pair this dimension rotates in, if any, and which side it is.
    const bool rotated = d < 2 * n_pairs;
    uint32_t i = 0, partner = d;
    bool first = true;
    if (rotated) {
      if (neox) {
        first = d < n_pairs;
        i = first ? d : d - n_pairs;
        partner = first ? d + n_pairs : d - n_pairs;
      } else {
        first = d % 2 == 0;
        i = d / 2;
        partner = d ^ 1u;
      }
    }
    double sum = 0;
    for (uint32_t j = 0; j < r; ++j) {
      const uint32_t t = my_top[j];
      const uint8_t* row = k_section + t * row_bytes + static_cast<uint64_t>(h) * head_dim * kb;
      const float x = LoadKey(row + static_cast<uint64_t>(d) * kb, k_dtype);
      float y = x;
      if (rotated) {
        const float xp = LoadKey(row + static_cast<uint64_t>(partner) * kb, k_dtype);
        double s, c;
        sincos(static_cast<double>(-positions[t]) * omega[i], &s, &c);
        const float cf = static_cast<float>(c);
        const float sf = static_cast<float>(s);
        // The pair (x0, x1) -> (x0 c - x1 s, x0 s + x1 c).
        y = first ? __fsub_rn(__fmul_rn(x, cf), __fmul_rn(xp, sf))
                  : __fadd_rn(__fmul_rn(xp, sf), __fmul_rn(x, cf));
      }
      sum += y;
    }
    out[static_cast<uint64_t>(h) * head_dim + d] = static_cast<float>(sum / r);
  }
}

}  // namespace

// LaunchReprKeys enqueues the kernel on `stream` (declared in repr_keys.cc).
// Every pointer is device memory: k_section is the layer's K section, omega
// (rotary_dim / 2 doubles, unused for ROPE_NONE), positions (n_tokens),
// attention (n_tokens x n_heads), top (n_heads x r), out (n_heads x head_dim),
// bad (one int, zeroed by the caller).
extern "C++" cudaError_t LaunchReprKeys(const void* k_section, int k_dtype, uint32_t n_tokens,
                                        uint32_t n_heads, uint32_t head_dim,
                                        uint32_t rotary_dim, int rope_type,
                                        const double* omega, const int64_t* positions,
                                        const float* attention, uint32_t r, uint32_t* top,
                                        float* out, int* bad, cudaStream_t stream) {
  if (k_dtype != kDTypeF16 && k_dtype != kDTypeBf16 && k_dtype != kDTypeF32) {
    return cudaErrorInvalidValue;
  }
  if (n_heads == 0 || n_heads > 0x7fffffffu || r == 0 || r > n_tokens) {
    return cudaErrorInvalidValue;
  }
  ReprKeysKernel<<<n_heads, kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(k_section), k_dtype, n_tokens, n_heads, head_dim,
      rotary_dim / 2, rope_type == kRopeNeox, omega, positions, attention, r, top, out, bad);
  return cudaGetLastError();
}

}  // namespace evoke
