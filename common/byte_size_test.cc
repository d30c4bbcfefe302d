#include "common/byte_size.h"

#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;

TEST(ByteSizeTest, Parses) {
  struct Case {
    const char* text;
    uint64_t bytes;
  } cases[] = {
      {"0", 0},           {"4096", 4096},          {"64MiB", 64ull << 20},
      {"64 MiB", 64ull << 20}, {"64m", 64ull << 20},  {"1GiB", 1ull << 30},
      {"1.5GiB", 3ull << 29},  {"2K", 2048},          {"1KB", 1000},
      {"3GB", 3000000000ull},  {"1TiB", 1ull << 40},  {" 7 B ", 7},
  };
  for (const Case& c : cases) {
    ASSERT_OK_AND_ASSIGN(uint64_t got, ParseByteSize(c.text));
    EXPECT_EQ(got, c.bytes) << c.text;
  }
}

TEST(ByteSizeTest, Rejects) {
  for (const char* bad : {"", "MiB", "-1", "12 parsecs", "1e3", "99999999999TiB",
                          "1..5GiB"}) {
    EXPECT_THAT(ParseByteSize(bad), StatusIs(absl::StatusCode::kInvalidArgument))
        << bad;
  }
}

TEST(ByteSizeTest, Formats) {
  EXPECT_EQ(FormatByteSize(0), "0 B");
  EXPECT_EQ(FormatByteSize(512), "512 B");
  EXPECT_EQ(FormatByteSize(64ull << 20), "64 MiB");
  EXPECT_EQ(FormatByteSize(3ull << 29), "1.50 GiB");
}

}  // namespace
}  // namespace evoke
