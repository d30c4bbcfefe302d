// TransferPlan (gpu/transfer_plan.h): how batches are cut, grouped and
// ordered over streams, checked without a GPU: coverage of every byte, one
// batched copy per group (never one call per page), the ordering proof, and
// checksums from simulated interleavings against the host's PayloadChecksum.
#include "gpu/transfer_plan.h"

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1ull << 20;

std::vector<uint8_t> Random(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Every byte of every op is copied exactly once by the plan's pieces.
void ExpectCovers(const TransferPlan& plan, absl::Span<const CopyOp> ops) {
  uint64_t want = 0, got = 0;
  for (const CopyOp& op : ops) want += op.bytes;
  for (const CopyOp& c : plan.copies) got += c.bytes;
  EXPECT_EQ(got, want);
  for (const CopyOp& op : ops) {
    uint64_t covered = 0;
    for (const CopyOp& c : plan.copies) {
      const auto* d = static_cast<const uint8_t*>(c.dst);
      const auto* base = static_cast<const uint8_t*>(op.dst);
      if (d >= base && d < base + op.bytes) {
        EXPECT_EQ(static_cast<const uint8_t*>(c.src) - static_cast<const uint8_t*>(op.src),
                  d - base);
        covered += c.bytes;
      }
    }
    EXPECT_EQ(covered, op.bytes);
  }
  // Every piece is in exactly one copy step.
  std::vector<int> seen(plan.copies.size(), 0);
  for (const PlanStep& s : plan.steps) {
    if (s.kind != StepKind::kCopy) continue;
    for (size_t k = s.begin; k < s.end; ++k) ++seen[k];
  }
  for (int n : seen) EXPECT_EQ(n, 1);
}

TEST(TransferPlanTest, ManySmallPagesAreOneBatchedCopy) {
  // 64 pages of 64 KiB scattered through a pool (a paged cache): not
  // adjacent, so nothing coalesces; still one copy call, not 64.
  std::vector<uint8_t> pool(128 * 64 * 1024), host(64 * 64 * 1024);
  std::vector<CopyOp> ops;
  for (int i = 0; i < 64; ++i) {
    ops.push_back(CopyOp{host.data() + i * 65536, pool.data() + (127 - 2 * i) * 65536, 65536});
  }
  const TransferPlan plan = PlanCopies(ops, CopyDirection::kToHost);
  EXPECT_EQ(plan.copies.size(), 64u);
  EXPECT_EQ(plan.copy_steps(), 1u);
  ExpectCovers(plan, ops);
  EXPECT_OK(CheckPlanOrdering(plan));

  // With a cap on pieces per batch, ceil(64 / 10) calls.
  PipelineOptions o;
  o.max_batch_ops = 10;
  EXPECT_EQ(PlanCopies(ops, CopyDirection::kToHost, o).copy_steps(), 7u);
}

TEST(TransferPlanTest, LargeCopiesAreCutOverTheCopyStreams) {
  std::vector<uint8_t> a(40 * kMiB), b(40 * kMiB);
  const CopyOp ops[] = {{b.data(), a.data(), 16 * kMiB},
                        {b.data() + 20 * kMiB, a.data() + 20 * kMiB, 20 * kMiB + 7}};
  const TransferPlan plan = PlanCopies(ops, CopyDirection::kToDevice);
  ExpectCovers(plan, ops);
  EXPECT_OK(CheckPlanOrdering(plan));
  // 8 MiB pieces: 2 + 3 (the last 4 MiB + 7 bytes), one step each (every
  // piece reaches split_bytes but the last), alternating streams.
  ASSERT_EQ(plan.copies.size(), 5u);
  ASSERT_EQ(plan.copy_steps(), 5u);
  std::vector<int> streams;
  for (const PlanStep& s : plan.steps) streams.push_back(s.stream);
  EXPECT_THAT(streams, ::testing::ElementsAre(2, 3, 2, 3, 2));
  EXPECT_EQ(plan.steps_of(StepKind::kWait), 0u);
}

TEST(TransferPlanTest, FetchHashesTheDeviceBytesBesideTheCopies) {
  std::vector<uint8_t> dev = Random(7 * kMiB, 1), host(7 * kMiB);
  const FetchBlock blocks[] = {
      {dev.data(), host.data(), 3 * kMiB + 100, true},         // short tail: on the host
      {dev.data() + 4 * kMiB, host.data() + 4 * kMiB, 1000, false},
      {dev.data() + 5 * kMiB, host.data() + 5 * kMiB, kMiB + 500, true},
  };
  const TransferPlan plan = PlanFetch(blocks);
  EXPECT_OK(CheckPlanOrdering(plan));
  ASSERT_FALSE(plan.steps.empty());
  EXPECT_EQ(plan.steps[0].kind, StepKind::kChecksum);  // issued first
  EXPECT_EQ(plan.steps[0].stream, TransferPlan::kChecksumStream);
  EXPECT_EQ(plan.steps_of(StepKind::kChecksum), 1u);
  EXPECT_EQ(plan.events, 0);  // Nothing to order: both sides only read the device.
  EXPECT_EQ(plan.ranges.size(), 3u + 2u);
  EXPECT_THAT(plan.chunk_index[0], ::testing::ElementsAre(0, 1, 2, -1));
  EXPECT_TRUE(plan.chunk_index[1].empty());

  for (uint64_t seed = 0; seed < 5; ++seed) {
    std::fill(host.begin(), host.end(), 0);
    std::vector<uint64_t> sums(plan.ranges.size());
    ASSERT_OK(SimulatePlan(plan, seed, [&](const PlanStep& s) {
      for (size_t k = s.begin; k < s.end; ++k) {
        if (s.kind == StepKind::kCopy) {
          std::memcpy(plan.copies[k].dst, plan.copies[k].src, plan.copies[k].bytes);
        } else if (s.kind == StepKind::kChecksum) {
          sums[k] = ChunkChecksum(plan.ranges[k].ptr, plan.ranges[k].bytes);
        }
      }
      return absl::OkStatus();
    }));
    const std::vector<uint64_t> got = BlockChecksums(plan, sums, blocks);
    EXPECT_EQ(got[0], PayloadChecksum(dev.data(), blocks[0].bytes));
    EXPECT_EQ(got[1], 0u);
    EXPECT_EQ(got[2], PayloadChecksum(dev.data() + 5 * kMiB, blocks[2].bytes));
    EXPECT_EQ(std::memcmp(host.data(), dev.data(), blocks[0].bytes), 0);
  }
}

// A landing of three blocks (one large, one with a hashed tail, one tiny),
// two re-anchored, in host memory posing as the device.
struct Landing {
  std::vector<uint8_t> host = Random(24 * kMiB, 7);
  std::vector<uint8_t> dev = std::vector<uint8_t>(24 * kMiB, 0);
  std::vector<DeviceReanchorJob> jobs;
  std::vector<LandingBlock> blocks;

  Landing() {
    jobs.resize(2);
    const uint64_t sizes[] = {16 * kMiB, 5 * kMiB + 300, 200};
    const uint64_t offsets[] = {0, 17 * kMiB, 23 * kMiB};
    for (int i = 0; i < 3; ++i) {
      blocks.push_back(LandingBlock{host.data() + offsets[i], dev.data() + offsets[i], sizes[i],
                                    true, nullptr});
    }
    jobs[0].device_payload = blocks[0].device_dst;
    jobs[0].payload_bytes = blocks[0].bytes;
    jobs[1].device_payload = blocks[1].device_dst;
    jobs[1].payload_bytes = blocks[1].bytes;
    blocks[0].reanchor = &jobs[0];
    blocks[1].reanchor = &jobs[1];
  }

  // Runs `plan` in the interleaving of `seed`: copies, checksums, and a
  // stand-in for re-anchoring that rewrites the whole payload (what matters
  // is that it must come after the hashing and before nothing else).
  std::vector<uint64_t> Run(const TransferPlan& plan, uint64_t seed) {
    std::fill(dev.begin(), dev.end(), 0);
    std::vector<uint64_t> sums(plan.ranges.size());
    EXPECT_OK(SimulatePlan(plan, seed, [&](const PlanStep& s) {
      for (size_t k = s.begin; k < s.end; ++k) {
        if (s.kind == StepKind::kCopy) {
          std::memcpy(plan.copies[k].dst, plan.copies[k].src, plan.copies[k].bytes);
        } else if (s.kind == StepKind::kChecksum) {
          sums[k] = ChunkChecksum(plan.ranges[k].ptr, plan.ranges[k].bytes);
        } else if (s.kind == StepKind::kReanchor) {
          auto* p = static_cast<uint8_t*>(plan.jobs[k].device_payload);
          for (uint64_t i = 0; i < plan.jobs[k].payload_bytes; i += 4096) p[i] ^= 0x5a;
        }
      }
      return absl::OkStatus();
    }));
    return BlockChecksums(plan, sums, blocks);
  }
};

TEST(TransferPlanTest, LandingPipelinesCopyVerifyAndReanchor) {
  Landing l;
  ASSERT_OK_AND_ASSIGN(const TransferPlan plan, PlanLanding(l.blocks));
  EXPECT_OK(CheckPlanOrdering(plan));
  std::vector<CopyOp> ops;
  for (const LandingBlock& b : l.blocks) ops.push_back({b.device_dst, b.host_src, b.bytes});
  ExpectCovers(plan, ops);
  // 2 MiB pieces: 8 + 3 + 1; the tiny block joins the 5 MiB block's last
  // piece (300 bytes) in one group, so 11 copy steps, each followed by a
  // checksum launch on the checksum stream.
  EXPECT_EQ(plan.copies.size(), 12u);
  EXPECT_EQ(plan.copy_steps(), 11u);
  EXPECT_EQ(plan.steps_of(StepKind::kChecksum), 11u);
  EXPECT_EQ(plan.steps_of(StepKind::kReanchor), 2u);
  // Copy streams never wait: DMA of piece k+1 is never held up by the
  // hashing of piece k.
  for (const PlanStep& s : plan.steps) {
    if (s.kind == StepKind::kWait) {
      EXPECT_LT(s.stream, TransferPlan::kFirstCopyStream);
    }
    if (s.kind == StepKind::kCopy) {
      EXPECT_GE(s.stream, TransferPlan::kFirstCopyStream);
    }
  }
  // Block 0 is re-anchored right after its last piece is hashed, before the
  // later blocks' copies are issued (they land while it rotates).
  size_t first_reanchor = 0, last_copy = 0;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    if (plan.steps[i].kind == StepKind::kReanchor && first_reanchor == 0) first_reanchor = i;
    if (plan.steps[i].kind == StepKind::kCopy) last_copy = i;
  }
  EXPECT_LT(first_reanchor, last_copy);
  // The 200-byte block is hashed on the host; the 5 MiB + 300 block's
  // 300-byte tail on the device.
  EXPECT_THAT(l.blocks[2].bytes, 200u);
  EXPECT_THAT(plan.chunk_index[2], ::testing::ElementsAre(-1));
  EXPECT_EQ(plan.chunk_index[1].size(), 6u);
  EXPECT_GE(plan.chunk_index[1][5], 0);

  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::vector<uint64_t> got = l.Run(plan, seed);
    for (size_t i = 0; i < l.blocks.size(); ++i) {
      EXPECT_EQ(got[i], PayloadChecksum(l.blocks[i].host_src, l.blocks[i].bytes))
          << "block " << i << " seed " << seed;
    }
  }
}

TEST(TransferPlanTest, MissingOrderingIsCaughtByTheCheckAndTheSimulation) {
  Landing l;
  ASSERT_OK_AND_ASSIGN(const TransferPlan good, PlanLanding(l.blocks));
  // Without the checksum stream's waits, hashing may read bytes that have
  // not landed.
  TransferPlan no_wait = good;
  std::erase_if(no_wait.steps, [](const PlanStep& s) {
    return s.kind == StepKind::kWait && s.stream == TransferPlan::kChecksumStream;
  });
  EXPECT_THAT(CheckPlanOrdering(no_wait),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("unordered")));
  bool wrong = false;
  for (uint64_t seed = 0; seed < 20 && !wrong; ++seed) {
    const std::vector<uint64_t> got = l.Run(no_wait, seed);
    wrong = got[0] != PayloadChecksum(l.blocks[0].host_src, l.blocks[0].bytes);
  }
  EXPECT_TRUE(wrong) << "no interleaving showed the race";

  // Without the re-anchor stream's waits, K may rotate before it is hashed.
  TransferPlan early_rope = good;
  std::erase_if(early_rope.steps, [](const PlanStep& s) {
    return s.kind == StepKind::kWait && s.stream == TransferPlan::kReanchorStream;
  });
  EXPECT_THAT(CheckPlanOrdering(early_rope),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("reanchor")));

  // A wait for an event never recorded before it.
  TransferPlan dangling = good;
  dangling.steps.insert(dangling.steps.begin(),
                        PlanStep{StepKind::kWait, TransferPlan::kChecksumStream, 0, 0, 0});
  EXPECT_THAT(CheckPlanOrdering(dangling),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("no earlier step")));
  EXPECT_THAT(SimulatePlan(dangling, 0, [](const PlanStep&) { return absl::OkStatus(); }),
              StatusIs(absl::StatusCode::kInternal));
}

TEST(TransferPlanTest, ManySmallBlocksLandInFewSteps) {
  // 64 blocks of 64 KiB, verified: 2 groups of 2 MiB, so 2 copy calls and 2
  // checksum launches for 64 blocks, not 64 of each.
  std::vector<uint8_t> host = Random(4 * kMiB, 3), dev(8 * kMiB);
  std::vector<LandingBlock> blocks;
  for (int i = 0; i < 64; ++i) {
    blocks.push_back({host.data() + i * 65536, dev.data() + (63 - i) * 2 * 65536, 65536, true,
                      nullptr});
  }
  ASSERT_OK_AND_ASSIGN(const TransferPlan plan, PlanLanding(blocks));
  EXPECT_OK(CheckPlanOrdering(plan));
  EXPECT_EQ(plan.copy_steps(), 2u);
  EXPECT_EQ(plan.steps_of(StepKind::kChecksum), 2u);
  EXPECT_EQ(plan.ranges.size(), 64u);
}

TEST(TransferPlanTest, PlainLandingHasNoEvents) {
  std::vector<uint8_t> host(3 * kMiB), dev(3 * kMiB);
  const LandingBlock b{host.data(), dev.data(), 3 * kMiB, false, nullptr};
  ASSERT_OK_AND_ASSIGN(const TransferPlan plan, PlanLanding({&b, 1}));
  EXPECT_EQ(plan.events, 0);
  EXPECT_EQ(plan.copy_steps(), 2u);
}

TEST(TransferPlanTest, ChecksumsMatchThePayloadChecksumAtEverySize) {
  for (uint64_t size : {uint64_t{1}, uint64_t{240}, uint64_t{241}, kMiB, kMiB + 1, kMiB + 240,
                        kMiB + 241, 3 * kMiB - 7}) {
    const std::vector<uint8_t> src = Random(size, size);
    std::vector<uint8_t> dst(size);
    const FetchBlock b{src.data(), dst.data(), size, true};
    const TransferPlan plan = PlanFetch({&b, 1});
    std::vector<uint64_t> sums;
    for (const DeviceRange& r : plan.ranges) sums.push_back(ChunkChecksum(r.ptr, r.bytes));
    std::memcpy(dst.data(), src.data(), size);
    EXPECT_EQ(BlockChecksums(plan, sums, {&b, 1})[0], PayloadChecksum(src.data(), size))
        << size;
  }
}

TEST(TransferPlanTest, BadOptionsAndJobsAreRefused) {
  std::vector<uint8_t> host(kMiB), dev(kMiB);
  const LandingBlock b{host.data(), dev.data(), kMiB, true, nullptr};
  PipelineOptions o;
  o.chunk_bytes = kMiB + 1;
  EXPECT_THAT(PlanLanding({&b, 1}, o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("chunk_bytes")));
  o = {};
  o.copy_streams = 0;
  EXPECT_THAT(CheckPipelineOptions(o), StatusIs(absl::StatusCode::kInvalidArgument));
  DeviceReanchorJob elsewhere;
  elsewhere.device_payload = host.data();
  elsewhere.payload_bytes = kMiB;
  const LandingBlock wrong{host.data(), dev.data(), kMiB, true, &elsewhere};
  EXPECT_THAT(PlanLanding({&wrong, 1}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("reanchor")));
}

}  // namespace
}  // namespace evoke
