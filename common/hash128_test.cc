#include "common/hash128.h"

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::HasSubstr;

TEST(Hash128Test, BytesAndHexRoundTrip) {
  const Hash128 id(0x0123456789abcdefULL, 0xfedcba9876543210ULL);
  EXPECT_EQ(id.ToHex(), "0123456789abcdeffedcba9876543210");
  ASSERT_OK_AND_ASSIGN(Hash128 from_hex, Hash128::FromHex(id.ToHex()));
  EXPECT_EQ(from_hex, id);
  ASSERT_OK_AND_ASSIGN(Hash128 from_bytes, Hash128::FromBytes(id.ToBytes()));
  EXPECT_EQ(from_bytes, id);
  ASSERT_OK_AND_ASSIGN(Hash128 upper,
                       Hash128::FromHex("0123456789ABCDEFFEDCBA9876543210"));
  EXPECT_EQ(upper, id);
}

TEST(Hash128Test, OrderingMatchesByteOrder) {
  const Hash128 a(1, 0xffffffffffffffffULL);
  const Hash128 b(2, 0);
  EXPECT_LT(a, b);
  EXPECT_LT(a.ToBytes(), b.ToBytes());
  EXPECT_LT(a.ToHex(), b.ToHex());
}

TEST(Hash128Test, RejectsMalformed) {
  EXPECT_THAT(Hash128::FromBytes("short"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got 5")));
  EXPECT_THAT(Hash128::FromBytes(std::string(17, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Hash128::FromHex("0123"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Hash128::FromHex("0123456789abcdeffedcba987654321g"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("position 31")));
}

TEST(Hash128Test, Hashable) {
  absl::flat_hash_set<Hash128> set = {Hash128(1, 2), Hash128(2, 1),
                                      Hash128(1, 2)};
  EXPECT_EQ(set.size(), 2u);
  EXPECT_TRUE(Hash128().IsZero());
  EXPECT_FALSE(Hash128(0, 1).IsZero());
}

}  // namespace
}  // namespace evoke
