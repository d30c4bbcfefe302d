#include "gpu/device.h"

#include "gtest/gtest.h"

namespace evoke {
namespace {

TEST(GpuDeviceTest, ListsDevicesOrExplainsWhyNot) {
  absl::StatusOr<std::vector<GpuDevice>> gpus = ListGpus();
  if (!gpus.ok()) {
    // Without CUDA or a device this must be a clear UNAVAILABLE, never a crash.
    EXPECT_EQ(gpus.status().code(), absl::StatusCode::kUnavailable) << gpus.status();
    EXPECT_FALSE(gpus.status().message().empty());
    GTEST_SKIP() << "no GPU: " << gpus.status();
  }
  ASSERT_TRUE(BuiltWithCuda());
  ASSERT_FALSE(gpus->empty());
  for (const GpuDevice& d : *gpus) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.total_memory_bytes, 0u);
    EXPECT_GE(d.compute_major, 5);
  }
}

}  // namespace
}  // namespace evoke
