#include "daemon/lease_manager.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "common/chain_hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/pinned_arena.h"
#include "testing/blocks.h"
#include "testing/fake_clock.h"
#include "testing/memory_tier.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

using ::evoke::testing::FakeClock;
using ::evoke::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A region that only counts as registered memory.
class FakeRegion final : public Region {
 public:
  Kind kind() const override { return Kind::kSharedMemory; }
  uint64_t size() const override { return 4096; }
};

class LeaseManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PinnedArenaOptions arena_options;
    arena_options.capacity_bytes = 1 << 20;
    arena_options.lock_memory = false;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PinnedArena> arena,
                         PinnedArena::Create(arena_options));
    ASSERT_OK_AND_ASSIGN(tiers_, TierManager::Open(TierManagerOptions(), std::move(arena),
                                                   std::make_unique<testing::MemoryTier>()));
  }

  // SavePinned saves one small block pinned by `owner`.
  void SavePinned(uint64_t seq, PinOwner owner) {
    const v1::BlockMeta meta = evoke::testing::SessionMeta(
        evoke::testing::OpaqueFingerprint("ns", "m"), "s", seq, /*n_tokens=*/1,
        /*layer_begin=*/0, /*layer_end=*/1, /*first_position=*/0);
    const std::string payload(1024, static_cast<char>('a' + seq));
    const SaveItem item{&meta, payload.size(), /*pin=*/true};
    HostSaveSource source({payload});
    ASSERT_OK(tiers_->Save({&item, 1}, source, false, absl::InfiniteFuture(), owner));
  }

  FakeClock clock_;
  std::unique_ptr<TierManager> tiers_;
};

TEST_F(LeaseManagerTest, IdleLeasesExpireByTheClock) {
  LeaseManagerOptions options;
  options.idle_timeout = absl::Minutes(1);
  options.clock = &clock_;
  LeaseManager leases(options, tiers_.get());
  const absl::Time t0 = clock_.Now();
  ASSERT_OK_AND_ASSIGN(Lease busy, leases.Grant("busy"));
  ASSERT_OK_AND_ASSIGN(Lease idle, leases.Grant("idle"));
  auto region = std::make_shared<FakeRegion>();
  std::weak_ptr<Region> region_alive = region;
  ASSERT_OK(leases.AddRegion(idle.id, std::move(region)));
  SavePinned(0, idle.owner);
  SavePinned(1, busy.owner);

  // Nothing is idle for a minute yet.
  clock_.Advance(absl::Seconds(59));
  EXPECT_EQ(leases.ExpireIdle(), 0u);
  ASSERT_OK(leases.Find(busy.id.ToBytes()));  // Uses `busy` at t0 + 59 s.
  clock_.Advance(absl::Seconds(1));           // `idle`: exactly one minute.
  EXPECT_EQ(leases.ExpireIdle(), 1u);

  EXPECT_THAT(leases.Find(idle.id.ToBytes()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("lease_id")));
  ASSERT_OK_AND_ASSIGN(LeaseInfo info, leases.Describe(busy.id));
  EXPECT_EQ(info.client_name, "busy");
  EXPECT_EQ(info.granted, t0);
  EXPECT_EQ(info.last_used, t0 + absl::Seconds(59));
  // Its regions went, and its pins; the other lease's pin stays.
  EXPECT_TRUE(region_alive.expired());
  ASSERT_OK_AND_ASSIGN(BlockInfo unpinned, tiers_->Describe(SessionBlockId("ns", "s", 0)));
  EXPECT_EQ(unpinned.pin_count, 0u);
  ASSERT_OK_AND_ASSIGN(BlockInfo pinned, tiers_->Describe(SessionBlockId("ns", "s", 1)));
  EXPECT_EQ(pinned.pin_count, 1u);
  const v1::LeaseStat stat = leases.Stats();
  EXPECT_EQ(stat.leases(), 1u);
  EXPECT_EQ(stat.leases_expired(), 1u);
  EXPECT_EQ(stat.pins_released_on_expiry(), 1u);

  // Region calls count as use too.
  clock_.Advance(absl::Seconds(50));
  ASSERT_OK_AND_ASSIGN(uint64_t rid, leases.AddRegion(busy.id, std::make_shared<FakeRegion>()));
  clock_.Advance(absl::Seconds(50));
  EXPECT_EQ(leases.ExpireIdle(), 0u);
  ASSERT_OK(leases.GetRegion(busy.id, rid, "region"));
  clock_.Advance(absl::Seconds(59));
  EXPECT_EQ(leases.ExpireIdle(), 0u);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(leases.ExpireIdle(), 1u);
  EXPECT_EQ(leases.Stats().leases(), 0u);
  // Ending an expired lease again is harmless.
  leases.End(busy.id);
  EXPECT_EQ(leases.Stats().leases_expired(), 2u);
}

TEST_F(LeaseManagerTest, ByDefaultLeasesNeverExpireByTime) {
  LeaseManagerOptions options;
  options.clock = &clock_;
  LeaseManager leases(options, tiers_.get());
  ASSERT_OK_AND_ASSIGN(Lease lease, leases.Grant("engine"));
  clock_.Advance(absl::Hours(24 * 365));
  EXPECT_EQ(leases.ExpireIdle(), 0u);
  EXPECT_OK(leases.Find(lease.id.ToBytes()));
}

TEST_F(LeaseManagerTest, AClockGoingBackwardsDoesNotExpireOrRejuvenate) {
  LeaseManagerOptions options;
  options.idle_timeout = absl::Minutes(1);
  options.clock = &clock_;
  LeaseManager leases(options, tiers_.get());
  ASSERT_OK_AND_ASSIGN(Lease lease, leases.Grant("engine"));
  const absl::Time t0 = clock_.Now();
  clock_.Advance(absl::Seconds(-3600));
  ASSERT_OK(leases.Find(lease.id.ToBytes()));
  EXPECT_EQ(leases.ExpireIdle(), 0u);
  // The use recorded while the clock was behind does not move last_used
  // back: the lease expires a minute after t0, not after t0 - 1 h.
  ASSERT_OK_AND_ASSIGN(LeaseInfo info, leases.Describe(lease.id));
  EXPECT_EQ(info.last_used, t0);
  clock_.Set(t0 + absl::Minutes(1));
  EXPECT_EQ(leases.ExpireIdle(), 1u);
}

// --- Shared-memory registration: owners and caps (issue #11).

int SealedMemfd(uint64_t size) {
  const int fd = memfd_create("lease-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
  EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  return fd;
}

TEST_F(LeaseManagerTest, LeasesRecordTheirOwnerUid) {
  LeaseManager leases(LeaseManagerOptions(), tiers_.get());
  ASSERT_OK_AND_ASSIGN(Lease mine, leases.Grant("engine", 1000));
  EXPECT_EQ(mine.owner_uid, 1000u);
  ASSERT_OK_AND_ASSIGN(Lease found, leases.Find(mine.id.ToBytes()));
  EXPECT_EQ(found.owner_uid, 1000u);
  ASSERT_OK_AND_ASSIGN(LeaseInfo info, leases.Describe(mine.id));
  EXPECT_EQ(info.owner_uid, 1000u);
  // Callers that do not know the peer: the daemon's own uid.
  ASSERT_OK_AND_ASSIGN(Lease dflt, leases.Grant("engine"));
  EXPECT_EQ(dflt.owner_uid, geteuid());
}

TEST_F(LeaseManagerTest, AnotherUidSeesMyLeaseAsUnknown) {
  LeaseManagerOptions options;
  options.idle_timeout = absl::Minutes(1);
  options.clock = &clock_;
  LeaseManager leases(options, tiers_.get());
  ASSERT_OK_AND_ASSIGN(Lease mine, leases.Grant("engine", 1000));
  const absl::Status unknown =
      leases.AddSharedMemoryRegion(std::string(16, 'z'), 1000, SealedMemfd(4096), 4096).status();
  EXPECT_THAT(unknown, StatusIs(absl::StatusCode::kNotFound));
  const int fd = SealedMemfd(4096);
  clock_.Advance(absl::Seconds(59));
  // Exactly the answer to an unknown lease, and no use of the lease.
  EXPECT_EQ(leases.AddSharedMemoryRegion(mine.id.ToBytes(), 2000, fd, 4096).status(), unknown);
  EXPECT_EQ(fcntl(fd, F_GETFD), -1) << "the refused fd was kept";
  EXPECT_EQ(leases.Stats().shm_regions(), 0u);
  EXPECT_EQ(leases.AddSharedMemoryRegion(mine.id.ToBytes(), 0, SealedMemfd(4096), 4096).status(),
            unknown) << "root is another uid too";
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(leases.ExpireIdle(), 1u) << "a refused attempt kept the lease alive";
  // Its owner can.
  ASSERT_OK_AND_ASSIGN(Lease again, leases.Grant("engine", 1000));
  ASSERT_OK_AND_ASSIGN(uint64_t rid, leases.AddSharedMemoryRegion(again.id.ToBytes(), 1000,
                                                                  SealedMemfd(4096), 4096));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Region> region, leases.GetRegion(again.id, rid, "r"));
  EXPECT_EQ(region->size(), 4096u);
  EXPECT_EQ(leases.mapping_budget().OfUid(1000).mappings, 1u);
}

TEST_F(LeaseManagerTest, MappingCapsCountAcrossLeasesAndPerUid) {
  LeaseManagerOptions options;
  options.max_mappings = 6;
  options.max_mappings_per_uid = 4;
  LeaseManager leases(options, tiers_.get());
  ASSERT_OK_AND_ASSIGN(Lease a1, leases.Grant("a1", 1000));
  ASSERT_OK_AND_ASSIGN(Lease a2, leases.Grant("a2", 1000));
  ASSERT_OK_AND_ASSIGN(Lease b, leases.Grant("b", 2000));
  ASSERT_OK_AND_ASSIGN(Lease c, leases.Grant("c", 3000));
  for (const Lease* l : {&a1, &a1, &a2, &a2}) {
    ASSERT_OK(leases.AddSharedMemoryRegion(l->id.ToBytes(), 1000, SealedMemfd(4096), 4096));
  }
  EXPECT_THAT(leases.AddSharedMemoryRegion(a2.id.ToBytes(), 1000, SealedMemfd(4096), 4096),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("uid 1000")));
  ASSERT_OK(leases.AddSharedMemoryRegion(b.id.ToBytes(), 2000, SealedMemfd(4096), 4096));
  ASSERT_OK(leases.AddSharedMemoryRegion(b.id.ToBytes(), 2000, SealedMemfd(4096), 4096));
  EXPECT_THAT(leases.AddSharedMemoryRegion(c.id.ToBytes(), 3000, SealedMemfd(4096), 4096),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-mappings)")));
  // Ending a lease unmaps its regions and returns their share.
  leases.End(a1.id);
  ASSERT_OK(leases.AddSharedMemoryRegion(c.id.ToBytes(), 3000, SealedMemfd(4096), 4096));
  EXPECT_EQ(leases.mapping_budget().Total().mappings, 5u);
  EXPECT_EQ(leases.Stats().shm_regions(), 5u);
}

// One uid cannot take every lease: by default it gets a quarter of them,
// and ending one gives its share back.
TEST_F(LeaseManagerTest, LeasesAreCappedPerUid) {
  LeaseManagerOptions options;
  options.max_leases = 16;
  LeaseManager leases(options, tiers_.get());
  EXPECT_EQ(leases.max_leases_per_uid(), 4u);
  std::vector<Lease> mine;
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(Lease l, leases.Grant("hog", 1000));
    mine.push_back(l);
  }
  EXPECT_THAT(leases.Grant("hog", 1000),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("uid 1000"), HasSubstr("--max-leases-per-uid"))));
  for (uid_t other : {2000u, 3000u, 4000u}) {
    for (int i = 0; i < 4; ++i) ASSERT_OK(leases.Grant("other", other).status());
  }
  // All 16 are taken now: the global cap answers, naming its flag.
  EXPECT_THAT(leases.Grant("late", 5000),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-leases)")));
  leases.End(mine[0].id);
  ASSERT_OK(leases.Grant("hog", 1000).status());
  LeaseManagerOptions explicit_cap;
  explicit_cap.max_leases = 16;
  explicit_cap.max_leases_per_uid = 10;
  EXPECT_EQ(LeaseManager(explicit_cap, tiers_.get()).max_leases_per_uid(), 10u);
}

TEST_F(LeaseManagerTest, MappingCapsDefaultWellUnderTheKernelLimit) {
  LeaseManager dflt(LeaseManagerOptions(), tiers_.get());
  EXPECT_EQ(dflt.mapping_budget().limits().max_mappings, DefaultMaxMappings());
  EXPECT_EQ(dflt.mapping_budget().limits().max_mappings_per_uid, DefaultMaxMappings() / 4);
  LeaseManagerOptions options;
  options.max_mappings = 1ull << 40;  // Lowered to what the kernel allows.
  options.max_mapped_bytes = 1 << 20;
  options.max_mapped_bytes_per_uid = 1ull << 40;
  LeaseManager capped(options, tiers_.get());
  EXPECT_EQ(capped.mapping_budget().limits().max_mappings, DefaultMaxMappings());
  EXPECT_EQ(capped.mapping_budget().limits().max_bytes_per_uid, 1u << 20);
}

}  // namespace
}  // namespace evoke

namespace evoke {
namespace {

// Handles: one PinOwner each, capped per lease, scoped to their lease, and
// released with it.
TEST_F(LeaseManagerTest, HandlesAreTheLeasesOwnAndEndWithIt) {
  LeaseManagerOptions options;
  options.max_handles_per_lease = 2;
  LeaseManager leases(options, tiers_.get());
  ASSERT_OK_AND_ASSIGN(Lease mine, leases.Grant("mine"));
  ASSERT_OK_AND_ASSIGN(Lease other, leases.Grant("other"));
  ASSERT_OK_AND_ASSIGN(LeaseManager::Handle a, leases.NewHandle(mine.id));
  ASSERT_OK_AND_ASSIGN(LeaseManager::Handle b, leases.NewHandle(mine.id));
  EXPECT_NE(a.id, b.id);
  EXPECT_NE(a.owner, b.owner);
  EXPECT_NE(a.owner, mine.owner);
  EXPECT_THAT(leases.NewHandle(mine.id),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("2 handles")));
  SavePinned(0, a.owner);
  SavePinned(1, b.owner);
  SavePinned(2, mine.owner);

  // Another lease cannot name them; the lease itself can, once.
  EXPECT_THAT(leases.TakeHandle(other.id, a.id),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("handle")));
  EXPECT_TRUE(leases.HasHandle(mine.id, a.id));
  ASSERT_OK_AND_ASSIGN(PinOwner owner, leases.TakeHandle(mine.id, a.id));
  EXPECT_EQ(owner, a.owner);
  EXPECT_FALSE(leases.HasHandle(mine.id, a.id));
  EXPECT_THAT(leases.TakeHandle(mine.id, a.id), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(tiers_->ReleaseOwner(owner), 1u);

  // Ending the lease releases its own pins and its open handles' pins.
  leases.End(mine.id);
  EXPECT_FALSE(leases.HasHandle(mine.id, b.id));
  EXPECT_THAT(leases.NewHandle(mine.id), StatusIs(absl::StatusCode::kNotFound));
  for (uint64_t seq : {0, 1, 2}) {
    ASSERT_OK_AND_ASSIGN(BlockInfo info, tiers_->Describe(SessionBlockId("ns", "s", seq)));
    EXPECT_EQ(info.pin_count, 0u) << seq;
  }
}

}  // namespace
}  // namespace evoke
