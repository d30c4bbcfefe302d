#include "common/summaries.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "common/block_validation.h"
#include "common/chain_hash.h"
#include "common/half.h"
#include "common/rope.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint32_t kLayers = 3, kHeads = 2, kDim = 32, kTokens = 24;

v1::BlockMeta Meta(v1::DType dtype, int32_t first_position) {
  v1::BlockMeta m;
  v1::LayoutFingerprint* fp = m.mutable_fingerprint();
  fp->set_namespace_("ns");
  fp->set_model_id("m");
  fp->set_k_dtype(dtype);
  fp->set_v_dtype(dtype);
  fp->set_n_layers(kLayers);
  fp->set_n_kv_heads(kHeads);
  fp->set_head_dim(kDim);
  fp->set_layout(v1::LAYOUT_CANONICAL_V1);
  fp->mutable_rope()->set_type(v1::ROPE_NEOX);
  fp->mutable_rope()->set_freq_base(10000);
  m.set_kind(v1::BLOCK_KIND_SESSION);
  m.set_session_id("s");
  m.set_id(SessionBlockId("ns", "s", 0).ToBytes());
  m.set_n_tokens(kTokens);
  m.set_layer_begin(0);
  m.set_layer_end(kLayers);
  m.set_first_position(first_position);
  return m;
}

// A canonical payload whose layer-1 keys are `x` (unrotated, f32
// [t][h][d]) rotated to the block's positions; other layers random.
std::string Payload(const v1::BlockMeta& meta, const std::vector<float>& x) {
  const v1::DType dtype = meta.fingerprint().k_dtype();
  const uint32_t b = DTypeBytes(dtype);
  const size_t elems = static_cast<size_t>(kTokens) * kHeads * kDim;
  std::string payload(CanonicalPayloadBytes(meta.fingerprint(), kTokens, kLayers).value(), '\0');
  std::vector<float> rotated = x;
  const RopePlan plan = MakeRopePlan(meta.fingerprint()).value();
  RotateKeys(plan, v1::DTYPE_F32, rotated.data(), kTokens, kHeads, OriginalPositions(meta));
  uint8_t* k1 = reinterpret_cast<uint8_t*>(payload.data()) + elems * b * 2;  // Layer 1's K.
  for (size_t i = 0; i < elems; ++i) {
    if (dtype == v1::DTYPE_F32) {
      std::memcpy(k1 + i * 4, &rotated[i], 4);
    } else {
      const uint16_t h = dtype == v1::DTYPE_F16 ? FloatToHalf(rotated[i]) : FloatToBf16(rotated[i]);
      std::memcpy(k1 + i * 2, &h, 2);
    }
  }
  return payload;
}

std::vector<float> Keys(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> x(static_cast<size_t>(kTokens) * kHeads * kDim);
  for (float& v : x) v = d(rng);
  return x;
}

TEST(SummariesTest, MeanKeysUndoesRopeAtAnyPosition) {
  const std::vector<float> x = Keys(1);
  std::vector<double> mean(kHeads * kDim, 0);
  for (uint32_t t = 0; t < kTokens; ++t) {
    for (uint32_t i = 0; i < kHeads * kDim; ++i) mean[i] += x[t * kHeads * kDim + i] / kTokens;
  }
  for (v1::DType dtype : {v1::DTYPE_F32, v1::DTYPE_F16, v1::DTYPE_BF16}) {
    const double tolerance = dtype == v1::DTYPE_F32 ? 1e-5 : dtype == v1::DTYPE_F16 ? 2e-3 : 1e-2;
    for (int32_t first : {0, 1000, 123456}) {
      const v1::BlockMeta meta = Meta(dtype, first);
      const std::string payload = Payload(meta, x);
      ASSERT_OK_AND_ASSIGN(
          v1::Summary s,
          MeanKeysSummary(meta, reinterpret_cast<const uint8_t*>(payload.data()), payload.size(), 1));
      EXPECT_EQ(s.kind(), v1::SUMMARY_MEAN_KEYS);
      EXPECT_EQ(s.layer(), 1u);
      ASSERT_EQ(s.values_size(), static_cast<int>(kHeads * kDim));
      double err = 0, norm = 0;
      for (uint32_t i = 0; i < kHeads * kDim; ++i) {
        err += (s.values(i) - mean[i]) * (s.values(i) - mean[i]);
        norm += mean[i] * mean[i];
      }
      EXPECT_LT(std::sqrt(err / norm), tolerance * 4) << dtype << " at " << first;
    }
  }
}

TEST(SummariesTest, ReprKeysAverageTheMostAttendedTokens) {
  const std::vector<float> x = Keys(2);
  const v1::BlockMeta meta = Meta(v1::DTYPE_F32, 500);
  const std::string payload = Payload(meta, x);
  std::vector<float> attention(kTokens * kHeads, 0.01f);
  attention[3 * kHeads + 0] = 5;  // Head 0: tokens 3 and 7.
  attention[7 * kHeads + 0] = 4;
  attention[10 * kHeads + 1] = 9;  // Head 1: tokens 10 and 0 (a tie broken by index).
  attention[0 * kHeads + 1] = 1;
  attention[20 * kHeads + 1] = 1;
  ASSERT_OK_AND_ASSIGN(v1::Summary s,
                       ReprKeysSummary(meta, reinterpret_cast<const uint8_t*>(payload.data()),
                                       payload.size(), 1, attention, 2));
  EXPECT_EQ(s.r(), 2u);
  for (uint32_t d = 0; d < kDim; ++d) {
    EXPECT_NEAR(s.values(d), (x[(3 * kHeads) * kDim + d] + x[(7 * kHeads) * kDim + d]) / 2, 1e-4);
    EXPECT_NEAR(s.values(kDim + d),
                (x[(10 * kHeads + 1) * kDim + d] + x[(0 * kHeads + 1) * kDim + d]) / 2, 1e-4);
  }
  EXPECT_THAT(ReprKeysSummary(meta, reinterpret_cast<const uint8_t*>(payload.data()),
                              payload.size(), 1, attention, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ReprKeysSummary(meta, reinterpret_cast<const uint8_t*>(payload.data()),
                              payload.size(), 1, absl::MakeConstSpan(attention).subspan(1), 2),
              StatusIs(absl::StatusCode::kInvalidArgument));
  attention[4] = std::numeric_limits<float>::infinity();
  EXPECT_THAT(ReprKeysSummary(meta, reinterpret_cast<const uint8_t*>(payload.data()),
                              payload.size(), 1, attention, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("attention: not all finite")));
}

// Issue #11: NaN or infinite keys gave a NaN MEAN_KEYS summary (the daemon
// computes one for blocks saved without), which ranked first in Recover.
TEST(SummariesTest, NonFiniteKeysGiveNoSummary) {
  for (const v1::DType dtype : {v1::DTYPE_F16, v1::DTYPE_BF16, v1::DTYPE_F32}) {
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()}) {
      SCOPED_TRACE(::testing::Message() << v1::DType_Name(dtype) << " " << bad);
      const v1::BlockMeta meta = Meta(dtype, 100);
      std::vector<float> x = Keys(4);
      x[(5 * kHeads + 1) * kDim + 3] = bad;  // Token 5, head 1, dim 3.
      const std::string payload = Payload(meta, x);
      const auto* p = reinterpret_cast<const uint8_t*>(payload.data());
      EXPECT_THAT(MeanKeysSummary(meta, p, payload.size(), 1),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           HasSubstr("payload: the keys of layer 1 are not all finite (head 1")));
      std::vector<float> attention(static_cast<size_t>(kTokens) * kHeads, 0.01f);
      attention[5 * kHeads + 1] = 1.0f;  // Token 5 is head 1's top token.
      EXPECT_THAT(ReprKeysSummary(meta, p, payload.size(), 1, attention, 2),
                  StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not all finite")));
      // Another layer's keys are fine and summarize.
      ASSERT_OK_AND_ASSIGN(const v1::Summary other, MeanKeysSummary(meta, p, payload.size(), 0));
      for (float v : other.values()) EXPECT_TRUE(std::isfinite(v));
    }
  }
}

TEST(SummariesTest, Errors) {
  const v1::BlockMeta meta = Meta(v1::DTYPE_F16, 0);
  const std::string payload = Payload(meta, Keys(3));
  const auto* p = reinterpret_cast<const uint8_t*>(payload.data());
  EXPECT_THAT(MeanKeysSummary(meta, p, payload.size(), kLayers),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(MeanKeysSummary(meta, p, payload.size() - 2, 1),
              StatusIs(absl::StatusCode::kInvalidArgument));
  v1::BlockMeta ntk = meta;
  ntk.mutable_fingerprint()->mutable_rope()->set_scaling(v1::ROPE_SCALING_DYNAMIC_NTK);
  EXPECT_THAT(MeanKeysSummary(ntk, p, payload.size(), 1),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(DefaultSummaryLayer(meta), 1u);
}

}  // namespace
}  // namespace evoke
