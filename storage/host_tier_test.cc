#include "storage/host_tier.h"

#include <atomic>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace evoke {
namespace {

constexpr uint64_t kKiB = 1024;

class HostTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PinnedArenaOptions options;
    options.capacity_bytes = 64 * kKiB;
    options.lock_memory = false;
    host_ = std::make_unique<HostTier>(PinnedArena::Create(options).value(),
                                       [this] { ++freed_; });
  }
  std::unique_ptr<HostTier> host_;
  std::atomic<int> freed_{0};
};

TEST_F(HostTierTest, ReservationFreesWhenDestroyed) {
  {
    std::optional<ArenaReservation> r = host_->Reserve(10 * kKiB);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->length(), 12 * kKiB);  // 3 granules of 4 KiB.
    EXPECT_EQ(host_->used_bytes(), 12 * kKiB);
    EXPECT_EQ(host_->pending_bytes(), 12 * kKiB);
    r->data()[0] = 1;  // Addressable.
  }
  EXPECT_EQ(host_->used_bytes(), 0u);
  EXPECT_EQ(host_->pending_bytes(), 0u);
  EXPECT_EQ(freed_.load(), 1);
}

TEST_F(HostTierTest, CommitMovesBytesFromPendingToResident) {
  std::optional<ArenaReservation> r = host_->Reserve(4 * kKiB);
  ASSERT_TRUE(r.has_value());
  r->Commit();
  r->Commit();  // Idempotent.
  EXPECT_TRUE(r->committed());
  EXPECT_EQ(host_->pending_bytes(), 0u);
  EXPECT_EQ(host_->used_bytes(), 4 * kKiB);
  r->Release();
  EXPECT_FALSE(static_cast<bool>(*r));
  EXPECT_EQ(host_->used_bytes(), 0u);
  EXPECT_EQ(host_->pending_bytes(), 0u);  // Not subtracted twice.
  r->Release();                           // No-op.
  EXPECT_EQ(freed_.load(), 1);
}

TEST_F(HostTierTest, MoveTransfersOwnership) {
  ArenaReservation a = std::move(host_->Reserve(4 * kKiB).value());
  ArenaReservation b = std::move(a);
  EXPECT_FALSE(static_cast<bool>(a));
  EXPECT_TRUE(static_cast<bool>(b));
  ArenaReservation c = std::move(host_->Reserve(4 * kKiB).value());
  c = std::move(b);  // Frees what `c` held.
  EXPECT_EQ(host_->used_bytes(), 4 * kKiB);
  EXPECT_EQ(freed_.load(), 1);
}

TEST_F(HostTierTest, ReserveAllIsContiguousOrNothing) {
  std::vector<ArenaReservation> got;
  const uint64_t sizes[] = {4 * kKiB, 8 * kKiB, 4 * kKiB};
  ASSERT_TRUE(host_->ReserveAll(sizes, &got));
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[1].extent().offset, got[0].extent().offset + got[0].length());
  EXPECT_EQ(got[2].extent().offset, got[1].extent().offset + got[1].length());
  EXPECT_EQ(host_->pending_bytes(), 16 * kKiB);
  // 48 KiB free: a batch of 52 KiB reserves nothing.
  std::vector<ArenaReservation> none;
  const uint64_t too_many[] = {40 * kKiB, 12 * kKiB};
  EXPECT_FALSE(host_->ReserveAll(too_many, &none));
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(host_->used_bytes(), 16 * kKiB);
  got.clear();
  EXPECT_EQ(host_->used_bytes(), 0u);
  EXPECT_EQ(host_->pending_bytes(), 0u);
}

TEST_F(HostTierTest, ReserveBelowRespectsTheLimit) {
  std::optional<ArenaReservation> a = host_->Reserve(32 * kKiB);
  ASSERT_TRUE(a.has_value());
  EXPECT_FALSE(host_->ReserveBelow(16 * kKiB, 40 * kKiB).has_value());
  EXPECT_TRUE(host_->ReserveBelow(8 * kKiB, 40 * kKiB).has_value());
  EXPECT_FALSE(host_->Reserve(64 * kKiB).has_value());
}

}  // namespace
}  // namespace evoke
