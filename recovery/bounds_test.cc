// Soundness of the recovery bounds: for every row and query,
// L <= ExactScore <= U, over random shapes (GQA included), outlier channels
// of ratio 10, 100 and 1000, rows on the rounding boundaries, rows whose
// mass is all in the residual, and extreme magnitudes. Independent of top-k.
#include "recovery/bounds.h"

#include <cfloat>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace evoke::recovery {
namespace {

struct Encoded {
  std::vector<int8_t> codes;
  std::vector<HeadCode> hc;
};

Encoded Encode(const std::vector<float>& x, const std::vector<float>& sigma, uint32_t heads,
               uint32_t dim) {
  Encoded e;
  e.codes.resize(x.size());
  e.hc.resize(heads);
  for (uint32_t h = 0; h < heads; ++h) {
    EncodeHead(x.data() + h * dim, sigma.data() + h * dim, dim, e.codes.data() + h * dim,
               &e.hc[h]);
  }
  return e;
}

// The bounds as the scan computes them (plain integer dot products).
void Bounds(const ScanQuery& sq, const Encoded& e, double* lo, double* hi) {
  std::vector<int32_t> dots(sq.vectors);
  for (uint32_t g = 0; g < sq.vectors; ++g) {
    int32_t acc = 0;
    const int8_t* c = e.codes.data() + (g / sq.group) * sq.dim;
    for (uint32_t d = 0; d < sq.dim; ++d) acc += int32_t{sq.u[g * sq.dim + d]} * c[d];
    dots[g] = acc;
  }
  RowBounds(sq, dots.data(), e.hc.data(), lo, hi);
}

struct Counts {
  int rows = 0;
  int unbounded = 0;
  double width = 0;  // Sum of (U - L) / (|S| + 1): how tight, for the log.
};

// Checks L <= S <= U for `x` against `queries` (every aggregation), with the
// table's channel scales `sigma`.
void ExpectSound(const std::vector<float>& x, const std::vector<float>& sigma,
                 const std::vector<float>& queries, uint32_t heads, uint32_t dim,
                 uint32_t n_q, Counts* counts, const char* what) {
  const Encoded e = Encode(x, sigma, heads, dim);
  for (bool max : {false, true}) {
    const ExactQuery q = MakeExactQuery(max, heads, dim, n_q, queries.data());
    const ScanQuery sq = MakeScanQuery(q, sigma.data());
    double lo = 0, hi = 0;
    Bounds(sq, e, &lo, &hi);
    const double s = ExactScore(q, x.data());
    ASSERT_LE(lo, s) << what << " max=" << max << " heads=" << heads << " dim=" << dim;
    ASSERT_GE(hi, s) << what << " max=" << max << " heads=" << heads << " dim=" << dim;
    ++counts->rows;
    if (std::isinf(hi)) {
      ++counts->unbounded;
    } else {
      counts->width += (hi - lo) / (std::fabs(s) + 1);
    }
  }
}

struct Shape {
  uint32_t heads, dim, group;
};

TEST(RecoveryBoundsTest, BoundsHoldTheExactScoreWithOutlierChannels) {
  const Shape shapes[] = {{1, 8, 1}, {8, 128, 1}, {8, 128, 4}, {32, 128, 1}, {4, 64, 4},
                          {2, 3, 2}};
  for (const Shape& shape : shapes) {
    for (float ratio : {1.0f, 10.0f, 100.0f, 1000.0f}) {
      std::mt19937 rng(shape.heads * 1000 + shape.dim + static_cast<uint32_t>(ratio));
      std::normal_distribution<float> normal;
      const uint32_t width = shape.heads * shape.dim, n_q = shape.heads * shape.group;
      // Fixed outlier channels, as real K caches have: 2 a head.
      std::vector<uint32_t> outliers;
      for (uint32_t h = 0; h < shape.heads; ++h) {
        for (int j = 0; j < 2; ++j) outliers.push_back(h * shape.dim + rng() % shape.dim);
      }
      auto row = [&] {
        std::vector<float> x(width);
        for (float& v : x) v = normal(rng);
        for (uint32_t c : outliers) x[c] = ratio * (1 + 0.1f * normal(rng));
        return x;
      };
      std::vector<float> sigma(width);
      ChannelScales(row().data(), shape.heads, shape.dim, sigma.data());
      Counts counts, loose;
      for (int r = 0; r < 200; ++r) {
        const std::vector<float> x = row();
        std::vector<float> q(static_cast<size_t>(n_q) * shape.dim);
        for (float& v : q) v = normal(rng);
        if (r % 3 == 1) {  // The query's outlier channels match the rows'.
          for (uint32_t g = 0; g < n_q; ++g) {
            for (uint32_t c : outliers) {
              if (c / shape.dim == g / shape.group) q[g * shape.dim + c % shape.dim] *= ratio;
            }
          }
        } else if (r % 3 == 2) {  // Or oppose them.
          for (uint32_t g = 0; g < n_q; ++g) {
            for (uint32_t c : outliers) {
              if (c / shape.dim == g / shape.group) q[g * shape.dim + c % shape.dim] = -ratio;
            }
          }
        }
        ExpectSound(x, sigma, q, shape.heads, shape.dim, n_q, &counts, "random");
        // Channel scales that do not fit this row (another table's first
        // row, 2^20 off): looser, still sound.
        std::vector<float> off = sigma;
        for (size_t j = 0; j < off.size(); j += 3) off[j] = std::ldexp(off[j], j % 2 ? 20 : -20);
        ExpectSound(x, off, q, shape.heads, shape.dim, n_q, &loose, "mismatched sigma");
      }
      EXPECT_EQ(counts.unbounded, 0);
      std::printf("bounds %ux%u gqa %u ratio %g: mean (U-L)/(|S|+1) %.3g over %d\n",
                  shape.heads, shape.dim, shape.group, ratio,
                  counts.width / (counts.rows - counts.unbounded), counts.rows);
    }
  }
}

// y on the rounding boundaries: y/s = c +- 0.5 (-+ 1 ulp), so each channel's
// residual is the largest the codes allow, with queries aligned with the
// residual's signs (the worst case of the Hölder bound).
TEST(RecoveryBoundsTest, RoundingBoundaryRowsAndResidualOnlyRows) {
  constexpr uint32_t kHeads = 4, kDim = 64;
  std::mt19937 rng(21);
  const std::vector<float> sigma(kHeads * kDim, 1.0f);
  Counts counts;
  for (int r = 0; r < 300; ++r) {
    const float s = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    std::vector<float> x(kHeads * kDim);
    for (uint32_t j = 0; j < x.size(); ++j) {
      const int c = static_cast<int>(rng() % 253) - 126;
      float v = (static_cast<float>(c) + (rng() % 2 ? 0.5f : -0.5f)) * s;
      if (r % 3 == 1) v = std::nextafter(v, INFINITY);
      if (r % 3 == 2) v = std::nextafter(v, -INFINITY);
      x[j] = v;
    }
    for (uint32_t h = 0; h < kHeads; ++h) x[h * kDim] = 127 * s;  // max|y| = 127 s.
    if (r % 5 == 0) {
      // The mass in the residual: one channel at 127 s, the rest under s / 2.
      for (uint32_t j = 0; j < x.size(); ++j) {
        if (j % kDim != 0) x[j] = (rng() % 2 ? 0.49f : -0.49f) * s;
      }
    }
    // Queries that follow the residual's sign (the codes cannot see it).
    std::vector<float> q(kHeads * kDim);
    const Encoded e = Encode(x, sigma, kHeads, kDim);
    for (uint32_t j = 0; j < q.size(); ++j) {
      const double res = x[j] - static_cast<double>(e.hc[j / kDim].scale) * e.codes[j];
      q[j] = res >= 0 ? 1.0f : -1.0f;
      if (j % kDim == 0) q[j] = 0;
    }
    ExpectSound(x, sigma, q, kHeads, kDim, kHeads, &counts, "boundary");
    for (float& v : q) v = -v;
    ExpectSound(x, sigma, q, kHeads, kDim, kHeads, &counts, "boundary, opposed");
  }
}

// Magnitudes from denormals to near FLT_MAX, zero rows and zero queries,
// against channel scales from a row of ordinary size: sound throughout; a
// head whose scale overflows is unbounded (always rescored), never wrong.
TEST(RecoveryBoundsTest, ExtremeMagnitudesZerosAndNegatives) {
  constexpr uint32_t kHeads = 2, kDim = 16;
  std::mt19937 rng(22);
  std::normal_distribution<float> normal;
  std::vector<float> first(kHeads * kDim);
  for (float& v : first) v = normal(rng);
  std::vector<float> sigma(kHeads * kDim);
  ChannelScales(first.data(), kHeads, kDim, sigma.data());
  Counts counts;
  for (float mag : {0.0f, 1e-45f, 1e-40f, 1e-30f, 1e-10f, 1.0f, 1e10f, 1e30f, 3e38f}) {
    for (float qmag : {0.0f, 1e-45f, 1e-30f, 1.0f, 1e30f, 3e38f}) {
      for (int r = 0; r < 20; ++r) {
        std::vector<float> x(kHeads * kDim), q(2 * kHeads * kDim);
        for (float& v : x) v = std::clamp(mag * normal(rng), -FLT_MAX, FLT_MAX);
        for (float& v : q) v = std::clamp(qmag * normal(rng), -FLT_MAX, FLT_MAX);
        if (r == 0) std::fill(x.begin() + kDim, x.end(), 0.0f);  // A zero head.
        ExpectSound(x, sigma, q, kHeads, kDim, 2 * kHeads, &counts, "magnitudes");
        // Scales from this row itself.
        std::vector<float> own(kHeads * kDim);
        ChannelScales(x.data(), kHeads, kDim, own.data());
        ExpectSound(x, own, q, kHeads, kDim, 2 * kHeads, &counts, "magnitudes, own sigma");
        // Scales at the clamp's end: y = x * 2^60 overflows an f32 scale.
        const std::vector<float> tiny(kHeads * kDim, std::ldexp(1.0f, -60));
        ExpectSound(x, tiny, q, kHeads, kDim, 2 * kHeads, &counts, "magnitudes, tiny sigma");
      }
    }
  }
  std::printf("extreme magnitudes: %d of %d bounds unbounded (rescored always)\n",
              counts.unbounded, counts.rows);
  EXPECT_GT(counts.unbounded, 0);  // The overflow path ran.
  // A zero row against any query, and any row against a zero query: exactly 0.
  const std::vector<float> zero(kHeads * kDim, 0.0f), q(kHeads * kDim, 1.0f);
  const ExactQuery eq = MakeExactQuery(false, kHeads, kDim, kHeads, q.data());
  double lo = 1, hi = -1;
  Bounds(MakeScanQuery(eq, sigma.data()), Encode(zero, sigma, kHeads, kDim), &lo, &hi);
  EXPECT_EQ(ExactScore(eq, zero.data()), 0.0);
  EXPECT_LE(lo, 0.0);
  EXPECT_GE(hi, 0.0);
  EXPECT_LT(hi - lo, 1e-280);
}

}  // namespace
}  // namespace evoke::recovery
