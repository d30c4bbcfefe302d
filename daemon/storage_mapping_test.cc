#include "daemon/storage_mapping.h"

#include "gtest/gtest.h"

namespace evoke {
namespace {

TEST(StorageMappingTest, ItemErrorsGainTheRequestsFieldPath) {
  const absl::Status checksum =
      ItemError(absl::StatusCode::kDataLoss, 3, ItemPart::kChecksum, "12 does not match");
  EXPECT_EQ(WithFieldPath(checksum, ItemsField::kSaveBlocks).message(),
            "blocks[3].meta.checksum: 12 does not match");
  EXPECT_EQ(WithFieldPath(checksum, ItemsField::kSaveBlocks).code(),
            absl::StatusCode::kDataLoss);
  const absl::Status missing =
      ItemError(absl::StatusCode::kNotFound, 1, ItemPart::kId, "block ab not found");
  EXPECT_EQ(WithFieldPath(missing, ItemsField::kIds).message(), "ids[1]: block ab not found");
  EXPECT_EQ(WithFieldPath(missing, ItemsField::kId).message(), "id: block ab not found");
  EXPECT_EQ(WithFieldPath(missing, ItemsField::kSaveBlocks).message(),
            "blocks[1].meta.id: block ab not found");
}

TEST(StorageMappingTest, FingerprintMismatchNamesTheRequestField) {
  const absl::Status s =
      ItemError(absl::StatusCode::kFailedPrecondition, 0, ItemPart::kFingerprint,
                "block 59f7 was saved with another layout: model_revision: stored \"a\"");
  EXPECT_EQ(WithFieldPath(s, ItemsField::kIds).message(),
            "fingerprint: block 59f7 (ids[0]) was saved with another layout: "
            "model_revision: stored \"a\"");
}

TEST(StorageMappingTest, LimitsNameTheFlag) {
  const absl::Status s = WithItem(
      WithLimit(absl::ResourceExhaustedError("payload of 2 GiB is larger than tier 1 (1 GiB)"),
                StorageLimit::kTier1Capacity),
      0, ItemPart::kBlock);
  EXPECT_EQ(WithFieldPath(s, ItemsField::kSaveBlocks).message(),
            "blocks[0]: payload of 2 GiB is larger than tier 1 (1 GiB); tier 1 is sized by "
            "--pinned-bytes");
}

TEST(StorageMappingTest, OtherErrorsPassUnchanged) {
  const absl::Status plain = absl::UnavailableError("shutting down");
  EXPECT_EQ(WithFieldPath(plain, ItemsField::kIds), plain);
  EXPECT_TRUE(WithFieldPath(absl::OkStatus(), ItemsField::kIds).ok());
}

TEST(StorageMappingTest, StatsMapEveryField) {
  TierStats in;
  in.host = TierOccupancy{1, 2, 3, 4};
  in.disk = TierOccupancy{5, 6, 7, 8};
  in.breadcrumb_blocks = 9;
  in.pinned_blocks = 10;
  in.pins = 11;
  in.counters.spill_errors = 12;
  in.counters.saves = 13;
  in.host_locked = true;
  in.host_lock_error = "none";
  in.host_largest_free_bytes = 14;
  in.high_watermark = 0.9;
  in.low_watermark = 0.7;
  in.uptime = absl::Seconds(15);
  v1::StatResponse out;
  ToProto(in, &out);
  EXPECT_EQ(out.pinned().capacity_bytes(), 4u);
  EXPECT_EQ(out.spill().blocks(), 5u);
  EXPECT_EQ(out.breadcrumb_blocks(), 9u);
  EXPECT_EQ(out.pinned_blocks(), 10u);
  EXPECT_EQ(out.leases().lease_pins(), 11u);
  EXPECT_EQ(out.counters().spill_errors(), 12u);
  EXPECT_EQ(out.counters().saves(), 13u);
  EXPECT_TRUE(out.pinned_memory_locked());
  EXPECT_EQ(out.pinned_largest_free_bytes(), 14u);
  EXPECT_DOUBLE_EQ(out.low_watermark(), 0.7);
  EXPECT_EQ(out.uptime_seconds(), 15u);
}

TEST(StorageMappingTest, LocationsRoundTrip) {
  for (BlockLocation l : {BlockLocation::kHost, BlockLocation::kDisk, BlockLocation::kBreadcrumb}) {
    EXPECT_EQ(LocationFromProto(ToProto(l)), l);
  }
  EXPECT_FALSE(LocationFromProto(v1::TIER_UNSPECIFIED).has_value());
}

}  // namespace
}  // namespace evoke
