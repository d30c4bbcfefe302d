#include "common/adaptive_spin.h"

#include "gtest/gtest.h"

namespace evoke {
namespace {

using absl::Microseconds;

TEST(AdaptiveSpinTest, StartsAtTheBaseWindow) {
  AdaptiveSpin spin(Microseconds(50), Microseconds(1000));
  EXPECT_EQ(spin.window(), Microseconds(50));
}

TEST(AdaptiveSpinTest, FollowsAPeerThatAnswersSoon) {
  AdaptiveSpin spin(Microseconds(50), Microseconds(1000));
  // A client that submits every 250 us: the window grows to cover the gap.
  for (int i = 0; i < 64; ++i) spin.Record(Microseconds(250));
  EXPECT_GE(spin.window(), Microseconds(490));
  EXPECT_LE(spin.window(), Microseconds(510));
  // Waits shorter than half the base keep the base window.
  for (int i = 0; i < 64; ++i) spin.Record(Microseconds(5));
  EXPECT_EQ(spin.window(), Microseconds(50));
}

TEST(AdaptiveSpinTest, FallsBackToTheBaseForASlowPeer) {
  AdaptiveSpin spin(Microseconds(50), Microseconds(1000));
  for (int i = 0; i < 64; ++i) spin.Record(Microseconds(200));
  ASSERT_GT(spin.window(), Microseconds(300));
  // Gaps over half the max (and idle periods, counted as the max): polling
  // would burn a core and still miss, so the window drops to the base.
  for (int i = 0; i < 64; ++i) spin.Record(absl::Seconds(2));
  EXPECT_EQ(spin.window(), Microseconds(50));
  for (int i = 0; i < 64; ++i) spin.Record(Microseconds(600));
  EXPECT_EQ(spin.window(), Microseconds(50));
}

TEST(AdaptiveSpinTest, AMaxAtTheBaseFixesTheWindow) {
  AdaptiveSpin spin(Microseconds(50), Microseconds(0));
  for (int i = 0; i < 64; ++i) spin.Record(Microseconds(20));
  EXPECT_EQ(spin.window(), Microseconds(50));
}

}  // namespace
}  // namespace evoke
