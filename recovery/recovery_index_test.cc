#include "recovery/recovery_index.h"

#include <random>

#include "common/chain_hash.h"
#include "common/fingerprint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint32_t kHeads = 4, kDim = 16;

v1::LayoutFingerprint Fp() {
  v1::LayoutFingerprint fp;
  fp.set_namespace_("ns");
  fp.set_model_id("m");
  fp.set_k_dtype(v1::DTYPE_F16);
  fp.set_v_dtype(v1::DTYPE_F16);
  fp.set_n_layers(2);
  fp.set_n_kv_heads(kHeads);
  fp.set_head_dim(kDim);
  fp.set_layout(v1::LAYOUT_CANONICAL_V1);
  return fp;
}

v1::BlockMeta Block(const std::string& session, uint64_t seq, const std::vector<float>& keys) {
  v1::BlockMeta m;
  *m.mutable_fingerprint() = Fp();
  m.set_kind(v1::BLOCK_KIND_SESSION);
  m.set_session_id(session);
  m.set_sequence(seq);
  m.set_id(SessionBlockId("ns", session, seq).ToBytes());
  v1::Summary* s = m.add_summaries();
  s->set_kind(v1::SUMMARY_MEAN_KEYS);
  s->set_layer(1);
  s->set_heads(kHeads);
  s->set_dim(kDim);
  s->mutable_values()->Assign(keys.begin(), keys.end());
  return m;
}

std::vector<float> Random(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

RecoveryQuery Query(const std::string& scope, const std::vector<float>& q, uint32_t n_q,
                    uint32_t k) {
  RecoveryQuery query;
  query.scope = scope;
  query.kind = v1::SUMMARY_MEAN_KEYS;
  query.layer = 1;
  query.queries = q;
  query.n_query_heads = n_q;
  query.k = k;
  return query;
}

TEST(RecoveryIndexTest, FindsTheMostSimilarBlockWithGqa) {
  RecoveryIndex index;
  std::mt19937 rng(1);
  std::vector<std::vector<float>> keys;
  for (int i = 0; i < 50; ++i) {
    keys.push_back(Random(rng, kHeads * kDim));
    index.Add(SessionBlockId("ns", "s", i), Block("s", i, keys.back()));
  }
  // 8 query heads over 4 KV heads: each query head is its KV head's key of
  // block 17 plus noise.
  std::vector<float> q;
  for (uint32_t h = 0; h < 8; ++h) {
    for (uint32_t d = 0; d < kDim; ++d) q.push_back(keys[17][(h / 2) * kDim + d] * 3 + 0.1f * d);
  }
  uint64_t candidates = 0;
  ASSERT_OK_AND_ASSIGN(std::vector<RecoveryHit> hits,
                       index.Search(Query(SessionScopeKey("ns", "s"), q, 8, 3), &candidates));
  ASSERT_EQ(hits.size(), 3u);
  EXPECT_EQ(hits[0].id, SessionBlockId("ns", "s", 17));
  EXPECT_EQ(candidates, 50u);
  EXPECT_GE(hits[0].score, hits[1].score);
  // The model scope sees the same blocks.
  ASSERT_OK_AND_ASSIGN(hits, index.Search(Query(ModelScopeKey(DigestFingerprint(Fp())), q, 8, 1),
                                          nullptr));
  EXPECT_EQ(hits[0].id, SessionBlockId("ns", "s", 17));
}

TEST(RecoveryIndexTest, ApproximateScanAgreesWithExactScan) {
  RecoveryIndex index;
  std::mt19937 rng(2);
  for (int i = 0; i < 3000; ++i) {
    index.Add(SessionBlockId("ns", "s", i), Block("s", i, Random(rng, kHeads * kDim)));
  }
  int agree = 0, total = 0;
  for (bool max : {false, true}) {
    for (int trial = 0; trial < 40; ++trial) {
      const std::vector<float> q = Random(rng, 8 * kDim);
      RecoveryQuery query = Query(SessionScopeKey("ns", "s"), q, 8, 8);
      query.aggregate_max = max;
      ASSERT_OK_AND_ASSIGN(std::vector<RecoveryHit> fast, index.Search(query, nullptr));
      ASSERT_OK_AND_ASSIGN(std::vector<RecoveryHit> exact, index.SearchExact(query));
      ASSERT_EQ(fast.size(), 8u);
      for (size_t i = 0; i < fast.size(); ++i) {
        EXPECT_NEAR(fast[i].score, exact[i].score, 1e-3f * (1 + std::fabs(exact[i].score)));
        agree += fast[i].id == exact[i].id;
        ++total;
      }
    }
  }
  // Rescoring in f32 after the int8 scan: the top 8 match the exact scan.
  EXPECT_GE(agree, total * 99 / 100);
}

TEST(RecoveryIndexTest, ExcludeMinScoreAndRemove) {
  RecoveryIndex index;
  std::vector<float> a(kHeads * kDim, 1.0f), b(kHeads * kDim, 0.5f), c(kHeads * kDim, -1.0f);
  index.Add(SessionBlockId("ns", "s", 0), Block("s", 0, a));
  index.Add(SessionBlockId("ns", "s", 1), Block("s", 1, b));
  index.Add(SessionBlockId("ns", "s", 2), Block("s", 2, c));
  const std::vector<float> q(kHeads * kDim, 1.0f);
  RecoveryQuery query = Query(SessionScopeKey("ns", "s"), q, kHeads, 3);
  absl::flat_hash_set<BlockId> exclude = {SessionBlockId("ns", "s", 0)};
  query.exclude = &exclude;
  query.has_min_score = true;
  query.min_score = 0;
  ASSERT_OK_AND_ASSIGN(std::vector<RecoveryHit> hits, index.Search(query, nullptr));
  ASSERT_EQ(hits.size(), 1u);  // Block 0 excluded, block 2 below 0.
  EXPECT_EQ(hits[0].id, SessionBlockId("ns", "s", 1));
  // Mean over query heads of dot products: 0.5 * kDim.
  EXPECT_NEAR(hits[0].score, 0.5f * kDim, 1e-4);
  index.Remove(SessionBlockId("ns", "s", 1), Block("s", 1, b));
  EXPECT_EQ(index.Rows(SessionScopeKey("ns", "s"), v1::SUMMARY_MEAN_KEYS, 1), 2u);
  ASSERT_OK_AND_ASSIGN(hits, index.Search(query, nullptr));
  EXPECT_TRUE(hits.empty());
}

TEST(RecoveryIndexTest, ShapeErrorsAndEmptyScopes) {
  RecoveryIndex index;
  index.Add(SessionBlockId("ns", "s", 0), Block("s", 0, std::vector<float>(kHeads * kDim, 1)));
  const std::vector<float> q(6 * kDim, 1.0f);
  EXPECT_THAT(index.Search(Query(SessionScopeKey("ns", "s"), q, 6, 1), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("n_query_heads: 6")));
  const std::vector<float> short_q(4 * kDim - 1, 1.0f);
  EXPECT_THAT(index.Search(Query(SessionScopeKey("ns", "s"), short_q, 4, 1), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("queries: has 63 floats")));
  EXPECT_THAT(index.Search(Query(SessionScopeKey("ns", "other"), q, 4, 1), nullptr),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("SUMMARY_MEAN_KEYS")));
  RecoveryQuery wrong_layer = Query(SessionScopeKey("ns", "s"), q, 4, 1);
  wrong_layer.layer = 0;
  EXPECT_THAT(index.Search(wrong_layer, nullptr), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace evoke

namespace evoke {
namespace {

// Summaries that would break the search (a NaN ranks first and breaks the
// sort's ordering; heads = 0 divides by zero in the shape check) are never
// indexed, whether a client sent them or a record on disk holds them.
TEST(RecoveryIndexTest, SummariesThatCannotBeScoredAreRefused) {
  RecoveryIndex index;
  std::vector<float> good(kHeads * kDim, 0.25f);
  std::vector<float> nan = good;
  nan[3] = std::nanf("");
  std::vector<float> inf = good;
  inf[0] = INFINITY;
  index.Add(SessionBlockId("ns", "s", 0), Block("s", 0, nan));  // First: it must not win.
  index.Add(SessionBlockId("ns", "s", 1), Block("s", 1, inf));
  v1::BlockMeta no_heads = Block("s", 2, good);
  no_heads.mutable_summaries(0)->set_heads(0);
  index.Add(SessionBlockId("ns", "s", 2), no_heads);
  v1::BlockMeta short_values = Block("s", 3, std::vector<float>(kDim, 1.0f));
  index.Add(SessionBlockId("ns", "s", 3), short_values);
  // Two scopes each (session and model): 4 blocks x 2.
  EXPECT_EQ(index.rejected_summaries(), 8u);
  EXPECT_EQ(index.Rows(SessionScopeKey("ns", "s"), v1::SUMMARY_MEAN_KEYS, 1), 0u);

  index.Add(SessionBlockId("ns", "s", 4), Block("s", 4, good));
  const std::vector<float> q(kHeads * kDim, 1.0f);
  RecoveryQuery query = Query(SessionScopeKey("ns", "s"), q, kHeads, 8);
  ASSERT_OK_AND_ASSIGN(std::vector<RecoveryHit> hits, index.Search(query, nullptr));
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_EQ(hits[0].id, SessionBlockId("ns", "s", 4));
  EXPECT_TRUE(std::isfinite(hits[0].score));
}

}  // namespace
}  // namespace evoke
