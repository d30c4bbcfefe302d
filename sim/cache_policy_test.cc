#include "sim/cache_policy.h"

#include <random>

#include "absl/container/flat_hash_set.h"

#include "gtest/gtest.h"

namespace evoke::sim {
namespace {

constexpr CachePolicyKind kAll[] = {CachePolicyKind::kLru,     CachePolicyKind::kSlru,
                                    CachePolicyKind::kArc,     CachePolicyKind::kTinyLfu,
                                    CachePolicyKind::kSessionLru, CachePolicyKind::kLruTurns,
                                    CachePolicyKind::kOptimal};

std::vector<BlockAccess> Reads(const std::vector<uint64_t>& keys) {
  std::vector<BlockAccess> out;
  uint32_t turn = 0;
  for (uint64_t k : keys) out.push_back({k, turn++ / 3, static_cast<uint32_t>(k % 7), 0, false});
  return out;
}

TEST(CachePolicyTest, NamesRoundTripAndUnknownNamesAreRefused) {
  for (CachePolicyKind k : kAll) {
    absl::StatusOr<CachePolicyKind> back = ParseCachePolicy(CachePolicyName(k));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, k);
  }
  absl::StatusOr<CachePolicyKind> bad = ParseCachePolicy("mru");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("mru"), absl::string_view::npos);
}

TEST(CachePolicyTest, LruEvictsTheLeastRecent) {
  // a b a c b with room for 2: a hits; c evicts b, so b misses.
  const CacheSimResult r = SimulateCache(Reads({1, 2, 1, 3, 2}), CachePolicyKind::kLru, 2);
  EXPECT_EQ(r.reads, 5u);
  EXPECT_EQ(r.hits, 1u);
  EXPECT_EQ(r.max_resident, 2u);
}

TEST(CachePolicyTest, WhatFitsIsAlwaysHitAfterItsFirstUse) {
  std::vector<uint64_t> keys;
  for (int round = 0; round < 5; ++round) {
    for (uint64_t k = 0; k < 20; ++k) keys.push_back(k);
  }
  for (CachePolicyKind k : kAll) {
    const CacheSimResult r = SimulateCache(Reads(keys), k, 20);
    EXPECT_EQ(r.hits, 80u) << CachePolicyName(k);
    EXPECT_LE(r.max_resident, 20u) << CachePolicyName(k);
  }
}

TEST(CachePolicyTest, EvictingByTurnKeepsATurnFromEvictingItsOwnContext) {
  // Two turns each read keys 1-6, with room for 4.
  std::vector<BlockAccess> stream;
  for (uint32_t turn = 0; turn < 2; ++turn) {
    for (uint64_t k = 1; k <= 6; ++k) stream.push_back({k, turn, 0, 0, false});
  }
  EXPECT_EQ(SimulateCache(stream, CachePolicyKind::kLru, 4).hits, 0u);  // Its loop case.
  const CacheSimResult r = SimulateCache(stream, CachePolicyKind::kLruTurns, 4);
  EXPECT_EQ(r.hits, 4u);  // 3-6 were kept after turn 0.
  EXPECT_EQ(r.max_resident, 6u);
}

TEST(CachePolicyTest, SegmentedPoliciesKeepARereadSetThroughAScan) {
  // Four keys read twice, a scan of 100 keys read once, the four again.
  std::vector<uint64_t> keys = {1, 2, 3, 4, 1, 2, 3, 4};
  for (uint64_t k = 100; k < 200; ++k) keys.push_back(k);
  for (uint64_t k = 1; k <= 4; ++k) keys.push_back(k);
  EXPECT_EQ(SimulateCache(Reads(keys), CachePolicyKind::kLru, 10).hits, 4u);
  EXPECT_EQ(SimulateCache(Reads(keys), CachePolicyKind::kSlru, 10).hits, 8u);
  EXPECT_EQ(SimulateCache(Reads(keys), CachePolicyKind::kOptimal, 10).hits, 8u);
}

TEST(CachePolicyTest, TheOfflineBoundIsNeverBeatenAndNoPolicyOverfills) {
  std::mt19937_64 rng(5);
  std::vector<double> w;
  for (int i = 0; i < 500; ++i) w.push_back(1.0 / (i + 1));
  std::discrete_distribution<uint64_t> zipf(w.begin(), w.end());
  std::vector<uint64_t> keys;
  for (int i = 0; i < 20000; ++i) keys.push_back(zipf(rng));
  AgentTraceOptions o;
  o.sessions = 60;
  const std::vector<BlockAccess> trace = AgentTraceAccesses(GenerateAgentTrace(o));
  for (const std::vector<BlockAccess>& stream : {Reads(keys), trace}) {
    for (uint64_t capacity : {8u, 50u, 200u}) {
      const uint64_t best = SimulateCache(stream, CachePolicyKind::kOptimal, capacity).hits;
      for (CachePolicyKind k : kAll) {
        const CacheSimResult r = SimulateCache(stream, k, capacity);
        EXPECT_LE(r.hits, best) << CachePolicyName(k) << " " << capacity;
        if (k != CachePolicyKind::kLruTurns) {  // It overfills within a turn.
          EXPECT_LE(r.max_resident, capacity) << CachePolicyName(k);
        }
        // (8 blocks, less than one prompt read in order, is LRU's worst case.)
        if (capacity >= 50) {
          EXPECT_GT(r.hits, 0u) << CachePolicyName(k) << " " << capacity;
        }
      }
    }
  }
}

TEST(CachePolicyTest, TheTraceStreamReadsEachTurnsContextThenWritesItsNewBlocks) {
  AgentTraceOptions o;
  o.sessions = 40;
  const AgentTrace trace = GenerateAgentTrace(o);
  const std::vector<BlockAccess> accesses = AgentTraceAccesses(trace);
  uint64_t reads = 0, writes = 0;
  for (const AgentTurn& t : trace.turns) {
    reads += o.prompt_blocks + t.context_blocks;
    writes += t.new_blocks;
  }
  uint64_t seen_reads = 0, seen_writes = 0;
  for (const BlockAccess& a : accesses) (a.write ? seen_writes : seen_reads)++;
  EXPECT_EQ(seen_reads, reads);
  EXPECT_EQ(seen_writes, writes);
  // A block is written before any read of it, except prompt blocks (read
  // first, never written: a miss prefills them).
  absl::flat_hash_set<uint64_t> written;
  for (const BlockAccess& a : accesses) {
    if (a.write) {
      EXPECT_TRUE(written.insert(a.key).second);
    } else if (a.owner < o.sessions) {
      EXPECT_TRUE(written.contains(a.key));
    }
  }
}

}  // namespace
}  // namespace evoke::sim
