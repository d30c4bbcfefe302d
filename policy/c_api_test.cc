// The policies' C API, called only through evoke/evoke_policy.h.
#include "evoke/evoke_policy.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A 4-token sink block (handle 0) then 64-token blocks (handles 1, 2, ...).
std::vector<evoke_resident_block> Session(int n) {
  std::vector<evoke_resident_block> blocks;
  uint64_t token = 0;
  for (int i = 0; i < n; ++i) {
    evoke_resident_block b;
    std::memset(&b, 0, sizeof(b));
    b.handle = static_cast<uint64_t>(i);
    b.first_token = token;
    b.n_tokens = i == 0 ? 4 : 64;
    b.first_position = static_cast<int64_t>(token);
    token += b.n_tokens;
    blocks.push_back(b);
  }
  return blocks;
}

evoke_cache_view View(const std::vector<evoke_resident_block>& blocks, uint64_t budget,
                      const evoke_attention_stats* attention = nullptr) {
  evoke_cache_view v;
  std::memset(&v, 0, sizeof(v));
  v.layer = EVOKE_POLICY_ALL;
  v.head = EVOKE_POLICY_ALL;
  v.budget_tokens = budget;
  v.resident = blocks.data();
  v.n_resident = blocks.size();
  v.attention = attention;
  return v;
}

TEST(PolicyCApiTest, CreateReportsBadNamesAndSpecs) {
  evoke_policy* p = nullptr;
  EXPECT_EQ(evoke_policy_create("nope", nullptr, &p), EVOKE_INVALID_ARGUMENT);
  EXPECT_THAT(evoke_policy_last_error(), HasSubstr("streaming_llm"));
  EXPECT_EQ(evoke_policy_create("h2o", "h2o_recent_share=2", &p), EVOKE_INVALID_ARGUMENT);
  EXPECT_THAT(evoke_policy_last_error(), HasSubstr("h2o_recent_share"));
  EXPECT_EQ(p, nullptr);
  ASSERT_EQ(evoke_policy_create("infllm", "", &p), EVOKE_OK);
  EXPECT_STREQ(evoke_policy_last_error(), "");
  int recovers = -1, needs_attention = -1;
  evoke_policy_describe(p, &recovers, &needs_attention);
  EXPECT_EQ(recovers, 1);
  EXPECT_EQ(needs_attention, 0);
  evoke_policy_destroy(p);
  evoke_policy_destroy(nullptr);
  EXPECT_EQ(evoke_policy_validate_budget("streaming_llm", nullptr, 68), EVOKE_OK);
  EXPECT_EQ(evoke_policy_validate_budget("streaming_llm", "sink_tokens=8", 68),
            EVOKE_INVALID_ARGUMENT);
  EXPECT_THAT(evoke_policy_last_error(), HasSubstr("budget_tokens"));
}

TEST(PolicyCApiTest, StreamingLlmEvictsOldestNonSinkBlocks) {
  evoke_policy* p = nullptr;
  ASSERT_EQ(evoke_policy_create("streaming_llm", "block_tokens=64", &p), EVOKE_OK);
  const std::vector<evoke_resident_block> s = Session(5);
  evoke_cache_view v = View(s, 200);
  uint64_t out[8];
  size_t n = 99;
  ASSERT_EQ(evoke_policy_choose_evictions(p, &v, 10, out, 8, &n), EVOKE_OK);
  ASSERT_EQ(n, 2u);
  EXPECT_EQ(out[0], 1u);
  EXPECT_EQ(out[1], 2u);
  // Too small an output: RESOURCE_EXHAUSTED with the count needed.
  EXPECT_EQ(evoke_policy_choose_evictions(p, &v, 10, out, 1, &n), EVOKE_RESOURCE_EXHAUSTED);
  EXPECT_EQ(n, 2u);
  // Sinks + pending + incoming beyond the budget.
  v.budget_tokens = 4;
  EXPECT_EQ(evoke_policy_choose_evictions(p, &v, 1, out, 8, &n), EVOKE_RESOURCE_EXHAUSTED);
  EXPECT_EQ(evoke_policy_choose_evictions(p, nullptr, 1, out, 8, &n), EVOKE_INVALID_ARGUMENT);
  EXPECT_THAT(evoke_policy_last_error(), HasSubstr("view"));
  evoke_policy_destroy(p);
}

TEST(PolicyCApiTest, H2OReadsAttentionStats) {
  evoke_attention_stats* stats = nullptr;
  ASSERT_EQ(evoke_attention_stats_create(1, 1, 32, 1, 0, &stats), EVOKE_OK);
  const std::vector<evoke_resident_block> s = Session(5);
  // Block 1 is a heavy hitter, block 2 draws nothing.
  std::vector<uint64_t> of;
  std::vector<float> w;
  const float mass[5] = {0.3f, 0.5f, 0.0f, 0.1f, 0.1f};
  for (const evoke_resident_block& b : s) {
    for (uint32_t t = 0; t < b.n_tokens; ++t) {
      of.push_back(b.handle);
      w.push_back(mass[b.handle] / b.n_tokens);
    }
  }
  of.push_back(EVOKE_POLICY_NO_BLOCK);
  w.push_back(0.0f);
  ASSERT_EQ(evoke_attention_stats_observe(stats, 0, 0, of.data(), nullptr, w.data(), of.size()),
            EVOKE_OK);
  EXPECT_EQ(evoke_attention_stats_observe(stats, 1, 0, of.data(), nullptr, w.data(), of.size()),
            EVOKE_INVALID_ARGUMENT);
  EXPECT_THAT(evoke_policy_last_error(), HasSubstr("layer"));
  EXPECT_NEAR(evoke_attention_stats_cumulative(stats, 1, EVOKE_POLICY_ALL, EVOKE_POLICY_ALL), 0.5,
              1e-5);
  evoke_attention_stats_end_step(stats);
  EXPECT_NEAR(evoke_attention_stats_window(stats, 1, 0, 0), 0.5, 1e-5);
  evoke_policy* p = nullptr;
  ASSERT_EQ(evoke_policy_create("h2o", nullptr, &p), EVOKE_OK);
  evoke_cache_view v = View(s, 206, stats);
  uint64_t out[8];
  size_t n = 0;
  // 270 - 206 = 64 tokens: block 2 (least mass) alone.
  ASSERT_EQ(evoke_policy_choose_evictions(p, &v, 10, out, 8, &n), EVOKE_OK);
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(out[0], 2u);
  evoke_attention_stats_forget(stats, 1);
  EXPECT_EQ(evoke_attention_stats_cumulative(stats, 1, EVOKE_POLICY_ALL, EVOKE_POLICY_ALL), 0.0);
  evoke_policy_destroy(p);
  evoke_attention_stats_destroy(stats);
}

// A callback source: stored blocks 10..13 score 1..4; status to return.
struct Store {
  evoke_status status = EVOKE_OK;
  float last_min = -1;
  int calls = 0;
};

evoke_status Rank(void* user, const float* queries, uint32_t n_query_heads, uint32_t head_dim,
                  uint32_t k, const float* min_score, evoke_candidate* out, size_t* n_out) {
  Store* store = static_cast<Store*>(user);
  ++store->calls;
  if (store->status != EVOKE_OK) return store->status;
  if (queries == nullptr || n_query_heads != 2 || head_dim != 2) return EVOKE_INVALID_ARGUMENT;
  store->last_min = min_score != nullptr ? *min_score : -1;
  size_t n = 0;
  for (int s = 4; s >= 1 && n < k; --s) {
    if (min_score != nullptr && s < *min_score) continue;
    out[n++] = evoke_candidate{static_cast<uint64_t>(9 + s), static_cast<float>(s), 64};
  }
  *n_out = n;
  return EVOKE_OK;
}

TEST(PolicyCApiTest, EvokeRecoversThroughACallbackAscending) {
  Store store;
  evoke_recovery_source* src = nullptr;
  ASSERT_EQ(evoke_recovery_source_from_callback(Rank, &store, &src), EVOKE_OK);
  evoke_policy* p = nullptr;
  ASSERT_EQ(evoke_policy_create("evoke", "evoke_topk=3", &p), EVOKE_OK);
  std::vector<evoke_resident_block> s = Session(3);
  // Against q = (1, 0) per head, block 1 scores 1 and block 2 scores 2:
  // the weakest resident non-sink block (1) is the gate.
  const float summary1[2] = {1.0f, 1.0f};
  const float summary2[2] = {2.0f, 0.0f};
  s[1].summary = summary1;
  s[1].summary_len = 2;
  s[2].summary = summary2;
  s[2].summary_len = 2;
  evoke_cache_view v = View(s, 10000);
  const float q[4] = {1, 0, 1, 0};  // 2 query heads, head_dim 2, one KV head.
  evoke_candidate out[4];
  size_t n = 0;
  ASSERT_EQ(evoke_policy_choose_recoveries(p, &v, q, 2, 2, src, out, 4, &n), EVOKE_OK)
      << evoke_policy_last_error();
  EXPECT_FLOAT_EQ(store.last_min, 1.0f);  // Block 1 scores 1, block 2 scores 2.
  ASSERT_EQ(n, 3u);
  EXPECT_EQ(out[0].handle, 11u);
  EXPECT_EQ(out[1].handle, 12u);
  EXPECT_EQ(out[2].handle, 13u);
  // Errors of the source come back unchanged.
  store.status = EVOKE_UNAVAILABLE;
  EXPECT_EQ(evoke_policy_choose_recoveries(p, &v, q, 2, 2, src, out, 4, &n), EVOKE_UNAVAILABLE);
  // Callback sources cannot register blocks.
  EXPECT_EQ(evoke_recovery_source_register(src, 1, 1, 64), EVOKE_FAILED_PRECONDITION);
  EXPECT_EQ(evoke_policy_choose_recoveries(p, &v, q, 0, 2, src, out, 4, &n),
            EVOKE_INVALID_ARGUMENT);
  evoke_policy_destroy(p);
  // Recovery-less policies do not ask.
  ASSERT_EQ(evoke_policy_create("recency", nullptr, &p), EVOKE_OK);
  const int calls = store.calls;
  store.status = EVOKE_OK;
  ASSERT_EQ(evoke_policy_choose_recoveries(p, &v, q, 2, 2, src, out, 4, &n), EVOKE_OK);
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(store.calls, calls);
  evoke_policy_destroy(p);
  evoke_recovery_source_destroy(src);
}

TEST(PolicyCApiTest, ConnectValidatesArguments) {
  evoke_recovery_source* src = nullptr;
  EXPECT_EQ(evoke_recovery_source_connect(nullptr, "", "s", 0, &src), EVOKE_INVALID_ARGUMENT);
  EXPECT_THAT(evoke_policy_last_error(), HasSubstr("ns"));
}

}  // namespace
