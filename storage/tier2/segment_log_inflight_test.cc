// Batches of several 4 MiB pieces, written with up to four pieces in
// flight (Stager): the bytes land where they belong whatever the order the
// writes finish in, and a piece that fails fails the batch and poisons the
// segment as a one-at-a-time write did.
#include <cerrno>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "gtest/gtest.h"
#include "storage/tier2/segment_io.h"
#include "storage/tier2/segment_log.h"
#include "testing/blocks.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;

SegmentLogOptions Options(std::shared_ptr<FaultSegmentIo> io, int in_flight) {
  SegmentLogOptions o;
  o.dir = "/dev/fault/segments";
  o.quarantine_dir = "/dev/fault/quarantine";
  o.segment_bytes = 64 << 20;
  o.instance[0] = 9;
  o.writes_in_flight = in_flight;
  o.io = std::move(io);
  return o;
}

// Appends blocks of `sizes` bytes as one batch; their payloads in `out`.
absl::StatusOr<std::vector<PayloadLocation>> AppendBlocks(SegmentLog& log,
                                                           const std::vector<uint64_t>& sizes,
                                                           uint64_t first,
                                                           std::vector<std::string>* out) {
  out->clear();
  std::vector<SegmentAppend> batch;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out->push_back(evoke::testing::Payload(first + i, sizes[i]));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::string& p = (*out)[i];
    batch.push_back({BlockId(3, first + i), p, PayloadChecksum(p.data(), p.size()), {}});
  }
  return log.Append(batch);
}

void ExpectReadable(SegmentLog& log, const std::vector<PayloadLocation>& at,
                    const std::vector<std::string>& payloads, uint64_t first) {
  ASSERT_EQ(at.size(), payloads.size());
  for (size_t i = 0; i < at.size(); ++i) {
    std::string got;
    ASSERT_OK(log.Read(BlockId(3, first + i), at[i], [&](absl::string_view p) {
      got.assign(p.data(), p.size());
      return absl::OkStatus();
    }));
    EXPECT_TRUE(got == payloads[i]) << i;
  }
}

TEST(SegmentLogInFlightTest, ManyPiecesLandInPlaceWithOneOrFourInFlight) {
  for (int in_flight : {1, 4}) {
    SCOPED_TRACE(in_flight);
    auto io = std::make_shared<FaultSegmentIo>(5);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<SegmentLog> log,
                         SegmentLog::Open(Options(io, in_flight), nullptr));
    std::vector<std::string> payloads;
    // 22 MiB in odd sizes: six pieces, the last partial.
    const std::vector<uint64_t> sizes = {3 << 20, (5 << 20) + 77, 4 << 20, 1, (9 << 20) + 4095};
    ASSERT_OK_AND_ASSIGN(std::vector<PayloadLocation> at,
                         AppendBlocks(*log, sizes, 100, &payloads));
    ExpectReadable(*log, at, payloads, 100);
    // A second batch reuses the staging buffers.
    std::vector<std::string> more;
    ASSERT_OK_AND_ASSIGN(std::vector<PayloadLocation> at2,
                         AppendBlocks(*log, {7 << 20, 6 << 20}, 200, &more));
    ExpectReadable(*log, at2, more, 200);
    // And both survive a crash and a reopen (the batch was synced).
    log.reset();
    io->Crash();
    ASSERT_OK_AND_ASSIGN(log, SegmentLog::Open(Options(io, in_flight), nullptr));
    ExpectReadable(*log, at, payloads, 100);
    ExpectReadable(*log, at2, more, 200);
  }
}

TEST(SegmentLogInFlightTest, AFailedPieceFailsTheBatchAndPoisonsTheSegment) {
  for (int err : {ENOSPC, EIO}) {
    SCOPED_TRACE(err);
    auto io = std::make_shared<FaultSegmentIo>(6);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<SegmentLog> log,
                         SegmentLog::Open(Options(io, 4), nullptr));
    std::vector<std::string> good;
    ASSERT_OK_AND_ASSIGN(std::vector<PayloadLocation> at,
                         AppendBlocks(*log, {1 << 20}, 1, &good));
    const uint64_t seg = at[0].segment;
    io->FailNextWrite(4096, err);  // Whichever piece is written next.
    std::vector<std::string> lost;
    EXPECT_THAT(AppendBlocks(*log, {6 << 20, 6 << 20, 6 << 20}, 10, &lost).status(),
                StatusIs(err == ENOSPC ? absl::StatusCode::kResourceExhausted
                                       : absl::StatusCode::kUnavailable));
    bool poisoned = false;
    for (const SegmentInfo& i : log->Segments()) {
      if (i.id == seg) poisoned = i.poisoned && !i.active;
    }
    EXPECT_TRUE(poisoned);
    std::vector<std::string> after;
    ASSERT_OK_AND_ASSIGN(std::vector<PayloadLocation> at2,
                         AppendBlocks(*log, {6 << 20, 6 << 20}, 20, &after));
    EXPECT_NE(at2[0].segment, seg);
    ExpectReadable(*log, at, good, 1);
    ExpectReadable(*log, at2, after, 20);
  }
}

}  // namespace
}  // namespace evoke
