// Loads of several blocks: those from tier 2 read ahead, several at once
// (TierManagerOptions::disk_reads_in_flight), those in tier 1 copied ahead
// across the copy pool, all verified and delivered in order.
#include <algorithm>
#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/status_macros.h"
#include "storage/pinned_arena.h"
#include "storage/spill_record.pb.h"
#include "storage/tier2/spill_store.h"
#include "storage/tier_manager.h"
#include "testing/blocks.h"
#include "testing/engine.h"
#include "testing/forwarding_spill_store.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke {
namespace {

using ::evoke::testing::IdOf;
using ::evoke::testing::Payload;
using ::evoke::testing::OpenEngine;
using ::evoke::testing::SaveBlocks;
using ::evoke::testing::StatusIs;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr PinOwner kOwner = 1;

// A SpillStore wrapper that counts the reads in flight at once (each one
// lasts a few milliseconds, so that overlapping reads overlap surely) and
// flips a byte of the payloads of chosen blocks as they are read: a fake of
// the disk boundary, for this module's tests only.
class WatchedSpillStore : public evoke::testing::ForwardingSpillStore {
 public:
  using ForwardingSpillStore::ForwardingSpillStore;

  void Corrupt(const BlockId& id) {
    absl::MutexLock lock(&mu_);
    corrupt_.insert(id);
  }
  int max_in_flight() const { return max_in_flight_.load(); }
  int reads() const { return reads_.load(); }

  absl::Status Read(const BlockId& id,
                    const std::function<absl::Status(const storage::SpillRecord&,
                                                     absl::string_view)>& consume) override {
    const int now = ++in_flight_;
    int seen = max_in_flight_.load();
    while (now > seen && !max_in_flight_.compare_exchange_weak(seen, now)) {
    }
    ++reads_;
    absl::SleepFor(absl::Milliseconds(5));
    bool corrupt;
    {
      absl::MutexLock lock(&mu_);
      corrupt = corrupt_.contains(id);
    }
    const absl::Status s = ForwardingSpillStore::Read(
        id, [&](const storage::SpillRecord& r, absl::string_view payload) {
          if (!corrupt) return consume(r, payload);
          std::string bad(payload);
          bad[bad.size() / 2] ^= 0x40;
          return consume(r, bad);
        });
    --in_flight_;
    return s;
  }

 private:
  std::atomic<int> in_flight_{0};
  std::atomic<int> max_in_flight_{0};
  std::atomic<int> reads_{0};
  absl::Mutex mu_;
  absl::flat_hash_set<BlockId> corrupt_ ABSL_GUARDED_BY(mu_);
};

class TierLoadTest : public ::testing::TestWithParam<int> {
 protected:
  // 48 blocks of 64 KiB saved into a 1 MiB tier 1, then all written to
  // tier 2 and evicted: every Load reads from disk.
  void SetUp() override {
    TierManagerOptions options;
    options.spill_batch_bytes = 256 * kKiB;
    options.disk_reads_in_flight = GetParam();
    auto tm = OpenEngine(dir_.Join("db"), 1 * kMiB, options,
                         [this](std::unique_ptr<SpillStore> real) {
                           auto watched = std::make_unique<WatchedSpillStore>(std::move(real));
                           disk_ = watched.get();
                           return watched;
                         });
    ASSERT_OK(tm);
    tm_ = std::move(tm).value();
    ASSERT_OK(SaveBlocks(*tm_, "s", kBlocks, 0, /*durable=*/false, &metas_, &ids_));
    ASSERT_OK(tm_->Flush(/*evict=*/true));
  }

  absl::Status LoadAll(StringLoadSink* sink, std::vector<LoadedInfo>* infos) {
    std::vector<v1::BlockMeta> metas;
    return tm_->Load(ids_, evoke::testing::OpaqueFingerprint(), *sink, &metas, infos);
  }

  static constexpr uint64_t kBlocks = 48;
  evoke::testing::TempDir dir_;
  WatchedSpillStore* disk_ = nullptr;
  std::unique_ptr<TierManager> tm_;
  std::vector<v1::BlockMeta> metas_;
  std::vector<BlockId> ids_;
};

TEST_P(TierLoadTest, ServesEveryBlockInOrderWithTheReadsItMayKeepInFlight) {
  StringLoadSink sink;
  std::vector<LoadedInfo> infos;
  ASSERT_OK(LoadAll(&sink, &infos));
  for (uint64_t i = 0; i < kBlocks; ++i) {
    ASSERT_EQ(sink.payloads()[i], Payload(i, 64 * kKiB)) << i;
    EXPECT_EQ(infos[i].served_from, BlockLocation::kDisk) << i;
  }
  EXPECT_EQ(disk_->reads(), static_cast<int>(kBlocks));
  EXPECT_EQ(tm_->Stats().counters.hits_tier2, kBlocks);
  // Reads overlap up to the option, never past it.
  EXPECT_LE(disk_->max_in_flight(), GetParam());
  if (GetParam() > 1) {
    EXPECT_GE(disk_->max_in_flight(), 2);
  }
}

TEST_P(TierLoadTest, ACorruptCopyFailsItsItemAndEveryCorruptCopyReadIsDropped) {
  disk_->Corrupt(ids_[5]);
  disk_->Corrupt(ids_[40]);
  StringLoadSink sink;
  std::vector<LoadedInfo> infos;
  const absl::Status s = LoadAll(&sink, &infos);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss));
  const std::optional<ItemRef> item = ErrorItem(s);
  ASSERT_TRUE(item.has_value());
  EXPECT_EQ(item->index, 5u);
  // Block 5 is a breadcrumb now; so is block 40 when the Load read it
  // ahead (with reads in flight), though its turn never came.
  ASSERT_OK_AND_ASSIGN(BlockInfo five, tm_->Describe(ids_[5]));
  EXPECT_EQ(five.location, BlockLocation::kBreadcrumb);
  ASSERT_OK_AND_ASSIGN(BlockInfo forty, tm_->Describe(ids_[40]));
  EXPECT_EQ(forty.location,
            GetParam() > 1 ? BlockLocation::kBreadcrumb : BlockLocation::kDisk);
  // The others still load, each from its own copy.
  StringLoadSink one;
  std::vector<v1::BlockMeta> metas;
  ASSERT_OK(tm_->Load({&ids_[6], 1}, evoke::testing::OpaqueFingerprint(), one, &metas, &infos));
  EXPECT_EQ(one.payloads()[0], Payload(6, 64 * kKiB));
}

// Sixteen blocks of 64 KiB held in tier 1 (and, durable, in tier 2): one
// Load copies them into the sink several at once across the copy pool, and
// each copy is still checked: with every tier-1 byte flipped, each block is
// served from its disk copy instead, byte for byte.
TEST(TierOneLoadTest, ManyTier1BlocksAreCopiedAtOnceAndEachIsStillVerified) {
  evoke::testing::TempDir dir;
  TierManagerOptions options;
  options.copy_threads = 2;
  PinnedArena* tier1 = nullptr;
  auto tm = OpenEngine(dir.Join("db"), 8 * kMiB, options, nullptr, &tier1);
  ASSERT_OK(tm);
  std::vector<v1::BlockMeta> metas;
  std::vector<BlockId> ids;
  ASSERT_OK(SaveBlocks(**tm, "t1", 16, 100, /*durable=*/true, &metas, &ids));
  for (const BlockLocation want : {BlockLocation::kHost, BlockLocation::kDisk}) {
    StringLoadSink sink;
    std::vector<v1::BlockMeta> got_metas;
    std::vector<LoadedInfo> infos;
    ASSERT_OK((*tm)->Load(ids, evoke::testing::OpaqueFingerprint(), sink, &got_metas, &infos));
    for (uint64_t i = 0; i < 16; ++i) {
      ASSERT_EQ(sink.payloads()[i], Payload(100 + i, 64 * kKiB)) << i;
      EXPECT_EQ(infos[i].served_from, want) << i;
    }
    // Flip every byte of tier 1 for the second round.
    for (uint64_t b = 0; b < tier1->capacity_bytes(); ++b) tier1->base()[b] ^= 0x5a;
  }
  EXPECT_GE((*tm)->Stats().counters.checksum_failures, 16u);
}

INSTANTIATE_TEST_SUITE_P(ReadsInFlight, TierLoadTest, ::testing::Values(1, 4),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return absl::StrCat("InFlight", p.param);
                         });

}  // namespace
}  // namespace evoke
