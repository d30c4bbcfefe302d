#include "storage/pinned_arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;

std::unique_ptr<PinnedArena> MakeArena(uint64_t capacity) {
  PinnedArenaOptions options;
  options.capacity_bytes = capacity;
  options.lock_memory = false;
  auto arena = PinnedArena::Create(options);
  EXPECT_TRUE(arena.ok()) << arena.status();
  return std::move(arena).value();
}

TEST(PinnedArenaTest, RejectsBadOptions) {
  PinnedArenaOptions options;
  options.capacity_bytes = 100;
  EXPECT_THAT(PinnedArena::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument));
  options.capacity_bytes = 1 << 20;
  options.granule_bytes = 5000;
  EXPECT_THAT(PinnedArena::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(PinnedArenaTest, SizeClassesBoundWaste) {
  auto arena = MakeArena(64 << 20);
  EXPECT_EQ(arena->RoundedSize(1), 4096u);
  EXPECT_EQ(arena->RoundedSize(4096), 4096u);
  EXPECT_EQ(arena->RoundedSize(4097), 8192u);
  EXPECT_EQ(arena->RoundedSize(64 << 10), 64u << 10);
  EXPECT_EQ(arena->RoundedSize(1 << 20), 1u << 20);
  for (uint64_t size = 1; size < (32u << 20); size = size * 3 / 2 + 7) {
    const uint64_t r = arena->RoundedSize(size);
    EXPECT_GE(r, size);
    EXPECT_EQ(r % 4096, 0u);
    if (size > 8 * 4096) {
      EXPECT_LE(r, size + size / 8 + 4096) << size;
    }
  }
}

TEST(PinnedArenaTest, AllocateFreeCoalesce) {
  auto arena = MakeArena(1 << 20);
  ASSERT_OK_AND_ASSIGN(Extent a, arena->Allocate(256 << 10));
  ASSERT_OK_AND_ASSIGN(Extent b, arena->Allocate(256 << 10));
  ASSERT_OK_AND_ASSIGN(Extent c, arena->Allocate(512 << 10));
  EXPECT_EQ(arena->GetStats().used_bytes, 1u << 20);
  EXPECT_THAT(arena->Allocate(1), StatusIs(absl::StatusCode::kResourceExhausted));
  arena->Free(b);
  EXPECT_EQ(arena->LargestFreeBytes(), 256u << 10);
  EXPECT_THAT(arena->Allocate(300 << 10),
              StatusIs(absl::StatusCode::kResourceExhausted));
  arena->Free(a);  // Coalesces with b's range.
  EXPECT_EQ(arena->LargestFreeBytes(), 512u << 10);
  arena->Free(c);
  EXPECT_EQ(arena->LargestFreeBytes(), 1u << 20);
  EXPECT_EQ(arena->GetStats().used_bytes, 0u);
  EXPECT_EQ(arena->GetStats().extents, 0u);
}

TEST(PinnedArenaTest, ContiguousBatchesAreAdjacentAndFreedOneByOne) {
  auto arena = MakeArena(1 << 20);
  ASSERT_OK_AND_ASSIGN(Extent first, arena->Allocate(4096));
  const uint64_t sizes[] = {100, 64 << 10, 5000, 4096};
  ASSERT_OK_AND_ASSIGN(std::vector<Extent> batch, arena->AllocateContiguous(sizes));
  ASSERT_EQ(batch.size(), 4u);
  for (size_t i = 0; i + 1 < batch.size(); ++i) {
    EXPECT_EQ(batch[i].offset + batch[i].length, batch[i + 1].offset);
    EXPECT_GE(batch[i].length, sizes[i]);
  }
  EXPECT_EQ(arena->GetStats().extents, 5u);
  for (const Extent& e : batch) arena->Free(e);
  arena->Free(first);
  EXPECT_EQ(arena->UsedBytes(), 0u);
  EXPECT_EQ(arena->LargestFreeBytes(), 1u << 20);
  const uint64_t too_big[] = {600 << 10, 600 << 10};
  EXPECT_THAT(arena->AllocateContiguous(too_big),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(PinnedArenaTest, RejectsZeroAndOversized) {
  auto arena = MakeArena(1 << 20);
  EXPECT_THAT(arena->Allocate(0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(arena->Allocate((1 << 20) + 1),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

// Random allocations and frees against a model: extents never overlap, never
// leave the region, the budget is never exceeded, and the bytes of one
// extent are never disturbed by work on another.
TEST(PinnedArenaTest, RandomizedAgainstModel) {
  constexpr uint64_t kCapacity = 8 << 20;
  auto arena = MakeArena(kCapacity);
  std::mt19937_64 rng(12345);
  std::map<uint64_t, std::pair<Extent, uint8_t>> live;  // offset -> (extent, fill)
  for (int step = 0; step < 20000; ++step) {
    const bool alloc = live.empty() || rng() % 100 < 55;
    if (alloc) {
      const uint64_t size = 1 + rng() % (256 << 10);
      absl::StatusOr<Extent> e = arena->Allocate(size);
      if (!e.ok()) {
        ASSERT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted);
        EXPECT_LT(arena->LargestFreeBytes(), arena->RoundedSize(size));
        continue;
      }
      ASSERT_GE(e->length, size);
      ASSERT_LE(e->offset + e->length, kCapacity);
      auto next = live.lower_bound(e->offset);
      if (next != live.end()) {
        ASSERT_GE(next->first, e->offset + e->length);
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second.first.length, e->offset);
      }
      const uint8_t fill = static_cast<uint8_t>(rng());
      std::memset(arena->Data(*e), fill, e->length);
      live[e->offset] = {*e, fill};
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      const auto [extent, fill] = it->second;
      const uint8_t* p = arena->Data(extent);
      for (uint64_t i = 0; i < extent.length; i += 509) ASSERT_EQ(p[i], fill);
      arena->Free(extent);
      live.erase(it);
    }
    uint64_t used = 0;
    for (const auto& [off, v] : live) used += v.first.length;
    ASSERT_EQ(arena->UsedBytes(), used);
    ASSERT_LE(used, kCapacity);
  }
  for (const auto& [off, v] : live) arena->Free(v.first);
  EXPECT_EQ(arena->LargestFreeBytes(), kCapacity);
}

TEST(PinnedArenaTest, ReportsLocking) {
  PinnedArenaOptions options;
  options.capacity_bytes = 1 << 20;
  options.lock_memory = true;
  ASSERT_OK_AND_ASSIGN(auto arena, PinnedArena::Create(options));
  const PinnedArena::Stats stats = arena->GetStats();
  // Either the region is locked, or the reason it is not is reported.
  EXPECT_NE(stats.locked, !stats.lock_error.empty());
}

// Pages of [p, p + n) in memory, by mincore; nullopt when it cannot tell.
std::optional<size_t> ResidentPages(const uint8_t* p, size_t n) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> v((n + page - 1) / page);
  if (mincore(const_cast<uint8_t*>(p), n, v.data()) != 0) return std::nullopt;
  size_t resident = 0;
  for (unsigned char c : v) resident += c & 1;
  return resident;
}

TEST(PinnedArenaTest, PrefaultFaultsEveryPageInWhenNotLocked) {
  PinnedArenaOptions options;
  options.capacity_bytes = 96 << 20;  // More than one prefault slice.
  options.lock_memory = false;
  const size_t pages = options.capacity_bytes / static_cast<size_t>(sysconf(_SC_PAGESIZE));
  {
    options.prefault = false;
    ASSERT_OK_AND_ASSIGN(auto arena, PinnedArena::Create(options));
    EXPECT_TRUE(arena->WaitForPrefault(absl::ZeroDuration()));
    const std::optional<size_t> resident = ResidentPages(arena->base(), arena->capacity_bytes());
    if (!resident) GTEST_SKIP() << "mincore cannot report residency here: " << strerror(errno);
    EXPECT_EQ(*resident, 0u);
    EXPECT_EQ(arena->GetStats().prefaulted_bytes, 0u);
    EXPECT_NE(arena->GetStats().prefault_error, "");
  }
  options.prefault = true;
  ASSERT_OK_AND_ASSIGN(auto arena, PinnedArena::Create(options));
  ASSERT_TRUE(arena->WaitForPrefault(absl::Seconds(60)));
  const PinnedArena::Stats stats = arena->GetStats();
  if (stats.prefault_error.find("Invalid argument") != std::string::npos) {
    GTEST_SKIP() << "this kernel cannot prefault (before Linux 5.14): " << stats.prefault_error;
  }
  EXPECT_EQ(stats.prefault_error, "");
  EXPECT_EQ(stats.prefaulted_bytes, options.capacity_bytes);
  EXPECT_EQ(ResidentPages(arena->base(), arena->capacity_bytes()), std::optional<size_t>(pages));
  // The memory is as before: zeroes, and usable.
  ASSERT_OK_AND_ASSIGN(Extent e, arena->Allocate(1 << 20));
  EXPECT_EQ(arena->Data(e)[12345], 0);
  std::memset(arena->Data(e), 7, 1 << 20);
  arena->Free(e);
}

TEST(PinnedArenaTest, DestroyedWhilePrefaulting) {
  PinnedArenaOptions options;
  options.capacity_bytes = 1ull << 30;
  options.lock_memory = false;
  ASSERT_OK_AND_ASSIGN(auto arena, PinnedArena::Create(options));
  arena.reset();  // Stops the prefault between slices, then unmaps.
}

}  // namespace
}  // namespace evoke
