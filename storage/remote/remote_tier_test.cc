// Tier 3 without a cluster: RemoteTier (layout, breaker, counters) and the
// engine's write-behind, fetch and fleet-wide lookup over an in-memory
// ObjectStore shared by two TierManagers ("two hosts"). The same paths run
// against a real Ceph cluster in tests/remote_tier_e2e_test.cc.
#include "storage/remote/remote_tier.h"

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/background_thread.h"
#include "common/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/tier_manager.h"
#include "testing/blocks.h"
#include "testing/fake_clock.h"
#include "testing/memory_object_store.h"
#include "testing/memory_tier.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

constexpr uint64_t kAnySize = UINT64_MAX;  // Fetch without a size limit.

using ::evoke::testing::IsOkAndHolds;
using ::evoke::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint64_t kKiB = 1024;

using ::evoke::testing::MemoryObjectStore;
using ::evoke::testing::SharedStore;

storage::SpillRecord RecordFor(const BlockId& id, uint64_t bytes) {
  storage::SpillRecord r;
  r.mutable_meta()->set_id(id.ToBytes());
  r.mutable_meta()->set_payload_bytes(bytes);
  return r;
}

class RemoteTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RemoteTierOptions options;
    options.retry = absl::Seconds(1);
    options.retry_max = absl::Seconds(4);
    options.clock = &clock_;
    store_.clock = &clock_;
    tier_ = std::make_unique<RemoteTier>(std::make_unique<SharedStore>(&store_), options);
    ASSERT_OK(tier_->Start());
  }
  void TearDown() override { tier_->Stop(); }

  evoke::testing::FakeClock clock_;
  MemoryObjectStore store_;
  std::unique_ptr<RemoteTier> tier_;
};

TEST_F(RemoteTierTest, WritesFetchesAndDedupsWithoutResendingPayloads) {
  const BlockId id = BlockId::FromHex("00112233445566778899aabbccddeeff").value();
  const std::string payload = evoke::testing::Payload(1, 64 * kKiB);
  const storage::SpillRecord record = RecordFor(id, payload.size());
  const RemoteTier::Block block{id, "ns", &record, payload, /*exclusive=*/true};
  ASSERT_OK(tier_->Write({&block, 1})[0]);
  EXPECT_EQ(store_.payload_bytes_sent, payload.size());
  // A second host writing the same content-addressed block: found by the
  // existence check, so its payload is not sent again.
  ASSERT_OK(tier_->Write({&block, 1})[0]);
  EXPECT_EQ(store_.payload_bytes_sent, payload.size());
  EXPECT_EQ(store_.write_ops, 1u);

  std::vector<storage::SpillRecord> records;
  std::vector<std::string> payloads;
  ASSERT_OK(tier_->Fetch("ns", {&id, 1}, kAnySize, &records, &payloads)[0]);
  EXPECT_EQ(payloads[0], payload);
  EXPECT_EQ(records[0].meta().id(), id.ToBytes());
  // Namespaces are separate: the same id elsewhere is absent.
  EXPECT_THAT(tier_->Fetch("other", {&id, 1}, kAnySize, &records, &payloads)[0],
              StatusIs(absl::StatusCode::kNotFound));
  const RemoteStats s = tier_->Stats();
  EXPECT_EQ(s.objects_written, 1u);
  EXPECT_EQ(s.dedups, 1u);
  EXPECT_EQ(s.fetches, 1u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.state, "closed");
}

TEST_F(RemoteTierTest, RefusesRecordsThatDoNotParseOrNameAnotherBlock) {
  const BlockId id = BlockId::FromHex("00112233445566778899aabbccddeeff").value();
  const BlockId other = BlockId::FromHex("ffeeddccbbaa99887766554433221100").value();
  const std::string payload = evoke::testing::Payload(2, 4 * kKiB);
  const storage::SpillRecord record = RecordFor(id, payload.size());
  const RemoteTier::Block block{id, "ns", &record, payload, true};
  ASSERT_OK(tier_->Write({&block, 1})[0]);
  std::vector<storage::SpillRecord> records;
  std::vector<std::string> payloads;

  store_.SetRecord("ns", id, "garbage");
  EXPECT_THAT(tier_->Fetch("ns", {&id, 1}, kAnySize, &records, &payloads)[0],
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("does not parse")));
  store_.SetRecord("ns", id, RemoteTier::EncodeRecord(RecordFor(other, payload.size())));
  EXPECT_THAT(tier_->Fetch("ns", {&id, 1}, kAnySize, &records, &payloads)[0],
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("another block")));
  store_.SetRecord("ns", id, RemoteTier::EncodeRecord(RecordFor(id, payload.size() + 1)));
  EXPECT_THAT(tier_->Fetch("ns", {&id, 1}, kAnySize, &records, &payloads)[0],
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bytes")));
  EXPECT_TRUE(payloads[0].empty());
  EXPECT_EQ(tier_->Stats().checksum_failures, 3u);
}

TEST_F(RemoteTierTest, ATimeoutOpensTheBreakerAndOneProbeClosesIt) {
  const BlockId id = BlockId::FromHex("00112233445566778899aabbccddeeff").value();
  std::vector<storage::SpillRecord> records;
  std::vector<std::string> payloads;
  store_.SetMode(MemoryObjectStore::Mode::kSlow);
  EXPECT_THAT(tier_->Fetch("ns", {&id, 1}, kAnySize, &records, &payloads)[0],
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("timed out")));
  EXPECT_EQ(store_.read_ops, 1u);
  // Open: the next calls fail at once without reaching the store.
  for (int i = 0; i < 5; ++i) {
    EXPECT_THAT(tier_->Fetch("ns", {&id, 1}, kAnySize, &records, &payloads)[0],
                StatusIs(absl::StatusCode::kUnavailable, HasSubstr("retrying in")));
  }
  EXPECT_EQ(store_.read_ops, 1u);
  EXPECT_EQ(tier_->Stats().state, "open");
  EXPECT_EQ(tier_->Stats().breaker_opens, 1u);
  // After the retry interval one probe goes through; it fails: open again,
  // for twice as long.
  clock_.Advance(absl::Milliseconds(1001));
  EXPECT_THAT(tier_->Fetch("ns", {&id, 1}, kAnySize, &records, &payloads)[0],
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(store_.read_ops, 2u);
  clock_.Advance(absl::Milliseconds(1500));
  EXPECT_THAT(tier_->Fetch("ns", {&id, 1}, kAnySize, &records, &payloads)[0],
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("retrying in")));
  EXPECT_EQ(store_.read_ops, 2u);
  // Back: the probe after 2 s succeeds (a miss is an answer) and closes it.
  store_.SetMode(MemoryObjectStore::Mode::kUp);
  clock_.Advance(absl::Milliseconds(600));
  EXPECT_THAT(tier_->Fetch("ns", {&id, 1}, kAnySize, &records, &payloads)[0],
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(tier_->Stats().state, "closed");
  EXPECT_THAT(tier_->Fetch("ns", {&id, 1}, kAnySize, &records, &payloads)[0],
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(store_.read_ops, 4u);
}

TEST_F(RemoteTierTest, RefusedConnectionsOpenTheBreakerAfterThreeFailures) {
  const BlockId id = BlockId::FromHex("00112233445566778899aabbccddeeff").value();
  store_.SetMode(MemoryObjectStore::Mode::kDown);
  for (int i = 0; i < 3; ++i) {
    EXPECT_THAT(tier_->ProbeRun("ns", {&id, 1}), StatusIs(absl::StatusCode::kUnavailable));
  }
  EXPECT_EQ(store_.exists_ops, 3u);
  EXPECT_THAT(tier_->ProbeRun("ns", {&id, 1}), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(store_.exists_ops, 3u);  // Open.
}

TEST(RemoteTierStartTest, StartsDisconnectedAndReconnectsInTheBackground) {
  MemoryObjectStore store;
  store.refuse_connect = true;
  RemoteTierOptions options;
  options.retry = absl::Milliseconds(10);
  RemoteTier tier(std::make_unique<SharedStore>(&store), options);
  EXPECT_THAT(tier.Start(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(tier.Stats().state, "disconnected");
  EXPECT_THAT(tier.Stats().last_error, HasSubstr("monitors unreachable"));
  const BlockId id = BlockId::FromHex("00112233445566778899aabbccddeeff").value();
  EXPECT_THAT(tier.ProbeRun("ns", {&id, 1}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not connected")));
  EXPECT_EQ(store.exists_ops, 0u);
  store.refuse_connect = false;
  EXPECT_TRUE(evoke::testing::WaitUntil([&] { return tier.Stats().connected; }));
  EXPECT_THAT(tier.ProbeRun("ns", {&id, 1}), IsOkAndHolds(0u));
}

// Expiry: blocks written before the cut-off go, in every namespace and over
// several pages of the listing; younger blocks and objects that are not
// blocks stay.
TEST_F(RemoteTierTest, ExpiryRemovesOnlyBlocksWrittenBeforeTheCutOff) {
  const std::string payload = evoke::testing::Payload(3, 64);
  auto write = [&](const std::string& ns, const BlockId& id) {
    const storage::SpillRecord record = RecordFor(id, payload.size());
    const RemoteTier::Block block{id, ns, &record, payload, true};
    ASSERT_OK(tier_->Write({&block, 1})[0]);
  };
  constexpr int kOld = 1100;  // More than one page of 1024.
  for (int i = 0; i < kOld; ++i) write(i % 2 ? "a" : "b", BlockId(0x200 + i, 1));
  store_.Put("a", "b.not-hex");
  store_.Put("a", "someone-elses-object");
  const absl::Time cut = clock_.Now() + absl::Minutes(30);
  clock_.Advance(absl::Hours(1));
  for (int i = 0; i < 5; ++i) write("a", BlockId(0x900 + i, 1));

  EXPECT_THAT(tier_->Expire(cut), IsOkAndHolds(static_cast<uint64_t>(kOld)));
  EXPECT_EQ(store_.size(), 5u + 2u);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(store_.Has("a", BlockId(0x900 + i, 1)));
  EXPECT_TRUE(store_.HasObject("a", "b.not-hex"));
  EXPECT_TRUE(store_.HasObject("a", "someone-elses-object"));
  EXPECT_EQ(tier_->Stats().expired_objects, static_cast<uint64_t>(kOld));
  // Nothing more is old enough.
  EXPECT_THAT(tier_->Expire(cut), IsOkAndHolds(0u));
  // A store that is down: the sweep stops with UNAVAILABLE, removes nothing.
  store_.SetMode(MemoryObjectStore::Mode::kDown);
  EXPECT_THAT(tier_->Expire(clock_.Now() + absl::Hours(1)),
              StatusIs(absl::StatusCode::kUnavailable));
  store_.SetMode(MemoryObjectStore::Mode::kUp);
  EXPECT_EQ(store_.size(), 7u);
}

TEST(RemoteTierExpiryTest, TheBackgroundSweepExpiresOldBlocks) {
  evoke::testing::FakeClock clock;
  MemoryObjectStore store;
  store.clock = &clock;
  RemoteTierOptions options;
  options.clock = &clock;
  options.retry = absl::Milliseconds(10);
  options.expire_after = absl::Hours(2);
  options.sweep_every = absl::Minutes(30);
  RemoteTier tier(std::make_unique<SharedStore>(&store), options);
  ASSERT_OK(tier.Start());
  const std::string payload = evoke::testing::Payload(4, 64);
  const BlockId old_id(0x1, 1), young_id(0x2, 1);
  const storage::SpillRecord old_record = RecordFor(old_id, payload.size());
  const storage::SpillRecord young_record = RecordFor(young_id, payload.size());
  const RemoteTier::Block old_block{old_id, "ns", &old_record, payload, true};
  ASSERT_OK(tier.Write({&old_block, 1})[0]);
  clock.Advance(absl::Hours(1) + absl::Minutes(45));
  const RemoteTier::Block young_block{young_id, "ns", &young_record, payload, true};
  ASSERT_OK(tier.Write({&young_block, 1})[0]);
  // 1 h 45 min: no sweep has found anything old enough yet.
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_TRUE(store.Has("ns", old_id));
  clock.Advance(absl::Minutes(30));  // The old block is 2 h 15 min old.
  EXPECT_TRUE(evoke::testing::WaitUntil([&] { return !store.Has("ns", old_id); }));
  EXPECT_TRUE(store.Has("ns", young_id));
  EXPECT_EQ(tier.Stats().expired_objects, 1u);
  tier.Stop();
}

TEST_F(RemoteTierTest, ProbeRunStopsAtTheFirstAbsentBlock) {
  std::vector<BlockId> ids;
  std::vector<std::string> payloads;
  std::vector<storage::SpillRecord> records;
  for (int i = 0; i < 70; ++i) {
    ids.push_back(BlockId(0x100 + i, 7));
    payloads.push_back(evoke::testing::Payload(i, 512));
  }
  for (int i = 0; i < 70; ++i) records.push_back(RecordFor(ids[i], 512));
  std::vector<RemoteTier::Block> blocks;
  for (int i = 0; i < 70; ++i) {
    if (i == 65) continue;  // A hole past two windows of 32.
    blocks.push_back({ids[i], "ns", &records[i], payloads[i], true});
  }
  for (const absl::Status& s : tier_->Write(blocks)) ASSERT_OK(s);
  EXPECT_THAT(tier_->ProbeRun("ns", ids, 32), IsOkAndHolds(65u));
  EXPECT_THAT(tier_->ProbeRun("other", ids, 32), IsOkAndHolds(0u));
}

// ------------------------------------------------------ through the engine

// A namespace scope that sees one namespace.
class OneNamespace final : public NamespaceScope {
 public:
  explicit OneNamespace(std::string ns) : ns_(std::move(ns)) {}
  bool SeesAll() const override { return false; }
  bool Sees(absl::string_view ns) const override { return ns == ns_; }

 private:
  std::string ns_;
};

// One "host": a TierManager (tier 1 in memory, tier 2 a MemoryTier) with a
// RemoteTier over the shared store.
struct Host {
  std::unique_ptr<RemoteTier> remote;
  std::unique_ptr<TierManager> tiers;
};

class RemoteEngineTest : public ::testing::Test {
 protected:
  // `max_block_bytes`, `staging_bytes`: this host's limits (0: defaults).
  // `write_bytes_per_s`: the write-behind budget (0: none), in bursts of
  // 64 KiB.
  Host Open(uint64_t queue_bytes = 256ull << 20, bool sessions = false,
            uint64_t max_block_bytes = 0, uint64_t staging_bytes = 0,
            uint64_t write_bytes_per_s = 0) {
    Host h;
    RemoteTierOptions ro;
    ro.retry = absl::Milliseconds(20);
    ro.retry_max = absl::Milliseconds(40);
    h.remote = std::make_unique<RemoteTier>(std::make_unique<SharedStore>(&store_), ro);
    EXPECT_OK(h.remote->Start());
    PinnedArenaOptions arena_options;
    arena_options.capacity_bytes = 16ull << 20;
    arena_options.lock_memory = false;
    auto arena = PinnedArena::Create(arena_options);
    EXPECT_OK(arena);
    TierManagerOptions options;
    options.remote = h.remote.get();
    options.remote_queue_bytes = queue_bytes;
    options.remote_sessions = sessions;
    options.remote_batch_blocks = 4;
    options.remote_write_bytes_per_s = write_bytes_per_s;
    options.remote_write_burst_bytes = 64 * kKiB;
    if (max_block_bytes != 0) options.limits.max_block_bytes = max_block_bytes;
    if (staging_bytes != 0) options.staging_bytes = staging_bytes;
    auto tm = TierManager::Open(options, std::move(arena).value(),
                                std::make_unique<evoke::testing::MemoryTier>());
    EXPECT_OK(tm);
    h.tiers = std::move(tm).value();
    return h;
  }

  // A chain of `n` prefix blocks of 16 tokens in namespace "ns".
  void MakeChain(int n) {
    std::vector<int32_t> tokens;
    for (int i = 0; i < 16 * n; ++i) tokens.push_back(1000 + i);
    metas_ = evoke::testing::PrefixChainMetas(fp_, tokens, 16);
    ASSERT_EQ(metas_.size(), static_cast<size_t>(n));
    ids_.clear();
    payloads_.clear();
    for (size_t i = 0; i < metas_.size(); ++i) {
      ids_.push_back(evoke::testing::IdOf(metas_[i]));
      payloads_.push_back(evoke::testing::Payload(i + 1, 32 * kKiB));
    }
  }
  absl::Status SaveChain(Host& h) {
    std::vector<SaveItem> items;
    std::vector<absl::string_view> views;
    for (size_t i = 0; i < metas_.size(); ++i) {
      items.push_back(SaveItem{&metas_[i], payloads_[i].size()});
      views.push_back(payloads_[i]);
    }
    HostSaveSource source(views);
    return h.tiers->Save(items, source, false, absl::InfiniteFuture()).status();
  }
  absl::Status Load(Host& h, absl::Span<const BlockId> ids, std::vector<std::string>* out,
                    std::vector<LoadedInfo>* infos, const NamespaceScope* scope = nullptr) {
    StringLoadSink sink;
    std::vector<v1::BlockMeta> metas;
    absl::Status s = h.tiers->Load(ids, fp_, sink, &metas, infos, scope);
    *out = sink.payloads();
    return s;
  }

  MemoryObjectStore store_;
  const v1::LayoutFingerprint fp_ = evoke::testing::OpaqueFingerprint("ns");
  std::vector<v1::BlockMeta> metas_;
  std::vector<BlockId> ids_;
  std::vector<std::string> payloads_;
};

// Prefetch with a fingerprint: what another host wrote comes from tier 3
// into tier 1 before any Load; an id tier 3 lacks is set aside as missing,
// and a caller that may not see the namespace fetches nothing.
TEST_F(RemoteEngineTest, APrefetchFetchesFromTier3IntoTier1) {
  Host a = Open();
  Host b = Open();
  MakeChain(4);
  ASSERT_OK(SaveChain(a));
  ASSERT_TRUE(a.tiers->WaitForRemoteIdle(absl::Seconds(10)));
  std::vector<BlockId> asked = {ids_[0], ids_[1],
                                BlockId::FromHex("00112233445566778899aabbccddeeff").value(),
                                ids_[2], ids_[3]};
  const OneNamespace other("other");
  ASSERT_OK_AND_ASSIGN(PrefetchResult none,
                       b.tiers->Prefetch(asked, &fp_, absl::Now() + absl::Seconds(10), &other));
  EXPECT_EQ(none.fetched, 0u);
  EXPECT_EQ(none.missing, 5u);
  EXPECT_TRUE(b.tiers->Lookup(ids_).empty());
  ASSERT_OK_AND_ASSIGN(PrefetchResult r,
                       b.tiers->Prefetch(asked, &fp_, absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(r.fetched, 4u);
  EXPECT_EQ(r.missing, 1u);
  EXPECT_EQ(r.failed, 0u);
  EXPECT_EQ(b.tiers->Lookup(ids_), std::vector<BlockLocation>(4, BlockLocation::kHost));
  std::vector<std::string> got;
  std::vector<LoadedInfo> infos;
  ASSERT_OK(Load(b, ids_, &got, &infos));
  EXPECT_EQ(got, payloads_);
  const TierStats st = b.tiers->Stats();
  EXPECT_EQ(st.counters.prefetched, 4u);
  EXPECT_EQ(st.counters.prefetch_hits, 4u);
}

TEST_F(RemoteEngineTest, APrefixSavedOnOneHostIsFoundAndLoadedOnAnother) {
  Host a = Open();
  Host b = Open();
  MakeChain(8);
  ASSERT_OK(SaveChain(a));
  ASSERT_TRUE(a.tiers->WaitForRemoteIdle(absl::Seconds(10)));
  EXPECT_EQ(store_.size(), 8u);
  TierStats sa = a.tiers->Stats();
  ASSERT_TRUE(sa.remote.has_value());
  EXPECT_EQ(sa.remote->objects_written, 8u);
  EXPECT_EQ(sa.remote->queue_blocks, 0u);

  // B has never seen the chain: the local lookup finds nothing, the
  // fleet-wide one all of it.
  EXPECT_TRUE(b.tiers->Lookup(ids_).empty());
  EXPECT_EQ(b.tiers->LookupFleet(ids_, "ns", ""),
            std::vector<BlockLocation>(8, BlockLocation::kRemote));
  std::vector<std::string> got;
  std::vector<LoadedInfo> infos;
  ASSERT_OK(Load(b, ids_, &got, &infos));
  EXPECT_EQ(got, payloads_);
  for (const LoadedInfo& info : infos) EXPECT_EQ(info.served_from, BlockLocation::kRemote);
  // Promoted: the second Load is local, and the blocks are never written
  // back to the store they came from.
  ASSERT_OK(Load(b, ids_, &got, &infos));
  for (const LoadedInfo& info : infos) EXPECT_EQ(info.served_from, BlockLocation::kHost);
  ASSERT_TRUE(b.tiers->WaitForRemoteIdle(absl::Seconds(10)));
  const uint64_t writes = store_.write_ops;
  EXPECT_EQ(b.tiers->Stats().remote->objects_written, 0u);
  // B computes the same prefix itself: a local dedup, nothing remote.
  ASSERT_OK(SaveChain(b));
  ASSERT_TRUE(b.tiers->WaitForRemoteIdle(absl::Seconds(10)));
  EXPECT_EQ(store_.write_ops, writes);
  EXPECT_EQ(b.tiers->Stats().remote->fetches, 8u);

  // A third host saving the same chain before ever loading it: the blocks
  // are new to it, but the store has them: nothing is sent.
  Host c = Open();
  const uint64_t sent = store_.payload_bytes_sent;
  ASSERT_OK(SaveChain(c));
  ASSERT_TRUE(c.tiers->WaitForRemoteIdle(absl::Seconds(10)));
  EXPECT_EQ(store_.payload_bytes_sent, sent);
  EXPECT_EQ(c.tiers->Stats().remote->dedups, 8u);
}

TEST_F(RemoteEngineTest, SessionBlocksStayLocalUnlessConfigured) {
  for (bool sessions : {false, true}) {
    SCOPED_TRACE(sessions);
    Host a = Open(256ull << 20, sessions);
    const v1::BlockMeta meta =
        evoke::testing::SessionMeta(fp_, sessions ? "s1" : "s0", 0, 16, 0, 1, 0);
    const std::string payload = evoke::testing::Payload(9, 16 * kKiB);
    const SaveItem item{&meta, payload.size()};
    HostSaveSource source({payload});
    const size_t before = store_.size();
    ASSERT_OK(a.tiers->Save({&item, 1}, source, false, absl::InfiniteFuture()).status());
    ASSERT_TRUE(a.tiers->WaitForRemoteIdle(absl::Seconds(10)));
    EXPECT_EQ(store_.size(), before + (sessions ? 1 : 0));
  }
}

// With --remote-sessions, dropping a session (or deleting its blocks)
// removes their remote copies; prefix blocks are shared by content and stay.
// A store that is down holds the removals until it is back.
TEST_F(RemoteEngineTest, DeletingASessionRemovesItsRemoteCopiesButNotSharedPrefixes) {
  Host a = Open(256ull << 20, /*sessions=*/true);
  MakeChain(2);
  ASSERT_OK(SaveChain(a));
  std::vector<v1::BlockMeta> metas;
  std::vector<std::string> payloads;
  for (int i = 0; i < 3; ++i) {
    metas.push_back(evoke::testing::SessionMeta(fp_, "s1", i, 16, 0, 1, 16 * i));
    payloads.push_back(evoke::testing::Payload(20 + i, 8 * kKiB));
  }
  metas.push_back(evoke::testing::SessionMeta(fp_, "s2", 0, 16, 0, 1, 0));
  payloads.push_back(evoke::testing::Payload(30, 8 * kKiB));
  std::vector<SaveItem> items;
  std::vector<absl::string_view> views;
  for (size_t i = 0; i < metas.size(); ++i) {
    items.push_back(SaveItem{&metas[i], payloads[i].size()});
    views.push_back(payloads[i]);
  }
  HostSaveSource source(views);
  ASSERT_OK(a.tiers->Save(items, source, false, absl::InfiniteFuture()).status());
  ASSERT_TRUE(a.tiers->WaitForRemoteIdle(absl::Seconds(10)));
  ASSERT_EQ(store_.size(), 2u + 4u);

  store_.SetMode(MemoryObjectStore::Mode::kDown);
  EXPECT_THAT(a.tiers->DropSession("ns", "s1"), IsOkAndHolds(3u));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(store_.size(), 6u);  // Down: nothing removed yet, nothing lost.
  EXPECT_EQ(a.tiers->Stats().remote->removals_queued, 3u);
  store_.SetMode(MemoryObjectStore::Mode::kUp);
  ASSERT_TRUE(a.tiers->WaitForRemoteIdle(absl::Seconds(10)));
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(store_.Has("ns", evoke::testing::IdOf(metas[i])));
  EXPECT_TRUE(store_.Has("ns", evoke::testing::IdOf(metas[3])));
  for (const BlockId& id : ids_) EXPECT_TRUE(store_.Has("ns", id));
  // Deleting a prefix block by id leaves its shared copy alone.
  ASSERT_OK(a.tiers->Delete({&ids_[0], 1}, nullptr));
  ASSERT_OK(a.tiers->Delete({&ids_.back(), 1}, nullptr));
  const BlockId s2 = evoke::testing::IdOf(metas[3]);
  ASSERT_OK(a.tiers->Delete({&s2, 1}, nullptr));
  ASSERT_TRUE(a.tiers->WaitForRemoteIdle(absl::Seconds(10)));
  for (const BlockId& id : ids_) EXPECT_TRUE(store_.Has("ns", id));
  EXPECT_FALSE(store_.Has("ns", s2));
  EXPECT_EQ(store_.size(), 2u);
  EXPECT_EQ(a.tiers->Stats().remote->removals_dropped, 0u);
}

TEST_F(RemoteEngineTest, ACorruptRemoteCopyIsRefusedCountedRemovedAndNeverServed) {
  Host a = Open();
  Host b = Open();
  MakeChain(3);
  ASSERT_OK(SaveChain(a));
  ASSERT_TRUE(a.tiers->WaitForRemoteIdle(absl::Seconds(10)));
  store_.FlipByte("ns", ids_[1]);
  std::vector<std::string> got;
  std::vector<LoadedInfo> infos;
  const absl::Status s = Load(b, ids_, &got, &infos);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("remote copy")));
  EXPECT_EQ(ErrorItem(s)->index, 1u);
  for (const std::string& p : got) EXPECT_NE(p, payloads_[1]);
  const TierStats sb = b.tiers->Stats();
  EXPECT_EQ(sb.remote->checksum_failures, 1u);
  EXPECT_EQ(sb.counters.checksum_failures, 1u);
  // The bad object is gone (exclusive writes could never replace it), and
  // it is not in B's index; the good blocks read with it were each checked
  // and saved as their reads completed, so B's run stops at block 1.
  EXPECT_FALSE(store_.Has("ns", ids_[1]));
  EXPECT_TRUE(store_.Has("ns", ids_[0]));
  EXPECT_EQ(b.tiers->Lookup(ids_).size(), 1u);
  EXPECT_THAT(b.tiers->Describe(ids_[1]), StatusIs(absl::StatusCode::kNotFound));
  // A holds a good copy; its next write of the block (here: a new save on a
  // host that lost it) puts a good one back.
  Host c = Open();
  ASSERT_OK(SaveChain(c));
  ASSERT_TRUE(c.tiers->WaitForRemoteIdle(absl::Seconds(10)));
  ASSERT_OK(Load(b, ids_, &got, &infos));
  EXPECT_EQ(got, payloads_);
}

// A host whose limits are stricter than the writer's: the object is never
// read (its size is checked first), it is left in place for the hosts that
// accept it (it used to be removed, for every host), and counted.
TEST_F(RemoteEngineTest, ARecordOverThisHostsLimitIsNeverReadAndLeftInPlace) {
  Host a = Open();
  MakeChain(3);  // 32 KiB blocks.
  ASSERT_OK(SaveChain(a));
  ASSERT_TRUE(a.tiers->WaitForRemoteIdle(absl::Seconds(10)));
  Host strict = Open(256ull << 20, false, /*max_block_bytes=*/16 * kKiB, 16 * kKiB);
  const uint64_t read_before = store_.read_bytes;
  std::vector<std::string> got;
  std::vector<LoadedInfo> infos;
  const absl::Status s = Load(strict, ids_, &got, &infos);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition,
                          HasSubstr("--max-block-bytes (16 KiB); left in place")));
  EXPECT_EQ(ErrorItem(s)->index, 0u);
  EXPECT_EQ(store_.read_bytes, read_before);
  for (const BlockId& id : ids_) EXPECT_TRUE(store_.Has("ns", id));
  EXPECT_EQ(strict.tiers->Stats().remote->refused_records, 1u);
  EXPECT_EQ(strict.tiers->Stats().remote->checksum_failures, 0u);
  // A host with room reads all three through a 64 KiB staging budget (two
  // rounds: 96 KiB do not fit at once).
  Host small = Open(256ull << 20, false, /*max_block_bytes=*/64 * kKiB, 64 * kKiB);
  ASSERT_OK(Load(small, ids_, &got, &infos));
  EXPECT_EQ(got, payloads_);
}

// A planted remote record: a prefix record without tokens, under an id that
// readers compute, with other bytes and a matching checksum. It passed the
// record checks (they verify a prefix id only against tokens that are
// there); now it is refused, counted and removed, and never served.
TEST_F(RemoteEngineTest, APrefixRecordWithoutItsTokensIsRefusedAndRemoved) {
  Host a = Open();
  MakeChain(2);
  ASSERT_OK(SaveChain(a));
  ASSERT_TRUE(a.tiers->WaitForRemoteIdle(absl::Seconds(10)));
  const std::string magic = RemoteTier::EncodeRecord(storage::SpillRecord());
  const std::string encoded = store_.RecordOf("ns", ids_[1]);
  storage::SpillRecord record;
  ASSERT_TRUE(record.ParseFromString(encoded.substr(magic.size())));
  const std::string planted = evoke::testing::Payload(99, payloads_[1].size());
  record.mutable_meta()->clear_tokens();
  record.mutable_meta()->set_checksum(PayloadChecksum(planted.data(), planted.size()));
  store_.SetRecord("ns", ids_[1], RemoteTier::EncodeRecord(record));
  store_.SetData("ns", ids_[1], planted);
  Host b = Open();
  std::vector<std::string> got;
  std::vector<LoadedInfo> infos;
  const absl::Status s = Load(b, ids_, &got, &infos);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("must carry its tokens")));
  EXPECT_EQ(ErrorItem(s)->index, 1u);
  for (const std::string& p : got) EXPECT_NE(p, planted);
  EXPECT_FALSE(store_.Has("ns", ids_[1]));
  EXPECT_EQ(b.tiers->Stats().remote->checksum_failures, 1u);
}

TEST_F(RemoteEngineTest, AnUnreachableTierMakesRemoteOnlyBlocksUnavailableNotNotFound) {
  Host a = Open();
  Host b = Open();
  MakeChain(2);
  ASSERT_OK(SaveChain(a));
  ASSERT_TRUE(a.tiers->WaitForRemoteIdle(absl::Seconds(10)));
  // B holds a block of its own.
  const v1::BlockMeta local = evoke::testing::SessionMeta(fp_, "local", 0, 16, 0, 1, 0);
  const std::string local_payload = evoke::testing::Payload(77, 8 * kKiB);
  const SaveItem item{&local, local_payload.size()};
  HostSaveSource source({local_payload});
  ASSERT_OK(b.tiers->Save({&item, 1}, source, false, absl::InfiniteFuture()).status());

  store_.SetMode(MemoryObjectStore::Mode::kSlow);
  std::vector<std::string> got;
  std::vector<LoadedInfo> infos;
  EXPECT_THAT(Load(b, {&ids_[0], 1}, &got, &infos),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot be reached")));
  const uint64_t reads = store_.read_ops;
  // The breaker is open: no further call waits on the store...
  EXPECT_THAT(Load(b, {&ids_[0], 1}, &got, &infos), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(store_.read_ops, reads);
  // ...and what B holds is served as ever.
  const BlockId local_id = evoke::testing::IdOf(local);
  ASSERT_OK(Load(b, {&local_id, 1}, &got, &infos));
  EXPECT_EQ(got[0], local_payload);
  // A fleet-wide lookup answers with what B holds.
  EXPECT_TRUE(b.tiers->LookupFleet(ids_, "ns", "").empty());

  store_.SetMode(MemoryObjectStore::Mode::kUp);
  EXPECT_TRUE(evoke::testing::WaitUntil([&] { return Load(b, ids_, &got, &infos).ok(); }));
  EXPECT_EQ(got, payloads_);
}

TEST_F(RemoteEngineTest, ANamespaceOutOfScopeIsNeverAskedFor) {
  Host a = Open();
  Host b = Open();
  MakeChain(2);
  ASSERT_OK(SaveChain(a));
  ASSERT_TRUE(a.tiers->WaitForRemoteIdle(absl::Seconds(10)));
  const OneNamespace other("other");
  const uint64_t reads = store_.read_ops, exists = store_.exists_ops;
  std::vector<std::string> got;
  std::vector<LoadedInfo> infos;
  // The same answer as for an absent block, and not one call to the store.
  EXPECT_THAT(Load(b, ids_, &got, &infos, &other),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("not found")));
  EXPECT_TRUE(b.tiers->LookupFleet(ids_, "ns", "", &other).empty());
  EXPECT_EQ(store_.read_ops, reads);
  EXPECT_EQ(store_.exists_ops, exists);
  const OneNamespace ns("ns");
  ASSERT_OK(Load(b, ids_, &got, &infos, &ns));
}

TEST_F(RemoteEngineTest, AFullQueueDropsTheNewestBlocksAndKeepsTheChainHeads) {
  store_.SetMode(MemoryObjectStore::Mode::kDown);
  Host a = Open(/*queue_bytes=*/4 * 32 * kKiB);
  MakeChain(10);
  ASSERT_OK(SaveChain(a));  // Never waits on the store.
  EXPECT_TRUE(evoke::testing::WaitUntil([&] {
    const RemoteStats r = *a.tiers->Stats().remote;
    return r.dropped_blocks == 6 && r.queue_blocks == 4;
  }));
  store_.SetMode(MemoryObjectStore::Mode::kUp);
  ASSERT_TRUE(a.tiers->WaitForRemoteIdle(absl::Seconds(10)));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(store_.Has("ns", ids_[i]), i < 4) << i;
  Host b = Open();
  EXPECT_EQ(b.tiers->LookupFleet(ids_, "ns", "").size(), 4u);
}

TEST_F(RemoteEngineTest, WriteBehindKeepsToItsBudget) {
  // 32 blocks of 32 KiB (1 MiB) in batches of 4 (128 KiB) at 2 MiB/s with
  // bursts of 64 KiB: a batch starts once the last one's debt is paid, so
  // at least (1 MiB - 64 KiB of burst - the last batch) / 2 MiB/s = 0.406 s,
  // however fast the store. Without a budget the same writes into memory
  // take milliseconds.
  Host a = Open(256ull << 20, false, 0, 0, /*write_bytes_per_s=*/2ull << 20);
  // Its thread also runs below serving, at the write-behind's nice value
  // (once it has started and named itself).
  std::optional<int> nice = NiceOfThread("evoke-upload");
  for (int i = 0; i < 500 && !nice.has_value(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    nice = NiceOfThread("evoke-upload");
  }
  EXPECT_EQ(nice, kWriteBehindNice);
  MakeChain(32);
  const absl::Time start = absl::Now();
  ASSERT_OK(SaveChain(a));  // The Save itself never waits for the budget.
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(400));
  ASSERT_TRUE(a.tiers->WaitForRemoteIdle(absl::Seconds(20)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(400));
  EXPECT_EQ(store_.size(), 32u);
  EXPECT_GT(a.tiers->Stats().remote->paced, 0u);
}

}  // namespace
}  // namespace evoke
