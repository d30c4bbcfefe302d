// Half-precision conversions: IEEE 754 binary16 ("f16") and bfloat16 ("bf16")
// to and from binary32, on raw 16-bit patterns.
//
// Header-only and dependency-free so that host code (.cc) and CUDA device code
// (.cu) share one definition: under nvcc every function is
// __host__ __device__. The same bits come out on either side.
//
// Rounding (float -> f16 / bf16) is round-to-nearest, ties-to-even, with
// overflow to +-inf (f16: |x| >= 65520; bf16: past the largest finite value
// after rounding), gradual underflow to subnormals, and signed zeros kept.
// NaN stays NaN (quiet, sign kept, the top payload bits kept where they fit);
// inf stays inf. Widening (f16 / bf16 -> float) is exact.
#ifndef EVOKE_COMMON_HALF_H_
#define EVOKE_COMMON_HALF_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define EVOKE_HOST_DEVICE __host__ __device__
#else
#define EVOKE_HOST_DEVICE
#endif

namespace evoke {

// FloatBits / BitsFloat reinterpret a float as its binary32 pattern and back.
EVOKE_HOST_DEVICE inline uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}
EVOKE_HOST_DEVICE inline float BitsFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

// HalfToFloat widens an f16 bit pattern to float (exact).
EVOKE_HOST_DEVICE inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) {  // inf or NaN: payload moves to the top of the mantissa.
    return BitsFloat(sign | 0x7f800000u | (mant << 13));
  }
  if (exp == 0) {
    if (mant == 0) return BitsFloat(sign);  // +-0
    // Subnormal: mant * 2^-24. Shift until bit 10 (the implicit one) is set;
    // each shift lowers the exponent. Biased f32 exponent: 113 - shifts
    // (103 for the smallest subnormal, 2^-24).
    uint32_t biased = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --biased;
    }
    return BitsFloat(sign | (biased << 23) | ((mant & 0x3ffu) << 13));
  }
  return BitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

// FloatToHalf narrows a float to an f16 bit pattern, rounding to nearest even.
EVOKE_HOST_DEVICE inline uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    if (abs == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
    // Quiet NaN, keeping the top 9 payload bits.
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  if (abs >= 0x477ff000u) {  // >= 65520: rounds past 65504 to inf.
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs >= 0x38800000u) {  // >= 2^-14: normal f16.
    // Rebias the exponent (127 -> 15) and drop 13 mantissa bits; a carry out
    // of the mantissa correctly bumps the exponent.
    uint32_t h = (abs - (112u << 23)) >> 13;
    const uint32_t rest = abs & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  if (abs <= 0x33000000u) {  // <= 2^-25: rounds to zero (2^-25 is a tie to 0).
    return static_cast<uint16_t>(sign);
  }
  // Subnormal f16: value = m * 2^(e - 150) with m the 24-bit significand;
  // in units of 2^-24 that is m >> (126 - e), e in [102, 112].
  const uint32_t e = abs >> 23;
  const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14..24
  uint32_t h = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (rest > halfway || (rest == halfway && (h & 1u))) ++h;  // may become 0x400
  return static_cast<uint16_t>(sign | h);
}

// Bf16ToFloat widens a bfloat16 bit pattern to float (exact: the upper 16
// bits of a binary32).
EVOKE_HOST_DEVICE inline float Bf16ToFloat(uint16_t b) {
  return BitsFloat(static_cast<uint32_t>(b) << 16);
}

// FloatToBf16 narrows a float to a bfloat16 bit pattern, rounding to nearest
// even.
EVOKE_HOST_DEVICE inline uint16_t FloatToBf16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {  // NaN: truncate, force quiet.
    return static_cast<uint16_t>((x >> 16) | 0x0040u);
  }
  // Adding 0x7fff plus the lowest kept bit rounds half to even; a carry into
  // the exponent is correct (and turns the largest values into inf).
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace evoke

#endif  // EVOKE_COMMON_HALF_H_
