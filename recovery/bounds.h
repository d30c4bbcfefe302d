// Bounds for exact top-k recovery: the compact encoding of a summary row,
// the interval [L, U] that provably holds its exact score, and the one f64
// function that defines the exact score (issue #13; the proof is in
// RecoveryIndex's comment and docs/ARCHITECTURE.md).
//
// Encoding of a row of `heads` x `dim` floats x against its table's channel
// scales sigma (powers of two, so x / sigma and q * sigma are exact in f64):
//   y = x / sigma; per head: s = max|y| / 127 rounded up to an f32,
//   c = round(y / s) as int8 (never clipped, so |y - s c| <= s / 2 per channel),
//   rho = ||y - s c||_2 / s rounded up (u16 fixed point of [0, sqrt(dim) / 2]),
//   l1 = ||c||_1 rounded up (u16 fixed point of [0, 127 dim]).
// A head whose s would overflow an f32 (|x| near FLT_MAX over a tiny sigma)
// gets s = +inf: its rows' bounds are (-inf, +inf), so they are always
// rescored.
//
// Query side, per scan vector g over KV head h (MEAN: the sum P_h of the
// group's query heads; MAX: each query head): q' = P sigma (exact),
// t = max|q'| / qmax, u = round(q' / t) as int16, so |q' - t u| <= t / 2.
// With the exact integer I = u . c:
//   q' . y = t s I + s (q' - t u) . c + q' . (y - s c)
//   |s (q' - t u) . c| <= s (t / 2) l1
//   |q' . (y - s c)|   <= s min(||q'||_2 rho, ||q'||_1 / 2)
// and q' . y = P . x exactly. Every quantity is computed in f64; a margin of
// 2^-30 (127 s (||q'||_1 + dim t)), which bounds 2^-30 sum |P_j x_j| and
// every term above, covers the rounding of the bound itself and of the f64
// reference (at most ~dim * 2^-53 of sum |P_j x_j| for dim up to 2^17).
#ifndef EVOKE_RECOVERY_BOUNDS_H_
#define EVOKE_RECOVERY_BOUNDS_H_

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

namespace evoke::recovery {

// Side data of one (row, head) of codes: 8 bytes.
struct HeadCode {
  float scale = 0;   // s; +inf: unbounded (always rescored).
  uint16_t rho = 0;  // ||y - s c||_2 / s, rounded up, in RhoUnit(dim).
  uint16_t l1 = 0;   // ||c||_1, rounded up, in L1Unit(dim).
};
static_assert(sizeof(HeadCode) == 8);

inline constexpr double kMarginRel = 0x1p-30;
// Covers underflow to 0 of products of tiny terms (never of a real score).
inline constexpr double kMarginAbs = 1e-290;

inline double RhoUnit(uint32_t dim) {
  return std::sqrt(static_cast<double>(dim)) / 2 * (1 + 0x1p-20) / 65535;
}
inline double L1Unit(uint32_t dim) { return 127.0 * dim / 65535; }

// The largest |u| of a query code: dim * 127 * qmax must fit an int32.
inline int32_t QueryMax(uint32_t dim) {
  return static_cast<int32_t>(std::min<int64_t>(
      32767, ((int64_t{1} << 31) - 1) / (127 * int64_t{std::max(1u, dim)})));
}

// ChannelScales picks a table's channel scales from its first row: per
// channel the power of two nearest max(|x_j|, RMS of x's head), clamped to
// [2^-60, 2^60]; 1 when that is 0. Outlier channels (fixed per model and
// layer in real K caches) get their own scale, so they do not swamp the
// row's int8 scale; the rest share the head's. Only the bounds' tightness
// depends on this choice, never their soundness.
void ChannelScales(const float* x, uint32_t heads, uint32_t dim, float* sigma);

// EncodeHead encodes one head (dim floats, its dim channel scales).
void EncodeHead(const float* x, const float* sigma, uint32_t dim, int8_t* codes,
                HeadCode* out);

// The exact score's query: MEAN sums each GQA group's query heads (f64, in
// head order) and divides the total by n_query_heads; MAX takes the best
// query head's dot product.
struct ExactQuery {
  bool max = false;
  uint32_t heads = 0;  // KV heads.
  uint32_t dim = 0;
  uint32_t n_query_heads = 0;
  uint32_t group = 1;     // Query heads per KV head.
  std::vector<double> p;  // MEAN: heads x dim; MAX: n_query_heads x dim.
  uint32_t vectors() const { return max ? n_query_heads : heads; }
  // Scan vectors per KV head.
  uint32_t vector_group() const { return max ? group : 1; }
};
ExactQuery MakeExactQuery(bool max, uint32_t heads, uint32_t dim, uint32_t n_query_heads,
                          const float* queries);

// ExactScore is THE exact score of a row (heads x dim floats): f64 products
// summed in a fixed order. Search's last pass and SearchExact both call it,
// so their order (score descending, then BlockId ascending) is identical.
double ExactScore(const ExactQuery& q, const float* x);

// The scan's query against one table's channel scales.
struct ScanQuery {
  bool max = false;
  uint32_t heads = 0, dim = 0, vectors = 0, group = 1;
  double divisor = 1;         // MEAN: n_query_heads.
  std::vector<int16_t> u;     // vectors x dim.
  std::vector<double> t;      // Per vector: the code's scale.
  std::vector<double> half_t_l1;  // t / 2 * L1Unit(dim).
  std::vector<double> n2_rho;     // ||q'||_2 * RhoUnit(dim) (rounded up).
  std::vector<double> half_n1;    // ||q'||_1 / 2 (rounded up).
  std::vector<double> margin;     // kMarginRel * 127 (||q'||_1 + dim t).
};
ScanQuery MakeScanQuery(const ExactQuery& q, const float* sigma);

// RowBounds turns a row's integer dot products (one per scan vector) into
// [*lo, *hi], which holds ExactScore of the row's values.
__attribute__((always_inline)) inline void RowBounds(const ScanQuery& sq, const int32_t* dots,
                                                     const HeadCode* hc, double* lo,
                                                     double* hi) {
  const double* t = sq.t.data();
  const double* half_t_l1 = sq.half_t_l1.data();
  const double* n2_rho = sq.n2_rho.data();
  const double* half_n1 = sq.half_n1.data();
  const double* margin = sq.margin.data();
  float max_scale = 0;
  for (uint32_t h = 0; h < sq.heads; ++h) max_scale = std::max(max_scale, hc[h].scale);
  if (!(max_scale <= FLT_MAX)) {  // A head that could not be encoded.
    *lo = -INFINITY;
    *hi = INFINITY;
    return;
  }
  if (!sq.max) {  // MEAN: one vector per head, summed.
    double a_sum = 0, b_sum = 0;
    for (uint32_t h = 0; h < sq.heads; ++h) {
      const double s = hc[h].scale;
      a_sum += t[h] * s * dots[h];
      b_sum += s * (half_t_l1[h] * hc[h].l1 + std::min(n2_rho[h] * hc[h].rho, half_n1[h]) +
                    margin[h]);
    }
    b_sum += kMarginAbs;
    // Rounding is monotone: fl(x / n) <= fl(U / n) whenever x <= U.
    *lo = (a_sum - b_sum) / sq.divisor;
    *hi = (a_sum + b_sum) / sq.divisor;
    return;
  }
  double best_lo = -INFINITY, best_hi = -INFINITY;
  for (uint32_t h = 0, g = 0; h < sq.heads; ++h) {
    const double s = hc[h].scale;
    for (uint32_t j = 0; j < sq.group; ++j, ++g) {
      const double a = t[g] * s * dots[g];
      const double b = s * (half_t_l1[g] * hc[h].l1 +
                            std::min(n2_rho[g] * hc[h].rho, half_n1[g]) + margin[g]) +
                       kMarginAbs;
      best_lo = std::max(best_lo, a - b);
      best_hi = std::max(best_hi, a + b);
    }
  }
  *lo = best_lo;
  *hi = best_hi;
}

}  // namespace evoke::recovery

#endif  // EVOKE_RECOVERY_BOUNDS_H_
