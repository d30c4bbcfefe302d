#include "policy/policy.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/attention_stats.h"
#include "policy/fake_recovery_source.h"
#include "testing/status_matchers.h"

namespace evoke::policy {
namespace {

using ::evoke::testing::IsOk;
using ::evoke::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// A session laid out as the SessionDriver forms it: a 4-token sink block
// (handle 0), then 64-token blocks (handles 1, 2, ...), at contiguous
// positions.
std::vector<ResidentBlock> Session(int n_blocks) {
  std::vector<ResidentBlock> blocks;
  uint64_t token = 0;
  for (int i = 0; i < n_blocks; ++i) {
    ResidentBlock b;
    b.handle = i;
    b.first_token = token;
    b.n_tokens = i == 0 ? 4 : 64;
    b.first_position = static_cast<int64_t>(token);
    token += b.n_tokens;
    blocks.push_back(b);
  }
  return blocks;
}

uint64_t Tokens(const std::vector<ResidentBlock>& blocks) {
  uint64_t t = 0;
  for (const ResidentBlock& b : blocks) t += b.n_tokens;
  return t;
}

CacheView ViewOf(const std::vector<ResidentBlock>& blocks, uint64_t budget,
                 const AttentionStats* attention = nullptr, uint64_t pending = 0) {
  CacheView v;
  v.budget_tokens = budget;
  v.pending_tokens = pending;
  v.session_tokens = Tokens(blocks) + pending;
  v.resident = blocks;
  v.attention = attention;
  return v;
}

std::unique_ptr<Policy> Make(const std::string& name, const PolicyParams& p = {}) {
  absl::StatusOr<std::unique_ptr<Policy>> policy = MakePolicy(name, p);
  EXPECT_THAT(policy, IsOk());
  return std::move(policy).value();
}

// Summaries and queries with head_dim 2, one KV head, one query head.
RecoveryQuery Query(const std::vector<float>& q) { return RecoveryQuery{q, 1}; }

// ------------------------------------------------------------ ScoreSummary

TEST(ScoreSummaryTest, GroupedQueryHeadsScoreAgainstTheirKvHead) {
  // 4 query heads, 2 KV heads, head_dim 2: heads 0,1 -> kv 0; 2,3 -> kv 1.
  const std::vector<float> q = {1, 0, 0, 1, 2, 0, 1, 1};
  const std::vector<float> summary = {3, 5, 7, 11};
  // dots: (1*3+0*5)=3, (0*3+1*5)=5, (2*7+0)=14, (7+11)=18 -> mean 10.
  EXPECT_EQ(ScoreSummary({q, 4}, summary), std::optional<float>(10.0f));
}

TEST(ScoreSummaryTest, ShapesThatDoNotFitGiveNothing) {
  const std::vector<float> q = {1, 0, 0, 1, 2, 0};  // 3 heads x 2.
  EXPECT_EQ(ScoreSummary({q, 3}, {}), std::nullopt);
  EXPECT_EQ(ScoreSummary({q, 3}, std::vector<float>{1, 2, 3}), std::nullopt);  // Not x2.
  EXPECT_EQ(ScoreSummary({q, 3}, std::vector<float>{1, 2, 3, 4}), std::nullopt);  // 3 % 2.
  EXPECT_EQ(ScoreSummary({q, 4}, std::vector<float>{1, 2}), std::nullopt);  // 6 % 4.
  EXPECT_EQ(ScoreSummary({q, 0}, std::vector<float>{1, 2}), std::nullopt);
}

// ------------------------------------------------- parameters and factory

TEST(PolicyParamsTest, ParsesFullAndShortKeys) {
  PolicyParams p;
  ASSERT_OK(ParsePolicyParams(
      " block_tokens=32, h2o_recent_share=0.2,window=16 ,pool_kernel=3,"
      "infllm_topk=16,repr_tokens=2,evoke_topk=2,resident_gate=false,sink_tokens=0",
      &p));
  EXPECT_EQ(p.block_tokens, 32u);
  EXPECT_DOUBLE_EQ(p.h2o_recent_share, 0.2);
  EXPECT_EQ(p.snapkv_window, 16u);
  EXPECT_EQ(p.snapkv_pool_kernel, 3u);
  EXPECT_EQ(p.infllm_topk, 16u);
  EXPECT_EQ(p.infllm_repr_tokens, 2u);
  EXPECT_EQ(p.evoke_topk, 2u);
  EXPECT_FALSE(p.evoke_resident_gate);
  EXPECT_EQ(p.sink_tokens, 0u);
  EXPECT_DOUBLE_EQ(p.snapkv_recent_share, 0.05);  // Untouched.
  ASSERT_OK(ParsePolicyParams("", &p));
}

TEST(PolicyParamsTest, ErrorsNameTheKeyAndLeaveParamsAlone) {
  PolicyParams p;
  EXPECT_THAT(ParsePolicyParams("block_tokens=8,bogus=1", &p),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("bogus"), HasSubstr("h2o_recent_share"))));
  EXPECT_EQ(p.block_tokens, 64u);
  EXPECT_THAT(ParsePolicyParams("recent_share=0.1", &p),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("ambiguous"), HasSubstr("snapkv_recent_share"))));
  EXPECT_THAT(ParsePolicyParams("topk=3", &p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ambiguous")));
  EXPECT_THAT(ParsePolicyParams("block_tokens=abc", &p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_tokens")));
  EXPECT_THAT(ParsePolicyParams("block_tokens=-1", &p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_tokens")));
  EXPECT_THAT(ParsePolicyParams("block_tokens=0", &p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_tokens")));
  EXPECT_THAT(ParsePolicyParams("h2o_recent_share=1.5", &p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("h2o_recent_share")));
  EXPECT_THAT(ParsePolicyParams("snapkv_recent_share=-0.1", &p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("snapkv_recent_share")));
  EXPECT_THAT(ParsePolicyParams("snapkv_pool_kernel=4", &p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("snapkv_pool_kernel")));
  EXPECT_THAT(ParsePolicyParams("evoke_topk=0", &p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("evoke_topk")));
  EXPECT_THAT(ParsePolicyParams("infllm_topk=2000", &p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("infllm_topk")));
  EXPECT_THAT(ParsePolicyParams("evoke_resident_gate=maybe", &p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("evoke_resident_gate")));
  EXPECT_THAT(ParsePolicyParams("block_tokens", &p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key=value")));
  EXPECT_EQ(p.block_tokens, 64u);
}

TEST(MakePolicyTest, EveryNameMakesItsPolicy) {
  for (const std::string& name : PolicyNames()) {
    std::unique_ptr<Policy> p = Make(name);
    EXPECT_EQ(p->info().name, name);
    EXPECT_EQ(p->info().recovers, name == "infllm" || name == "evoke") << name;
    EXPECT_EQ(p->info().needs_attention, name == "h2o" || name == "snapkv") << name;
  }
  EXPECT_EQ(PolicyNames().size(), 6u);
}

TEST(MakePolicyTest, UnknownNameListsTheKnownOnes) {
  EXPECT_THAT(MakePolicy("pyramidkv"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("pyramidkv"), HasSubstr("streaming_llm"),
                                        HasSubstr("evoke"))));
  PolicyParams p;
  p.h2o_recent_share = 1.0;
  EXPECT_THAT(MakePolicy("h2o", p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("h2o_recent_share")));
}

TEST(ValidateBudgetTest, SinksPlusOneBlock) {
  PolicyParams p;  // 4 sinks, blocks of 64.
  EXPECT_OK(ValidateBudget("streaming_llm", p, 68));
  EXPECT_THAT(ValidateBudget("streaming_llm", p, 67),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("budget_tokens"), HasSubstr("68"))));
  EXPECT_THAT(ValidateBudget("evoke", p, 67), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ValidateBudget("infllm", p, 67), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_OK(ValidateBudget("recency", p, 64));
  EXPECT_THAT(ValidateBudget("recency", p, 63), StatusIs(absl::StatusCode::kInvalidArgument));
  // H2O: the recent guard (at least one block) plus one block.
  EXPECT_OK(ValidateBudget("h2o", p, 128));
  EXPECT_THAT(ValidateBudget("h2o", p, 127),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("budget_tokens")));
  EXPECT_THAT(ValidateBudget("nope", p, 1000), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ValidateBudgetTest, MinBudgetIsTheFirstAcceptedBudget) {
  PolicyParams p;
  for (const std::string& name : PolicyNames()) {
    ASSERT_OK_AND_ASSIGN(uint64_t min, MinBudget(name, p));
    EXPECT_OK(ValidateBudget(name, p, min)) << name;
    EXPECT_FALSE(ValidateBudget(name, p, min - 1).ok()) << name;
  }
  ASSERT_OK_AND_ASSIGN(uint64_t streaming, MinBudget("streaming_llm", p));
  EXPECT_EQ(streaming, 68u);
  ASSERT_OK_AND_ASSIGN(uint64_t h2o, MinBudget("h2o", p));
  EXPECT_EQ(h2o, 128u);
  // A larger recent share protects more blocks.
  p.h2o_recent_share = 0.6;
  ASSERT_OK_AND_ASSIGN(uint64_t big, MinBudget("h2o", p));
  EXPECT_OK(ValidateBudget("h2o", p, big));
  EXPECT_FALSE(ValidateBudget("h2o", p, big - 1).ok());
  EXPECT_GT(big, 128u);
  EXPECT_THAT(MinBudget("nope", p), StatusIs(absl::StatusCode::kInvalidArgument));
  // A share of 0.5: 128 fits (one guard block + one), 129-191 do not (the
  // guard rounds up to two blocks); the least is still 128.
  p.h2o_recent_share = 0.5;
  ASSERT_OK_AND_ASSIGN(uint64_t half, MinBudget("h2o", p));
  EXPECT_EQ(half, 128u);
  EXPECT_FALSE(ValidateBudget("h2o", p, 150).ok());
}

// ---------------------------------------------------------------- recency

TEST(RecencyTest, EvictsOldestFirstIncludingTheFirstBlock) {
  const std::vector<ResidentBlock> s = Session(5);  // 4 + 4 * 64 = 260 tokens.
  std::unique_ptr<Policy> p = Make("recency");
  ASSERT_OK_AND_ASSIGN(auto none, p->ChooseEvictions(ViewOf(s, 261), 1));
  EXPECT_THAT(none, IsEmpty());
  // One more token needs 1 token: the oldest block (the 4-token first one).
  ASSERT_OK_AND_ASSIGN(auto one, p->ChooseEvictions(ViewOf(s, 260), 1));
  EXPECT_THAT(one, ElementsAre(0u));
  // 270 - 206 = 64 tokens: the first two blocks (68).
  ASSERT_OK_AND_ASSIGN(auto two, p->ChooseEvictions(ViewOf(s, 206), 10));
  EXPECT_THAT(two, ElementsAre(0u, 1u));
  ASSERT_OK_AND_ASSIGN(auto three, p->ChooseEvictions(ViewOf(s, 200), 10));
  EXPECT_THAT(three, ElementsAre(0u, 1u, 2u));
  ASSERT_OK_AND_ASSIGN(auto all, p->ChooseEvictions(ViewOf(s, 1), 1));
  EXPECT_THAT(all, ElementsAre(0u, 1u, 2u, 3u, 4u));
  EXPECT_THAT(p->ChooseEvictions(ViewOf(s, 1, nullptr, 5), 1),
              StatusIs(absl::StatusCode::kResourceExhausted));
  // An incoming count that would wrap around when added is still too many.
  EXPECT_THAT(p->ChooseEvictions(ViewOf(s, 1000), UINT64_MAX),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(StreamingLlmTest, KeepsSinksAndEvictsOldestOthers) {
  std::vector<ResidentBlock> s = Session(5);
  std::reverse(s.begin(), s.end());  // Order in the view does not matter.
  std::unique_ptr<Policy> p = Make("streaming_llm");
  ASSERT_OK_AND_ASSIGN(auto two, p->ChooseEvictions(ViewOf(s, 200), 10));
  EXPECT_THAT(two, ElementsAre(1u, 2u));
  ASSERT_OK_AND_ASSIGN(auto all, p->ChooseEvictions(ViewOf(s, 5), 1));
  EXPECT_THAT(all, ElementsAre(1u, 2u, 3u, 4u));
  // Sinks (4) + pending (10) + incoming (1) cannot fit 14.
  EXPECT_THAT(p->ChooseEvictions(ViewOf(s, 14, nullptr, 10), 1),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("streaming_llm")));
}

TEST(StreamingLlmTest, RecoversNothing) {
  const std::vector<ResidentBlock> s = Session(3);
  FakeRecoverySource source;
  source.AddWithScore(9, 64, 1.0f);
  std::unique_ptr<Policy> p = Make("streaming_llm");
  ASSERT_OK_AND_ASSIGN(auto r, p->ChooseRecoveries(ViewOf(s, 1000), Query({1, 0}), source));
  EXPECT_THAT(r, IsEmpty());
  EXPECT_EQ(source.calls(), 0);
}

// ------------------------------------------------------------- h2o, snapkv

// One observed row for the session: `mass[h]` spread evenly over block h.
void ObserveBlocks(AttentionStats* stats, const std::vector<ResidentBlock>& blocks,
                   const std::vector<float>& mass, uint32_t layer = 0, uint32_t head = 0) {
  std::vector<BlockHandle> of;
  std::vector<uint32_t> in;
  std::vector<float> w;
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (uint32_t t = 0; t < blocks[i].n_tokens; ++t) {
      of.push_back(blocks[i].handle);
      in.push_back(t);
      w.push_back(mass[i] / blocks[i].n_tokens);
    }
  }
  ASSERT_OK(stats->Observe(layer, head, of, in, w));
}

TEST(H2OTest, ProtectsRecentShareAndKeepsHeavyHitters) {
  const std::vector<ResidentBlock> s = Session(7);  // 4 + 6 * 64 = 388.
  AttentionStats stats({.n_layers = 1, .n_heads = 1, .window = 4, .pool_kernel = 1});
  // Block 6 (newest) draws little, block 2 a lot, the sink a lot.
  ObserveBlocks(&stats, s, {0.3f, 0.01f, 0.3f, 0.02f, 0.03f, 0.04f, 0.0f});
  stats.EndStep();
  PolicyParams params;
  params.h2o_recent_share = 0.3;  // 0.3 * 260 = 78 tokens -> 2 blocks.
  std::unique_ptr<Policy> p = Make("h2o", params);
  ASSERT_OK_AND_ASSIGN(auto v, p->ChooseEvictions(ViewOf(s, 260, &stats), 1));
  // Lowest mass first among blocks 0..4 (5 and 6 protected): 1, 3; then
  // 4 would be next. 388 + 1 - 260 = 129 tokens: three 64-token blocks.
  EXPECT_THAT(v, ElementsAre(1u, 3u, 4u));
  // The guard (block 6, 64 tokens) + 1 incoming cannot fit 60.
  EXPECT_THAT(p->ChooseEvictions(ViewOf(s, 60, &stats), 1),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(H2OTest, WithoutStatisticsFallsBackToRecency) {
  const std::vector<ResidentBlock> s = Session(5);
  std::unique_ptr<Policy> p = Make("h2o");
  ASSERT_OK_AND_ASSIGN(auto v, p->ChooseEvictions(ViewOf(s, 206), 10));
  EXPECT_THAT(v, ElementsAre(0u, 1u));
}

TEST(H2OTest, TiesGoToTheOlderBlock) {
  const std::vector<ResidentBlock> s = Session(5);
  AttentionStats stats({.pool_kernel = 1});
  ObserveBlocks(&stats, s, {0.5f, 0.1f, 0.1f, 0.1f, 0.2f});
  std::unique_ptr<Policy> p = Make("h2o");
  ASSERT_OK_AND_ASSIGN(auto v, p->ChooseEvictions(ViewOf(s, 200, &stats), 10));
  EXPECT_THAT(v, ElementsAre(1u, 2u));
}

TEST(SnapKVTest, WindowForgetsOldMassWhileH2ORemembersIt) {
  const std::vector<ResidentBlock> s = Session(6);  // 4 + 5 * 64 = 324.
  AttentionStats stats({.n_layers = 1, .n_heads = 1, .window = 3, .pool_kernel = 1});
  // Early on block 1 is the heavy hitter; later block 2 is.
  for (int step = 0; step < 5; ++step) {
    ObserveBlocks(&stats, s, {0.5f, 0.4f, 0.0f, 0.05f, 0.03f, 0.02f});
    stats.EndStep();
  }
  for (int step = 0; step < 3; ++step) {
    ObserveBlocks(&stats, s, {0.5f, 0.0f, 0.4f, 0.05f, 0.03f, 0.02f});
    stats.EndStep();
  }
  PolicyParams params;
  params.h2o_recent_share = 0.05;
  params.snapkv_recent_share = 0.05;
  // Evict one 64-token block: 324 + 1 - 300 = 25 tokens.
  std::unique_ptr<Policy> h2o = Make("h2o", params);
  std::unique_ptr<Policy> snap = Make("snapkv", params);
  ASSERT_OK_AND_ASSIGN(auto hv, h2o->ChooseEvictions(ViewOf(s, 300, &stats), 1));
  ASSERT_OK_AND_ASSIGN(auto sv, snap->ChooseEvictions(ViewOf(s, 300, &stats), 1));
  // H2O: block 2 has 1.2 cumulative, block 1 has 2.0, 3 has 0.4, 4 has 0.24.
  EXPECT_THAT(hv, ElementsAre(4u));
  // Make block 4 a recent heavy hitter too; then H2O evicts 3, SnapKV 1.
  ObserveBlocks(&stats, s, {0.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0.0f});
  ASSERT_OK_AND_ASSIGN(hv, h2o->ChooseEvictions(ViewOf(s, 300, &stats), 1));
  ASSERT_OK_AND_ASSIGN(sv, snap->ChooseEvictions(ViewOf(s, 300, &stats), 1));
  EXPECT_THAT(hv, ElementsAre(3u));
  EXPECT_THAT(sv, ElementsAre(1u));  // Its mass left the 3-step window.
}

// ----------------------------------------------------------------- infllm

// Stored blocks 10..19 (64 tokens each) with summaries (x, 0) for x = handle.
void AddStored(FakeRecoverySource* source) {
  for (BlockHandle h = 10; h < 20; ++h) {
    source->AddWithSummary(h, 64, {static_cast<float>(h), 0.0f});
  }
}

ResidentBlock Recovered(BlockHandle handle, uint64_t first_token, int64_t position,
                        const std::vector<float>& summary) {
  ResidentBlock b;
  b.handle = handle;
  b.first_token = first_token;
  b.n_tokens = 64;
  b.first_position = position;
  b.recovered = true;
  b.summary = summary;
  return b;
}

TEST(InfLLMTest, SwapsTopKSets) {
  FakeRecoverySource source;
  AddStored(&source);
  PolicyParams params;
  params.infllm_topk = 2;
  std::unique_ptr<Policy> p = Make("infllm", params);
  std::vector<ResidentBlock> s = Session(4);  // 0 sink, 1..3.
  // Query (1, 0): the best stored are 19, 18; returned worst first.
  ASSERT_OK_AND_ASSIGN(auto r1, p->ChooseRecoveries(ViewOf(s, 10000), Query({1, 0}), source));
  ASSERT_EQ(r1.size(), 2u);
  EXPECT_EQ(r1[0].handle, 18u);
  EXPECT_EQ(r1[1].handle, 19u);
  EXPECT_EQ(source.last_k(), 2u);
  // They land at the tail.
  const std::vector<float> sum18 = {18, 0}, sum19 = {19, 0};
  s.push_back(Recovered(18, 5000, 200, sum18));
  s.push_back(Recovered(19, 6000, 264, sum19));
  source.SetResident(18, true);
  source.SetResident(19, true);
  // While they are the top-K set, the oldest other blocks go first.
  ASSERT_OK_AND_ASSIGN(auto e1, p->ChooseEvictions(ViewOf(s, Tokens(s)), 1));
  EXPECT_THAT(e1, ElementsAre(1u));
  // Query (-1, 0): the best stored now are 10, 11; both beat 18 and 19, so
  // the set becomes {10, 11} and both are returned.
  ASSERT_OK_AND_ASSIGN(auto r2, p->ChooseRecoveries(ViewOf(s, 10000), Query({-1, 0}), source));
  ASSERT_EQ(r2.size(), 2u);
  EXPECT_EQ(r2[0].handle, 11u);
  EXPECT_EQ(r2[1].handle, 10u);
  // Now 18 and 19 left the set: they go before the old blocks, earliest
  // loaded first.
  ASSERT_OK_AND_ASSIGN(auto e2, p->ChooseEvictions(ViewOf(s, Tokens(s) - 100), 0));
  EXPECT_THAT(e2, ElementsAre(18u, 19u));
  // Sinks stay even when everything else goes.
  ASSERT_OK_AND_ASSIGN(auto e3, p->ChooseEvictions(ViewOf(s, 4), 0));
  EXPECT_THAT(e3, UnorderedElementsAre(1u, 2u, 3u, 18u, 19u));
}

TEST(InfLLMTest, ResidentMembersStayInTheSet) {
  FakeRecoverySource source;
  AddStored(&source);
  PolicyParams params;
  params.infllm_topk = 2;
  std::unique_ptr<Policy> p = Make("infllm", params);
  std::vector<ResidentBlock> s = Session(3);
  const std::vector<float> sum19 = {19, 0};
  s.push_back(Recovered(19, 6000, 200, sum19));
  source.SetResident(19, true);
  // 19 is resident and still the best: only 18 comes back.
  ASSERT_OK_AND_ASSIGN(auto r, p->ChooseRecoveries(ViewOf(s, 10000), Query({1, 0}), source));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].handle, 18u);
  // 19 is in the set: the old blocks go first, then 19 last.
  ASSERT_OK_AND_ASSIGN(auto e, p->ChooseEvictions(ViewOf(s, 4), 0));
  EXPECT_THAT(e, ElementsAre(1u, 2u, 19u));
}

TEST(InfLLMTest, SourceErrorsComeBackUnchanged) {
  FakeRecoverySource source;
  source.SetError(absl::UnavailableError("daemon down"));
  std::unique_ptr<Policy> p = Make("infllm");
  EXPECT_THAT(p->ChooseRecoveries(ViewOf(Session(2), 1000), Query({1, 0}), source),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("daemon down")));
}

// ------------------------------------------------------------------ evoke

TEST(EvokeTest, GateRefusesCandidatesBelowTheWeakestResident) {
  FakeRecoverySource source;
  AddStored(&source);
  std::unique_ptr<Policy> p = Make("evoke");  // topk 4, gate on.
  std::vector<ResidentBlock> s = Session(3);
  const std::vector<float> sink = {-100, 0}, a = {16.5f, 0}, b = {30, 0};
  s[0].summary = sink;  // Sinks do not gate.
  s[1].summary = a;
  s[2].summary = b;
  ASSERT_OK_AND_ASSIGN(auto r, p->ChooseRecoveries(ViewOf(s, 10000), Query({1, 0}), source));
  EXPECT_EQ(source.last_min_score(), std::optional<float>(16.5f));
  EXPECT_EQ(source.last_k(), 4u);
  // Only 17, 18, 19 beat 16.5; ascending, the best last.
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].handle, 17u);
  EXPECT_EQ(r[1].handle, 18u);
  EXPECT_EQ(r[2].handle, 19u);
  EXPECT_LT(r[0].score, r[1].score);
  EXPECT_LT(r[1].score, r[2].score);
}

TEST(EvokeTest, NoSummariesNoGateAndTopKAscending) {
  FakeRecoverySource source;
  AddStored(&source);
  std::unique_ptr<Policy> p = Make("evoke");
  ASSERT_OK_AND_ASSIGN(auto r,
                       p->ChooseRecoveries(ViewOf(Session(3), 10000), Query({1, 0}), source));
  EXPECT_EQ(source.last_min_score(), std::nullopt);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].handle, 16u);
  EXPECT_EQ(r[3].handle, 19u);
  // Gate off: no min_score even with summaries.
  PolicyParams params;
  params.evoke_resident_gate = false;
  std::unique_ptr<Policy> ungated = Make("evoke", params);
  std::vector<ResidentBlock> s = Session(3);
  const std::vector<float> a = {100, 0};
  s[1].summary = a;
  ASSERT_OK_AND_ASSIGN(r, ungated->ChooseRecoveries(ViewOf(s, 10000), Query({1, 0}), source));
  EXPECT_EQ(source.last_min_score(), std::nullopt);
  EXPECT_EQ(r.size(), 4u);
}

TEST(EvokeTest, RecoveredBlocksCountAsRecentForEviction) {
  std::unique_ptr<Policy> p = Make("evoke");
  std::vector<ResidentBlock> s = Session(4);  // Positions 0, 4, 68, 132.
  const std::vector<float> none;
  // Block 9 (old tokens) came back at the tail, position 196.
  s.push_back(Recovered(9, 70, 196, none));
  ASSERT_OK_AND_ASSIGN(auto e, p->ChooseEvictions(ViewOf(s, 100), 0));
  EXPECT_THAT(e, ElementsAre(1u, 2u, 3u));
  ASSERT_OK_AND_ASSIGN(e, p->ChooseEvictions(ViewOf(s, 4), 0));
  EXPECT_THAT(e, ElementsAre(1u, 2u, 3u, 9u));
  EXPECT_THAT(p->ChooseEvictions(ViewOf(s, 4), 1),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(EvokeTest, SourceErrorsComeBackUnchanged) {
  FakeRecoverySource source;
  source.SetError(absl::UnavailableError("gone"));
  std::unique_ptr<Policy> p = Make("evoke");
  EXPECT_THAT(p->ChooseRecoveries(ViewOf(Session(2), 1000), Query({1, 0}), source),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("gone")));
}

}  // namespace
}  // namespace evoke::policy
