#include <vector>

#include "gpu/cuda_ipc.h"
#include "gpu/device.h"
#include "gtest/gtest.h"

namespace evoke {
namespace {

TEST(CoalesceCopiesTest, MergesOnlyWhenBothSidesAreContiguous) {
  char src[100], dst[100];
  const CopyOp ops[] = {
      {dst + 0, src + 0, 10},   // These three become
      {dst + 10, src + 10, 5},  // one copy of 20.
      {dst + 15, src + 15, 5},
      {dst + 40, src + 20, 5},  // dst jumps: new copy
      {dst + 45, src + 30, 5},  // src jumps: new copy
      {dst + 50, src + 35, 0},  // empty: dropped
  };
  const std::vector<CopyOp> merged = CoalesceCopies(ops);
  ASSERT_EQ(merged.size(), 3u);
  EXPECT_EQ(merged[0].dst, dst);
  EXPECT_EQ(merged[0].bytes, 20u);
  EXPECT_EQ(merged[1].dst, dst + 40);
  EXPECT_EQ(merged[2].src, src + 30);
  EXPECT_TRUE(CoalesceCopies({}).empty());
}

TEST(CudaIpcTest, FailsCleanlyWithoutADevice) {
  if (absl::StatusOr<std::unique_ptr<DeviceCopier>> c = DeviceCopier::Create(0); c.ok()) {
    GTEST_SKIP() << "a CUDA device exists; covered by cuda_ipc_test";
  }
  EXPECT_EQ(DeviceCopier::Create(0).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CudaIpcMapping::Open(std::string(64, '\0'), 0, 4096).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(CudaIpcMapping::Open("short", 0, 4096).status().code(),
            BuiltWithCuda() ? absl::StatusCode::kInvalidArgument
                               : absl::StatusCode::kUnavailable);
  char buffer[4096];
  EXPECT_FALSE(HostRegistration::Start(buffer, sizeof(buffer)).ok());
}

}  // namespace
}  // namespace evoke
