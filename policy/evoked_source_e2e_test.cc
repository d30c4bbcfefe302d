// EvokedRecoverySource against a real evoked: blocks saved with known mean
// keys are ranked as ScoreSummary ranks them, resident blocks are excluded,
// min_score is honoured, a stopped daemon reads as UNAVAILABLE; and a
// SessionDriver running EVOKE over a fake engine that saves to evoked brings
// the best stored block back.
#include "policy/evoked_source.h"

#include <algorithm>
#include <cstring>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/block_validation.h"
#include "evoke/evoke_policy.h"
#include "evoke/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/session_driver.h"
#include "testing/daemon_process.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke::policy {
namespace {

using ::evoke::testing::DaemonProcess;
using ::evoke::testing::StatusIs;
using ::testing::IsEmpty;

constexpr uint32_t kLayers = 4, kHeads = 2, kDim = 64, kTokens = 16, kSummaryLayer = 2;
constexpr uint32_t kQueryHeads = 4;
const char kNs[] = "policy";
const char kSession[] = "sess-e2e";

v1::LayoutFingerprint Fingerprint() {
  v1::LayoutFingerprint fp;
  fp.set_namespace_(kNs);
  fp.set_model_id("test/tiny-llama");
  fp.set_model_revision("r1");
  fp.set_k_dtype(v1::DTYPE_F16);
  fp.set_v_dtype(v1::DTYPE_F16);
  fp.set_n_layers(kLayers);
  fp.set_n_kv_heads(kHeads);
  fp.set_head_dim(kDim);
  fp.set_layout(v1::LAYOUT_CANONICAL_V1);
  fp.mutable_rope()->set_type(v1::ROPE_NEOX);
  fp.mutable_rope()->set_freq_base(10000);
  return fp;
}

// Session block `seq` with an explicit MEAN_KEYS summary of kSummaryLayer.
v1::BlockMeta BlockMeta(uint64_t seq, const std::vector<float>& mean_keys) {
  v1::BlockMeta meta = SessionBlockMeta(Fingerprint(), kSession, seq, kTokens, 0, kLayers,
                                        static_cast<int32_t>(seq * kTokens));
  v1::Summary* s = meta.add_summaries();
  s->set_kind(v1::SUMMARY_MEAN_KEYS);
  s->set_layer(kSummaryLayer);
  s->set_heads(kHeads);
  s->set_dim(kDim);
  for (float v : mean_keys) s->add_values(v);
  return meta;
}

std::string Payload(uint64_t seed) {
  const uint64_t size = CanonicalPayloadBytes(Fingerprint(), kTokens, kLayers).value();
  std::string bytes(size, '\0');
  std::mt19937_64 rng(seed);
  for (char& c : bytes) c = static_cast<char>(rng() & 0x3f);  // Small finite f16 values.
  return bytes;
}

class EvokedSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<DaemonProcess>> d = DaemonProcess::Start(dir_.path());
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(d).value();
    client_ = daemon_->Connect();
    ASSERT_NE(client_, nullptr);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    for (uint32_t i = 0; i < kBlocks; ++i) {
      std::vector<float> keys(kHeads * kDim);
      for (float& v : keys) v = normal(rng);
      summaries_.push_back(keys);
    }
    query_.resize(kQueryHeads * kDim);
    for (float& v : query_) v = normal(rng);
  }

  // Saves block i and registers it as handle 100 + i.
  void SaveAndRegister(EvokedRecoverySource* source, uint32_t i) {
    const v1::BlockMeta meta = BlockMeta(i, summaries_[i]);
    const std::string payload = Payload(i);
    ASSERT_OK(client_->Save({BlockToSave(meta, payload)}).status());
    source->Register(100 + i, BlockIdOf(meta), kTokens);
  }

  RecoveryQuery Query() const { return RecoveryQuery{query_, kQueryHeads}; }

  // Handles of the stored blocks best first by ScoreSummary, skipping
  // `resident`.
  std::vector<BlockHandle> Expected(const std::vector<BlockHandle>& resident,
                                    std::optional<float> min_score, size_t k) const {
    std::vector<std::pair<float, BlockHandle>> scored;
    for (uint32_t i = 0; i < kBlocks; ++i) {
      if (std::count(resident.begin(), resident.end(), 100 + i)) continue;
      const float s = *ScoreSummary(Query(), summaries_[i]);
      if (min_score.has_value() && s < *min_score) continue;
      scored.push_back({s, 100 + i});
    }
    std::sort(scored.begin(), scored.end(), [](auto& a, auto& b) { return a.first > b.first; });
    std::vector<BlockHandle> out;
    for (size_t j = 0; j < scored.size() && j < k; ++j) out.push_back(scored[j].second);
    return out;
  }

  static constexpr uint32_t kBlocks = 8;
  evoke::testing::TempDir dir_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  std::vector<std::vector<float>> summaries_;
  std::vector<float> query_;
};

std::vector<BlockHandle> HandlesOf(const std::vector<Candidate>& c) {
  std::vector<BlockHandle> out;
  for (const Candidate& x : c) out.push_back(x.handle);
  return out;
}

TEST_F(EvokedSourceTest, RanksLikeScoreSummaryExcludesResidentHonoursMinScore) {
  EvokedRecoverySource source(client_.get(), {.ns = kNs, .session_id = kSession,
                                              .layer = kSummaryLayer});
  // Nothing registered: no call, nothing back.
  ASSERT_OK_AND_ASSIGN(auto none, source.Rank(Query(), 4, std::nullopt));
  EXPECT_THAT(none, IsEmpty());
  for (uint32_t i = 0; i < kBlocks; ++i) SaveAndRegister(&source, i);

  ASSERT_OK_AND_ASSIGN(auto all, source.Rank(Query(), kBlocks, std::nullopt));
  EXPECT_EQ(HandlesOf(all), Expected({}, std::nullopt, kBlocks));
  for (const Candidate& c : all) {
    EXPECT_NEAR(c.score, *ScoreSummary(Query(), summaries_[c.handle - 100]), 1e-3);
    EXPECT_EQ(c.n_tokens, kTokens);
  }
  // The best two become resident: excluded.
  const std::vector<BlockHandle> resident = {all[0].handle, all[1].handle};
  source.SetResident(resident[0], true);
  source.SetResident(resident[1], true);
  ASSERT_OK_AND_ASSIGN(auto rest, source.Rank(Query(), 3, std::nullopt));
  EXPECT_EQ(HandlesOf(rest), Expected(resident, std::nullopt, 3));
  // min_score between the 4th and 5th best overall: the 3rd and 4th pass.
  const float gate = (all[3].score + all[4].score) / 2;
  ASSERT_OK_AND_ASSIGN(auto gated, source.Rank(Query(), kBlocks, gate));
  EXPECT_EQ(HandlesOf(gated), Expected(resident, gate, kBlocks));
  EXPECT_EQ(gated.size(), 2u);  // The 3rd and 4th best.
  // A forgotten block is skipped even though evoked still has it.
  source.Forget(all[2].handle);
  ASSERT_OK_AND_ASSIGN(auto after, source.Rank(Query(), kBlocks, gate));
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].handle, all[3].handle);
}

TEST_F(EvokedSourceTest, BlocksItNeverRegisteredDoNotCrowdOutItsOwn) {
  // An earlier process of the same session stored blocks this source does
  // not know: even when they all score higher, Rank still finds its own.
  EvokedRecoverySource source(client_.get(), {.ns = kNs, .session_id = kSession,
                                              .layer = kSummaryLayer});
  for (uint32_t i = 0; i < kBlocks; ++i) SaveAndRegister(&source, i);
  const std::vector<BlockHandle> order = Expected({}, std::nullopt, kBlocks);
  // Forget all but the weakest: the others are now "someone else's".
  for (size_t j = 0; j + 1 < order.size(); ++j) source.Forget(order[j]);
  ASSERT_OK_AND_ASSIGN(auto ranked, source.Rank(Query(), 1, std::nullopt));
  ASSERT_EQ(ranked.size(), 1u);
  EXPECT_EQ(ranked[0].handle, order.back());
}

TEST_F(EvokedSourceTest, StoppedDaemonIsUnavailable) {
  EvokedRecoverySource source(client_.get(), {.ns = kNs, .session_id = kSession,
                                              .layer = kSummaryLayer});
  SaveAndRegister(&source, 0);
  ASSERT_OK(source.Rank(Query(), 1, std::nullopt).status());
  daemon_->KillHard();
  EXPECT_THAT(source.Rank(Query(), 1, std::nullopt), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(EvokedSourceTest, QueryShapeErrorsComeBackUnchanged) {
  EvokedRecoverySource source(client_.get(), {.ns = kNs, .session_id = kSession,
                                              .layer = kSummaryLayer});
  SaveAndRegister(&source, 0);
  const std::vector<float> bad(3 * kDim, 1.0f);  // 3 query heads over 2 KV heads.
  EXPECT_THAT(source.Rank({bad, 3}, 1, std::nullopt),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// An engine that saves evicted blocks to evoked (with their mean keys) and
// registers them with the source; Bring only records.
class SavingEngine final : public BlockEngine {
 public:
  SavingEngine(Client* client, EvokedRecoverySource* source,
               const std::vector<std::vector<float>>* summaries)
      : client_(client), source_(source), summaries_(summaries) {}
  absl::StatusOr<uint64_t> Evict(const ResidentBlock& block, bool stored) override {
    if (stored) {
      source_->SetResident(block.handle, false);
      return 0;
    }
    const v1::BlockMeta meta = BlockMeta(block.handle, (*summaries_)[block.handle]);
    const std::string payload = Payload(block.handle);
    absl::StatusOr<std::vector<v1::SaveResult>> saved = client_->Save({BlockToSave(meta, payload)});
    if (!saved.ok()) return saved.status();
    source_->Register(block.handle, BlockIdOf(meta), block.n_tokens);
    return payload.size();
  }
  absl::StatusOr<uint64_t> Bring(BlockHandle handle, uint32_t, int64_t) override {
    brought.push_back(handle);
    source_->SetResident(handle, true);
    return 0;
  }
  std::vector<BlockHandle> brought;

 private:
  Client* client_;
  EvokedRecoverySource* source_;
  const std::vector<std::vector<float>>* summaries_;
};

TEST_F(EvokedSourceTest, DriverRecoversTheBestStoredBlockThroughEvoked) {
  EvokedRecoverySource source(client_.get(), {.ns = kNs, .session_id = kSession,
                                              .layer = kSummaryLayer});
  SavingEngine engine(client_.get(), &source, &summaries_);
  PolicyParams params;
  params.block_tokens = kTokens;
  params.sink_tokens = 0;
  params.evoke_topk = 1;
  params.evoke_resident_gate = false;
  std::unique_ptr<Policy> policy = std::move(MakePolicy("evoke", params)).value();
  DriverOptions options;
  options.budget_tokens = 3 * kTokens;
  options.block_tokens = kTokens;
  options.sink_tokens = 0;
  SessionDriver driver(policy.get(), &engine, &source, nullptr, options);
  int64_t position = 0;
  for (uint32_t t = 0; t < kBlocks * kTokens; ++t) {
    ASSERT_OK(driver.MakeRoom(1));
    ASSERT_OK(driver.TokenDecoded(position++).status());
  }
  // Blocks 0..4 went to evoked (5, 6, 7 resident, 7 completed last).
  const std::vector<BlockHandle> expected = Expected({5 + 100, 6 + 100, 7 + 100}, std::nullopt, 1);
  // Expected() names handles 100 + i; the driver's handles are i.
  ASSERT_EQ(expected.size(), 1u);
  EXPECT_EQ(driver.stats().blocks_saved, 5u);
  ASSERT_OK(driver.RecoveryPoint(Query(), &position));
  ASSERT_EQ(engine.brought.size(), 1u);
  EXPECT_EQ(engine.brought[0], expected[0] - 100);
  EXPECT_EQ(driver.stats().recovery_failures, 0u);
  EXPECT_EQ(position, static_cast<int64_t>((kBlocks + 1) * kTokens));
}

// The C API's connected source: blocks registered by sequence number.
TEST_F(EvokedSourceTest, CApiConnectedSourceRecoversTheBest) {
  for (uint32_t i = 0; i < kBlocks; ++i) {
    const v1::BlockMeta meta = BlockMeta(i, summaries_[i]);
    const std::string payload = Payload(i);
    ASSERT_OK(client_->Save({BlockToSave(meta, payload)}).status());
  }
  evoke_recovery_source* src = nullptr;
  ASSERT_EQ(evoke_recovery_source_connect(daemon_->socket().c_str(), kNs, kSession, kSummaryLayer,
                                          &src),
            EVOKE_OK)
      << evoke_policy_last_error();
  for (uint32_t i = 0; i < kBlocks; ++i) {
    ASSERT_EQ(evoke_recovery_source_register(src, 100 + i, i, kTokens), EVOKE_OK);
  }
  const std::vector<BlockHandle> best = Expected({}, std::nullopt, 2);
  ASSERT_EQ(evoke_recovery_source_set_resident(src, best[0], 1), EVOKE_OK);
  evoke_policy* p = nullptr;
  ASSERT_EQ(evoke_policy_create("evoke", "evoke_topk=2,evoke_resident_gate=false", &p), EVOKE_OK);
  evoke_cache_view view;
  std::memset(&view, 0, sizeof(view));
  view.layer = EVOKE_POLICY_ALL;
  view.head = EVOKE_POLICY_ALL;
  view.budget_tokens = 1000;
  evoke_candidate out[4];
  size_t n = 0;
  ASSERT_EQ(evoke_policy_choose_recoveries(p, &view, query_.data(), kQueryHeads, kDim, src, out,
                                           4, &n),
            EVOKE_OK)
      << evoke_policy_last_error();
  // The best is resident: the 2nd and 3rd best come back, the better last.
  const std::vector<BlockHandle> rest = Expected({best[0]}, std::nullopt, 2);
  ASSERT_EQ(n, 2u);
  EXPECT_EQ(out[0].handle, rest[1]);
  EXPECT_EQ(out[1].handle, rest[0]);
  daemon_->KillHard();
  EXPECT_EQ(evoke_policy_choose_recoveries(p, &view, query_.data(), kQueryHeads, kDim, src, out, 4,
                                           &n),
            EVOKE_UNAVAILABLE);
  evoke_policy_destroy(p);
  evoke_recovery_source_destroy(src);
}

}  // namespace
}  // namespace evoke::policy
