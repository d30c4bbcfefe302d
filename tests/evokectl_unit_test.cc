// evokectl's parts without a daemon: the screen of `top` from made-up Stat
// answers (rates, hit rates, percentiles from histogram buckets, zero
// divisions, a restarted daemon, a narrow terminal), the exit-code table,
// progress lines and the block stream format (round trip, truncation and
// damage detected and located).
#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "tools/evokectl/exit_codes.h"
#include "tools/evokectl/progress.h"
#include "tools/evokectl/top_view.h"
#include "common/checksum.h"
#include "evoke/block_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke::ctl {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::AllOf;
using ::testing::DoubleNear;
using ::testing::HasSubstr;
using ::testing::Not;

// ----------------------------------------------------------------- top

TEST(HistogramQuantileTest, InterpolatesInsideTheBucket) {
  const std::vector<double> bounds = {0.001, 0.01, 0.1};
  // 100 calls: 50 at most 1 ms, 40 in (1 ms, 10 ms], 9 in (10, 100 ms], 1 above.
  const std::vector<uint64_t> counts = {50, 40, 9, 1};
  std::optional<Quantile> p50 = HistogramQuantile(bounds, counts, 0.5);
  ASSERT_TRUE(p50.has_value());
  EXPECT_FALSE(p50->overflow);
  EXPECT_THAT(p50->seconds, DoubleNear(0.001, 1e-12));  // The 50th call: end of bucket 0.
  std::optional<Quantile> p90 = HistogramQuantile(bounds, counts, 0.9);
  ASSERT_TRUE(p90.has_value());
  EXPECT_THAT(p90->seconds, DoubleNear(0.01, 1e-12));
  std::optional<Quantile> p70 = HistogramQuantile(bounds, counts, 0.7);
  ASSERT_TRUE(p70.has_value());
  // The 70th call is the 20th of 40 in (1 ms, 10 ms]: halfway.
  EXPECT_THAT(p70->seconds, DoubleNear(0.0055, 1e-12));
  std::optional<Quantile> p99 = HistogramQuantile(bounds, counts, 0.99);
  ASSERT_TRUE(p99.has_value());
  EXPECT_FALSE(p99->overflow);
  EXPECT_THAT(p99->seconds, DoubleNear(0.1, 1e-12));
  std::optional<Quantile> p100 = HistogramQuantile(bounds, counts, 1.0);
  ASSERT_TRUE(p100.has_value());
  EXPECT_TRUE(p100->overflow);
  EXPECT_EQ(p100->seconds, 0.1);
}

TEST(HistogramQuantileTest, NoCallsOrWrongShapeIsNoAnswer) {
  EXPECT_FALSE(HistogramQuantile({0.1}, {0, 0}, 0.5).has_value());
  EXPECT_FALSE(HistogramQuantile({0.1}, {1}, 0.5).has_value());  // Lacks the overflow bucket.
  EXPECT_FALSE(HistogramQuantile({}, {}, 0.5).has_value());
  std::optional<Quantile> only_overflow = HistogramQuantile({}, {3}, 0.5);
  ASSERT_TRUE(only_overflow.has_value());
  EXPECT_TRUE(only_overflow->overflow);
}

v1::RpcStat Rpc(const std::string& method, uint64_t calls, uint64_t errors, double sum,
                const std::vector<uint64_t>& counts) {
  v1::RpcStat r;
  r.set_method(method);
  r.set_calls(calls);
  r.set_errors(errors);
  r.set_seconds_sum(sum);
  for (double b : {0.001, 0.01, 0.1}) r.add_bucket_upper_seconds(b);
  for (uint64_t c : counts) r.add_bucket_counts(c);
  return r;
}

v1::StatResponse BaseStat() {
  v1::StatResponse s;
  s.set_version("1.2.3");
  s.set_pid(4242);
  s.set_uptime_seconds(100);
  s.mutable_pinned()->set_blocks(10);
  s.mutable_pinned()->set_payload_bytes(1 << 20);
  s.mutable_pinned()->set_used_bytes(8 << 20);
  s.mutable_pinned()->set_capacity_bytes(32 << 20);
  s.mutable_spill()->set_blocks(3);
  s.mutable_spill()->set_capacity_bytes(0);  // No budget: no bar, no division.
  s.mutable_counters();
  return s;
}

std::string Screen(const std::vector<std::string>& lines) { return absl::StrJoin(lines, "\n"); }

std::string LineStartingWith(const std::vector<std::string>& lines, const std::string& prefix) {
  for (const std::string& l : lines) {
    if (absl::StartsWith(l, prefix)) return l;
  }
  return "";
}

TEST(RenderTopTest, RatesHitRatesAndLatencyOverTheInterval) {
  v1::StatResponse prev = BaseStat();
  prev.mutable_counters()->set_saves(100);
  prev.mutable_counters()->set_loads(50);
  prev.mutable_counters()->set_hits_tier1(40);
  prev.mutable_counters()->set_hits_tier2(5);
  prev.mutable_counters()->set_misses(5);
  *prev.add_rpcs() = Rpc("Save", 10, 0, 0.05, {5, 5, 0, 0});
  v1::StatResponse cur = prev;
  cur.set_uptime_seconds(102);
  cur.mutable_counters()->set_saves(300);       // +200 in 2 s: 100/s.
  cur.mutable_counters()->set_loads(90);        // +40: 20/s.
  cur.mutable_counters()->set_hits_tier1(70);   // +30
  cur.mutable_counters()->set_hits_tier2(15);   // +10
  cur.mutable_counters()->set_misses(5);        // +0
  // +100 calls over the interval: 50 under 1 ms, 49 in (1, 10 ms], 1 above 100 ms.
  *cur.mutable_rpcs(0) = Rpc("Save", 110, 2, 0.05 + 0.5, {55, 54, 0, 1});
  *cur.add_rpcs() = Rpc("Load", 0, 0, 0, {0, 0, 0, 0});  // Never called: left out.
  *prev.add_rpcs() = Rpc("Pin", 3, 0, 0.003, {3, 0, 0, 0});
  *cur.add_rpcs() = Rpc("Pin", 3, 0, 0.003, {3, 0, 0, 0});  // No calls in the interval.

  TopInput in;
  in.prev = &prev;
  in.cur = &cur;
  in.elapsed_seconds = 2.0;
  in.width = 120;
  in.target = "unix:/run/evoke/evoked.sock";
  const std::vector<std::string> lines = RenderTop(in);
  const std::string screen = Screen(lines);
  EXPECT_THAT(lines[0], AllOf(HasSubstr("evoked 1.2.3"), HasSubstr("pid 4242"),
                              HasSubstr("up 1m42s"), HasSubstr("unix:/run/evoke/evoked.sock")));
  EXPECT_THAT(LineStartingWith(lines, "1 pinned host"),
              AllOf(HasSubstr(" 10 "), HasSubstr("1 MiB"), HasSubstr("32 MiB"),
                    HasSubstr("[####"), HasSubstr("25.0%")));
  // The spill tier has no capacity: no bar, no percentage.
  EXPECT_THAT(LineStartingWith(lines, "2 spill (disk)"), AllOf(Not(HasSubstr("[")), HasSubstr("-")));
  // Hit rate over the interval: 30 / 10 / 0 of 40 lookups.
  EXPECT_THAT(LineStartingWith(lines, "last 2.0s"),
              AllOf(HasSubstr("75.0%"), HasSubstr("25.0%"), HasSubstr("0.0%"), HasSubstr(" 40")));
  // Since start: 70 / 15 / 5 of 90.
  EXPECT_THAT(LineStartingWith(lines, "since start"),
              AllOf(HasSubstr("77.8%"), HasSubstr("16.7%"), HasSubstr("5.6%"), HasSubstr(" 90")));
  // Throughput: 100 saves/s, 20 loads/s.
  bool throughput = false;
  for (const std::string& l : lines) {
    if (absl::StartsWith(l, "last 2.0s") && absl::StrContains(l, "100.0")) {
      throughput = true;
      EXPECT_THAT(l, HasSubstr("20.0"));
    }
  }
  EXPECT_TRUE(throughput) << screen;
  EXPECT_THAT(screen, HasSubstr("totals: saves 300  dedups 0  loads 90"));
  // Save: 50 calls/s, 1 error/s, mean 5 ms, p50 1 ms (the 50th call ends
  // bucket 0), p99 10 ms (99th call ends bucket 1), 110 calls since start.
  EXPECT_THAT(LineStartingWith(lines, "Save"),
              AllOf(HasSubstr("50.0"), HasSubstr("1.0"), HasSubstr("5.00ms"),
                    HasSubstr("1.00ms"), HasSubstr("10.00ms"), HasSubstr("110")));
  EXPECT_EQ(LineStartingWith(lines, "Load"), "");
  // Pin had no calls in the interval: zero rates, no mean or percentiles
  // (no division by zero calls), 3 calls since start.
  EXPECT_THAT(LineStartingWith(lines, "Pin"),
              AllOf(HasSubstr("0.0"), HasSubstr("-"), HasSubstr(" 3")));
  EXPECT_THAT(screen, Not(HasSubstr("nan")));
  EXPECT_THAT(screen, Not(HasSubstr("inf")));
}

TEST(RenderTopTest, RpcsReportedButNoneCalled) {
  v1::StatResponse cur = BaseStat();
  *cur.add_rpcs() = Rpc("Save", 0, 0, 0, {0, 0, 0, 0});
  TopInput in;
  in.cur = &cur;
  const std::string screen = Screen(RenderTop(in));
  EXPECT_THAT(screen, HasSubstr("(no calls yet)"));
  EXPECT_THAT(screen, Not(HasSubstr("n/a")));
}

TEST(RenderTopTest, OverflowPercentileShowsAboveTheLastBound) {
  v1::StatResponse cur = BaseStat();
  *cur.add_rpcs() = Rpc("Flush", 2, 0, 1.0, {0, 0, 0, 2});
  TopInput in;
  in.cur = &cur;
  const std::vector<std::string> lines = RenderTop(in);
  EXPECT_THAT(LineStartingWith(lines, "Flush"), HasSubstr(">100.00ms"));
}

TEST(RenderTopTest, FirstFrameAveragesSinceStartAndEmptyRpcsSayNa) {
  v1::StatResponse cur = BaseStat();
  cur.mutable_counters()->set_saves(500);  // Over 100 s of uptime: 5/s.
  TopInput in;
  in.cur = &cur;
  in.width = 120;
  const std::vector<std::string> lines = RenderTop(in);
  const std::string screen = Screen(lines);
  EXPECT_THAT(LineStartingWith(lines, "avg since start"), HasSubstr("5.0"));
  EXPECT_THAT(screen, HasSubstr("RPC LATENCY: n/a"));
  // No loads at all: hit rates are "-", not a division by zero.
  EXPECT_THAT(LineStartingWith(lines, "since start"), HasSubstr("-"));
  EXPECT_THAT(screen, Not(HasSubstr("nan")));
}

TEST(RenderTopTest, ZeroElapsedAndZeroUptimeDoNotDivide) {
  v1::StatResponse cur = BaseStat();
  cur.set_uptime_seconds(0);
  cur.mutable_counters()->set_saves(5);
  TopInput in;
  in.cur = &cur;
  const std::string screen = Screen(RenderTop(in));
  EXPECT_THAT(screen, Not(HasSubstr("nan")));
  EXPECT_THAT(screen, Not(HasSubstr("inf")));
  v1::StatResponse prev = cur;
  in.prev = &prev;
  in.elapsed_seconds = 0;
  const std::string again = Screen(RenderTop(in));
  EXPECT_THAT(again, Not(HasSubstr("nan")));
  EXPECT_THAT(again, Not(HasSubstr("inf")));
}

TEST(RenderTopTest, RestartedDaemonIsNotADelta) {
  v1::StatResponse prev = BaseStat();
  prev.mutable_counters()->set_saves(1000);
  *prev.add_rpcs() = Rpc("Save", 1000, 0, 1, {1000, 0, 0, 0});
  v1::StatResponse cur = BaseStat();
  cur.set_pid(4243);
  cur.set_uptime_seconds(10);
  cur.mutable_counters()->set_saves(20);  // 2/s over its 10 s of uptime.
  *cur.add_rpcs() = Rpc("Save", 20, 0, 0.01, {20, 0, 0, 0});
  TopInput in;
  in.prev = &prev;
  in.cur = &cur;
  in.elapsed_seconds = 1;
  const std::vector<std::string> lines = RenderTop(in);
  EXPECT_THAT(LineStartingWith(lines, "avg since start"), HasSubstr("2.0"));
  EXPECT_THAT(LineStartingWith(lines, "Save"), HasSubstr("2.0"));
}

TEST(RenderTopTest, NarrowTerminalCutsEveryLine) {
  v1::StatResponse cur = BaseStat();
  *cur.add_rpcs() = Rpc("Save", 10, 0, 0.05, {5, 5, 0, 0});
  for (int width : {20, 40, 79}) {
    TopInput in;
    in.cur = &cur;
    in.width = width;
    in.target = std::string(200, 'x');
    const std::vector<std::string> lines = RenderTop(in);
    ASSERT_GT(lines.size(), 8u);
    for (const std::string& l : lines) EXPECT_LE(static_cast<int>(l.size()), width) << l;
    EXPECT_THAT(LineStartingWith(lines, "1 pinned host"), Not(HasSubstr("[")));
  }
}

TEST(RenderTopTest, DisconnectedShowsTheNoticeAndTheLastAnswer) {
  TopInput in;
  in.target = "unix:/nowhere.sock";
  in.disconnected = "failed to connect";
  std::string screen = Screen(RenderTop(in));
  EXPECT_THAT(screen, HasSubstr("disconnected, retrying: failed to connect"));
  v1::StatResponse last = BaseStat();
  in.cur = &last;
  screen = Screen(RenderTop(in));
  EXPECT_THAT(screen, HasSubstr("disconnected, retrying"));
  EXPECT_THAT(screen, HasSubstr("1 pinned host"));
}

// ----------------------------------------------------------------- exit codes

TEST(ExitCodesTest, OneCodePerKindOfFailure) {
  EXPECT_EQ(ExitCodeFor(absl::OkStatus()), 0);
  EXPECT_EQ(ExitCodeFor(absl::NotFoundError("")), 3);
  EXPECT_EQ(ExitCodeFor(absl::UnavailableError("")), 4);
  EXPECT_EQ(ExitCodeFor(absl::DeadlineExceededError("")), 4);
  EXPECT_EQ(ExitCodeFor(absl::DataLossError("")), 5);
  EXPECT_EQ(ExitCodeFor(absl::PermissionDeniedError("")), 6);
  EXPECT_EQ(ExitCodeFor(absl::UnauthenticatedError("")), 6);
  EXPECT_EQ(ExitCodeFor(absl::InvalidArgumentError("")), 1);
  EXPECT_EQ(ExitCodeFor(absl::InternalError("")), 1);
  EXPECT_EQ(ExitCodeFor(absl::ResourceExhaustedError("")), 1);
  for (int code = 0; code <= 6; ++code) {
    EXPECT_THAT(ExitCodeTable(), HasSubstr("\n  " + std::to_string(code) + "  "));
  }
}

// ----------------------------------------------------------------- progress

TEST(ProgressTest, BarCountRateAndEta) {
  const std::string line = FormatProgress("verify", 250, 1000, "blocks", absl::Seconds(5), 20);
  EXPECT_THAT(line, HasSubstr("verify [#####...............]  25% 250/1000 blocks"));
  EXPECT_THAT(line, HasSubstr("50/s"));
  EXPECT_THAT(line, HasSubstr("ETA 15s"));
  const std::string unknown = FormatProgress("flush", 42, 0, "blocks", absl::Seconds(2));
  EXPECT_THAT(unknown, AllOf(HasSubstr("flush 42 blocks"), Not(HasSubstr("["))));
  EXPECT_THAT(FormatProgress("check", 2 << 20, 4 << 20, "bytes", absl::Seconds(1)),
              HasSubstr("2.0 MiB/4.0 MiB"));
  // Nothing done yet, no time passed: no division.
  EXPECT_THAT(FormatProgress("x", 0, 10, "blocks", absl::ZeroDuration()), Not(HasSubstr("nan")));
}

TEST(ProgressTest, DisabledDrawsNothingEnabledDrawsOnOneLine) {
  evoke::testing::TempDir dir;
  const std::string path = dir.Join("progress.txt");
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  {
    Progress off("off", 10, "blocks", false, f);
    off.Add(10);
  }
  {
    Progress on("on", 10, "blocks", true, f);
    on.Add(5);
    on.Add(5);
  }
  std::fclose(f);
  const std::string text = evoke::testing::ReadFile(path);
  EXPECT_THAT(text, Not(HasSubstr("off")));
  EXPECT_THAT(text, HasSubstr("on [##############################] 100% 10/10 blocks"));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1);
}

// ----------------------------------------------------------------- streams

v1::BlockMeta Meta(int i, const std::string& payload) {
  v1::BlockMeta m;
  m.set_id(std::string(15, 'i') + static_cast<char>(i));
  m.set_session_id("s");
  m.set_sequence(i);
  m.set_payload_bytes(payload.size());
  m.set_checksum(PayloadChecksum(payload.data(), payload.size()));
  return m;
}

std::string Payload(int i) { return std::string(1000 + i * 37, static_cast<char>('a' + i)); }

class BlockStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<BlockStreamWriter> w,
                         BlockStreamWriter::Create(path_));
    for (int i = 0; i < 5; ++i) ASSERT_OK(w->Append(Meta(i, Payload(i)), Payload(i)));
    // Not at the path until finished.
    EXPECT_FALSE(std::ifstream(path_).good());
    ASSERT_OK(w->Finish());
    EXPECT_EQ(w->records(), 5u);
    bytes_ = evoke::testing::ReadFile(path_);
    ASSERT_EQ(bytes_.size(), w->bytes());
  }
  void Rewrite(const std::string& bytes) {
    std::ofstream(path_, std::ios::binary | std::ios::trunc) << bytes;
  }
  // Reads the whole stream: the blocks read and the final status.
  absl::Status ReadAll(std::vector<BlockFile>* blocks) {
    absl::StatusOr<std::unique_ptr<BlockStreamReader>> r = BlockStreamReader::Open(path_);
    if (!r.ok()) return r.status();
    for (;;) {
      BlockFile b;
      absl::StatusOr<bool> more = (*r)->Next(&b);
      if (!more.ok()) return more.status();
      if (!*more) return absl::OkStatus();
      blocks->push_back(std::move(b));
    }
  }
  evoke::testing::TempDir dir_;
  std::string path_ = dir_.Join("ns.evks");
  std::string bytes_;
};

TEST_F(BlockStreamTest, RoundTrip) {
  std::vector<BlockFile> blocks;
  ASSERT_OK(ReadAll(&blocks));
  ASSERT_EQ(blocks.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(blocks[i].payload, Payload(i));
    EXPECT_EQ(blocks[i].meta.sequence(), static_cast<uint64_t>(i));
  }
}

TEST_F(BlockStreamTest, TruncationAnywhereIsDetected) {
  for (size_t cut : {size_t{10}, size_t{17}, size_t{20}, bytes_.size() / 2, bytes_.size() - 25,
                     bytes_.size() - 1}) {
    Rewrite(bytes_.substr(0, cut));
    std::vector<BlockFile> blocks;
    const absl::Status s = ReadAll(&blocks);
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated"))) << cut;
  }
  Rewrite(bytes_.substr(0, bytes_.size() - 25));  // Exactly without the trailer.
  std::vector<BlockFile> blocks;
  EXPECT_THAT(ReadAll(&blocks),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("ends without its trailer"), HasSubstr("record 6"))));
  EXPECT_EQ(blocks.size(), 5u);  // What came before is intact.
}

TEST_F(BlockStreamTest, EveryFlippedByteIsDetected) {
  // Past the 16-byte header (a damaged magic or version is "not a stream"),
  // every single flipped byte is refused; never a silent different block.
  for (size_t at = 16; at < bytes_.size(); at += 7) {
    std::string damaged = bytes_;
    damaged[at] ^= 0x20;
    Rewrite(damaged);
    std::vector<BlockFile> blocks;
    const absl::Status s = ReadAll(&blocks);
    ASSERT_THAT(s, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("record"))) << at;
  }
  // In record 3: the message names it.
  std::string damaged = bytes_;
  damaged[bytes_.size() / 2] ^= 1;
  Rewrite(damaged);
  std::vector<BlockFile> blocks;
  EXPECT_THAT(ReadAll(&blocks), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("record 3 ")));
  EXPECT_EQ(blocks.size(), 2u);
}

TEST_F(BlockStreamTest, DroppedRecordsAndTrailingBytesAreDetected) {
  // Drop record 2 (its header and body), keep the trailer: the count and
  // the chain no longer match.
  const size_t first = 16;
  const uint64_t len0 = static_cast<uint8_t>(bytes_[first + 1]) |
                        (static_cast<uint64_t>(static_cast<uint8_t>(bytes_[first + 2])) << 8);
  const size_t second = first + 9 + len0;
  const uint64_t len1 = static_cast<uint8_t>(bytes_[second + 1]) |
                        (static_cast<uint64_t>(static_cast<uint8_t>(bytes_[second + 2])) << 8);
  Rewrite(bytes_.substr(0, second) + bytes_.substr(second + 9 + len1));
  std::vector<BlockFile> blocks;
  EXPECT_THAT(ReadAll(&blocks), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("missing")));
  Rewrite(bytes_ + "x");
  blocks.clear();
  EXPECT_THAT(ReadAll(&blocks),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bytes after its trailer")));
}

TEST_F(BlockStreamTest, SingleBlockFilesAndOtherFiles) {
  ASSERT_OK(WriteBlockFile(dir_.Join("one.evk"), Meta(7, Payload(7)), Payload(7)));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<BlockStreamReader> r,
                       BlockStreamReader::Open(dir_.Join("one.evk")));
  EXPECT_FALSE(r->is_stream());
  BlockFile b;
  ASSERT_OK_AND_ASSIGN(bool more, r->Next(&b));
  EXPECT_TRUE(more);
  EXPECT_EQ(b.payload, Payload(7));
  ASSERT_OK_AND_ASSIGN(more, r->Next(&b));
  EXPECT_FALSE(more);
  EXPECT_THAT(BlockStreamReader::Open("/dev/zero").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not an evoke block file")));
  EXPECT_THAT(BlockStreamReader::Open(dir_.Join("missing")).status(),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(BlockStreamReader::Open(dir_.path()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("directory")));
}

TEST_F(BlockStreamTest, UnfinishedWriterLeavesNothing) {
  const std::string other = dir_.Join("other.evks");
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<BlockStreamWriter> w, BlockStreamWriter::Create(other));
    ASSERT_OK(w->Append(Meta(1, Payload(1)), Payload(1)));
  }
  EXPECT_FALSE(std::ifstream(other).good());
  EXPECT_FALSE(std::ifstream(other + ".tmp").good());
  EXPECT_THAT(BlockStreamWriter::Create(dir_.Join("no/such/dir/x")).status(),
              StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace evoke::ctl
