// CheckMappedRegion (gpu/cuda_ipc.h) is the decision CudaIpcMapping::Open and
// CheckDeviceMemory make about a client's size against the allocation the
// driver reports. It is pure, so it runs here, in every build (CI included),
// not only where a GPU is.
#include "gmock/gmock.h"
#include "gpu/cuda_ipc.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;

// Issue #11: when cuMemGetAddressRange was missing or failed, the client's
// size was trusted (Open, and CheckDeviceMemory before the kernels).
TEST(CheckMappedRegionTest, RefusesWhatTheDriverCannotVouchFor) {
  const DeviceAddressRange range{true, 0x10000, 0x4000};
  EXPECT_EQ(CheckMappedRegion(0x10000, 0x4000, range).value(), 0x4000u);
  EXPECT_EQ(CheckMappedRegion(0x11000, 1, range).value(), 0x3000u);
  EXPECT_THAT(CheckMappedRegion(0x11000, 0x3001, range),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("size: 12289 bytes exceed the exported allocation "
                                            "(12288 bytes)")));
  EXPECT_THAT(CheckMappedRegion(0x10000, 0, range),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // The pointer outside the range the driver reports.
  EXPECT_THAT(CheckMappedRegion(0xf000, 16, range),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("outside")));
  EXPECT_THAT(CheckMappedRegion(0x14000, 16, range),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("outside")));
  // A range that wraps around 2^64.
  EXPECT_THAT(CheckMappedRegion(~0ull - 8, 4, DeviceAddressRange{true, ~0ull - 16, 64}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Unknown: refused, however small the size.
  EXPECT_THAT(CheckMappedRegion(0x10000, 1, DeviceAddressRange{}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::HasSubstr("cuMemGetAddressRange")));
}

}  // namespace
}  // namespace evoke
