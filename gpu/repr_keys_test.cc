// GPU tests of gpu/repr_keys.h against the CPU reference (common/summaries.h):
// the same tokens chosen (exactly, ties included), and the same summary.
// Bound on the values: both sides un-rotate with the same float operations
// and sum in double; they can differ only where the device's double sincos
// and glibc's round to different floats, which moves an un-rotated element by
// at most 1 ulp of f32 at the pair's magnitude. The test allows 1e-6 of the
// head's largest key magnitude. Skips, with the reason, without a device.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rope.h"
#include "common/summaries.h"
#include "gmock/gmock.h"
#include "gpu/cuda_test_util.h"
#include "gpu/repr_keys.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

using ::evoke::testing::CanonicalFingerprint;
using ::evoke::testing::DeviceBuffer;
using ::evoke::testing::DTypeSize;
using ::evoke::testing::StatusIs;
using ::evoke::testing::StoreAs;
using ::testing::HasSubstr;

struct Block {
  v1::BlockMeta meta;
  std::vector<uint8_t> payload;
  std::vector<float> attention;  // n_tokens x n_heads
};

Block RandomBlock(std::mt19937_64& rng, v1::DType kd, v1::RopeType type, uint32_t head_dim,
                  uint32_t n_heads, uint32_t n_tokens, bool coarse_attention) {
  Block b;
  v1::LayoutFingerprint fp = CanonicalFingerprint(type, kd, v1::DTYPE_F16, 4, n_heads, head_dim);
  if (type != v1::ROPE_NONE && rng() % 2 == 0) {
    fp.mutable_rope()->set_rotary_dim(2 * (1 + rng() % (head_dim / 2)));
  }
  if (type == v1::ROPE_NONE) fp.clear_rope();
  *b.meta.mutable_fingerprint() = fp;
  b.meta.set_n_tokens(n_tokens);
  b.meta.set_layer_begin(1);
  b.meta.set_layer_end(3);
  b.meta.set_first_position(static_cast<int32_t>(rng() % 200000));
  const uint64_t k_elems = uint64_t{n_tokens} * n_heads * head_dim;
  const uint64_t stride = k_elems * (DTypeSize(kd) + 2);
  b.payload.resize(2 * stride);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  for (uint8_t& c : b.payload) c = static_cast<uint8_t>(rng());  // V: random bytes.
  for (uint32_t l = 0; l < 2; ++l) {
    for (uint64_t e = 0; e < k_elems; ++e) {
      StoreAs(kd, b.payload.data() + l * stride + e * DTypeSize(kd), normal(rng));
    }
  }
  b.attention.resize(uint64_t{n_tokens} * n_heads);
  for (float& a : b.attention) {
    // Coarse values make ties, which must break to the earlier token.
    a = coarse_attention ? static_cast<float>(rng() % 4) : std::fabs(normal(rng));
  }
  return b;
}

TEST(ReprKeysDeviceTest, MatchesCpuForRandomBlocks) {
  EVOKE_REQUIRE_CUDA_DEVICE();
  std::mt19937_64 rng(7);
  const v1::DType kDTypes[] = {v1::DTYPE_F16, v1::DTYPE_BF16, v1::DTYPE_F32};
  const v1::RopeType kTypes[] = {v1::ROPE_NORM, v1::ROPE_NEOX, v1::ROPE_NONE};
  const uint32_t kHeadDims[] = {8, 64, 128};
  int cases = 0;
  for (int iter = 0; iter < 36; ++iter) {
    const v1::DType kd = kDTypes[iter % 3];
    const v1::RopeType type = kTypes[(iter / 3) % 3];
    const uint32_t head_dim = kHeadDims[rng() % 3];
    const uint32_t n_heads = 1 + rng() % 8;
    const uint32_t n_tokens = 1 + rng() % 300;
    const uint32_t r = 1 + rng() % std::min<uint32_t>(n_tokens, 16);
    const uint32_t layer = 1 + rng() % 2;
    Block b = RandomBlock(rng, kd, type, head_dim, n_heads, n_tokens, iter % 2 == 0);
    SCOPED_TRACE(absl::StrCat("case ", iter, ": k=", kd, " rope=", type, " head_dim=",
                              head_dim, " heads=", n_heads, " tokens=", n_tokens, " r=", r));
    ASSERT_OK_AND_ASSIGN(v1::Summary cpu, ReprKeysSummary(b.meta, b.payload.data(),
                                                          b.payload.size(), layer,
                                                          b.attention, r));
    const std::vector<uint32_t> cpu_top = TopTokensPerHead(b.attention, n_tokens, n_heads, r);
    DeviceBuffer payload(b.payload, iter % 4 == 3 ? 2 : 0);
    DeviceBuffer attention(b.attention.data(), b.attention.size() * sizeof(float), 0);
    std::vector<uint32_t> gpu_top;
    ASSERT_OK_AND_ASSIGN(
        v1::Summary gpu,
        ReprKeysSummaryOnDevice(b.meta, payload.get(), b.payload.size(), layer,
                                static_cast<const float*>(attention.get()), r, 0, &gpu_top));
    EXPECT_EQ(gpu_top, cpu_top);
    EXPECT_EQ(gpu.kind(), v1::SUMMARY_REPR_KEYS);
    EXPECT_EQ(gpu.layer(), layer);
    EXPECT_EQ(gpu.heads(), n_heads);
    EXPECT_EQ(gpu.dim(), head_dim);
    EXPECT_EQ(gpu.r(), r);
    ASSERT_EQ(gpu.values_size(), cpu.values_size());
    for (uint32_t h = 0; h < n_heads; ++h) {
      float scale = 0;
      for (uint32_t d = 0; d < head_dim; ++d) {
        scale = std::max(scale, std::fabs(cpu.values(h * head_dim + d)));
      }
      for (uint32_t d = 0; d < head_dim; ++d) {
        const int i = static_cast<int>(h * head_dim + d);
        ASSERT_NEAR(gpu.values(i), cpu.values(i), 1e-6f * std::max(scale, 1.0f))
            << "head " << h << " dim " << d;
      }
    }
    ++cases;
  }
  std::printf("repr keys GPU vs CPU: %d random blocks, same tokens and summaries\n", cases);
}

TEST(ReprKeysDeviceTest, RefusesBadInput) {
  EVOKE_REQUIRE_CUDA_DEVICE();
  std::mt19937_64 rng(3);
  Block b = RandomBlock(rng, v1::DTYPE_F16, v1::ROPE_NEOX, 64, 2, 16, false);
  DeviceBuffer payload(b.payload, 0);
  DeviceBuffer attention(b.attention.data(), b.attention.size() * sizeof(float), 0);
  const float* att = static_cast<const float*>(attention.get());
  EXPECT_THAT(ReprKeysSummaryOnDevice(b.meta, payload.get(), b.payload.size(), 1, att, 0, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("r: 0")));
  EXPECT_THAT(ReprKeysSummaryOnDevice(b.meta, payload.get(), b.payload.size(), 7, att, 2, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layer")));
  EXPECT_THAT(ReprKeysSummaryOnDevice(b.meta, b.payload.data(), b.payload.size(), 1, att, 2, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device_payload")));
  EXPECT_THAT(ReprKeysSummaryOnDevice(b.meta, payload.get(), b.payload.size(), 1,
                                      b.attention.data(), 2, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device_attention")));
  b.attention[5] = std::nanf("");
  DeviceBuffer nan_attention(b.attention.data(), b.attention.size() * sizeof(float), 0);
  EXPECT_THAT(ReprKeysSummaryOnDevice(b.meta, payload.get(), b.payload.size(), 1,
                                      static_cast<const float*>(nan_attention.get()), 2, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("attention: not all finite")));
  EXPECT_THAT(ReprKeysSummary(b.meta, b.payload.data(), b.payload.size(), 1, b.attention, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("attention: not all finite")));
  // The device still works after the refusals.
  b.attention[5] = 1;
  DeviceBuffer good(b.attention.data(), b.attention.size() * sizeof(float), 0);
  EXPECT_OK(ReprKeysSummaryOnDevice(b.meta, payload.get(), b.payload.size(), 1,
                                    static_cast<const float*>(good.get()), 2, 0));
}

}  // namespace
}  // namespace evoke
