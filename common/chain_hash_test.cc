#include "common/chain_hash.h"

#include <vector>

#include "gtest/gtest.h"

namespace evoke {
namespace {

const FingerprintDigest kFp(0x1111, 0x2222);

TEST(ChainHashTest, DeterministicAndChained) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<BlockId> chain = PrefixChain(tokens, 4, kFp);
  ASSERT_EQ(chain.size(), 2u);
  const BlockId first = PrefixBlockId(BlockId(), {1, 2, 3, 4}, kFp);
  EXPECT_EQ(chain[0], first);
  EXPECT_EQ(chain[1], PrefixBlockId(first, {5, 6, 7, 8}, kFp));
  EXPECT_EQ(PrefixChain(tokens, 4, kFp), chain);
}

TEST(ChainHashTest, EveryInputMatters) {
  const BlockId base = PrefixBlockId(BlockId(), {1, 2, 3}, kFp);
  EXPECT_NE(base, PrefixBlockId(BlockId(), {1, 2, 4}, kFp));
  EXPECT_NE(base, PrefixBlockId(BlockId(0, 1), {1, 2, 3}, kFp));
  EXPECT_NE(base, PrefixBlockId(BlockId(), {1, 2, 3}, FingerprintDigest(1, 1)));
  EXPECT_NE(base, PrefixBlockId(BlockId(), {1, 2}, kFp));
  // Two chains that share a later block's tokens but not the earlier ones
  // differ at that block too.
  const std::vector<int32_t> a = {1, 2, 9, 9};
  const std::vector<int32_t> b = {3, 4, 9, 9};
  EXPECT_NE(PrefixChain(a, 2, kFp)[1], PrefixChain(b, 2, kFp)[1]);
}

TEST(ChainHashTest, PartialTrailingBlockExcluded) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5};
  EXPECT_EQ(PrefixChain(tokens, 2, kFp).size(), 2u);
  EXPECT_TRUE(PrefixChain(tokens, 0, kFp).empty());
  EXPECT_TRUE(PrefixChain(tokens, 6, kFp).empty());
}

TEST(ChainHashTest, SessionIds) {
  const BlockId id = SessionBlockId("ns", "s1", 7);
  EXPECT_EQ(id, SessionBlockId("ns", "s1", 7));
  EXPECT_NE(id, SessionBlockId("ns", "s1", 8));
  EXPECT_NE(id, SessionBlockId("ns", "s2", 7));
  EXPECT_NE(id, SessionBlockId("ns2", "s1", 7));
  // Length prefixes keep ("ab","c") and ("a","bc") apart.
  EXPECT_NE(SessionBlockId("ab", "c", 0), SessionBlockId("a", "bc", 0));
}

}  // namespace
}  // namespace evoke
