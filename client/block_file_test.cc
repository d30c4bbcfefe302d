#include "evoke/block_file.h"

#include "common/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;

v1::BlockMeta Meta(const std::string& payload) {
  v1::BlockMeta m;
  m.set_id(std::string(16, 'i'));
  m.set_session_id("s");
  m.set_payload_bytes(payload.size());
  m.set_checksum(PayloadChecksum(payload.data(), payload.size()));
  return m;
}

TEST(BlockFileTest, RoundTripThroughDisk) {
  evoke::testing::TempDir dir;
  const std::string payload(5000, 'q');
  ASSERT_OK(WriteBlockFile(dir.Join("b.evk"), Meta(payload), payload));
  ASSERT_OK_AND_ASSIGN(BlockFile file, ReadBlockFile(dir.Join("b.evk")));
  EXPECT_EQ(file.payload, payload);
  EXPECT_EQ(file.meta.session_id(), "s");
}

TEST(BlockFileTest, EveryCorruptionIsDetected) {
  const std::string payload(1000, 'p');
  ASSERT_OK_AND_ASSIGN(std::string bytes, EncodeBlockFile(Meta(payload), payload));
  for (size_t i = 0; i < bytes.size(); i += 7) {
    std::string bad = bytes;
    bad[i] ^= 0x20;
    EXPECT_FALSE(DecodeBlockFile(bad).ok()) << "flip at " << i;
  }
  EXPECT_THAT(DecodeBlockFile(bytes.substr(0, bytes.size() - 1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(DecodeBlockFile("garbage"), StatusIs(absl::StatusCode::kInvalidArgument));
  std::string flipped = bytes;
  flipped[bytes.size() - 30] ^= 1;  // Inside the payload.
  EXPECT_THAT(DecodeBlockFile(flipped), StatusIs(absl::StatusCode::kDataLoss));
}

TEST(BlockFileTest, RefusesMetaWithoutMatchingChecksum) {
  v1::BlockMeta m = Meta("abc");
  EXPECT_THAT(EncodeBlockFile(m, "abd"), StatusIs(absl::StatusCode::kInvalidArgument));
  m.clear_checksum();
  EXPECT_THAT(EncodeBlockFile(m, "abc"), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace evoke
