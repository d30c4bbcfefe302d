#include "common/token_bucket.h"

#include "gtest/gtest.h"

namespace evoke {
namespace {

TEST(TokenBucketTest, UnlimitedNeverWaits) {
  const absl::Time t0 = absl::UnixEpoch();
  TokenBucket b(0, 0, t0);
  b.Take(1ull << 40, t0);
  EXPECT_EQ(b.Wait(t0), absl::ZeroDuration());
}

TEST(TokenBucketTest, BurstThenRate) {
  const absl::Time t0 = absl::UnixEpoch();
  TokenBucket b(/*rate=*/1000, /*burst=*/500, t0);
  EXPECT_EQ(b.Wait(t0), absl::ZeroDuration());  // Starts full.
  b.Take(500, t0);
  EXPECT_EQ(b.Wait(t0), absl::ZeroDuration());  // Empty, not in debt.
  b.Take(250, t0);
  EXPECT_EQ(b.Wait(t0), absl::Milliseconds(250));
  EXPECT_EQ(b.Wait(t0 + absl::Milliseconds(100)), absl::Milliseconds(150));
  EXPECT_EQ(b.Wait(t0 + absl::Milliseconds(250)), absl::ZeroDuration());
}

TEST(TokenBucketTest, IdleTimeRefillsOnlyUpToTheBurst) {
  const absl::Time t0 = absl::UnixEpoch();
  TokenBucket b(1000, 500, t0);
  b.Take(500, t0);
  // An hour idle buys 500 bytes, not 3.6 MB.
  const absl::Time later = t0 + absl::Hours(1);
  b.Take(1500, later);
  EXPECT_EQ(b.Wait(later), absl::Seconds(1));
}

TEST(TokenBucketTest, BatchLargerThanTheBurstGoesWholeAndIsPaidFor) {
  const absl::Time t0 = absl::UnixEpoch();
  TokenBucket b(1 << 20, 1 << 20, t0);
  b.Take(64 << 20, t0);  // One 64 MiB batch at 1 MiB/s.
  EXPECT_EQ(b.Wait(t0), absl::Seconds(63));
  // Over any stretch: at most rate x time + burst.
  uint64_t taken = 64 << 20;
  absl::Time now = t0;
  for (int i = 0; i < 100; ++i) {
    now += b.Wait(now);
    b.Take(4 << 20, now);
    taken += 4 << 20;
  }
  EXPECT_LE(static_cast<double>(taken),
            absl::ToDoubleSeconds(now - t0) * (1 << 20) + (1 << 20) + (4 << 20));
}

}  // namespace
}  // namespace evoke
