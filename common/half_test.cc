// Tests of common/half.h: f16 and bf16 conversions, exhaustively over every
// 16-bit pattern and against the compiler's own _Float16.
#include "common/half.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace evoke {
namespace {

TEST(HalfTest, F16WidensEveryPatternExactly) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    if (exp == 0x1f) {
      if (mant == 0) {
        EXPECT_EQ(f, sign * std::numeric_limits<float>::infinity());
      } else {
        EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      }
      continue;
    }
    const double expected =
        exp == 0 ? sign * std::ldexp(mant, -24) : sign * std::ldexp(1024 + mant, exp - 25);
    EXPECT_EQ(static_cast<double>(f), expected) << std::hex << h;
    EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
  }
}

TEST(HalfTest, F16RoundTripsEveryPattern) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t back = FloatToHalf(HalfToFloat(static_cast<uint16_t>(h)));
    const bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    if (!nan) {
      EXPECT_EQ(back, h) << std::hex << h;
    } else {
      // NaN stays NaN with its sign; quiet NaNs keep their payload.
      EXPECT_EQ(back & 0x7c00, 0x7c00) << std::hex << h;
      EXPECT_NE(back & 0x3ff, 0) << std::hex << h;
      EXPECT_EQ(back & 0x8000, h & 0x8000) << std::hex << h;
      if (h & 0x200) {
        EXPECT_EQ(back, h) << std::hex << h;
      }
    }
  }
}

// Every tie between two adjacent f16 values rounds to the even one, and one
// float ulp either side of it rounds to the nearer one; this covers
// subnormals, the subnormal/normal boundary and the overflow threshold.
TEST(HalfTest, F16RoundsToNearestEven) {
  for (uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
    for (uint32_t h = 0; h < 0x7c00; ++h) {
      const uint16_t lo_bits = static_cast<uint16_t>(sign | h);
      const uint16_t hi_bits = static_cast<uint16_t>(sign | (h + 1));
      const float lo = HalfToFloat(lo_bits);
      // For h = 0x7bff the next "value" is 65536 (rounds to inf: 0x7c00).
      const float hi = h == 0x7bff ? (sign ? -65536.0f : 65536.0f) : HalfToFloat(hi_bits);
      const float mid = (lo + hi) / 2;  // exact: 12 significant bits
      ASSERT_EQ(static_cast<double>(mid),
                (static_cast<double>(lo) + static_cast<double>(hi)) / 2);
      EXPECT_EQ(FloatToHalf(mid), (h & 1) ? hi_bits : lo_bits) << std::hex << h;
      EXPECT_EQ(FloatToHalf(std::nextafter(mid, lo)), lo_bits) << std::hex << h;
      EXPECT_EQ(FloatToHalf(std::nextafter(mid, hi)), hi_bits) << std::hex << h;
      EXPECT_EQ(FloatToHalf(lo), lo_bits) << std::hex << h;
    }
  }
}

TEST(HalfTest, F16EdgeCases) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.996f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // tie with 65536 -> even -> inf
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::max()), 0xfc00);
  EXPECT_EQ(FloatToHalf(inf), 0x7c00);
  EXPECT_EQ(FloatToHalf(-inf), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -14)), 0x0400);   // smallest normal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);   // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);   // tie -> even (0)
  EXPECT_EQ(FloatToHalf(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(FloatToHalf(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);   // 1.5 ulp -> 2
  EXPECT_EQ(FloatToHalf(std::ldexp(1023.5f, -24)), 0x0400);  // carries into normal
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::denorm_min()), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie -> even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even
  const uint16_t qnan = FloatToHalf(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(qnan & 0x7e00, 0x7e00);
  // A float NaN whose payload lives only in the low bits stays NaN.
  EXPECT_EQ(FloatToHalf(BitsFloat(0x7f800001u)) & 0x7e00, 0x7e00);
  EXPECT_EQ(FloatToHalf(BitsFloat(0xff800001u)), 0xfe00);
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7c01)));
  EXPECT_EQ(HalfToFloat(0x7c00), inf);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x03ff), std::ldexp(1023.0f, -24));
}

#if defined(__FLT16_MAX__)
// The compiler's _Float16 conversion (IEEE, round-to-nearest-even) agrees on
// random float bit patterns of every exponent.
TEST(HalfTest, F16MatchesCompilerFloat16) {
  std::mt19937 rng(11);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t bits = static_cast<uint32_t>(rng());
    // Concentrate on the exponents f16 can represent (biased 100..143).
    if (i % 2 == 0) bits = (bits & 0x807fffffu) | ((100u + rng() % 44) << 23);
    const float f = BitsFloat(bits);
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    const uint16_t got = FloatToHalf(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(got)));
    } else {
      ASSERT_EQ(got, want) << std::hex << bits;
    }
  }
}
#endif

TEST(HalfTest, Bf16RoundTripsEveryPattern) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(b));
    EXPECT_EQ(FloatBits(f), b << 16);
    const uint16_t back = FloatToBf16(f);
    const bool nan = (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0;
    if (!nan) {
      EXPECT_EQ(back, b) << std::hex << b;
    } else {
      EXPECT_EQ(back, b | 0x40) << std::hex << b;  // quieted, payload kept
    }
  }
}

TEST(HalfTest, Bf16RoundsToNearestEven) {
  for (uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
    for (uint32_t b = 0; b < 0x7f80; ++b) {
      const uint16_t lo_bits = static_cast<uint16_t>(sign | b);
      const uint16_t hi_bits = static_cast<uint16_t>(sign | (b + 1));
      const float lo = Bf16ToFloat(lo_bits);
      // For b = 0x7f7f the next "value" is 2^128 (rounds to inf: 0x7f80).
      const double hi_d = b == 0x7f7f ? (sign ? -1.0 : 1.0) * std::ldexp(1.0, 128)
                                      : Bf16ToFloat(hi_bits);
      // The midpoint needs 9 significant bits: exact in float.
      const double mid_d = (static_cast<double>(lo) + hi_d) / 2;
      const float mid = static_cast<float>(mid_d);
      ASSERT_EQ(static_cast<double>(mid), mid_d);
      EXPECT_EQ(FloatToBf16(mid), (b & 1) ? hi_bits : lo_bits) << std::hex << b;
      EXPECT_EQ(FloatToBf16(std::nextafter(mid, lo)), lo_bits) << std::hex << b;
      EXPECT_EQ(FloatToBf16(std::nextafter(mid, static_cast<float>(hi_d))), hi_bits)
          << std::hex << b;
    }
  }
}

TEST(HalfTest, Bf16EdgeCases) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToBf16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(inf), 0x7f80);
  EXPECT_EQ(FloatToBf16(-inf), 0xff80);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up
  EXPECT_EQ(FloatToBf16(BitsFloat(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f818000u)), 0x3f82);  // tie -> even
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f808001u)), 0x3f81);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToBf16(BitsFloat(0x00008000u)), 0x0000);  // subnormal tie -> even
  EXPECT_EQ(FloatToBf16(BitsFloat(0x00018000u)), 0x0002);
  EXPECT_EQ(FloatToBf16(BitsFloat(0x007fffffu)), 0x0080);  // up to the smallest normal
  EXPECT_EQ(FloatToBf16(BitsFloat(0x7f800001u)), 0x7fc0);  // NaN stays NaN
  EXPECT_EQ(FloatToBf16(BitsFloat(0xffc12345u)), 0xffc1);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(0x7fc0)));
}

}  // namespace
}  // namespace evoke
