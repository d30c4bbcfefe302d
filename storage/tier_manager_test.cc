#include "storage/tier_manager.h"

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/chain_hash.h"
#include "common/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/spill_record.pb.h"
#include "storage/tier2/spill_store.h"
#include "testing/blocks.h"
#include "testing/forwarding_spill_store.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * 1024;

v1::LayoutFingerprint Fingerprint() { return evoke::testing::OpaqueFingerprint(); }

// Block `seq` of `session`: 16 tokens over layer 0.
v1::BlockMeta SessionMeta(const std::string& session, uint64_t seq) {
  return evoke::testing::SessionMeta(Fingerprint(), session, seq, /*n_tokens=*/16,
                                     /*layer_begin=*/0, /*layer_end=*/1,
                                     /*first_position=*/0);
}

using evoke::testing::IdOf;
using evoke::testing::Payload;

constexpr PinOwner kOwner = 1;

// NamesItem: `s` is about item `index` of the batch, and that part of it.
bool NamesItem(const absl::Status& s, size_t index, ItemPart part) {
  const std::optional<ItemRef> item = ErrorItem(s);
  return item.has_value() && item->index == index && item->part == part;
}

// A SpillStore wrapper whose writes can be made to fail (a fake of the disk
// boundary, for this module's tests only).
class FlakySpillStore : public evoke::testing::ForwardingSpillStore {
 public:
  using ForwardingSpillStore::ForwardingSpillStore;
  std::atomic<bool> fail_writes{false};

  absl::Status Put(absl::Span<const SpillWrite> writes, bool sync) override {
    if (fail_writes) return absl::ResourceExhaustedError("injected: disk full");
    return ForwardingSpillStore::Put(writes, sync);
  }
  absl::Status DropPayloads(absl::Span<const SpillWrite> b) override {
    if (fail_writes) return absl::ResourceExhaustedError("injected: disk full");
    return ForwardingSpillStore::DropPayloads(b);
  }
};

class TierManagerTest : public ::testing::Test {
 protected:
  void Open(uint64_t pinned_bytes, uint64_t spill_bytes = 1ull << 30,
            absl::Duration wait = absl::Seconds(10)) {
    tm_.reset();
    PinnedArenaOptions arena_options;
    arena_options.capacity_bytes = pinned_bytes;
    arena_options.lock_memory = false;
    auto arena = PinnedArena::Create(arena_options);
    ASSERT_OK(arena);
    arena_ = arena->get();
    SpillStoreOptions spill_options;
    spill_options.path = dir_.Join("db");
    auto spill = SpillStore::Open(spill_options);
    ASSERT_OK(spill);
    auto flaky = std::make_unique<FlakySpillStore>(std::move(spill).value());
    flaky_ = flaky.get();
    TierManagerOptions options;
    options.spill_bytes = spill_bytes;
    options.max_wait_for_room = wait;
    options.spill_batch_bytes = 256 * kKiB;
    if (configure_) configure_(options);
    auto tm = TierManager::Open(options, std::move(arena).value(), std::move(flaky));
    ASSERT_OK(tm);
    tm_ = std::move(tm).value();
  }

  absl::StatusOr<std::vector<SavedBlock>> Save(const v1::BlockMeta& meta,
                                                 const std::string& payload,
                                                 bool pin = false,
                                                 bool durable = false) {
    const SaveItem item{&meta, payload.size(), pin};
    HostSaveSource source({payload});
    return tm_->Save({&item, 1}, source, durable, absl::InfiniteFuture(), kOwner);
  }

  absl::StatusOr<std::string> Load(const BlockId& id,
                                   BlockLocation* from = nullptr,
                                   const v1::LayoutFingerprint& fp = Fingerprint()) {
    StringLoadSink sink;
    std::vector<v1::BlockMeta> metas;
    std::vector<LoadedInfo> infos;
    absl::Status s = tm_->Load({&id, 1}, fp, sink, &metas, &infos);
    if (!s.ok()) return s;
    if (from != nullptr) *from = infos[0].served_from;
    return sink.payloads()[0];
  }

  TierStats Stat() { return tm_->Stats(); }

  // Applied to the options by Open, when set.
  std::function<void(TierManagerOptions&)> configure_;
  evoke::testing::TempDir dir_;
  PinnedArena* arena_ = nullptr;
  FlakySpillStore* flaky_ = nullptr;
  std::unique_ptr<TierManager> tm_;
};

TEST_F(TierManagerTest, SaveLoadRoundTrip) {
  Open(4 * kMiB);
  const v1::BlockMeta meta = SessionMeta("s", 0);
  const std::string payload = Payload(1, 100 * kKiB);
  ASSERT_OK_AND_ASSIGN(auto results, Save(meta, payload));
  ASSERT_EQ(results.size(), 1u);
  EXPECT_FALSE(results[0].deduplicated);
  EXPECT_EQ(results[0].checksum, PayloadChecksum(payload.data(), payload.size()));
  EXPECT_EQ(results[0].location, BlockLocation::kHost);
  BlockLocation from;
  ASSERT_OK_AND_ASSIGN(std::string got, Load(IdOf(meta), &from));
  EXPECT_EQ(got, payload);
  EXPECT_EQ(from, BlockLocation::kHost);

  ASSERT_OK_AND_ASSIGN(BlockInfo info, tm_->Describe(IdOf(meta)));
  EXPECT_EQ(info.meta.payload_bytes(), payload.size());
  EXPECT_EQ(info.meta.checksum(), results[0].checksum);
  EXPECT_GT(info.meta.created_unix_ms(), 0);
  EXPECT_EQ(info.location, BlockLocation::kHost);
  EXPECT_FALSE(info.on_disk);

  const TierStats st = Stat();
  EXPECT_EQ(st.host.blocks, 1u);
  EXPECT_EQ(st.host.payload_bytes, payload.size());
  EXPECT_EQ(st.counters.saves, 1u);
  EXPECT_EQ(st.counters.hits_tier1, 1u);
}

TEST_F(TierManagerTest, DedupAndConflicts) {
  Open(4 * kMiB);
  const v1::BlockMeta meta = SessionMeta("s", 0);
  ASSERT_OK(Save(meta, Payload(1, 8 * kKiB)));
  ASSERT_OK_AND_ASSIGN(auto again, Save(meta, Payload(1, 8 * kKiB)));
  EXPECT_TRUE(again[0].deduplicated);
  EXPECT_THAT(Save(meta, Payload(2, 8 * kKiB)),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("Delete it first")));

  // A prefix block keeps its first copy.
  v1::BlockMeta prefix = SessionMeta("s", 0);
  prefix.set_kind(v1::BLOCK_KIND_PREFIX);
  prefix.set_id(BlockId(77, 77).ToBytes());
  ASSERT_OK(Save(prefix, Payload(3, 8 * kKiB)));
  ASSERT_OK_AND_ASSIGN(auto second, Save(prefix, Payload(4, 8 * kKiB)));
  EXPECT_TRUE(second[0].deduplicated);
  ASSERT_OK_AND_ASSIGN(std::string got, Load(BlockId(77, 77)));
  EXPECT_EQ(got, Payload(3, 8 * kKiB));
  EXPECT_EQ(Stat().counters.dedups, 2u);
}

TEST_F(TierManagerTest, ChecksumMismatchRejectsWholeBatch) {
  Open(4 * kMiB);
  v1::BlockMeta good = SessionMeta("s", 0);
  v1::BlockMeta bad = SessionMeta("s", 1);
  bad.set_checksum(12345);
  const std::string p0 = Payload(1, 8 * kKiB), p1 = Payload(2, 8 * kKiB);
  const SaveItem items[] = {{&good, p0.size(), false}, {&bad, p1.size(), false}};
  HostSaveSource source({p0, p1});
  const absl::Status mismatch =
      tm_->Save(items, source, false, absl::InfiniteFuture()).status();
  EXPECT_THAT(mismatch, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("does not match")));
  EXPECT_TRUE(NamesItem(mismatch, 1, ItemPart::kChecksum));
  EXPECT_THAT(Load(IdOf(good)), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(Stat().host.used_bytes, 0u);
  // A correct client checksum is accepted.
  bad.set_checksum(PayloadChecksum(p1.data(), p1.size()));
  EXPECT_OK(Save(bad, p1));
}

TEST_F(TierManagerTest, FingerprintMismatchIsRefused) {
  Open(4 * kMiB);
  const v1::BlockMeta meta = SessionMeta("s", 0);
  ASSERT_OK(Save(meta, Payload(1, 4 * kKiB)));
  v1::LayoutFingerprint other = Fingerprint();
  other.set_model_revision("r2");
  EXPECT_THAT(Load(IdOf(meta), nullptr, other),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("model_revision: stored \"\", requested \"r2\"")));
}

TEST_F(TierManagerTest, SpillsPastHighWatermarkAndLoadsBack) {
  Open(1 * kMiB);
  std::vector<v1::BlockMeta> metas;
  for (int i = 0; i < 48; ++i) {
    metas.push_back(SessionMeta("s", i));
    ASSERT_OK(Save(metas.back(), Payload(i, 64 * kKiB))) << i;
    const TierStats st = Stat();
    ASSERT_LE(st.host.used_bytes, st.host.capacity_bytes);
  }
  ASSERT_TRUE(tm_->WaitForSpillerIdle(absl::Seconds(10)));
  TierStats st = Stat();
  EXPECT_GT(st.counters.spills, 0u);
  EXPECT_GT(st.disk.blocks, 0u);
  EXPECT_LE(st.host.used_bytes, st.host.capacity_bytes * 95 / 100);
  EXPECT_EQ(st.host.blocks + st.disk.blocks -
                /*clean copies counted twice*/ 0,
            st.host.blocks + st.disk.blocks);
  // The oldest block went to disk first (LRU).
  ASSERT_OK_AND_ASSIGN(BlockInfo oldest, tm_->Describe(IdOf(metas[0])));
  EXPECT_EQ(oldest.location, BlockLocation::kDisk);
  ASSERT_OK_AND_ASSIGN(BlockInfo newest, tm_->Describe(IdOf(metas.back())));
  EXPECT_EQ(newest.location, BlockLocation::kHost);

  for (int i = 0; i < 48; ++i) {
    ASSERT_OK_AND_ASSIGN(std::string got, Load(IdOf(metas[i])));
    ASSERT_EQ(got, Payload(i, 64 * kKiB)) << i;
  }
  st = Stat();
  EXPECT_GT(st.counters.hits_tier2, 0u);
  EXPECT_GT(st.counters.promotions, 0u);
  EXPECT_LE(st.host.used_bytes, st.host.capacity_bytes);
}

TEST_F(TierManagerTest, PinnedBlocksNeverSpill) {
  Open(1 * kMiB);
  std::vector<v1::BlockMeta> pinned;
  for (int i = 0; i < 4; ++i) {
    pinned.push_back(SessionMeta("p", i));
    ASSERT_OK(Save(pinned.back(), Payload(100 + i, 64 * kKiB), /*pin=*/true));
  }
  for (int i = 0; i < 40; ++i) ASSERT_OK(Save(SessionMeta("s", i), Payload(i, 64 * kKiB)));
  ASSERT_TRUE(tm_->WaitForSpillerIdle(absl::Seconds(10)));
  for (const auto& m : pinned) {
    ASSERT_OK_AND_ASSIGN(BlockInfo info, tm_->Describe(IdOf(m)));
    EXPECT_EQ(info.location, BlockLocation::kHost);
    EXPECT_EQ(info.pin_count, 1u);
  }
  EXPECT_EQ(Stat().pinned_blocks, 4u);
  const BlockId id = IdOf(pinned[0]);
  EXPECT_THAT(tm_->Unpin({&id, 1}, /*owner=*/2),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not pinned")));
  ASSERT_OK(tm_->Unpin({&id, 1}, kOwner));
  EXPECT_THAT(tm_->Unpin({&id, 1}, kOwner),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not pinned")));
  // Releasing an owner drops all of its pins at once.
  EXPECT_EQ(tm_->ReleaseOwner(kOwner), 3u);
  EXPECT_EQ(Stat().pinned_blocks, 0u);
  EXPECT_EQ(tm_->ReleaseOwner(kOwner), 0u);
}

TEST_F(TierManagerTest, FullOfPinnedBlocksIsResourceExhausted) {
  Open(1 * kMiB);
  for (int i = 0; i < 16; ++i) {
    ASSERT_OK(Save(SessionMeta("p", i), Payload(i, 64 * kKiB), /*pin=*/true));
  }
  const absl::Time start = absl::Now();
  EXPECT_THAT(Save(SessionMeta("s", 0), Payload(0, 64 * kKiB)),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("pinned")));
  // It failed at once rather than waiting for a spill that cannot happen.
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(TierManagerTest, BlockLargerThanTier1IsResourceExhausted) {
  Open(1 * kMiB);
  EXPECT_THAT(Save(SessionMeta("s", 0), Payload(0, 2 * kMiB)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("larger than tier 1")));
}

TEST_F(TierManagerTest, PinPromotesSpilledBlock) {
  Open(1 * kMiB);
  const v1::BlockMeta meta = SessionMeta("s", 0);
  ASSERT_OK(Save(meta, Payload(0, 64 * kKiB)));
  ASSERT_OK(tm_->Flush(/*evict=*/true));
  ASSERT_OK_AND_ASSIGN(BlockInfo before, tm_->Describe(IdOf(meta)));
  EXPECT_EQ(before.location, BlockLocation::kDisk);
  const BlockId id = IdOf(meta);
  ASSERT_OK(tm_->Pin({&id, 1}, kOwner, absl::InfiniteFuture()));
  ASSERT_OK_AND_ASSIGN(BlockInfo after, tm_->Describe(id));
  EXPECT_EQ(after.location, BlockLocation::kHost);
  EXPECT_TRUE(after.on_disk);
  EXPECT_EQ(after.pin_count, 1u);
}

TEST_F(TierManagerTest, BreadcrumbsPastSpillBudget) {
  Open(1 * kMiB, /*spill_bytes=*/256 * kKiB);
  std::vector<v1::BlockMeta> metas;
  for (int i = 0; i < 12; ++i) {
    metas.push_back(SessionMeta("s", i));
    ASSERT_OK(Save(metas.back(), Payload(i, 64 * kKiB)));
  }
  ASSERT_OK(tm_->Flush(/*evict=*/true));
  const TierStats st = Stat();
  EXPECT_LE(st.disk.payload_bytes, 256 * kKiB);
  EXPECT_GT(st.breadcrumb_blocks, 0u);
  EXPECT_EQ(st.counters.breadcrumbs, st.breadcrumb_blocks);
  ASSERT_OK_AND_ASSIGN(BlockInfo crumb, tm_->Describe(IdOf(metas[0])));
  EXPECT_EQ(crumb.location, BlockLocation::kBreadcrumb);
  EXPECT_FALSE(crumb.bytes_available);
  EXPECT_EQ(crumb.meta.session_id(), "s");
  EXPECT_THAT(Load(IdOf(metas[0])),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("breadcrumb")));
  // The newest blocks kept their bytes.
  ASSERT_OK_AND_ASSIGN(std::string got, Load(IdOf(metas.back())));
  EXPECT_EQ(got, Payload(11, 64 * kKiB));
  // Saving the same bytes again revives a breadcrumb.
  ASSERT_OK_AND_ASSIGN(auto revived, Save(metas[0], Payload(0, 64 * kKiB)));
  EXPECT_FALSE(revived[0].deduplicated);
  ASSERT_OK_AND_ASSIGN(got, Load(IdOf(metas[0])));
  EXPECT_EQ(got, Payload(0, 64 * kKiB));
  EXPECT_EQ(Stat().breadcrumb_blocks, st.breadcrumb_blocks - 1);
}

TEST_F(TierManagerTest, ShutdownThenReopenKeepsEverything) {
  Open(1 * kMiB);
  std::vector<v1::BlockMeta> metas;
  for (int i = 0; i < 24; ++i) {
    metas.push_back(SessionMeta("s", i));
    ASSERT_OK(Save(metas.back(), Payload(i, 64 * kKiB), /*pin=*/i == 23));
  }
  ASSERT_OK(tm_->Shutdown());
  EXPECT_THAT(Save(SessionMeta("s", 99), Payload(0, 4 * kKiB)),
              StatusIs(absl::StatusCode::kUnavailable));
  Open(1 * kMiB);
  const TierStats st = Stat();
  EXPECT_EQ(st.disk.blocks, 24u);
  EXPECT_EQ(st.host.blocks, 0u);
  for (int i = 0; i < 24; ++i) {
    BlockLocation from;
    ASSERT_OK_AND_ASSIGN(std::string got, Load(IdOf(metas[i]), &from));
    EXPECT_EQ(got, Payload(i, 64 * kKiB));
    EXPECT_EQ(from, BlockLocation::kDisk);
  }
}

TEST_F(TierManagerTest, CrashLosesOnlyTier1OnlyBlocks) {
  Open(1 * kMiB);
  const v1::BlockMeta durable = SessionMeta("s", 0);
  ASSERT_OK_AND_ASSIGN(auto r, Save(durable, Payload(0, 64 * kKiB), false, /*durable=*/true));
  ASSERT_OK_AND_ASSIGN(BlockInfo info, tm_->Describe(IdOf(durable)));
  EXPECT_TRUE(info.on_disk);
  const v1::BlockMeta volatile_block = SessionMeta("s", 1);
  ASSERT_OK(Save(volatile_block, Payload(1, 64 * kKiB)));
  // "Crash": drop the manager without Shutdown (no flush).
  Open(1 * kMiB);
  ASSERT_OK_AND_ASSIGN(std::string got, Load(IdOf(durable)));
  EXPECT_EQ(got, Payload(0, 64 * kKiB));
  EXPECT_THAT(Load(IdOf(volatile_block)), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(TierManagerTest, CorruptTier1CopyIsNeverServed) {
  Open(1 * kMiB);
  const v1::BlockMeta clean = SessionMeta("s", 0);
  const v1::BlockMeta dirty = SessionMeta("s", 1);
  ASSERT_OK(Save(clean, Payload(0, 64 * kKiB), false, /*durable=*/true));
  ASSERT_OK(Save(dirty, Payload(1, 64 * kKiB)));
  // Flip every byte of tier 1.
  for (uint64_t i = 0; i < arena_->capacity_bytes(); ++i) arena_->base()[i] ^= 0x5a;
  ASSERT_OK_AND_ASSIGN(VerifyReport report, tm_->Verify({}));
  EXPECT_EQ(report.blocks_checked, 2u);
  EXPECT_EQ(report.corrupt.size(), 2u);
  EXPECT_EQ(report.copies_ok, 1u);  // The disk copy of `clean`.
  // The block with a disk copy is still served, from disk.
  BlockLocation from;
  ASSERT_OK_AND_ASSIGN(std::string got, Load(IdOf(clean), &from));
  EXPECT_EQ(got, Payload(0, 64 * kKiB));
  EXPECT_EQ(from, BlockLocation::kDisk);
  // The other one has no good copy left: it is a breadcrumb.
  EXPECT_THAT(Load(IdOf(dirty)), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_GE(Stat().counters.checksum_failures, 2u);
}

// A sink that takes every block through Deliver (as the device paths do),
// keeping copies.
class DeliverSink final : public LoadSink {
 public:
  absl::Status Prepare(absl::Span<const v1::BlockMeta> metas) override {
    got.resize(metas.size());
    return absl::OkStatus();
  }
  uint8_t* HostDestination(size_t) override { return nullptr; }
  absl::Status Deliver(size_t i, const uint8_t* bytes, uint64_t n, uint64_t) override {
    got[i].assign(reinterpret_cast<const char*>(bytes), n);
    return absl::OkStatus();
  }
  std::vector<std::string> got;
};

TEST_F(TierManagerTest, DeliverPathServesTheDiskCopyWhenTier1IsCorrupt) {
  Open(1 * kMiB);
  const v1::BlockMeta meta = SessionMeta("s", 0);
  ASSERT_OK(Save(meta, Payload(0, 64 * kKiB), false, /*durable=*/true));  // Clean.
  for (uint64_t i = 0; i < arena_->capacity_bytes(); i += 4096) arena_->base()[i] ^= 1;
  const BlockId id = IdOf(meta);
  DeliverSink sink;
  std::vector<v1::BlockMeta> metas;
  std::vector<LoadedInfo> infos;
  ASSERT_OK(tm_->Load({&id, 1}, Fingerprint(), sink, &metas, &infos));
  EXPECT_EQ(sink.got[0], Payload(0, 64 * kKiB));
  EXPECT_EQ(infos[0].served_from, BlockLocation::kDisk);
  EXPECT_EQ(Stat().counters.checksum_failures, 1u);
  ASSERT_OK_AND_ASSIGN(BlockInfo info, tm_->Describe(id));
  EXPECT_EQ(info.location, BlockLocation::kDisk);  // The bad tier-1 copy is gone.
}

TEST_F(TierManagerTest, CorruptTier1CopyDetectedOnLoad) {
  Open(1 * kMiB);
  const v1::BlockMeta meta = SessionMeta("s", 1);
  ASSERT_OK(Save(meta, Payload(1, 64 * kKiB)));
  for (uint64_t i = 0; i < arena_->capacity_bytes(); i += 4096) arena_->base()[i] ^= 1;
  EXPECT_THAT(Load(IdOf(meta)), StatusIs(absl::StatusCode::kDataLoss,
                                         HasSubstr("failed its checksum")));
  EXPECT_EQ(Stat().counters.checksum_failures, 1u);
}

TEST_F(TierManagerTest, CorruptDiskCopyIsDataLoss) {
  Open(1 * kMiB);
  const v1::BlockMeta meta = SessionMeta("s", 0);
  ASSERT_OK(Save(meta, Payload(0, 256 * kKiB)));
  ASSERT_OK(tm_->Flush(/*evict=*/true));
  tm_.reset();
  // Flip bytes inside the payload in every segment file (its one record
  // starts after the 4 KiB file header: a 64-byte header, then the payload).
  int corrupted = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir_.Join("db/segments"))) {
    if (f.path().extension() != ".evs") continue;
    std::fstream file(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t payload = 4096 + 64;
    for (uint64_t off = payload + 1024; off < payload + 255 * kKiB; off += 1024) {
      file.seekp(off);
      file.put('\x7f');
    }
    ++corrupted;
  }
  ASSERT_GT(corrupted, 0);
  Open(1 * kMiB);
  EXPECT_THAT(Load(IdOf(meta)), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(Stat().counters.checksum_failures, 1u);
  // Quarantined: it is now a breadcrumb, and later loads miss.
  ASSERT_OK_AND_ASSIGN(BlockInfo info, tm_->Describe(IdOf(meta)));
  EXPECT_EQ(info.location, BlockLocation::kBreadcrumb);
  EXPECT_THAT(Load(IdOf(meta)), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(TierManagerTest, DeleteDropSessionLookupList) {
  Open(4 * kMiB);
  for (int i = 0; i < 5; ++i) ASSERT_OK(Save(SessionMeta("a", i), Payload(i, 4 * kKiB)));
  for (int i = 0; i < 3; ++i) ASSERT_OK(Save(SessionMeta("b", i), Payload(i, 4 * kKiB)));

  std::vector<BlockId> chain = {IdOf(SessionMeta("a", 0)), IdOf(SessionMeta("a", 1)),
                                BlockId(1, 1), IdOf(SessionMeta("a", 2))};
  EXPECT_EQ(tm_->Lookup(chain).size(), 2u);

  const BlockId missing[] = {IdOf(SessionMeta("a", 0)), BlockId(5, 5)};
  const absl::Status not_deleted = tm_->Delete(missing);
  EXPECT_THAT(not_deleted, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_TRUE(NamesItem(not_deleted, 1, ItemPart::kId));
  EXPECT_OK(tm_->Describe(IdOf(SessionMeta("a", 0))));  // Nothing deleted.
  const BlockId one[] = {IdOf(SessionMeta("a", 0))};
  ASSERT_OK(tm_->Delete(one));
  EXPECT_THAT(tm_->Describe(one[0]), StatusIs(absl::StatusCode::kNotFound));

  ASSERT_OK_AND_ASSIGN(uint32_t dropped, tm_->DropSession("ns", "b"));
  EXPECT_EQ(dropped, 3u);
  ASSERT_OK_AND_ASSIGN(dropped, tm_->DropSession("ns", "b"));
  EXPECT_EQ(dropped, 0u);

  // Pagination: 4 blocks left, pages of 3.
  bool more = false;
  std::vector<BlockInfo> page = tm_->List({}, nullptr, 3, &more);
  ASSERT_EQ(page.size(), 3u);
  EXPECT_TRUE(more);
  const BlockId last = BlockId::FromBytes(page.back().meta.id()).value();
  std::vector<BlockInfo> rest = tm_->List({}, &last, 3, &more);
  EXPECT_EQ(rest.size(), 1u);
  EXPECT_FALSE(more);
  ListFilter filter;
  filter.session_id = "b";
  EXPECT_TRUE(tm_->List(filter, nullptr, 10, &more).empty());
  EXPECT_EQ(Stat().host.blocks, 4u);
  EXPECT_EQ(Stat().host.used_bytes, 4 * 4 * kKiB);
}

TEST_F(TierManagerTest, SpillFailureBackPressureAndRecovery) {
  Open(1 * kMiB, 1ull << 30, /*wait=*/absl::Milliseconds(500));
  flaky_->fail_writes = true;
  int saved = 0;
  absl::Status last;
  for (int i = 0; i < 32 && last.ok(); ++i) {
    auto r = Save(SessionMeta("s", i), Payload(i, 64 * kKiB));
    last = r.status();
    if (r.ok()) ++saved;
  }
  EXPECT_THAT(last, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_GT(Stat().counters.spill_errors, 0u);
  EXPECT_LE(Stat().host.used_bytes, Stat().host.capacity_bytes);
  // Reads keep working while the disk is failing.
  ASSERT_OK_AND_ASSIGN(std::string got, Load(IdOf(SessionMeta("s", 0))));
  EXPECT_EQ(got, Payload(0, 64 * kKiB));
  // Once the disk recovers, spilling resumes and saves succeed again.
  flaky_->fail_writes = false;
  ASSERT_OK(Save(SessionMeta("s", 100), Payload(100, 64 * kKiB)));
  for (int i = 0; i < saved; ++i) {
    ASSERT_OK_AND_ASSIGN(got, Load(IdOf(SessionMeta("s", i))));
    ASSERT_EQ(got, Payload(i, 64 * kKiB));
  }
}

TEST_F(TierManagerTest, ConcurrentClientsNeverExceedBudget) {
  Open(2 * kMiB);
  constexpr int kThreads = 8;
  constexpr int kBlocksPerThread = 40;
  std::atomic<int> errors{0};
  std::atomic<bool> done{false};
  std::atomic<uint64_t> max_used{0};
  std::thread watcher([&] {
    while (!done) {
      const TierStats st = tm_->Stats();
      uint64_t prev = max_used.load();
      while (st.host.used_bytes > prev &&
             !max_used.compare_exchange_weak(prev, st.host.used_bytes)) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      const std::string session = "t" + std::to_string(t);
      for (int i = 0; i < kBlocksPerThread; ++i) {
        const uint64_t size = (16 + rng() % 112) * kKiB;
        const v1::BlockMeta meta = SessionMeta(session, i);
        const std::string payload = Payload(t * 1000 + i, size);
        const SaveItem item{&meta, payload.size(), false};
        HostSaveSource source({payload});
        if (!tm_->Save({&item, 1}, source, false, absl::InfiniteFuture()).ok()) ++errors;
        const int j = rng() % (i + 1);
        const BlockId id = IdOf(SessionMeta(session, j));
        StringLoadSink sink;
        std::vector<v1::BlockMeta> metas;
        std::vector<LoadedInfo> infos;
        absl::Status s = tm_->Load({&id, 1}, Fingerprint(), sink, &metas, &infos);
        const std::string& out = s.ok() ? sink.payloads()[0] : std::string();
        if (!s.ok()) {
          ADD_FAILURE() << s;
          ++errors;
        } else if (out != Payload(t * 1000 + j, out.size())) {
          ADD_FAILURE() << "bytes differ for " << session << "/" << j;
          ++errors;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  watcher.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_LE(max_used.load(), 2 * kMiB);
  const TierStats st = Stat();
  EXPECT_EQ(st.counters.saves, uint64_t{kThreads * kBlocksPerThread});
  EXPECT_GT(st.counters.spills, 0u);
}

// Dedup compares namespaces as well as ids: a block whose id collides with
// another namespace's block (ids hash the namespace in, so this takes a
// 128-bit collision, forced here) is refused, and neither the stored bytes
// nor a breadcrumb of the other namespace change.
TEST_F(TierManagerTest, AnIdCollisionAcrossNamespacesNeverDeduplicates) {
  Open(4 * kMiB);
  const v1::BlockMeta a = evoke::testing::SessionMeta(evoke::testing::OpaqueFingerprint("a"),
                                                      "s", 0, 16, 0, 1, 0);
  v1::BlockMeta b = evoke::testing::SessionMeta(evoke::testing::OpaqueFingerprint("b"), "s", 0,
                                                16, 0, 1, 0);
  b.set_id(a.id());  // The forced collision.
  const std::string bytes_a = Payload(1, 8 * kKiB);
  ASSERT_OK(Save(a, bytes_a).status());
  for (const std::string& bytes : {bytes_a, Payload(2, 8 * kKiB)}) {
    EXPECT_THAT(Save(b, bytes).status(),
                StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("another namespace")));
  }
  absl::StatusOr<std::string> loaded = Load(IdOf(a), nullptr, a.fingerprint());
  ASSERT_OK(loaded.status());
  EXPECT_EQ(*loaded, bytes_a);
  EXPECT_EQ(tm_->Usage("b").blocks, 0u);
  EXPECT_EQ(tm_->Usage("a").blocks, 1u);
}

// Quotas are exact under concurrency: 64 threads across 3 namespaces save
// (half of them durably) until refused, while a watcher samples usage. No
// namespace ever holds more than its metadata or tier-2 quota, the daemon-
// wide metadata budget holds as well, summaries the engine adds at commit
// included; and every reservation is settled (dropping a namespace's
// blocks frees its quota for new Saves).
TEST_F(TierManagerTest, ConcurrentSavesNeverOverrunQuotas) {
  constexpr uint64_t kMetaQuota = 20000;
  constexpr uint64_t kTier2Quota = 48 * kKiB;
  constexpr uint64_t kBudget = 50000;  // Below the three quotas together.
  constexpr uint32_t kSummaryFloats = 512;
  configure_ = [&](TierManagerOptions& o) {
    o.metadata_bytes = kBudget;
    o.quota = [](absl::string_view) {
      NamespaceQuota q;
      q.metadata_bytes = kMetaQuota;
      q.tier2_bytes = kTier2Quota;
      return q;
    };
    o.summarize = [](const v1::BlockMeta&, const uint8_t*, uint64_t) {
      v1::Summary s;
      s.set_kind(v1::SUMMARY_MEAN_KEYS);
      for (uint32_t i = 0; i < kSummaryFloats; ++i) s.add_values(1.0f + i);
      return std::optional<v1::Summary>(std::move(s));
    };
    o.summary_bound = [](const v1::BlockMeta&) -> uint64_t { return 4 * kSummaryFloats + 64; };
  };
  Open(8 * kMiB);
  const std::vector<std::string> spaces = {"a", "b", "c"};
  std::atomic<bool> done{false};
  std::atomic<int> refused{0}, saved{0}, other_errors{0};
  absl::Mutex mu;
  std::map<std::string, NamespaceUsage> peak;
  uint64_t peak_total = 0;
  std::thread watcher([&] {
    while (!done) {
      absl::MutexLock lock(&mu);
      for (const std::string& ns : spaces) {
        const NamespaceUsage u = tm_->Usage(ns);
        peak[ns].metadata_bytes = std::max(peak[ns].metadata_bytes, u.metadata_bytes);
        peak[ns].tier2_bytes = std::max(peak[ns].tier2_bytes, u.tier2_bytes);
      }
      peak_total = std::max(peak_total, tm_->Stats().metadata_bytes);
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 64; ++t) {
    threads.emplace_back([&, t] {
      const std::string& ns = spaces[t % 3];
      v1::LayoutFingerprint fp = evoke::testing::OpaqueFingerprint(ns);
      for (int i = 0, refusals = 0; i < 40 && refusals < 3; ++i) {
        const v1::BlockMeta meta = evoke::testing::SessionMeta(
            fp, "t" + std::to_string(t), i, 16, 0, 1, 0);
        const std::string payload = Payload(t * 1000 + i, 4 * kKiB);
        const SaveItem item{&meta, payload.size(), false};
        HostSaveSource source({payload});
        const absl::Status s =
            tm_->Save({&item, 1}, source, /*durable=*/t % 2 == 0, absl::InfiniteFuture(), kOwner)
                .status();
        if (s.ok()) {
          ++saved;
        } else if (s.code() == absl::StatusCode::kResourceExhausted) {
          ++refused;
          ++refusals;
        } else {
          ADD_FAILURE() << s;
          ++other_errors;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  watcher.join();
  EXPECT_EQ(other_errors.load(), 0);
  EXPECT_GT(saved.load(), 0);
  EXPECT_GT(refused.load(), 0);
  for (const std::string& ns : spaces) {
    const NamespaceUsage u = tm_->Usage(ns);
    EXPECT_LE(peak[ns].metadata_bytes, kMetaQuota) << ns;
    EXPECT_LE(peak[ns].tier2_bytes, kTier2Quota) << ns;
    EXPECT_LE(u.metadata_bytes, kMetaQuota) << ns;
  }
  EXPECT_LE(peak_total, kBudget);
  EXPECT_LE(Stat().metadata_bytes, kBudget);
  // Nothing stays reserved: with namespace a emptied, a's Saves fit again.
  for (int t = 0; t < 64; t += 3) {
    ASSERT_OK(tm_->DropSession("a", "t" + std::to_string(t)).status());
  }
  EXPECT_EQ(tm_->Usage("a").metadata_bytes, 0u);
  const v1::BlockMeta meta =
      evoke::testing::SessionMeta(evoke::testing::OpaqueFingerprint("a"), "again", 0, 16, 0, 1, 0);
  ASSERT_OK(Save(meta, Payload(7, 4 * kKiB), false, /*durable=*/true).status());
}

}  // namespace
}  // namespace evoke

namespace evoke {
namespace {

// Records on disk are checked at start as a Save would be: a corrupt or
// hostile one (a key that is not its id, an impossible size) stays out of
// the index and is never served, the daemon starts anyway, and Delete or
// Verify removes it.
TEST_F(TierManagerTest, InvalidRecordsAreKeptOutAndRemovable) {
  const v1::BlockMeta good = SessionMeta("s", 0);
  const v1::BlockMeta wrong_key = SessionMeta("s", 1);
  v1::BlockMeta huge = SessionMeta("s", 2);
  v1::BlockMeta no_checksum = SessionMeta("s", 3);
  {
    SpillStoreOptions options;
    options.path = dir_.Join("db");
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<SpillStore> disk, SpillStore::Open(options));
    const std::string payload = Payload(7, 4 * kKiB);
    std::vector<storage::SpillRecord> records(4);
    const v1::BlockMeta* metas[] = {&good, &wrong_key, &huge, &no_checksum};
    for (int i = 0; i < 4; ++i) {
      *records[i].mutable_meta() = *metas[i];
      records[i].mutable_meta()->set_payload_bytes(payload.size());
      if (i != 3) {
        records[i].mutable_meta()->set_checksum(PayloadChecksum(payload.data(), payload.size()));
      }
    }
    records[1].mutable_meta()->set_id("short");            // Not the key.
    records[2].mutable_meta()->set_payload_bytes(1ull << 62);  // A bad_alloc in Verify.
    std::vector<SpillWrite> writes;
    for (int i = 0; i < 4; ++i) writes.push_back({IdOf(*metas[i]), &records[i], payload});
    ASSERT_OK(disk->Put(writes, /*sync=*/true));
  }
  Open(1 * kMiB);
  EXPECT_EQ(Stat().counters.invalid_records, 3u);
  EXPECT_EQ(Stat().disk.blocks, 1u);
  ASSERT_OK_AND_ASSIGN(std::string got, Load(IdOf(good)));
  EXPECT_EQ(got, Payload(7, 4 * kKiB));
  EXPECT_THAT(Load(IdOf(wrong_key)), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(tm_->Describe(IdOf(huge)), StatusIs(absl::StatusCode::kNotFound));
  bool more = false;
  EXPECT_EQ(tm_->List({}, nullptr, 10, &more).size(), 1u);

  // Delete removes one; Verify reports and removes the others.
  const BlockId wrong[] = {IdOf(wrong_key)};
  ASSERT_OK(tm_->Delete(wrong));
  ASSERT_OK_AND_ASSIGN(VerifyReport report, tm_->Verify({}));
  EXPECT_EQ(report.corrupt.size(), 2u);
  for (const CorruptCopy& c : report.corrupt) {
    EXPECT_THAT(c.detail, HasSubstr("record failed validation at start"));
  }
  EXPECT_EQ(report.copies_ok, 2u);  // `good`: tier 1 (promoted by the Load) and disk.
  Open(1 * kMiB);  // Nothing invalid is left on disk.
  EXPECT_EQ(Stat().counters.invalid_records, 0u);
  EXPECT_EQ(Stat().disk.blocks, 1u);
}

}  // namespace
}  // namespace evoke
