#include "storage/tier_types.h"

#include "gtest/gtest.h"

namespace evoke {
namespace {

TEST(TierTypesTest, ItemErrorsCarryIndexAndPart) {
  const absl::Status s =
      ItemError(absl::StatusCode::kNotFound, 3, ItemPart::kChecksum, "block x not found");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "block x not found");  // No wire path in storage.
  const std::optional<ItemRef> item = ErrorItem(s);
  ASSERT_TRUE(item.has_value());
  EXPECT_EQ(item->index, 3u);
  EXPECT_EQ(item->part, ItemPart::kChecksum);
  EXPECT_FALSE(ErrorItem(absl::NotFoundError("plain")).has_value());
  EXPECT_TRUE(WithItem(absl::OkStatus(), 1, ItemPart::kId).ok());
}

TEST(TierTypesTest, LimitsTravelWithTheError) {
  const absl::Status s =
      WithLimit(absl::ResourceExhaustedError("too big"), StorageLimit::kTier1Capacity);
  EXPECT_EQ(ErrorLimit(s), StorageLimit::kTier1Capacity);
  EXPECT_FALSE(ErrorLimit(absl::ResourceExhaustedError("x")).has_value());
  // Both can be attached.
  const absl::Status both = WithItem(s, 2, ItemPart::kBlock);
  EXPECT_EQ(ErrorLimit(both), StorageLimit::kTier1Capacity);
  EXPECT_EQ(ErrorItem(both)->index, 2u);
}

}  // namespace
}  // namespace evoke
