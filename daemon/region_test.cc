// Shared-memory regions against hostile descriptors, and the caps on what
// the daemon maps (issue #11, "hostile or slow clients").
#include "daemon/region.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/fd_passing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::HasSubstr;

constexpr unsigned kSeals = F_SEAL_SHRINK | F_SEAL_GROW;

// A memfd of `size` bytes (sparse) with `seals`.
int Memfd(uint64_t size, unsigned seals = kSeals) {
  const int fd = memfd_create("region-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
  if (seals != 0) {
    EXPECT_EQ(fcntl(fd, F_ADD_SEALS, seals), 0);
  }
  return fd;
}

// Whether `fd` is open in this process.
bool IsOpen(int fd) { return fcntl(fd, F_GETFD) >= 0; }

// A kB field of /proc/self/status (e.g. "RssShmem"), in bytes.
uint64_t StatusBytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      return std::stoull(line.substr(field.size() + 1)) * 1024;
    }
  }
  return 0;
}

constexpr uint64_t kMax = 64ull << 30;

// Map with a descriptor it must refuse: the status, and the descriptor is
// closed (Map owns it on every path).
absl::Status MapRefused(int fd, uint64_t size, uint64_t max = kMax) {
  absl::StatusOr<std::unique_ptr<ShmRegion>> r = ShmRegion::Map(fd, size, max);
  EXPECT_FALSE(IsOpen(fd)) << "Map kept fd " << fd;
  return r.status();
}

TEST(ShmRegionTest, MapsASealedMemfdReadWriteShared) {
  const int fd = Memfd(8192);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShmRegion> r, ShmRegion::Map(dup(fd), 8192, kMax));
  EXPECT_EQ(r->size(), 8192u);
  r->host_data()[4096] = 'x';
  char c = 0;
  ASSERT_EQ(pread(fd, &c, 1, 4096), 1);
  EXPECT_EQ(c, 'x');
  close(fd);
}

// Finding: MAP_POPULATE made the daemon allocate every page of whatever
// size a sparse memfd claimed (1 GiB per registration here).
TEST(ShmRegionTest, SparseMemfdIsNotPopulated) {
  const uint64_t before = StatusBytes("RssShmem");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShmRegion> r, ShmRegion::Map(Memfd(1ull << 30), 1ull << 30, kMax));
  const uint64_t after = StatusBytes("RssShmem");
  EXPECT_LT(after, before + (16ull << 20)) << "mapping 1 GiB sparse grew RssShmem from "
                                           << before << " to " << after;
}

TEST(ShmRegionTest, RefusesWhatIsNotASealedMemfdOfTheSize) {
  EXPECT_THAT(MapRefused(Memfd(4096, 0), 4096),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("sealed with F_SEAL_SHRINK and F_SEAL_GROW")));
  EXPECT_THAT(MapRefused(Memfd(4096, F_SEAL_GROW), 4096),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("F_SEAL_SHRINK is missing")));
  EXPECT_THAT(MapRefused(Memfd(4096, F_SEAL_SHRINK), 4096),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("F_SEAL_GROW is missing")));
  // Undersized (the client declares more than it has) and oversized.
  EXPECT_THAT(MapRefused(Memfd(4096), 8192),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("8192 does not match the memfd's size 4096")));
  EXPECT_THAT(MapRefused(Memfd(8192), 4096),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("does not match")));
  EXPECT_THAT(MapRefused(Memfd(0), 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("size: 0 must be in")));
  EXPECT_THAT(MapRefused(Memfd(8192), 8192, /*max=*/4096),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--max-region-bytes")));
  EXPECT_THAT(MapRefused(Memfd(4096, kSeals | F_SEAL_WRITE), 4096),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("F_SEAL_WRITE")));
  EXPECT_THAT(MapRefused(Memfd(4096, kSeals | F_SEAL_FUTURE_WRITE), 4096),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("F_SEAL_FUTURE_WRITE")));
  // A sealed memfd opened read-only (through /proc): no shared writable map.
  const int rw = Memfd(4096);
  const int ro = open(("/proc/self/fd/" + std::to_string(rw)).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(ro, 0);
  EXPECT_THAT(MapRefused(ro, 4096),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cannot map read-write")));
  // An O_PATH descriptor of a memfd: no seals can be read through it.
  const int path_only = open(("/proc/self/fd/" + std::to_string(rw)).c_str(), O_PATH | O_CLOEXEC);
  ASSERT_GE(path_only, 0);
  EXPECT_THAT(MapRefused(path_only, 4096), StatusIs(absl::StatusCode::kInvalidArgument));
  close(rw);
}

TEST(ShmRegionTest, RefusesOtherFileTypesByName) {
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  close(p[1]);
  EXPECT_THAT(MapRefused(p[0], 4096),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("a pipe")));
  evoke::testing::TempDir dir;
  EXPECT_THAT(MapRefused(open(dir.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC), 4096),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("a directory")));
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  close(sv[1]);
  EXPECT_THAT(MapRefused(sv[0], 4096),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("a socket")));
  EXPECT_THAT(MapRefused(open("/dev/zero", O_RDWR | O_CLOEXEC), 4096),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("a character device")));
  EXPECT_THAT(MapRefused(eventfd(0, EFD_CLOEXEC), 4096),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a memfd")));
  // A regular file on disk, of the right size: not shared memory.
  const std::string path = dir.Join("plain");
  const int plain = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_EQ(ftruncate(plain, 4096), 0);
  EXPECT_THAT(MapRefused(plain, 4096),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be a memfd sealed")));
  EXPECT_THAT(MapRefused(-1, 4096), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ShmRegionTest, SealsForbidShrinkingAfterMapping) {
  const int fd = Memfd(1 << 20);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShmRegion> r, ShmRegion::Map(dup(fd), 1 << 20, kMax));
  EXPECT_NE(ftruncate(fd, 4096), 0);  // EPERM: the daemon can never SIGBUS.
  EXPECT_NE(ftruncate(fd, 2 << 20), 0);
  r->host_data()[(1 << 20) - 1] = 1;  // The last page is still there.
  close(fd);
}

// A mapping the kernel refuses (here: more address space than exists) is an
// error, never an abort.
TEST(ShmRegionTest, RefusedMmapIsResourceExhausted) {
  const uint64_t huge = 1ull << 48;  // 256 TiB: more than user address space.
  const int fd = Memfd(huge);
  EXPECT_THAT(ShmRegion::Map(fd, huge, UINT64_MAX),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("refused to map")));
  EXPECT_FALSE(IsOpen(fd));
}

TEST(RegionTest, CheckSliceRefusesEmptyAndOverflowingSlices) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShmRegion> r, ShmRegion::Map(Memfd(8192), 8192, kMax));
  EXPECT_OK(r->CheckSlice(0, 8192, "s"));
  EXPECT_OK(r->CheckSlice(8191, 1, "s"));
  EXPECT_THAT(r->CheckSlice(0, 0, "s"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("s.length: must be > 0")));
  EXPECT_THAT(r->CheckSlice(8192, 1, "s"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(r->CheckSlice(1, 8192, "s"), StatusIs(absl::StatusCode::kInvalidArgument));
  // offset + length wraps around 2^64.
  EXPECT_THAT(r->CheckSlice(UINT64_MAX, 2, "s"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(r->CheckSlice(4096, UINT64_MAX - 4095, "s"),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// --- MappingBudget

TEST(MappingBudgetTest, DefaultMaxMappingsStaysWellUnderTheKernelLimit) {
  std::ifstream in("/proc/sys/vm/max_map_count");
  uint64_t kernel = 65530;
  in >> kernel;
  EXPECT_LE(DefaultMaxMappings(), kernel / 4);
  EXPECT_LE(DefaultMaxMappings(), 16384u);
  EXPECT_GT(DefaultMaxMappings(), 0u);
}

TEST(MappingBudgetTest, CapsCountsAndBytesInAllAndPerUid) {
  MappingLimits limits;
  limits.max_mappings = 4;
  limits.max_mappings_per_uid = 3;
  limits.max_bytes = 1000;
  limits.max_bytes_per_uid = 600;
  MappingBudget budget(limits);
  std::vector<MappingBudget::Charge> charges;
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(MappingBudget::Charge c, budget.Reserve(1000, 10));
    charges.push_back(std::move(c));
  }
  EXPECT_THAT(budget.Reserve(1000, 10),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("uid 1000 has 3 regions mapped")));
  ASSERT_OK_AND_ASSIGN(MappingBudget::Charge other, budget.Reserve(2000, 10));
  EXPECT_THAT(budget.Reserve(3000, 10),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-mappings)")));
  EXPECT_EQ(budget.Total().mappings, 4u);
  EXPECT_EQ(budget.Total().bytes, 40u);
  EXPECT_EQ(budget.OfUid(1000).mappings, 3u);
  charges.clear();  // Returned.
  EXPECT_EQ(budget.Total().mappings, 1u);
  EXPECT_EQ(budget.OfUid(1000).mappings, 0u);
  // Bytes: per uid, then in all; no overflow with huge requests.
  EXPECT_THAT(budget.Reserve(1000, 601),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("--max-mapped-bytes-per-uid")));
  EXPECT_THAT(budget.Reserve(1000, UINT64_MAX), StatusIs(absl::StatusCode::kResourceExhausted));
  ASSERT_OK_AND_ASSIGN(MappingBudget::Charge big, budget.Reserve(1000, 600));
  ASSERT_OK_AND_ASSIGN(MappingBudget::Charge rest, budget.Reserve(3000, 390));
  EXPECT_THAT(budget.Reserve(4000, 1),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-mapped-bytes;")));
  EXPECT_EQ(budget.Total().bytes, 1000u);
}

// A principal's cap from the policy replaces the per-uid flag for its uid
// (larger or smaller); the daemon-wide cap still holds.
TEST(MappingBudgetTest, ThePolicysCapReplacesThePerUidFlag) {
  MappingLimits limits;
  limits.max_bytes = 1000;
  limits.max_bytes_per_uid = 100;
  MappingBudget budget(limits);
  ASSERT_OK_AND_ASSIGN(MappingBudget::Charge big, budget.Reserve(7, 500, /*for uid=*/600));
  EXPECT_THAT(budget.Reserve(7, 101, 600),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("limit of 600 B of mapped memory (max_mapped_bytes in the policy")));
  ASSERT_OK_AND_ASSIGN(MappingBudget::Charge small, budget.Reserve(8, 40, 50));
  EXPECT_THAT(budget.Reserve(8, 11, 50), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(budget.Reserve(9, 101), StatusIs(absl::StatusCode::kResourceExhausted,
                                               HasSubstr("--max-mapped-bytes-per-uid")));
  EXPECT_THAT(budget.Reserve(9, 461, 2000),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-mapped-bytes;")));
}

TEST(MappingBudgetTest, ChargesMoveAndOutliveTheBudget) {
  MappingLimits limits;
  limits.max_mappings = 1;
  std::optional<MappingBudget> budget(std::in_place, limits);
  ASSERT_OK_AND_ASSIGN(MappingBudget::Charge a, budget->Reserve(1, 5));
  MappingBudget::Charge b = std::move(a);
  MappingBudget::Charge c;
  c = std::move(b);
  EXPECT_EQ(budget->Total().mappings, 1u);
  EXPECT_THAT(budget->Reserve(1, 5), StatusIs(absl::StatusCode::kResourceExhausted));
  c = MappingBudget::Charge();
  EXPECT_EQ(budget->Total().mappings, 0u);
  ASSERT_OK_AND_ASSIGN(MappingBudget::Charge d, budget->Reserve(1, 5));
  budget.reset();  // d is returned later, to the state it shares.
}

TEST(MappingBudgetTest, RegionsHoldTheirChargeUntilUnmapped) {
  MappingLimits limits;
  limits.max_mappings = 2;
  MappingBudget budget(limits);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShmRegion> a,
                       ShmRegion::Map(Memfd(4096), 4096, kMax, &budget, 7));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShmRegion> b,
                       ShmRegion::Map(Memfd(4096), 4096, kMax, &budget, 7));
  const int fd = Memfd(4096);
  EXPECT_THAT(ShmRegion::Map(fd, 4096, kMax, &budget, 7),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_FALSE(IsOpen(fd));
  // A refused descriptor charges nothing.
  EXPECT_THAT(ShmRegion::Map(Memfd(4096, 0), 4096, kMax, &budget, 7),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(budget.OfUid(7).bytes, 8192u);
  a.reset();
  EXPECT_EQ(budget.Total().mappings, 1u);
  ASSERT_OK_AND_ASSIGN(a, ShmRegion::Map(Memfd(4096), 4096, kMax, &budget, 7));
}

}  // namespace
}  // namespace evoke
