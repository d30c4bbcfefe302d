#include "testing/blocks.h"

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/block_validation.h"
#include "common/chain_hash.h"
#include "common/fingerprint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke::testing {
namespace {

using ::testing::HasSubstr;

TEST(BlocksTest, FingerprintsAreValid) {
  const BlockLimits limits;
  EXPECT_OK(ValidateFingerprint(OpaqueFingerprint(), limits, "opaque"));
  EXPECT_OK(ValidateFingerprint(CanonicalFingerprint("ns", "m", 32, 8, 128, v1::DTYPE_BF16),
                                limits, "canonical"));
  EXPECT_OK(ValidateFingerprint(SmallFingerprint(), limits, "small"));
}

TEST(BlocksTest, OpaqueFingerprintAcceptsAnySize) {
  const v1::LayoutFingerprint fp = OpaqueFingerprint("a", "b");
  EXPECT_EQ(fp.namespace_(), "a");
  EXPECT_EQ(fp.model_id(), "b");
  EXPECT_EQ(fp.layout(), v1::LAYOUT_OPAQUE);
  const v1::BlockMeta meta = SessionMeta(fp, "s", 0, 16, 0, 1, 0);
  EXPECT_OK(ValidateBlockForSave(meta, 12345, BlockLimits(), "b"));
}

// The end-to-end tests' layout; tests depend on these sizes (2 KiB a token).
TEST(BlocksTest, SmallFingerprintIsTheE2eLayout) {
  const v1::LayoutFingerprint fp = SmallFingerprint("x");
  EXPECT_EQ(fp.namespace_(), "x");
  EXPECT_EQ(fp.model_id(), "test/tiny-llama");
  EXPECT_EQ(fp.model_revision(), "r1");
  EXPECT_EQ(fp.n_layers(), 4u);
  EXPECT_EQ(fp.n_kv_heads(), 2u);
  EXPECT_EQ(fp.head_dim(), 64u);
  EXPECT_EQ(fp.k_dtype(), v1::DTYPE_F16);
  EXPECT_EQ(fp.v_dtype(), v1::DTYPE_F16);
  EXPECT_EQ(fp.layout(), v1::LAYOUT_CANONICAL_V1);
  EXPECT_EQ(fp.rope().type(), v1::ROPE_NEOX);
  EXPECT_EQ(fp.rope().freq_base(), 10000);
  EXPECT_THAT(CanonicalPayloadBytes(fp, 1, 4), IsOkAndHolds(2048u));
}

TEST(BlocksTest, SessionMetaIdsAreTheDaemons) {
  const v1::LayoutFingerprint fp = SmallFingerprint("ns1");
  const v1::BlockMeta m = SessionMeta(fp, "sess", 3, 16);
  EXPECT_EQ(IdOf(m), SessionBlockId("ns1", "sess", 3));
  EXPECT_EQ(m.kind(), v1::BLOCK_KIND_SESSION);
  EXPECT_EQ(m.layer_begin(), 0u);
  EXPECT_EQ(m.layer_end(), 4u);
  EXPECT_EQ(m.first_position(), 48);
  EXPECT_OK(ValidateBlockForSave(m, CanonicalPayload(m, 1).size(), BlockLimits(), "b"));
  EXPECT_EQ(IdOf(v1::BlockMeta()), BlockId());
}

TEST(BlocksTest, PrefixChainMetasChainLikePrefixChain) {
  const v1::LayoutFingerprint fp = SmallFingerprint();
  std::vector<int32_t> tokens(70);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(100 + i);
  const std::vector<v1::BlockMeta> metas = PrefixChainMetas(fp, tokens, 16);
  const std::vector<BlockId> chain = PrefixChain(tokens, 16, DigestFingerprint(fp));
  ASSERT_EQ(metas.size(), 4u);  // The trailing 6 tokens are not a block.
  ASSERT_EQ(chain.size(), 4u);
  for (size_t i = 0; i < metas.size(); ++i) {
    EXPECT_EQ(IdOf(metas[i]), chain[i]) << i;
    EXPECT_EQ(metas[i].kind(), v1::BLOCK_KIND_PREFIX);
    EXPECT_EQ(metas[i].first_position(), static_cast<int32_t>(16 * i));
    EXPECT_EQ(metas[i].tokens(0), static_cast<int32_t>(100 + 16 * i));
    EXPECT_EQ(metas[i].parent_id(), i == 0 ? "" : chain[i - 1].ToBytes());
  }
}

TEST(BlocksTest, PayloadsAreDeterministic) {
  EXPECT_EQ(Payload(7, 1000), Payload(7, 1000));
  EXPECT_NE(Payload(7, 1000), Payload(8, 1000));
  EXPECT_EQ(Payload(7, 0), "");
  EXPECT_EQ(Payload(7, 13).size(), 13u);
  // Pinned bytes: the same on every machine and run (xorshift64 from a
  // splitmix-style seed), so stored test data never silently changes.
  uint64_t words[2];
  const std::string p = Payload(1, 16);
  std::memcpy(words, p.data(), 16);
  EXPECT_EQ(words[0], 0x74b13e34a4e62b8fULL);
  EXPECT_EQ(words[1], 0xd82b2754f964e418ULL);
  std::string filled(1000, '\0');
  FillPayload(7, filled.data(), filled.size());
  EXPECT_EQ(filled, Payload(7, 1000));
}

TEST(BlocksTest, SessionBlockCarriesACanonicalPayload) {
  const TestBlock b = SessionBlock("s", 2, 64);
  EXPECT_EQ(b.payload.size(), 64u * 2048);
  EXPECT_EQ(b.id(), SessionBlockId("test", "s", 2));
  EXPECT_EQ(SessionBlock("s", 2, 64).payload, b.payload);
  EXPECT_NE(SessionBlock("s", 3, 64).payload, b.payload);
  EXPECT_NE(SessionBlock("t", 2, 64).payload, b.payload);
}

TEST(BlocksTest, WaitUntilReturnsOnceTrue) {
  int calls = 0;
  const absl::Time start = absl::Now();
  EXPECT_TRUE(WaitUntil([&] { return ++calls == 3; }, absl::Seconds(10),
                        absl::Milliseconds(1)));
  EXPECT_EQ(calls, 3);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(BlocksTest, WaitUntilGivesUpAtTheTimeoutAfterALastPoll) {
  int calls = 0;
  const absl::Time start = absl::Now();
  EXPECT_FALSE(WaitUntil([&] { return ++calls < 0; }, absl::Milliseconds(100),
                         absl::Milliseconds(30)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_GE(calls, 4);  // t = 0, 30, 60, 90 and the deadline.
  EXPECT_LE(calls, 6);
}

TEST(BlocksTest, EventuallyNamesWhatDidNotHappen) {
  const ::testing::AssertionResult r =
      Eventually([] { return false; }, "the lease ends", absl::Milliseconds(20));
  EXPECT_FALSE(r);
  EXPECT_THAT(r.message(), HasSubstr("the lease ends: still false after 20ms"));
  EXPECT_TRUE(Eventually([] { return true; }, "x"));
}

}  // namespace
}  // namespace evoke::testing
