// The log line format (key=value, quoting, levels) and the rate limiter of
// hot-path log call sites (common/log.h).
#include <thread>
#include <vector>

#include "common/log.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace evoke {
namespace {

using ::testing::HasSubstr;

TEST(LogFormatTest, OneLineOfKeyValueFields) {
  // 2026-12-01T23:59:59.123Z
  const int64_t ms = int64_t{1796169599} * 1000 + 123;
  EXPECT_EQ(FormatLogLine(LogLevel::kWarning, "evoked", ms, "disk is full",
                          {LogField("path", "/var/lib/evoke"), LogField("free_bytes", 0)}),
            "ts=2026-12-01T23:59:59.123Z level=warning prog=evoked msg=\"disk is full\" "
            "path=/var/lib/evoke free_bytes=0");
  EXPECT_EQ(FormatLogLine(LogLevel::kInfo, "evoked", ms, "x", {}, 7),
            "ts=2026-12-01T23:59:59.123Z level=info prog=evoked msg=\"x\" suppressed=7");
}

TEST(LogFormatTest, ValuesAreQuotedAndEscapedWhenNeeded) {
  EXPECT_EQ(QuoteLogValue("plain"), "plain");
  EXPECT_EQ(QuoteLogValue(""), "\"\"");
  EXPECT_EQ(QuoteLogValue("two words"), "\"two words\"");
  EXPECT_EQ(QuoteLogValue("a=b"), "\"a=b\"");
  EXPECT_EQ(QuoteLogValue("say \"hi\"\\"), "\"say \\\"hi\\\"\\\\\"");
  // A message can never break the line: newlines and controls are escaped.
  EXPECT_EQ(QuoteLogValue("one\ntwo\tthree\x01"), "\"one\\ntwo\\tthree\\x01\"");
  const std::string line = FormatLogLine(LogLevel::kError, "evoked", 0,
                                         "injected\nts=1970 level=info msg=forged", {});
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_THAT(line, HasSubstr("msg=\"injected\\nts=1970 level=info msg=forged\""));
}

TEST(LogRateLimiterTest, OneLinePerIntervalAndTheRestCounted) {
  LogRateLimiter limiter(3600);  // Nothing more this hour after the first.
  uint64_t suppressed = 99;
  ASSERT_TRUE(limiter.Allow(&suppressed));
  EXPECT_EQ(suppressed, 0u);
  std::vector<std::thread> threads;
  std::atomic<int> allowed{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        uint64_t s = 0;
        if (limiter.Allow(&s)) ++allowed;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(allowed.load(), 0);

  LogRateLimiter fast(0.05);
  ASSERT_TRUE(fast.Allow(&suppressed));
  int held = 0;
  while (!fast.Allow(&suppressed)) ++held;  // Spins for about 50 ms.
  EXPECT_GT(held, 0);
  EXPECT_EQ(suppressed, static_cast<uint64_t>(held));
}

}  // namespace
}  // namespace evoke
