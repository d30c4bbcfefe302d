#include "storage/block_index.h"

#include <memory>
#include <string>
#include <vector>

#include "common/chain_hash.h"
#include "gtest/gtest.h"

namespace evoke {
namespace {

constexpr uint64_t kKiB = 1024;

v1::BlockMeta Meta(const std::string& ns, const std::string& session, uint64_t seq,
                   uint64_t bytes) {
  v1::BlockMeta m;
  m.mutable_fingerprint()->set_namespace_(ns);
  m.set_kind(v1::BLOCK_KIND_SESSION);
  m.set_session_id(session);
  m.set_sequence(seq);
  m.set_id(SessionBlockId(ns, session, seq).ToBytes());
  m.set_payload_bytes(bytes);
  return m;
}

class BlockIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PinnedArenaOptions options;
    options.capacity_bytes = 1024 * kKiB;
    options.lock_memory = false;
    host_ = std::make_unique<HostTier>(PinnedArena::Create(options).value(), nullptr);
  }

  // Add stores a committed, dirty block of `bytes` (4 KiB granules).
  IndexEntry* Add(const std::string& ns, const std::string& session, uint64_t seq,
                  uint64_t bytes = 4 * kKiB) {
    const v1::BlockMeta meta = Meta(ns, session, seq, bytes);
    const BlockId id = BlockId::FromBytes(meta.id()).value();
    bool revived = true;
    IndexEntry* e = index_.BeginWrite(id, &revived);
    EXPECT_FALSE(revived);
    index_.ReplaceMetaForWrite(e, meta);
    e->payload_bytes = bytes;
    index_.CommitWrite(e, std::move(host_->Reserve(bytes).value()), ++now_);
    return e;
  }

  std::unique_ptr<HostTier> host_;
  BlockIndex index_;
  int64_t now_ = 0;
};

TEST_F(BlockIndexTest, LifecycleKeepsCountsAndListsInStep) {
  IndexEntry* e = Add("ns", "s", 0, 8 * kKiB);
  EXPECT_EQ(e->state, BlockState::kDirty);
  EXPECT_EQ(index_.ram_blocks(), 1u);
  EXPECT_EQ(index_.ram_payload_bytes(), 8 * kKiB);
  EXPECT_EQ(index_.evictable_bytes(), 8 * kKiB);
  EXPECT_EQ(host_->pending_bytes(), 0u);  // Committed.

  index_.MarkOnDisk(e);
  EXPECT_EQ(e->state, BlockState::kClean);
  EXPECT_TRUE(e->record_on_disk);
  EXPECT_EQ(index_.disk_blocks(), 1u);
  EXPECT_EQ(index_.disk_lru().size(), 1u);

  index_.DetachRam(e).Release();
  EXPECT_EQ(e->state, BlockState::kSpilled);
  EXPECT_EQ(index_.ram_blocks(), 0u);
  EXPECT_EQ(index_.evictable_bytes(), 0u);
  EXPECT_TRUE(index_.ram_lru().empty());
  EXPECT_EQ(host_->used_bytes(), 0u);

  index_.AttachRam(e, std::move(host_->Reserve(8 * kKiB).value()));
  EXPECT_EQ(e->state, BlockState::kClean);
  EXPECT_EQ(host_->pending_bytes(), 0u);

  index_.MarkOffDisk(e, /*record_kept=*/false);
  EXPECT_EQ(e->state, BlockState::kDirty);
  EXPECT_FALSE(e->record_on_disk);
  EXPECT_TRUE(index_.disk_lru().empty());

  index_.DetachRam(e).Release();
  EXPECT_EQ(e->state, BlockState::kBreadcrumb);
  EXPECT_EQ(index_.count(BlockState::kBreadcrumb), 1u);
  EXPECT_FALSE(e->bytes_available());

  // A breadcrumb is revived by a new save, or restored by an abort. The
  // placeholder is a new generation: a promotion that looked the breadcrumb
  // up before cannot mistake it for the block it read.
  bool revived = false;
  const uint64_t gen = e->gen;
  EXPECT_EQ(index_.BeginWrite(e->id, &revived), e);
  EXPECT_TRUE(revived);
  EXPECT_EQ(index_.FindGen(e->id, gen), nullptr);
  EXPECT_EQ(index_.FindVisible(e->id), nullptr);  // Placeholders are hidden.
  EXPECT_EQ(index_.count(BlockState::kBreadcrumb), 0u);
  index_.AbortWrite(e, revived);
  EXPECT_EQ(e->state, BlockState::kBreadcrumb);
  EXPECT_EQ(index_.FindVisible(e->id), e);
}

TEST_F(BlockIndexTest, PinsLeaveTheRamLruAndOwnersReleaseThem) {
  IndexEntry* a = Add("ns", "s", 0);
  IndexEntry* b = Add("ns", "s", 1);
  index_.AddPin(a, 7);
  index_.AddPin(a, 7);
  index_.AddPin(b, 8);
  EXPECT_EQ(index_.pinned_blocks(), 2u);
  EXPECT_EQ(index_.pin_count(), 3u);
  EXPECT_TRUE(index_.ram_lru().empty());
  EXPECT_EQ(index_.evictable_bytes(), 0u);
  EXPECT_EQ(index_.PinsOf(*a, 7), 2u);
  EXPECT_FALSE(index_.RemovePin(a, 8));  // Not 8's pin.
  EXPECT_EQ(index_.ReleaseOwner(7), 2u);
  EXPECT_EQ(index_.ram_lru().size(), 1u);
  EXPECT_EQ(index_.ram_lru().front(), a);
  EXPECT_TRUE(index_.RemovePin(b, 8));
  EXPECT_EQ(index_.pinned_blocks(), 0u);
  EXPECT_EQ(index_.pin_count(), 0u);
  EXPECT_EQ(index_.evictable_bytes(), 8 * kKiB);
}

TEST_F(BlockIndexTest, ReleaseOwnerReachesABreadcrumbBeingSavedAgain) {
  IndexEntry* e = Add("ns", "s", 0);
  index_.AddPin(e, 7);
  index_.Quarantine(e);  // Its only copy failed: a pinned breadcrumb.
  ASSERT_EQ(e->state, BlockState::kBreadcrumb);
  bool revived = false;
  ASSERT_EQ(index_.BeginWrite(e->id, &revived), e);
  EXPECT_EQ(index_.ReleaseOwner(7), 1u);
  EXPECT_EQ(e->pins, 0u);
  EXPECT_EQ(index_.pin_count(), 0u);
  EXPECT_EQ(index_.pinned_blocks(), 0u);
}

TEST_F(BlockIndexTest, TouchMovesToTheHotEnd) {
  IndexEntry* a = Add("ns", "s", 0);
  IndexEntry* b = Add("ns", "s", 1);
  EXPECT_EQ(index_.ram_lru().back(), a);  // Coldest.
  index_.Touch(a, 99);
  EXPECT_EQ(index_.ram_lru().back(), b);
  EXPECT_EQ(a->last_access_ms, 99);
}

TEST_F(BlockIndexTest, RemovedWhileReadKeepsBytesUntilTheLastReader) {
  IndexEntry* e = Add("ns", "s", 0, 16 * kKiB);
  index_.AddReader(e);
  const BlockId id = e->id;
  index_.Remove(e);
  EXPECT_EQ(index_.Find(id), nullptr);
  EXPECT_EQ(e->state, BlockState::kRemoved);
  EXPECT_EQ(host_->used_bytes(), 16 * kKiB);  // A reader still copies from it.
  EXPECT_EQ(index_.ram_blocks(), 0u);
  index_.ReleaseReader(e);
  EXPECT_EQ(host_->used_bytes(), 0u);
  EXPECT_EQ(index_.count(BlockState::kRemoved), 0u);
}

TEST_F(BlockIndexTest, QuarantineWaitsForReaders) {
  IndexEntry* e = Add("ns", "s", 0);
  index_.AddReader(e);
  index_.Quarantine(e);
  EXPECT_TRUE(e->in_ram());
  EXPECT_FALSE(e->ram_readable());
  index_.ReleaseReader(e);
  EXPECT_EQ(e->state, BlockState::kBreadcrumb);
  EXPECT_EQ(host_->used_bytes(), 0u);
}

TEST_F(BlockIndexTest, RecoveredEntriesAreOrderedByLastAccess) {
  const v1::BlockMeta old_meta = Meta("ns", "s", 0, 4 * kKiB);
  const v1::BlockMeta new_meta = Meta("ns", "s", 1, 4 * kKiB);
  const v1::BlockMeta crumb = Meta("ns", "s", 2, 4 * kKiB);
  IndexEntry* fresh = index_.AddRecovered(BlockId::FromBytes(new_meta.id()).value(),
                                          new_meta, true, 200);
  IndexEntry* old = index_.AddRecovered(BlockId::FromBytes(old_meta.id()).value(),
                                        old_meta, true, 100);
  index_.AddRecovered(BlockId::FromBytes(crumb.id()).value(), crumb, false, 300);
  index_.FinishLoading();
  EXPECT_EQ(index_.disk_blocks(), 2u);
  EXPECT_EQ(index_.count(BlockState::kBreadcrumb), 1u);
  EXPECT_EQ(index_.disk_lru().front(), fresh);
  EXPECT_EQ(index_.disk_lru().back(), old);
  EXPECT_EQ(index_.SessionIds("ns", "s").size(), 3u);
}

TEST_F(BlockIndexTest, ListUsesSecondaryIndexesAndResumes) {
  for (int i = 0; i < 50; ++i) Add("a", "s1", i);
  for (int i = 0; i < 7; ++i) Add("b", "s2", i);
  for (int i = 0; i < 5; ++i) Add("b", "s1", i);  // Same session id, other namespace.

  std::vector<BlockInfo> out;
  ListFilter by_ns{"b", "", std::nullopt};
  EXPECT_EQ(index_.ListPage(by_ns, nullptr, 100, 1000, &out), std::nullopt);
  EXPECT_EQ(out.size(), 12u);
  for (const BlockInfo& b : out) EXPECT_EQ(b.meta.fingerprint().namespace_(), "b");

  // A selective filter visits only its own entries: with a budget of 8
  // visits (of 62 blocks) it still finds all 7 of b/s2 and reaches the end.
  out.clear();
  ListFilter by_session{"b", "s2", std::nullopt};
  EXPECT_EQ(index_.ListPage(by_session, nullptr, 100, 8, &out), std::nullopt);
  EXPECT_EQ(out.size(), 7u);

  // Session alone spans namespaces, in id order.
  out.clear();
  ListFilter s1{"", "s1", std::nullopt};
  index_.ListPage(s1, nullptr, 100, 1000, &out);
  EXPECT_EQ(out.size(), 55u);
  for (size_t i = 1; i < out.size(); ++i) {
    EXPECT_LT(BlockId::FromBytes(out[i - 1].meta.id()).value(),
              BlockId::FromBytes(out[i].meta.id()).value());
  }

  // A walk cut by its visit budget resumes where it stopped, missing
  // nothing and repeating nothing.
  std::vector<BlockInfo> all;
  std::optional<BlockId> cursor;
  int rounds = 0;
  do {
    cursor = index_.ListPage({}, cursor ? &*cursor : nullptr, 1000, 10, &all);
    ++rounds;
  } while (cursor);
  EXPECT_EQ(all.size(), 62u);
  EXPECT_GE(rounds, 7);

  // The location filter.
  IndexEntry* e = index_.FindVisible(BlockId::FromBytes(out[0].meta.id()).value());
  index_.MarkOnDisk(e);
  index_.DetachRam(e).Release();
  std::vector<BlockInfo> on_disk;
  ListFilter disk_only{"", "", BlockLocation::kDisk};
  index_.ListPage(disk_only, nullptr, 100, 1000, &on_disk);
  ASSERT_EQ(on_disk.size(), 1u);
  EXPECT_EQ(on_disk[0].meta.id(), out[0].meta.id());
  EXPECT_TRUE(on_disk[0].on_disk);
}

TEST_F(BlockIndexTest, DirtyByAccessIsColdestFirst) {
  IndexEntry* a = Add("ns", "s", 0);
  IndexEntry* b = Add("ns", "s", 1);
  IndexEntry* c = Add("ns", "s", 2);
  index_.MarkOnDisk(b);
  index_.Touch(a, 50);
  const std::vector<IndexEntry*> dirty = index_.DirtyByAccess();
  ASSERT_EQ(dirty.size(), 2u);
  EXPECT_EQ(dirty[0], c);
  EXPECT_EQ(dirty[1], a);
}

}  // namespace
}  // namespace evoke
