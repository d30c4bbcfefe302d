#include "policy/attention_stats.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke::policy {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr BlockHandle kA = 7, kB = 9;
constexpr BlockHandle kNone = AttentionStats::kNoBlock;
constexpr int32_t kAll = CacheView::kAll;

TEST(AttentionStatsTest, CumulativePerLayerHeadAndSummed) {
  AttentionStats stats({.n_layers = 2, .n_heads = 2, .window = 4, .pool_kernel = 1});
  const std::vector<BlockHandle> of = {kA, kA, kB, kNone};
  ASSERT_OK(stats.Observe(0, 0, of, {}, std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f}));
  ASSERT_OK(stats.Observe(1, 1, of, {}, std::vector<float>{0.5f, 0.0f, 0.25f, 0.25f}));
  stats.EndStep();
  ASSERT_OK(stats.Observe(0, 0, of, {}, std::vector<float>{1.0f, 0.0f, 0.0f, 0.0f}));
  EXPECT_NEAR(stats.Cumulative(kA, 0, 0), 1.3, 1e-6);
  EXPECT_NEAR(stats.Cumulative(kA, 1, 1), 0.5, 1e-6);
  EXPECT_NEAR(stats.Cumulative(kA, 0, 1), 0.0, 1e-9);
  EXPECT_NEAR(stats.Cumulative(kA, kAll, 0), 1.3, 1e-6);
  EXPECT_NEAR(stats.Cumulative(kA, 1, kAll), 0.5, 1e-6);
  EXPECT_NEAR(stats.Cumulative(kA, kAll, kAll), 1.8, 1e-6);
  EXPECT_NEAR(stats.Cumulative(kB, kAll, kAll), 0.55, 1e-6);
  EXPECT_EQ(stats.Cumulative(12345, kAll, kAll), 0.0);
  EXPECT_EQ(stats.Cumulative(kA, 5, 0), 0.0);  // Out of range: nothing.
  EXPECT_EQ(stats.steps(), 1u);
}

TEST(AttentionStatsTest, RejectsBadRows) {
  AttentionStats stats({.n_layers = 2, .n_heads = 2});
  const std::vector<BlockHandle> of = {kA, kA};
  const std::vector<float> w = {0.5f, 0.5f};
  EXPECT_THAT(stats.Observe(2, 0, of, {}, w),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layer")));
  EXPECT_THAT(stats.Observe(0, 2, of, {}, w),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("head")));
  EXPECT_THAT(stats.Observe(0, 0, std::vector<BlockHandle>{kA}, {}, w),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_of_token")));
  EXPECT_THAT(stats.Observe(0, 0, of, std::vector<uint32_t>{0}, w),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token_in_block")));
  // A token index no block can have (it would size the per-token table).
  EXPECT_THAT(stats.Observe(0, 0, of, std::vector<uint32_t>{0, 0xFFFFFFF0u}, w),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token_in_block[1]")));
  EXPECT_EQ(stats.Cumulative(kA, kAll, kAll), 0.0);
}

TEST(AttentionStatsTest, WindowSlidesOverSteps) {
  AttentionStats stats({.window = 2, .pool_kernel = 1});
  const std::vector<BlockHandle> of = {kA};
  ASSERT_OK(stats.Observe(0, 0, of, {}, std::vector<float>{1.0f}));
  EXPECT_NEAR(stats.Window(kA, kAll, kAll), 1.0, 1e-6);  // The step in progress counts.
  stats.EndStep();
  ASSERT_OK(stats.Observe(0, 0, of, {}, std::vector<float>{2.0f}));
  EXPECT_NEAR(stats.Window(kA, 0, 0), 3.0, 1e-6);
  stats.EndStep();
  EXPECT_NEAR(stats.Window(kA, 0, 0), 2.0, 1e-6);  // Step 0 left.
  EXPECT_NEAR(stats.Window(kA, kAll, kAll), 2.0, 1e-6);
  stats.EndStep();
  EXPECT_EQ(stats.Window(kA, 0, 0), 0.0);  // Exactly: nothing is left.
  EXPECT_EQ(stats.Window(kA, kAll, kAll), 0.0);
  EXPECT_NEAR(stats.Cumulative(kA, 0, 0), 3.0, 1e-6);  // H2O remembers.
  stats.EndStep();
  ASSERT_OK(stats.Observe(0, 0, of, {}, std::vector<float>{4.0f}));
  EXPECT_NEAR(stats.Window(kA, 0, 0), 4.0, 1e-6);
}

TEST(AttentionStatsTest, LongRunsStayExact) {
  AttentionStats stats({.window = 3, .pool_kernel = 1});
  const std::vector<BlockHandle> of = {kA};
  for (int step = 0; step < 1000; ++step) {
    ASSERT_OK(stats.Observe(0, 0, of, {}, std::vector<float>{0.1f * (step % 7)}));
    stats.EndStep();
  }
  // Steps 998 and 999 are in the window (1000, in progress, has nothing):
  // 998 % 7 = 4, 999 % 7 = 5.
  EXPECT_NEAR(stats.Window(kA, 0, 0), 0.9, 1e-5);
  EXPECT_NEAR(stats.Cumulative(kA, 0, 0), 0.1 * (142 * 21 + (0 + 1 + 2 + 3 + 4 + 5)), 1e-3);
}

TEST(AttentionStatsTest, PoolingSpreadsAPeakToNeighbourTokensThenBlocks) {
  AttentionStats stats({.window = 4, .pool_kernel = 3});
  // Tokens 0..2 are block A, 3..5 block B; the peak is A's last token.
  const std::vector<BlockHandle> of = {kA, kA, kA, kB, kB, kB};
  ASSERT_OK(stats.Observe(0, 0, of, {}, std::vector<float>{0, 0, 1, 0, 0, 0}));
  // Pooled row: 0, 1, 1, 1, 0, 0.
  EXPECT_NEAR(stats.Window(kA, 0, 0), 2.0, 1e-6);
  EXPECT_NEAR(stats.Window(kB, 0, 0), 1.0, 1e-6);  // B gains from A's peak.
  // Cumulative is not pooled.
  EXPECT_NEAR(stats.Cumulative(kA, 0, 0), 1.0, 1e-6);
  EXPECT_EQ(stats.Cumulative(kB, 0, 0), 0.0);
  // Kernel 5 reaches two tokens each side.
  AttentionStats wide({.window = 4, .pool_kernel = 5});
  ASSERT_OK(wide.Observe(0, 0, of, {}, std::vector<float>{0, 0, 1, 0, 0, 0}));
  EXPECT_NEAR(wide.Window(kA, 0, 0), 3.0, 1e-6);
  EXPECT_NEAR(wide.Window(kB, 0, 0), 2.0, 1e-6);
}

TEST(AttentionStatsTest, PoolingMatchesADirectScan) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (uint32_t kernel : {3u, 5u, 7u}) {
    for (size_t n : {1u, 2u, 3u, 6u, 7u, 8u, 50u, 101u}) {
      std::vector<float> w(n);
      for (float& x : w) x = u(rng);
      // Each token its own block: Window(i) is pooled token i.
      std::vector<BlockHandle> of(n);
      for (size_t i = 0; i < n; ++i) of[i] = i;
      AttentionStats stats({.window = 2, .pool_kernel = kernel});
      ASSERT_OK(stats.Observe(0, 0, of, {}, w));
      const size_t r = kernel / 2;
      for (size_t i = 0; i < n; ++i) {
        float m = 0;
        for (size_t j = (i >= r ? i - r : 0); j <= std::min(n - 1, i + r); ++j) m = std::max(m, w[j]);
        EXPECT_FLOAT_EQ(static_cast<float>(stats.Window(i, 0, 0)), m)
            << "kernel " << kernel << " n " << n << " i " << i;
      }
    }
  }
}

TEST(AttentionStatsTest, TokenMassOfTheTokenLayerPerHead) {
  AttentionStats stats({.n_layers = 2, .n_heads = 2, .pool_kernel = 1, .token_layer = 1});
  const std::vector<BlockHandle> of = {kA, kA, kA, kNone};
  const std::vector<uint32_t> in = {0, 1, 2, 0};
  ASSERT_OK(stats.Observe(1, 0, of, in, std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f}));
  ASSERT_OK(stats.Observe(1, 1, of, in, std::vector<float>{0.5f, 0.0f, 0.25f, 0.25f}));
  ASSERT_OK(stats.Observe(0, 0, of, in, std::vector<float>{9, 9, 9, 9}));  // Other layer.
  stats.EndStep();
  ASSERT_OK(stats.Observe(1, 0, of, in, std::vector<float>{0.1f, 0.0f, 0.0f, 0.0f}));
  const absl::Span<const float> mass = stats.TokenMass(kA);
  ASSERT_EQ(mass.size(), 6u);  // 3 tokens x 2 heads.
  EXPECT_NEAR(mass[0], 0.2f, 1e-6);   // token 0 head 0.
  EXPECT_NEAR(mass[1], 0.5f, 1e-6);   // token 0 head 1.
  EXPECT_NEAR(mass[2], 0.2f, 1e-6);
  EXPECT_NEAR(mass[3], 0.0f, 1e-6);
  EXPECT_NEAR(mass[4], 0.3f, 1e-6);
  EXPECT_NEAR(mass[5], 0.25f, 1e-6);
  EXPECT_THAT(stats.TokenMass(kB), IsEmpty());
}

TEST(AttentionStatsTest, ForgetStartsABlockAfresh) {
  AttentionStats stats({.window = 4, .pool_kernel = 1});
  const std::vector<BlockHandle> of = {kA, kB};
  const std::vector<uint32_t> in = {0, 0};
  ASSERT_OK(stats.Observe(0, 0, of, in, std::vector<float>{0.6f, 0.4f}));
  stats.EndStep();
  stats.Forget(kA);
  EXPECT_EQ(stats.Cumulative(kA, kAll, kAll), 0.0);
  EXPECT_EQ(stats.Window(kA, kAll, kAll), 0.0);
  EXPECT_THAT(stats.TokenMass(kA), IsEmpty());
  EXPECT_NEAR(stats.Cumulative(kB, kAll, kAll), 0.4, 1e-6);
  ASSERT_OK(stats.Observe(0, 0, of, in, std::vector<float>{0.3f, 0.7f}));
  EXPECT_NEAR(stats.Cumulative(kA, kAll, kAll), 0.3, 1e-6);
  EXPECT_NEAR(stats.Window(kA, kAll, kAll), 0.3, 1e-6);
  EXPECT_THAT(stats.TokenMass(kA), ElementsAre(::testing::FloatNear(0.3f, 1e-6)));
}

TEST(AttentionStatsTest, OptionsAreMadeUsable) {
  AttentionStats stats({.n_layers = 0, .n_heads = 0, .window = 0, .pool_kernel = 4});
  EXPECT_EQ(stats.options().n_layers, 1u);
  EXPECT_EQ(stats.options().n_heads, 1u);
  EXPECT_EQ(stats.options().window, 1u);
  EXPECT_EQ(stats.options().pool_kernel, 5u);
}

}  // namespace
}  // namespace evoke::policy
