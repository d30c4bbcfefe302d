// Tests of common/rope.h (RoPE re-anchoring); common/half.h has its own
// (half_test.cc).
//
// The re-anchoring properties are checked on seeded random shapes, RoPE
// parameters, positions and dtypes against a double-precision reference that
// rotates unrotated keys directly at the new positions.
#include "common/rope.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/blocks.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// Helpers.

uint32_t Bytes(v1::DType d) { return d == v1::DTYPE_F32 ? 4 : 2; }

void StoreAs(v1::DType d, uint8_t* p, double v) {
  const float f = static_cast<float>(v);
  if (d == v1::DTYPE_F32) {
    std::memcpy(p, &f, 4);
    return;
  }
  const uint16_t h = d == v1::DTYPE_F16 ? FloatToHalf(f) : FloatToBf16(f);
  std::memcpy(p, &h, 2);
}

double LoadAs(v1::DType d, const uint8_t* p) {
  if (d == v1::DTYPE_F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return d == v1::DTYPE_F16 ? HalfToFloat(h) : Bf16ToFloat(h);
}

// Norm-relative error bound per head for one re-anchor of a stored K.
double Bound(v1::DType d) {
  switch (d) {
    case v1::DTYPE_F16:
      return 2e-3;
    case v1::DTYPE_BF16:
      return 1e-2;
    default:
      return 1e-5;
  }
}

// One layer, one KV head of `head_dim`, f16, with RoPE `type` at `freq_base`.
v1::LayoutFingerprint BaseFingerprint(v1::RopeType type, uint32_t head_dim,
                                      double freq_base) {
  return testing::WithRope(testing::CanonicalFingerprint("test", "model", 1, 1, head_dim),
                           type, freq_base);
}

// A random canonical fingerprint with RoPE, covering NORM and NEOX, partial
// rotary dims, bases, linear scale, per-pair factors and YaRN.
v1::LayoutFingerprint RandomFingerprint(std::mt19937_64& rng, v1::DType k_dtype) {
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  auto pick = [&](uint32_t n) {
    return static_cast<uint32_t>(std::uniform_int_distribution<uint32_t>(0, n - 1)(rng));
  };
  static const uint32_t kHeadDims[] = {2, 4, 6, 8, 16, 24, 32, 64, 80, 96, 128, 256};
  static const v1::DType kDTypes[] = {v1::DTYPE_F16, v1::DTYPE_BF16, v1::DTYPE_F32};
  const uint32_t head_dim = kHeadDims[pick(std::size(kHeadDims))];
  v1::LayoutFingerprint fp = BaseFingerprint(
      pick(2) == 0 ? v1::ROPE_NORM : v1::ROPE_NEOX, head_dim, 10000);
  fp.set_k_dtype(k_dtype);
  fp.set_v_dtype(kDTypes[pick(3)]);
  fp.set_n_layers(1 + pick(4));
  fp.set_n_kv_heads(1 + pick(4));
  v1::RopeParams* r = fp.mutable_rope();
  r->set_rotary_dim(pick(2) == 0 ? 0 : 2 * (1 + pick(head_dim / 2)));
  const uint32_t rotary_dim = r->rotary_dim() == 0 ? head_dim : r->rotary_dim();
  static const double kBases[] = {10000, 500000, 1000000};
  r->set_freq_base(pick(4) == 3 ? std::exp(uniform(std::log(10.0), std::log(1e7)))
                                : kBases[pick(3)]);
  r->set_freq_scale(pick(2) == 0 ? (pick(2) == 0 ? 0.0 : 1.0) : uniform(0.05, 1.0));
  r->set_scaling(static_cast<v1::RopeScaling>(pick(4)));  // NONE..YARN
  if (pick(5) < 2) {
    for (uint32_t i = 0; i < rotary_dim / 2; ++i) {
      r->add_freq_factors(static_cast<float>(uniform(0.5, 8.0)));
    }
  }
  if (r->scaling() == v1::ROPE_SCALING_YARN) {
    static const float kExt[] = {1.0f, 0.0f, 0.5f};
    static const uint32_t kCtx[] = {2048, 4096, 8192, 32768};
    r->set_yarn_ext_factor(kExt[pick(3)]);
    r->set_yarn_attn_factor(1.0f);
    r->set_yarn_beta_fast(static_cast<float>(uniform(16, 64)));
    r->set_yarn_beta_slow(static_cast<float>(uniform(0.5, 2)));
    r->set_n_ctx_orig(kCtx[pick(4)]);
  }
  return fp;
}

// A block over layers [layer_begin, layer_end) with the given positions.
v1::BlockMeta MakeMeta(const v1::LayoutFingerprint& fp, uint32_t n_tokens,
                       uint32_t layer_begin, uint32_t layer_end,
                       const std::vector<int64_t>& positions, bool contiguous) {
  v1::BlockMeta meta;
  *meta.mutable_fingerprint() = fp;
  meta.set_n_tokens(n_tokens);
  meta.set_layer_begin(layer_begin);
  meta.set_layer_end(layer_end);
  if (contiguous) {
    meta.set_first_position(static_cast<int32_t>(positions[0]));
  } else {
    for (int64_t p : positions) meta.add_positions(static_cast<int32_t>(p));
  }
  return meta;
}

// RotateRef rotates one head `x` (head_dim values) to position `pos` in
// double, with the plan's angle table: the reference K.
std::vector<double> RotateRef(const RopePlan& plan, const float* x, double pos) {
  std::vector<double> out(x, x + plan.head_dim);
  const uint32_t n = plan.rotary_dim / 2;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t j0 = plan.type == v1::ROPE_NEOX ? i : 2 * i;
    const uint32_t j1 = plan.type == v1::ROPE_NEOX ? i + n : 2 * i + 1;
    const double a = pos * plan.omega[i];
    const double c = std::cos(a), s = std::sin(a);
    out[j0] = x[j0] * c - x[j1] * s;
    out[j1] = x[j0] * s + x[j1] * c;
  }
  return out;
}

// One random test block: unrotated keys, original positions and a canonical
// payload whose K is the keys rotated at the original positions.
struct TestBlock {
  v1::LayoutFingerprint fp;
  v1::BlockMeta meta;
  RopePlan plan;
  uint32_t n_layers = 0, n_tokens = 0, n_heads = 0, head_dim = 0;
  std::vector<float> x;  // [layer][token][head][dim], unrotated
  std::vector<int64_t> old_pos;
  std::vector<uint8_t> payload;

  size_t KElem(uint32_t l, uint32_t t, uint32_t h) const {
    return ((static_cast<size_t>(l) * n_tokens + t) * n_heads + h) * head_dim;
  }
  uint64_t LayerStride() const {
    return static_cast<uint64_t>(n_tokens) * n_heads * head_dim *
           (Bytes(fp.k_dtype()) + Bytes(fp.v_dtype()));
  }
  // Byte offset of head h of token t in layer l's K section.
  uint64_t KOffset(uint32_t l, uint32_t t, uint32_t h) const {
    return l * LayerStride() +
           ((static_cast<uint64_t>(t) * n_heads + h) * head_dim) * Bytes(fp.k_dtype());
  }
  uint64_t KBytes() const {
    return static_cast<uint64_t>(n_tokens) * n_heads * head_dim * Bytes(fp.k_dtype());
  }
};

TestBlock RandomBlock(std::mt19937_64& rng, v1::DType k_dtype) {
  TestBlock b;
  b.fp = RandomFingerprint(rng, k_dtype);
  auto plan = MakeRopePlan(b.fp);
  EXPECT_TRUE(plan.ok()) << plan.status();
  b.plan = *plan;
  std::uniform_int_distribution<uint32_t> small(0, 1u << 30);
  const uint32_t layer_begin = small(rng) % b.fp.n_layers();
  const uint32_t layer_end = layer_begin + 1 + small(rng) % (b.fp.n_layers() - layer_begin);
  b.n_layers = layer_end - layer_begin;
  b.n_tokens = 1 + small(rng) % 12;
  b.n_heads = b.fp.n_kv_heads();
  b.head_dim = b.fp.head_dim();
  const bool contiguous = small(rng) % 2 == 0;
  b.old_pos.resize(b.n_tokens);
  const int64_t first = small(rng) % 100000;
  for (uint32_t t = 0; t < b.n_tokens; ++t) {
    b.old_pos[t] = contiguous ? first + t : small(rng) % (1 << 20);
  }
  b.meta = MakeMeta(b.fp, b.n_tokens, layer_begin, layer_end, b.old_pos, contiguous);
  EXPECT_EQ(OriginalPositions(b.meta), b.old_pos);

  std::normal_distribution<float> normal(0.0f, 1.0f);
  b.x.resize(static_cast<size_t>(b.n_layers) * b.n_tokens * b.n_heads * b.head_dim);
  for (float& v : b.x) v = normal(rng);
  b.payload.resize(b.n_layers * b.LayerStride());
  for (uint8_t& c : b.payload) c = static_cast<uint8_t>(rng());  // V stays random
  const v1::DType kd = b.fp.k_dtype();
  for (uint32_t l = 0; l < b.n_layers; ++l) {
    for (uint32_t t = 0; t < b.n_tokens; ++t) {
      for (uint32_t h = 0; h < b.n_heads; ++h) {
        const std::vector<double> k =
            RotateRef(b.plan, &b.x[b.KElem(l, t, h)], static_cast<double>(b.old_pos[t]));
        uint8_t* head = b.payload.data() + b.KOffset(l, t, h);
        for (uint32_t j = 0; j < b.head_dim; ++j) StoreAs(kd, head + j * Bytes(kd), k[j]);
      }
    }
  }
  return b;
}

// Random deltas (about 1 in 5 zero) keeping every new position in [0, 2^21).
std::vector<int64_t> RandomDelta(std::mt19937_64& rng, const std::vector<int64_t>& base) {
  std::vector<int64_t> d(base.size());
  for (size_t t = 0; t < base.size(); ++t) {
    if (rng() % 5 == 0) continue;
    d[t] = static_cast<int64_t>(rng() % (1 << 21)) - base[t];
  }
  return d;
}

// Per-head norm-relative error of stored K in `p` against K rotated directly
// at `pos` from the unrotated keys. Returns the largest.
double MaxHeadError(const TestBlock& b, const std::vector<uint8_t>& p,
                    const std::vector<int64_t>& pos) {
  const v1::DType kd = b.fp.k_dtype();
  double worst = 0;
  for (uint32_t l = 0; l < b.n_layers; ++l) {
    for (uint32_t t = 0; t < b.n_tokens; ++t) {
      for (uint32_t h = 0; h < b.n_heads; ++h) {
        const std::vector<double> ref =
            RotateRef(b.plan, &b.x[b.KElem(l, t, h)], static_cast<double>(pos[t]));
        const uint8_t* head = p.data() + b.KOffset(l, t, h);
        double err = 0, norm = 0;
        for (uint32_t j = 0; j < b.head_dim; ++j) {
          const double diff = LoadAs(kd, head + j * Bytes(kd)) - ref[j];
          err += diff * diff;
          norm += ref[j] * ref[j];
        }
        worst = std::max(worst, std::sqrt(err) / std::max(std::sqrt(norm), 1e-30));
      }
    }
  }
  return worst;
}

std::string Describe(const TestBlock& b) {
  const v1::RopeParams& r = b.fp.rope();
  return absl::StrCat(
      "k_dtype=", b.fp.k_dtype(), " v_dtype=", b.fp.v_dtype(), " type=", r.type(),
      " head_dim=", b.head_dim, " rotary_dim=", b.plan.rotary_dim, " base=",
      r.freq_base(), " scale=", r.freq_scale(), " scaling=", r.scaling(),
      " factors=", r.freq_factors_size(), " layers=", b.n_layers, " tokens=",
      b.n_tokens, " heads=", b.n_heads);
}

const v1::DType kAllDTypes[] = {v1::DTYPE_F16, v1::DTYPE_BF16, v1::DTYPE_F32};

// ---------------------------------------------------------------------------
// Re-anchoring properties.

// 1. Re-anchored K equals K computed directly at the new positions; V, the
// dims past rotary_dim and tokens with delta 0 stay byte-identical.
TEST(RopeReanchorTest, MatchesDirectRotationAtNewPositions) {
  std::mt19937_64 rng(20240601);
  double worst[3] = {0, 0, 0};
  for (int iter = 0; iter < 240; ++iter) {
    const v1::DType kd = kAllDTypes[iter % 3];
    TestBlock b = RandomBlock(rng, kd);
    SCOPED_TRACE(absl::StrCat("case ", iter, ": ", Describe(b)));
    const std::vector<int64_t> delta = RandomDelta(rng, b.old_pos);
    std::vector<int64_t> new_pos(b.n_tokens);
    for (uint32_t t = 0; t < b.n_tokens; ++t) new_pos[t] = b.old_pos[t] + delta[t];

    std::vector<uint8_t> p = b.payload;
    ASSERT_OK(ReanchorCanonicalBlock(b.plan, b.meta, p.data(), p.size(), delta));

    const double err = MaxHeadError(b, p, new_pos);
    worst[iter % 3] = std::max(worst[iter % 3], err);
    EXPECT_LT(err, Bound(kd));

    const uint32_t kb = Bytes(kd);
    for (uint32_t l = 0; l < b.n_layers; ++l) {
      // V byte-identical.
      const uint64_t v_off = l * b.LayerStride() + b.KBytes();
      ASSERT_EQ(std::memcmp(p.data() + v_off, b.payload.data() + v_off,
                            b.LayerStride() - b.KBytes()),
                0)
          << "layer " << l << " V changed";
      for (uint32_t t = 0; t < b.n_tokens; ++t) {
        for (uint32_t h = 0; h < b.n_heads; ++h) {
          const uint8_t* now = p.data() + b.KOffset(l, t, h);
          const uint8_t* was = b.payload.data() + b.KOffset(l, t, h);
          if (delta[t] == 0) {
            ASSERT_EQ(std::memcmp(now, was, b.head_dim * kb), 0)
                << "token " << t << " with delta 0 changed";
          }
          // Dims >= rotary_dim byte-identical.
          const size_t off = static_cast<size_t>(b.plan.rotary_dim) * kb;
          ASSERT_EQ(std::memcmp(now + off, was + off, b.head_dim * kb - off), 0)
              << "dims past rotary_dim changed (token " << t << ", head " << h << ")";
        }
      }
    }
  }
  std::printf("max per-head norm-relative error: f16 %.3g (bound %.0e), bf16 %.3g "
              "(bound %.0e), f32 %.3g (bound %.0e)\n",
              worst[0], Bound(v1::DTYPE_F16), worst[1], Bound(v1::DTYPE_BF16),
              worst[2], Bound(v1::DTYPE_F32));
}

// 2. Re-anchoring by a, then by b, equals re-anchoring by a + b (both within
// the bound of the direct rotation; b = -a goes back to the original).
TEST(RopeReanchorTest, ComposesAdditively) {
  std::mt19937_64 rng(7);
  double worst[3] = {0, 0, 0};
  for (int iter = 0; iter < 150; ++iter) {
    const v1::DType kd = kAllDTypes[iter % 3];
    TestBlock b = RandomBlock(rng, kd);
    SCOPED_TRACE(absl::StrCat("case ", iter, ": ", Describe(b)));
    const std::vector<int64_t> a = RandomDelta(rng, b.old_pos);
    std::vector<int64_t> mid(b.n_tokens), second(b.n_tokens), sum(b.n_tokens),
        final_pos(b.n_tokens);
    for (uint32_t t = 0; t < b.n_tokens; ++t) mid[t] = b.old_pos[t] + a[t];
    std::vector<int64_t> bd = RandomDelta(rng, mid);
    if (iter % 4 == 0) {
      for (uint32_t t = 0; t < b.n_tokens; ++t) bd[t] = -a[t];  // back home
    }
    for (uint32_t t = 0; t < b.n_tokens; ++t) {
      sum[t] = a[t] + bd[t];
      final_pos[t] = b.old_pos[t] + sum[t];
    }

    std::vector<uint8_t> twice = b.payload, once = b.payload;
    ASSERT_OK(ReanchorCanonicalBlock(b.plan, b.meta, twice.data(), twice.size(), a));
    ASSERT_OK(ReanchorCanonicalBlock(b.plan, b.meta, twice.data(), twice.size(), bd));
    ASSERT_OK(ReanchorCanonicalBlock(b.plan, b.meta, once.data(), once.size(), sum));

    const double e_twice = MaxHeadError(b, twice, final_pos);
    const double e_once = MaxHeadError(b, once, final_pos);
    worst[iter % 3] = std::max({worst[iter % 3], e_twice, e_once});
    EXPECT_LT(e_twice, Bound(kd));
    EXPECT_LT(e_once, Bound(kd));
    // V untouched by either path.
    for (uint32_t l = 0; l < b.n_layers; ++l) {
      const uint64_t v_off = l * b.LayerStride() + b.KBytes();
      ASSERT_EQ(std::memcmp(twice.data() + v_off, b.payload.data() + v_off,
                            b.LayerStride() - b.KBytes()),
                0);
    }
  }
  std::printf("max per-head norm-relative error after a then b: f16 %.3g, bf16 %.3g, "
              "f32 %.3g\n",
              worst[0], worst[1], worst[2]);
}

// 3. Delta 0 leaves the whole payload byte-identical, even bit patterns that a
// conversion would change (signaling NaNs, NaN payloads).
TEST(RopeReanchorTest, ZeroDeltaLeavesPayloadByteIdentical) {
  for (v1::DType kd : kAllDTypes) {
    v1::LayoutFingerprint fp = BaseFingerprint(v1::ROPE_NEOX, 8, 10000);
    fp.set_k_dtype(kd);
    fp.set_v_dtype(kd);
    fp.set_n_layers(2);
    fp.set_n_kv_heads(2);
    ASSERT_OK_AND_ASSIGN(const RopePlan plan, MakeRopePlan(fp));
    const std::vector<int64_t> pos = {5, 6, 7};
    const v1::BlockMeta meta = MakeMeta(fp, 3, 0, 2, pos, true);
    std::vector<uint8_t> payload(2 * 3 * 2 * 8 * 2 * Bytes(kd));
    // Signaling NaNs: 0x7c01 (f16), 0xff81 (bf16), 0x7f800001 (f32), which a
    // round trip through float would quiet.
    for (size_t i = 0; i < payload.size(); i += Bytes(kd)) {
      if (kd == v1::DTYPE_F16) {
        const uint16_t h = 0x7c01;
        std::memcpy(&payload[i], &h, 2);
      } else if (kd == v1::DTYPE_BF16) {
        const uint16_t h = 0xff81;
        std::memcpy(&payload[i], &h, 2);
      } else {
        const uint32_t f = 0x7f800001u;
        std::memcpy(&payload[i], &f, 4);
      }
    }
    const std::vector<uint8_t> before = payload;
    ASSERT_OK(ReanchorCanonicalBlock(plan, meta, payload.data(), payload.size(),
                                     std::vector<int64_t>(3, 0)));
    EXPECT_EQ(payload, before) << "dtype " << kd;
    // RotateKeys directly, too.
    RotateKeys(plan, kd, payload.data(), 3, 2, std::vector<int64_t>(3, 0));
    EXPECT_EQ(payload, before) << "dtype " << kd;
  }
}

// 4a. DYNAMIC_NTK cannot be re-anchored.
TEST(RopePlanTest, DynamicNtkIsFailedPrecondition) {
  v1::LayoutFingerprint fp = BaseFingerprint(v1::ROPE_NEOX, 128, 10000);
  fp.mutable_rope()->set_scaling(v1::ROPE_SCALING_DYNAMIC_NTK);
  EXPECT_THAT(MakeRopePlan(fp), StatusIs(absl::StatusCode::kFailedPrecondition,
                                         HasSubstr("rope.scaling")));
  fp.mutable_rope()->set_type(v1::ROPE_NORM);
  EXPECT_THAT(MakeRopePlan(fp), StatusIs(absl::StatusCode::kFailedPrecondition,
                                         HasSubstr("rope.scaling")));
}

// 4b. Without RoPE (NONE or UNSPECIFIED), re-anchoring is a no-op.
TEST(RopeReanchorTest, RopeNoneIsNoOp) {
  for (v1::RopeType type : {v1::ROPE_NONE, v1::ROPE_TYPE_UNSPECIFIED}) {
    v1::LayoutFingerprint fp = BaseFingerprint(type, 16, 10000);
    fp.mutable_rope()->set_scaling(v1::ROPE_SCALING_DYNAMIC_NTK);  // cleared by NONE
    fp.set_n_layers(3);
    ASSERT_OK_AND_ASSIGN(const RopePlan plan, MakeRopePlan(fp));
    EXPECT_EQ(plan.type, v1::ROPE_NONE);
    EXPECT_TRUE(plan.omega.empty());
    std::vector<int64_t> pos = {0, 1, 2, 3};
    const v1::BlockMeta meta = MakeMeta(fp, 4, 1, 3, pos, true);
    std::vector<uint8_t> payload(2 * 4 * 16 * 4);
    std::mt19937 rng(3);
    for (uint8_t& c : payload) c = static_cast<uint8_t>(rng());
    const std::vector<uint8_t> before = payload;
    ASSERT_OK(ReanchorCanonicalBlock(plan, meta, payload.data(), payload.size(),
                                     {100, -1, 7, 12345}));
    EXPECT_EQ(payload, before);
    RotateKeys(plan, v1::DTYPE_F16, payload.data(), 4, 1, {100, -1, 7, 12345});
    EXPECT_EQ(payload, before);
  }
}

TEST(RopePlanTest, InvalidParamsAreInvalidArgument) {
  v1::LayoutFingerprint fp = BaseFingerprint(v1::ROPE_NEOX, 128, 10000);
  fp.mutable_rope()->set_rotary_dim(7);
  EXPECT_THAT(MakeRopePlan(fp), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("rope.rotary_dim")));
  fp.mutable_rope()->set_rotary_dim(130);
  EXPECT_THAT(MakeRopePlan(fp), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("rope.rotary_dim")));
  fp.mutable_rope()->set_rotary_dim(64);
  fp.mutable_rope()->set_freq_base(0);
  EXPECT_THAT(MakeRopePlan(fp), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("rope.freq_base")));
  fp.mutable_rope()->set_freq_base(10000);
  fp.mutable_rope()->add_freq_factors(1.0f);
  EXPECT_THAT(MakeRopePlan(fp), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("rope.freq_factors")));
  fp.mutable_rope()->clear_freq_factors();
  fp.mutable_rope()->set_freq_scale(-1);
  EXPECT_THAT(MakeRopePlan(fp), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("rope.freq_scale")));
  fp.mutable_rope()->set_freq_scale(0.5);
  fp.set_head_dim(0);
  EXPECT_THAT(MakeRopePlan(fp), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("head_dim")));
  // Finite, valid parameters whose angle table overflows a double.
  fp = BaseFingerprint(v1::ROPE_NEOX, 4, 10000);
  fp.mutable_rope()->set_scaling(v1::ROPE_SCALING_LINEAR);
  fp.mutable_rope()->set_freq_scale(1e308);
  fp.mutable_rope()->add_freq_factors(1e-30f);
  fp.mutable_rope()->add_freq_factors(1.0f);
  EXPECT_THAT(MakeRopePlan(fp), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("not finite")));
}

TEST(RopeReanchorTest, BadShapesAreInvalidArgument) {
  v1::LayoutFingerprint fp = BaseFingerprint(v1::ROPE_NORM, 8, 10000);
  fp.set_n_layers(2);
  ASSERT_OK_AND_ASSIGN(const RopePlan plan, MakeRopePlan(fp));
  const v1::BlockMeta meta = MakeMeta(fp, 2, 0, 2, {0, 1}, true);
  std::vector<uint8_t> payload(2 * 2 * 8 * 4);
  const std::vector<int64_t> delta = {1, 1};
  EXPECT_OK(ReanchorCanonicalBlock(plan, meta, payload.data(), payload.size(), delta));
  EXPECT_THAT(ReanchorCanonicalBlock(plan, meta, payload.data(), payload.size() - 2, delta),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("payload")));
  EXPECT_THAT(ReanchorCanonicalBlock(plan, meta, payload.data(), payload.size(), {1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("delta")));
  v1::BlockMeta bad = meta;
  bad.mutable_fingerprint()->set_layout(v1::LAYOUT_OPAQUE);
  EXPECT_THAT(ReanchorCanonicalBlock(plan, bad, payload.data(), payload.size(), delta),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layout")));
  bad = meta;
  bad.set_layer_end(3);
  EXPECT_THAT(ReanchorCanonicalBlock(plan, bad, payload.data(), payload.size(), delta),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layer")));
  // A plan for another shape or rope type is refused.
  v1::LayoutFingerprint other = fp;
  other.set_head_dim(16);
  ASSERT_OK_AND_ASSIGN(const RopePlan wide, MakeRopePlan(other));
  EXPECT_THAT(ReanchorCanonicalBlock(wide, meta, payload.data(), payload.size(), delta),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("plan")));
  other = fp;
  other.mutable_rope()->set_type(v1::ROPE_NEOX);
  ASSERT_OK_AND_ASSIGN(const RopePlan neox, MakeRopePlan(other));
  EXPECT_THAT(ReanchorCanonicalBlock(neox, meta, payload.data(), payload.size(), delta),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("plan")));
}

// NORM pairs adjacent dims, NEOX the two halves: rotating e_0 by a quarter
// turn (omega_0 = 1 always) moves it onto dim 1 (NORM) or dim rotary_dim/2
// (NEOX). A hand-checkable case.
TEST(RopeReanchorTest, PairingOfNormAndNeox) {
  for (v1::RopeType type : {v1::ROPE_NORM, v1::ROPE_NEOX}) {
    v1::LayoutFingerprint fp = BaseFingerprint(type, 8, 10000);
    fp.mutable_rope()->set_rotary_dim(4);
    fp.set_k_dtype(v1::DTYPE_F32);
    ASSERT_OK_AND_ASSIGN(const RopePlan plan, MakeRopePlan(fp));
    ASSERT_EQ(plan.omega.size(), 2u);
    EXPECT_EQ(plan.omega[0], 1.0);
    EXPECT_DOUBLE_EQ(plan.omega[1], 0.01);  // 10000^(-2/4)
    // Rotate e_0 by delta with angle pi/2: delta * omega_0 = delta rad, so use
    // a plan with omega_0 set by hand to pi/2 per position.
    RopePlan quarter = plan;
    quarter.omega[0] = M_PI / 2;
    float k[8] = {1, 0, 0, 0, 5, 6, 7, 8};
    RotateKeys(quarter, v1::DTYPE_F32, k, 1, 1, {1});
    const int target = type == v1::ROPE_NORM ? 1 : 2;
    for (int j = 0; j < 4; ++j) {
      EXPECT_NEAR(k[j], j == target ? 1.0f : 0.0f, 1e-7) << "dim " << j << " type " << type;
    }
    EXPECT_EQ(k[4], 5);
    EXPECT_EQ(k[7], 8);
  }
}

// f16 keys take a bulk-conversion path on CPUs with F16C: it must give the
// same bits as the element-by-element rounding the contract describes, for
// every kind of value (subnormals, values that overflow, negative zero) and
// rotary width (multiples of 8 take the fast path, others the scalar one).
TEST(RopeReanchorTest, F16RotationMatchesScalarReferenceBitForBit) {
  std::mt19937 gen(5);
  std::uniform_int_distribution<uint32_t> bits(0, 0xffff);
  for (v1::RopeType type : {v1::ROPE_NORM, v1::ROPE_NEOX}) {
    for (uint32_t rotary : {64u, 48u, 6u}) {
      v1::LayoutFingerprint fp = BaseFingerprint(type, 64, 10000);
      fp.mutable_rope()->set_rotary_dim(rotary);
      ASSERT_OK_AND_ASSIGN(const RopePlan plan, MakeRopePlan(fp));
      constexpr uint32_t kTokens = 5, kHeads = 3;
      std::vector<uint16_t> k(kTokens * kHeads * 64);
      for (uint16_t& h : k) {
        do {
          h = static_cast<uint16_t>(bits(gen));
        } while ((h & 0x7c00) == 0x7c00);  // No inf or NaN inputs.
      }
      k[0] = 0x0001;  // Smallest subnormal.
      k[1] = 0x7bff;  // 65504: rotations may overflow to inf.
      k[2] = 0x8000;  // -0.
      std::vector<uint16_t> expected = k;
      const std::vector<int64_t> delta = {3, 3, -70000, 0, 12345};
      const size_t n_pairs = rotary / 2;
      for (uint32_t t = 0; t < kTokens; ++t) {
        if (delta[t] == 0) continue;
        for (uint32_t h = 0; h < kHeads; ++h) {
          uint16_t* head = expected.data() + (t * kHeads + h) * 64;
          for (size_t i = 0; i < n_pairs; ++i) {
            const size_t j0 = type == v1::ROPE_NEOX ? i : 2 * i;
            const size_t j1 = type == v1::ROPE_NEOX ? i + n_pairs : 2 * i + 1;
            const double angle = static_cast<double>(delta[t]) * plan.omega[i];
            const float c = static_cast<float>(std::cos(angle));
            const float sn = static_cast<float>(std::sin(angle));
            const float x0 = HalfToFloat(head[j0]), x1 = HalfToFloat(head[j1]);
            const float a = x0 * c, b = x1 * sn, e = x0 * sn, f = x1 * c;
            head[j0] = FloatToHalf(a - b);
            head[j1] = FloatToHalf(e + f);
          }
        }
      }
      RotateKeys(plan, v1::DTYPE_F16, k.data(), kTokens, kHeads, delta);
      for (size_t i = 0; i < k.size(); ++i) {
        ASSERT_EQ(k[i], expected[i]) << "element " << i << " type " << type << " rotary "
                                     << rotary;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// 5. The angle table against llama.cpp's formula.

// Llama 3.1 (8B): head_dim 128, freq_base 500000, rope_freqs as written by
// llama.cpp's convert_hf_to_gguf.py for rope_type "llama3" (factor 8,
// low_freq_factor 1, high_freq_factor 4, original context 8192).
TEST(RopePlanTest, AngleTableMatchesLlamaCppForLlama31) {
  v1::LayoutFingerprint fp = BaseFingerprint(v1::ROPE_NEOX, 128, 500000);
  fp.mutable_rope()->set_scaling(v1::ROPE_SCALING_LLAMA3);
  std::vector<float> factors;
  for (int i = 0; i < 64; ++i) {
    const double freq = 1.0 / std::pow(500000.0, (2.0 * i) / 128.0);
    const double wavelen = 2 * M_PI / freq;
    double f;
    if (wavelen < 8192.0 / 4.0) {
      f = 1;
    } else if (wavelen > 8192.0 / 1.0) {
      f = 8;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      f = 1 / ((1 - smooth) / 8 + smooth);
    }
    factors.push_back(static_cast<float>(f));
    fp.mutable_rope()->add_freq_factors(static_cast<float>(f));
  }
  ASSERT_OK_AND_ASSIGN(const RopePlan plan, MakeRopePlan(fp));
  EXPECT_EQ(plan.type, v1::ROPE_NEOX);
  EXPECT_EQ(plan.rotary_dim, 128u);
  ASSERT_EQ(plan.omega.size(), 64u);
  for (int i = 0; i < 64; ++i) {
    // theta_extrap = p * theta_scale^i / ff[i], theta_scale = base^(-2/n_dims).
    const double expected = std::pow(std::pow(500000.0, -2.0 / 128.0), i) / factors[i];
    EXPECT_NEAR(plan.omega[i], expected, 1e-12 * expected) << "pair " << i;
  }
  // Spot values computed by hand (Python, double): high-frequency pairs keep
  // factor 1, the smooth band in between, low-frequency pairs get factor 8.
  EXPECT_EQ(plan.omega[0], 1.0);
  EXPECT_NEAR(plan.omega[1], 0.8146172338565447, 1e-15);
  EXPECT_NEAR(plan.omega[28], 0.003211445994752591, 1e-17);
  EXPECT_NEAR(factors[30], 1.5534146285049255f, 1e-6);
  EXPECT_NEAR(plan.omega[30], 0.0013718936077665963, 1e-17);
  EXPECT_NEAR(plan.omega[34], 0.00017850781228492037, 1e-18);
  EXPECT_NEAR(plan.omega[63], 3.068925988914511e-07, 1e-21);
}

// YaRN: Llama-2-7B shape (head_dim 128, base 10000) extended 4x from 4096
// tokens (freq_scale 0.25, ext_factor 1, beta_fast 32, beta_slow 1).
// corr dims: 128 ln(4096 / (beta 2 pi)) / (2 ln 10000) = 20.944 (beta 32),
// 45.027 (beta 1) -> [floor, ceil] = [20, 46].
TEST(RopePlanTest, AngleTableMatchesLlamaCppForYarn) {
  v1::LayoutFingerprint fp = BaseFingerprint(v1::ROPE_NORM, 128, 10000);
  v1::RopeParams* r = fp.mutable_rope();
  r->set_scaling(v1::ROPE_SCALING_YARN);
  r->set_freq_scale(0.25);
  r->set_yarn_ext_factor(1.0f);
  r->set_yarn_attn_factor(1.0f);
  r->set_yarn_beta_fast(32.0f);
  r->set_yarn_beta_slow(1.0f);
  r->set_n_ctx_orig(4096);
  ASSERT_OK_AND_ASSIGN(const RopePlan plan, MakeRopePlan(fp));
  ASSERT_EQ(plan.omega.size(), 64u);
  auto corr_dim = [](double beta) {
    return 128 * std::log(4096 / (beta * 2 * M_PI)) / (2 * std::log(10000.0));
  };
  const double low = std::max(0.0, std::floor(corr_dim(32)));
  const double high = std::min(127.0, std::ceil(corr_dim(1)));
  ASSERT_EQ(low, 20);
  ASSERT_EQ(high, 46);
  for (int i = 0; i < 64; ++i) {
    const double base = std::pow(10000.0, -2.0 * i / 128);
    const double y = (i - low) / std::max(0.001, high - low);
    const double ramp = 1 - std::min(1.0, std::max(0.0, y));  // * ext_factor 1
    const double expected = 0.25 * base * (1 - ramp) + base * ramp;
    EXPECT_NEAR(plan.omega[i], expected, 1e-6 * expected) << "pair " << i;
  }
  // Below the ramp: pure extrapolation; past it: pure interpolation.
  EXPECT_EQ(plan.omega[0], 1.0);
  EXPECT_NEAR(plan.omega[20], 0.05623413251903491, 1e-16);
  EXPECT_NEAR(plan.omega[21], 0.047292038501684786, 1e-8);
  EXPECT_NEAR(plan.omega[30], 0.009488517882700576, 1e-8);
  EXPECT_NEAR(plan.omega[46], 0.000333380358040831, 1e-18);
  EXPECT_NEAR(plan.omega[63], 2.8869549617236455e-05, 1e-19);

  // ext_factor 0: no ramp, omega = freq_scale * base everywhere.
  r->set_yarn_ext_factor(0.0f);
  ASSERT_OK_AND_ASSIGN(const RopePlan flat, MakeRopePlan(fp));
  for (int i = 0; i < 64; ++i) {
    EXPECT_NEAR(flat.omega[i], 0.25 * std::pow(10000.0, -2.0 * i / 128),
                1e-15) << "pair " << i;
  }
  // Linear scaling: omega = freq_scale * base; rotary_dim < head_dim changes
  // the exponent's denominator.
  fp = BaseFingerprint(v1::ROPE_NEOX, 128, 10000);
  fp.mutable_rope()->set_scaling(v1::ROPE_SCALING_LINEAR);
  fp.mutable_rope()->set_freq_scale(0.5);
  fp.mutable_rope()->set_rotary_dim(32);
  ASSERT_OK_AND_ASSIGN(const RopePlan linear, MakeRopePlan(fp));
  ASSERT_EQ(linear.omega.size(), 16u);
  for (int i = 0; i < 16; ++i) {
    EXPECT_NEAR(linear.omega[i], 0.5 * std::pow(10000.0, -2.0 * i / 32), 1e-15);
  }
}

// ---------------------------------------------------------------------------
// 6. YaRN at large shifts (issue #11): the angle delta * omega must be exact
// to double rounding however far a block moves. The ramp used to be mixed in
// float, an error of ~1.3e-10 x |delta| radians.

// YarnReferenceOmega is omega for pair i in long double, the corr dims as
// ggml computes them (float, then floor / ceil: integers).
long double YarnReferenceOmega(const v1::RopeParams& r, uint32_t rotary_dim, uint32_t i) {
  const float pi = 3.14159265358979323846f;
  auto corr_dim = [&](float beta) {
    return static_cast<float>(rotary_dim) *
           std::log(static_cast<float>(r.n_ctx_orig()) / (beta * 2 * pi)) /
           (2 * std::log(static_cast<float>(r.freq_base())));
  };
  const float low_f = std::floor(corr_dim(r.yarn_beta_fast()));
  const float high_f = std::ceil(corr_dim(r.yarn_beta_slow()));
  const long double low = low_f > 0.0f ? low_f : 0.0f;
  const long double high =
      high_f < static_cast<float>(rotary_dim - 1) ? high_f : static_cast<float>(rotary_dim - 1);
  const long double scale = r.freq_scale() == 0 ? 1.0L : r.freq_scale();
  long double base = std::pow(static_cast<long double>(r.freq_base()),
                              -2.0L * i / static_cast<long double>(rotary_dim));
  if (!r.freq_factors().empty()) base /= r.freq_factors(static_cast<int>(i));
  const long double y = (static_cast<long double>(i) - low) / std::max(0.001L, high - low);
  const long double ramp = 1 - std::min(1.0L, std::max(0.0L, y));
  const long double mix = ramp * static_cast<long double>(r.yarn_ext_factor());
  return scale * base * (1 - mix) + base * mix;
}

std::vector<v1::LayoutFingerprint> LargeShiftYarnFingerprints() {
  std::vector<v1::LayoutFingerprint> out;
  struct Shape {
    v1::RopeType type;
    uint32_t head_dim, rotary_dim;
    double base, scale;
    float ext, beta_fast, beta_slow;
    uint32_t n_ctx;
  } shapes[] = {
      // Llama-2-7B extended 4x (as AngleTableMatchesLlamaCppForYarn).
      {v1::ROPE_NORM, 128, 0, 10000, 0.25, 1.0f, 32, 1, 4096},
      // Qwen2-style NEOX, base 1e6, 4x from 32k, half mix.
      {v1::ROPE_NEOX, 128, 0, 1000000, 0.25, 0.5f, 32, 1, 32768},
      // Partial rotary dims, 16x, odd betas.
      {v1::ROPE_NEOX, 96, 64, 500000, 0.0625, 1.0f, 24, 1.5f, 8192},
  };
  for (const Shape& sh : shapes) {
    v1::LayoutFingerprint fp = BaseFingerprint(sh.type, sh.head_dim, sh.base);
    fp.set_k_dtype(v1::DTYPE_F32);
    fp.set_v_dtype(v1::DTYPE_F32);
    v1::RopeParams* r = fp.mutable_rope();
    r->set_rotary_dim(sh.rotary_dim);
    r->set_scaling(v1::ROPE_SCALING_YARN);
    r->set_freq_scale(sh.scale);
    r->set_yarn_ext_factor(sh.ext);
    r->set_yarn_attn_factor(1.0f);
    r->set_yarn_beta_fast(sh.beta_fast);
    r->set_yarn_beta_slow(sh.beta_slow);
    r->set_n_ctx_orig(sh.n_ctx);
    out.push_back(fp);
  }
  return out;
}

TEST(RopePlanTest, YarnAngleTableIsExactToDoubleRounding) {
  for (const v1::LayoutFingerprint& fp : LargeShiftYarnFingerprints()) {
    ASSERT_OK_AND_ASSIGN(const RopePlan plan, MakeRopePlan(fp));
    for (uint32_t i = 0; i < plan.omega.size(); ++i) {
      const long double want = YarnReferenceOmega(fp.rope(), plan.rotary_dim, i);
      // A few double roundings (pow, the mix): well under 1e-15 relative.
      EXPECT_LE(std::fabs(plan.omega[i] - want) / want, 1e-15L)
          << fp.rope().ShortDebugString() << " pair " << i;
    }
  }
}

TEST(RopeReanchorTest, YarnLargeShiftsMatchLongDoubleReference) {
  const int64_t kShifts[] = {131072,       -131072,       1 << 20,      -(1 << 24),
                             (1ll << 28) + 12345, (1ll << 31) - 1, -(1ll << 31) + 1};
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  for (const v1::LayoutFingerprint& fp : LargeShiftYarnFingerprints()) {
    SCOPED_TRACE(fp.rope().ShortDebugString());
    ASSERT_OK_AND_ASSIGN(const RopePlan plan, MakeRopePlan(fp));
    const uint32_t head_dim = fp.head_dim();
    const uint32_t n_pairs = plan.rotary_dim / 2;
    const uint32_t n_heads = 2;
    for (const int64_t shift : kShifts) {
      SCOPED_TRACE(shift);
      const uint32_t n_tokens = 3;
      std::vector<float> x(static_cast<size_t>(n_tokens) * n_heads * head_dim);
      for (float& v : x) v = value(rng);
      std::vector<float> y = x;
      // Tokens moved by shift, shift + 1 and shift - 7 (per-token tables).
      const std::vector<int64_t> delta = {shift, shift + 1, shift - 7};
      RotateKeys(plan, v1::DTYPE_F32, y.data(), n_tokens, n_heads, delta);
      double worst = 0;
      for (uint32_t t = 0; t < n_tokens; ++t) {
        for (uint32_t h = 0; h < n_heads; ++h) {
          const float* in = &x[(static_cast<size_t>(t) * n_heads + h) * head_dim];
          const float* out = &y[(static_cast<size_t>(t) * n_heads + h) * head_dim];
          long double err2 = 0, norm2 = 0;
          for (uint32_t i = 0; i < n_pairs; ++i) {
            const uint32_t j0 = plan.type == v1::ROPE_NEOX ? i : 2 * i;
            const uint32_t j1 = plan.type == v1::ROPE_NEOX ? i + n_pairs : 2 * i + 1;
            const long double angle =
                static_cast<long double>(delta[t]) * YarnReferenceOmega(fp.rope(), plan.rotary_dim, i);
            const long double c = std::cos(angle), s = std::sin(angle);
            const long double r0 = in[j0] * c - in[j1] * s;
            const long double r1 = in[j0] * s + in[j1] * c;
            err2 += (out[j0] - r0) * (out[j0] - r0) + (out[j1] - r1) * (out[j1] - r1);
          }
          for (uint32_t j = 0; j < head_dim; ++j) norm2 += static_cast<long double>(in[j]) * in[j];
          for (uint32_t j = plan.rotary_dim; j < head_dim; ++j) {
            ASSERT_EQ(out[j], in[j]);  // Past rotary_dim: untouched.
          }
          worst = std::max(worst, static_cast<double>(std::sqrt(err2 / norm2)));
        }
      }
      // f32 rounding (~1e-7) plus the double angle's rounding, |delta| x
      // 2^-52 at most; the float ramp made it 1.3e-10 x |delta|.
      const double bound = 1e-6 + std::fabs(static_cast<double>(shift)) * 0x1p-51;
      EXPECT_LE(worst, bound);
      EXPECT_LE(worst, Bound(v1::DTYPE_F32));  // The documented f32 bound.
    }
  }
}

TEST(RopePlanTest, OriginalPositions) {
  v1::BlockMeta meta;
  meta.set_n_tokens(3);
  meta.set_first_position(40);
  EXPECT_EQ(OriginalPositions(meta), (std::vector<int64_t>{40, 41, 42}));
  meta.add_positions(7);
  meta.add_positions(3);
  meta.add_positions(2147483647);
  EXPECT_EQ(OriginalPositions(meta), (std::vector<int64_t>{7, 3, 2147483647}));
}

}  // namespace
}  // namespace evoke
