#include "recovery/bounds.h"

#include <cmath>
#include <limits>

namespace evoke::recovery {

namespace {

double PowerOfTwoNear(double v) {
  if (!(v > 0) || !std::isfinite(v)) return 1.0;
  const int e = std::clamp(static_cast<int>(std::lround(std::log2(v))), -60, 60);
  return std::ldexp(1.0, e);
}

}  // namespace

void ChannelScales(const float* x, uint32_t heads, uint32_t dim, float* sigma) {
  for (uint32_t h = 0; h < heads; ++h) {
    const float* xh = x + static_cast<size_t>(h) * dim;
    double sq = 0;
    for (uint32_t d = 0; d < dim; ++d) sq += static_cast<double>(xh[d]) * xh[d];
    const double rms = std::sqrt(sq / dim);
    for (uint32_t d = 0; d < dim; ++d) {
      sigma[static_cast<size_t>(h) * dim + d] =
          static_cast<float>(PowerOfTwoNear(std::max<double>(std::fabs(xh[d]), rms)));
    }
  }
}

void EncodeHead(const float* x, const float* sigma, uint32_t dim, int8_t* codes,
                HeadCode* out) {
  // y = x / sigma is exact in f64 (sigma a power of two in [2^-60, 2^60]).
  double maxabs = 0;
  for (uint32_t d = 0; d < dim; ++d) {
    maxabs = std::max(maxabs, std::fabs(static_cast<double>(x[d]) / sigma[d]));
  }
  *out = HeadCode{};
  if (maxabs == 0) {
    std::fill(codes, codes + dim, int8_t{0});
    return;
  }
  const double s64 = maxabs / 127;
  float s = static_cast<float>(s64);
  if (static_cast<double>(s) < s64) s = std::nextafter(s, std::numeric_limits<float>::infinity());
  if (!(s <= FLT_MAX)) {  // Unbounded: always rescored.
    out->scale = std::numeric_limits<float>::infinity();
    std::fill(codes, codes + dim, int8_t{0});
    return;
  }
  const double sd = s;
  double e2 = 0;
  uint64_t l1 = 0;
  for (uint32_t d = 0; d < dim; ++d) {
    const double y = static_cast<double>(x[d]) / sigma[d];
    const int64_t c = std::clamp<int64_t>(std::llround(y / sd), -127, 127);
    codes[d] = static_cast<int8_t>(c);
    const double e = y - sd * static_cast<double>(c);
    e2 += e * e;
    l1 += static_cast<uint64_t>(c < 0 ? -c : c);
  }
  out->scale = s;
  // rho = ||e||_2 / s <= sqrt(dim) / 2; RhoUnit's range has 2^-20 to spare
  // for the rounding of this f64 computation (covered by 2^-30 here).
  const double rho = std::sqrt(e2) / sd * (1 + kMarginRel);
  out->rho = static_cast<uint16_t>(std::min(65535.0, std::ceil(rho / RhoUnit(dim))));
  // ceil(l1 * 65535 / (127 dim)) in integers.
  const uint64_t den = 127ull * dim;
  out->l1 = static_cast<uint16_t>(std::min<uint64_t>(65535, (l1 * 65535 + den - 1) / den));
}

ExactQuery MakeExactQuery(bool max, uint32_t heads, uint32_t dim, uint32_t n_query_heads,
                          const float* queries) {
  ExactQuery q;
  q.max = max;
  q.heads = heads;
  q.dim = dim;
  q.n_query_heads = n_query_heads;
  q.group = n_query_heads / heads;
  if (max) {
    q.p.assign(queries, queries + static_cast<size_t>(n_query_heads) * dim);
  } else {
    q.p.assign(static_cast<size_t>(heads) * dim, 0.0);
    for (uint32_t h = 0; h < n_query_heads; ++h) {
      double* dst = q.p.data() + static_cast<size_t>(h / q.group) * dim;
      const float* src = queries + static_cast<size_t>(h) * dim;
      for (uint32_t d = 0; d < dim; ++d) dst[d] += src[d];
    }
  }
  return q;
}

namespace {

// Four partial sums, combined in a fixed order: deterministic, and faster
// than one chain. Not inlined and not multi-versioned: every caller gets
// the same instructions, so the same rounding (no FMA contraction either).
#if !defined(__clang__)
__attribute__((noinline, optimize("fp-contract=off")))
#else
__attribute__((noinline))
#endif
double DotF64(const double* p, const float* x, uint32_t n) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  uint32_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a0 += p[i] * static_cast<double>(x[i]);
    a1 += p[i + 1] * static_cast<double>(x[i + 1]);
    a2 += p[i + 2] * static_cast<double>(x[i + 2]);
    a3 += p[i + 3] * static_cast<double>(x[i + 3]);
  }
  for (; i < n; ++i) a0 += p[i] * static_cast<double>(x[i]);
  return (a0 + a1) + (a2 + a3);
}

}  // namespace

double ExactScore(const ExactQuery& q, const float* x) {
  if (!q.max) {
    double sum = 0;
    for (uint32_t h = 0; h < q.heads; ++h) {
      sum += DotF64(q.p.data() + static_cast<size_t>(h) * q.dim,
                    x + static_cast<size_t>(h) * q.dim, q.dim);
    }
    return sum / q.n_query_heads;
  }
  double best = -INFINITY;
  for (uint32_t g = 0; g < q.n_query_heads; ++g) {
    best = std::max(best, DotF64(q.p.data() + static_cast<size_t>(g) * q.dim,
                                 x + static_cast<size_t>(g / q.group) * q.dim, q.dim));
  }
  return best;
}

ScanQuery MakeScanQuery(const ExactQuery& q, const float* sigma) {
  ScanQuery sq;
  sq.max = q.max;
  sq.heads = q.heads;
  sq.dim = q.dim;
  sq.vectors = q.vectors();
  sq.group = q.vector_group();
  sq.divisor = q.max ? 1.0 : static_cast<double>(q.n_query_heads);
  const uint32_t dim = q.dim;
  const double qmax = QueryMax(dim);
  const double rho_unit = RhoUnit(dim), l1_unit = L1Unit(dim);
  sq.u.resize(static_cast<size_t>(sq.vectors) * dim);
  sq.t.resize(sq.vectors);
  sq.half_t_l1.resize(sq.vectors);
  sq.n2_rho.resize(sq.vectors);
  sq.half_n1.resize(sq.vectors);
  sq.margin.resize(sq.vectors);
  std::vector<double> qp(dim);
  for (uint32_t g = 0; g < sq.vectors; ++g) {
    const double* p = q.p.data() + static_cast<size_t>(g) * dim;
    const float* sig = sigma + static_cast<size_t>(g / sq.group) * dim;
    double maxabs = 0, n1 = 0, n2 = 0;
    for (uint32_t d = 0; d < dim; ++d) {
      qp[d] = p[d] * sig[d];  // Exact: sigma is a power of two.
      maxabs = std::max(maxabs, std::fabs(qp[d]));
      n1 += std::fabs(qp[d]);
      n2 += qp[d] * qp[d];
    }
    const double t = maxabs > 0 ? maxabs / qmax : 0.0;
    int16_t* u = sq.u.data() + static_cast<size_t>(g) * dim;
    for (uint32_t d = 0; d < dim; ++d) {
      u[d] = t > 0 ? static_cast<int16_t>(
                         std::clamp<int64_t>(std::llround(qp[d] / t), -32767, 32767))
                   : int16_t{0};
    }
    sq.t[g] = t;
    sq.half_t_l1[g] = t / 2 * l1_unit;
    sq.n2_rho[g] = std::sqrt(n2) * rho_unit;
    sq.half_n1[g] = n1 / 2;
    sq.margin[g] = kMarginRel * 127 * (n1 + dim * t);
  }
  return sq;
}

}  // namespace evoke::recovery
