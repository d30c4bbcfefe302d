// Every evoke policy driving the real llama.cpp (random-weight tiny Llama)
// through KvAdapter, against a real evoked: a 600-step session in a 256-token
// budget with 32-token blocks decodes past its budget, evicts by policy,
// recovers by policy (infllm, evoke), and keeps decoding through a daemon
// outage. Every recovered block is checked: V byte-identical to what was
// evicted, layer 0's K equal (f16 tolerance) to the same tokens decoded
// directly at the new positions. Label: llama.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "engines/llama/attention_capture.h"
#include "engines/llama/kv_adapter.h"
#include "engines/llama/policy_engine.h"
#include "engines/llama/random_model.h"
#include "tests/llama_fixture.h"

namespace evoke::testing {
namespace {

using llama::ContextPtr;
using llama::KvAdapter;

constexpr uint32_t kBudget = 256, kBlock = 32, kSteps = 600;
constexpr uint32_t kOutageBegin = 300, kOutageEnd = 380;

class LlamaPolicyTest : public LlamaTest, public ::testing::WithParamInterface<std::string> {
 protected:
  // evoked summarises layer 0 (the recovery layer).
  void SetUp() override { StartDaemon({"--summary-layer", "0"}); }

  static ContextPtr MakeContext(uint32_t n_ctx, llama::AttentionCapture* capture,
                                llama_context_params* used) {
    llama_context_params p =
        TestContextParams(n_ctx, 256, GGML_TYPE_F16, /*flash_attn=*/true, /*n_threads=*/1);
    if (capture != nullptr) capture->Install(p);
    *used = p;
    return ContextPtr(llama_init_from_model(model_, p));
  }
};

TEST_P(LlamaPolicyTest, BudgetedSessionEvictsRecoversAndSurvivesAnOutage) {
  const std::string name = GetParam();
  llama::AttentionCapture capture({.layers = {}, .query_layer = 0});
  llama_context_params p;
  ContextPtr ctx = MakeContext(512, &capture, &p);
  ASSERT_NE(ctx, nullptr);
  // The engine's own client, which outlives the daemon's restart.
  std::unique_ptr<Client> engine_client = daemon_->Connect();
  ASSERT_NE(engine_client, nullptr);
  llama::AdapterOptions ao = TestAdapterOptions("policy-test", name);
  absl::StatusOr<std::unique_ptr<KvAdapter>> adapter =
      KvAdapter::Open(ctx.get(), p, engine_client.get(), ao);
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  llama::SessionOptions so;
  so.policy = name;
  so.params.block_tokens = kBlock;
  so.budget_tokens = kBudget;
  so.summary_layer = 0;
  absl::StatusOr<std::unique_ptr<llama::LlamaPolicySession>> session =
      llama::LlamaPolicySession::Create(ctx.get(), &capture, adapter->get(), engine_client.get(),
                                        ao.ns, ao.session_id, so);
  ASSERT_TRUE(session.ok()) << session.status();
  llama::LlamaPolicySession& s = **session;

  // A probe context computes K directly: the same tokens at the new positions.
  llama_context_params pp;
  ContextPtr probe = MakeContext(64, nullptr, &pp);
  ASSERT_NE(probe, nullptr);
  ao.session_id = name + "-probe";
  absl::StatusOr<std::unique_ptr<KvAdapter>> probe_adapter =
      KvAdapter::Open(probe.get(), pp, engine_client.get(), ao);
  ASSERT_TRUE(probe_adapter.ok()) << probe_adapter.status();
  const v1::LayoutFingerprint& fp = (*adapter)->fingerprint();

  // What the test knows independently: the token at each position, and the
  // V bytes of every block when it left.
  std::map<int64_t, llama_token> token_at;
  struct Left {
    std::vector<llama_token> tokens;
    std::string payload;  // Canonical K/V at eviction.
  };
  std::map<policy::BlockHandle, Left> left;
  int checked = 0;
  double worst_k = 0;
  s.engine().set_observer([&](policy::BlockHandle h, int64_t first, uint32_t n, bool bring) {
    if (!bring) {
      absl::StatusOr<llama::CanonicalRange> r =
          (*adapter)->Read(static_cast<llama_pos>(first), static_cast<llama_pos>(first + n));
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(r->positions.size(), n);
      Left& l = left[h];
      l.tokens.clear();
      for (int64_t q = first; q < first + n; ++q) {
        l.tokens.push_back(token_at.at(q));
        token_at.erase(q);
      }
      l.payload = r->payload;
      return;
    }
    ASSERT_TRUE(left.count(h)) << "brought a block that never left";
    const Left& l = left[h];
    ASSERT_EQ(l.tokens.size(), n);
    absl::StatusOr<llama::CanonicalRange> now =
        (*adapter)->Read(static_cast<llama_pos>(first), static_cast<llama_pos>(first + n));
    ASSERT_TRUE(now.ok()) << now.status();
    ASSERT_EQ(now->positions.size(), n);
    for (uint32_t layer = 0; layer < fp.n_layers(); ++layer) {
      EXPECT_TRUE(LayerOf(now->payload, n, fp, layer).v == LayerOf(l.payload, n, fp, layer).v)
          << "V of layer " << layer << " changed on its way back";
    }
    // Direct: the block's tokens decoded at their new positions (layer 0's
    // K depends only on the token and its position).
    llama_memory_seq_rm(llama_get_memory(probe.get()), 0, -1, -1);
    ASSERT_TRUE(llama::DecodeTokens(probe.get(), l.tokens, static_cast<llama_pos>(first)));
    absl::StatusOr<llama::CanonicalRange> direct =
        (*probe_adapter)->Read(static_cast<llama_pos>(first), static_cast<llama_pos>(first + n));
    ASSERT_TRUE(direct.ok()) << direct.status();
    const double err = WorstHeadRelError(WidenBytes(LayerOf(now->payload, n, fp, 0).k, fp.k_dtype()),
                                         WidenBytes(LayerOf(direct->payload, n, fp, 0).k, fp.k_dtype()),
                                         fp.head_dim());
    worst_k = std::max(worst_k, err);
    EXPECT_LE(err, 2e-3) << "re-anchored K vs direct computation at " << first;
    for (uint32_t i = 0; i < n; ++i) token_at[first + i] = l.tokens[i];
    ++checked;
  });

  llama_token token = 1;
  uint64_t saved_before_outage = 0, brought_before_outage = 0, failures_in_outage = 0;
  for (uint32_t step = 0; step < kSteps; ++step) {
    if (step == kOutageBegin) {
      saved_before_outage = s.engine_stats().evicted_saved;
      brought_before_outage = s.engine_stats().brought;
      ASSERT_OK(daemon_->Terminate());
    }
    if (step == kOutageEnd) {
      failures_in_outage = s.driver_stats().recovery_failures;
      Restart();
    }
    absl::Status decoded = s.Decode(token);
    ASSERT_TRUE(decoded.ok()) << "step " << step << ": " << decoded;
    if (HasFatalFailure()) return;
    // Recoveries land before the token; the token sits at the last position.
    token_at[s.next_position() - 1] = token;
    ASSERT_LE(s.cells_used(), kBudget) << "step " << step << ": over budget";
    const float* logits = llama_get_logits_ith(ctx.get(), -1);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model_));
    ASSERT_TRUE(std::all_of(logits, logits + n_vocab, [](float x) { return std::isfinite(x); }));
    token = static_cast<llama_token>(std::max_element(logits, logits + n_vocab) - logits);
  }
  const policy::DriverStats& d = s.driver_stats();
  const llama::EngineStats& e = s.engine_stats();
  // Past its budget, by policy.
  EXPECT_GT(s.next_position(), static_cast<int64_t>(2 * kBudget));
  EXPECT_EQ(s.max_cells_used() <= kBudget, true);
  EXPECT_GE(s.max_cells_used(), kBudget - kBlock) << "the budget was used";
  EXPECT_GE(d.blocks_saved + d.blocks_dropped, 10u);
  EXPECT_GE(e.evicted_saved, 5u);
  // The outage: evictions went on unsaved, nothing crashed, and after the
  // restart blocks are saved again.
  EXPECT_GT(e.blocks_lost, 0u) << "no eviction fell in the outage";
  EXPECT_GT(e.evicted_saved, saved_before_outage + 1);
  if (s.policy_info().recovers) {
    EXPECT_GT(brought_before_outage, 0u) << name << " recovered nothing before the outage";
    EXPECT_GT(failures_in_outage, 0u) << "recovery during the outage did not fail";
    EXPECT_EQ(d.blocks_recovered, e.brought);
    EXPECT_EQ(checked, static_cast<int>(e.brought));
  } else {
    EXPECT_EQ(e.brought, 0u);
    EXPECT_EQ(d.recovery_failures, 0u);
  }
  // InfLLM ranks by representative keys, computed from the captured
  // attention for every block saved outside the outage.
  if (name == "infllm") {
    EXPECT_EQ(e.repr_summaries, e.evicted_saved + e.blocks_lost);
  } else {
    EXPECT_EQ(e.repr_summaries, 0u);
  }
  RecordProperty("repr_summaries", static_cast<int>(e.repr_summaries));
  RecordProperty("evicted_saved", static_cast<int>(e.evicted_saved));
  RecordProperty("evicted_dropped", static_cast<int>(e.evicted_dropped));
  RecordProperty("blocks_lost", static_cast<int>(e.blocks_lost));
  RecordProperty("recovered", static_cast<int>(e.brought));
  RecordProperty("recovery_failures", static_cast<int>(d.recovery_failures));
  RecordProperty("worst_k_error", std::to_string(worst_k));
}

INSTANTIATE_TEST_SUITE_P(Policies, LlamaPolicyTest,
                         ::testing::Values("recency", "streaming_llm", "h2o", "snapkv", "infllm",
                                           "evoke"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// RecoverAtPromptEnd: a recovery point in the middle of a block. The tokens
// decoded since the last block boundary are rolled back, blocks come back
// at that boundary, and the same tokens are decoded again after them: the
// cache stays within the budget, every block stays contiguous, and the tail
// sits right after what was brought.
TEST_F(LlamaPolicyTest, RecoverAtPromptEndBringsBlocksAtTheBoundaryAndReplaysTheTail) {
  for (const std::string name : {"infllm", "recency"}) {
    SCOPED_TRACE(name);
    llama::AttentionCapture capture({.layers = {}, .query_layer = 0});
    llama_context_params p;
    ContextPtr ctx = MakeContext(512, &capture, &p);
    ASSERT_NE(ctx, nullptr);
    llama::AdapterOptions ao = TestAdapterOptions("policy-test", "prompt-end-" + name);
    absl::StatusOr<std::unique_ptr<KvAdapter>> adapter =
        KvAdapter::Open(ctx.get(), p, client_.get(), ao);
    ASSERT_TRUE(adapter.ok()) << adapter.status();
    llama::SessionOptions so;
    so.policy = name;
    so.params.block_tokens = kBlock;
    so.budget_tokens = kBudget;
    so.summary_layer = 0;
    // Periodic recovery points only every 10 blocks, so that the one at the
    // prompt's end has stored blocks to bring.
    so.recovery_every_tokens = 10 * kBlock;
    auto session = llama::LlamaPolicySession::Create(ctx.get(), &capture, adapter->get(),
                                                     client_.get(), ao.ns, ao.session_id, so);
    ASSERT_TRUE(session.ok()) << session.status();
    llama::LlamaPolicySession& s = **session;
    std::vector<std::pair<int64_t, uint32_t>> brought;
    s.engine().set_observer([&](policy::BlockHandle, int64_t first, uint32_t n, bool bring) {
      if (bring) brought.push_back({first, n});
    });
    // 13 blocks and a half: past the budget, some tokens pending (how many
    // depends on the policy's sink tokens, which shift block boundaries).
    for (uint32_t i = 0; i < 13 * kBlock + kBlock / 2; ++i) {
      ASSERT_OK(s.Decode(static_cast<llama_token>(1 + (i * 7) % 200)));
    }
    const uint64_t tail = s.driver().pending_tokens();
    ASSERT_GT(tail, 0u);
    const int64_t before = s.next_position();
    const int64_t boundary = before - static_cast<int64_t>(tail);
    brought.clear();
    ASSERT_OK(s.RecoverAtPromptEnd());
    ASSERT_LE(s.cells_used(), kBudget);
    EXPECT_EQ(s.driver().pending_tokens(), tail) << "the tail was decoded again";
    uint64_t n_brought = 0;
    int64_t expect_first = boundary;
    for (const auto& [first, n] : brought) {
      EXPECT_EQ(first, expect_first) << "blocks land contiguously from the boundary";
      expect_first += n;
      n_brought += n;
    }
    EXPECT_EQ(s.next_position(), before + static_cast<int64_t>(n_brought));
    if (name == "infllm") {
      EXPECT_GT(n_brought, 0u) << "nothing was brought at the prompt's end";
    } else {
      EXPECT_EQ(n_brought, 0u);
    }
    // And the session goes on.
    for (uint32_t i = 0; i < 3 * kBlock; ++i) ASSERT_OK(s.Decode(5));
    ASSERT_LE(s.max_cells_used(), kBudget);
  }
}

// DecodeMany (runs in one llama_decode each) keeps the books as Decode one
// token at a time does: the same blocks evicted, each at the same token,
// whatever the runs' lengths; then Adopt takes over a sequence decoded
// outside the session, and DropPending rolls the unfinished block back.
TEST_F(LlamaPolicyTest, DecodeManyEvictsAtTheTokensDecodeWould) {
  std::vector<llama_token> tokens;
  for (uint32_t i = 0; i < 12 * kBlock + 7; ++i) {
    tokens.push_back(static_cast<llama_token>(1 + (i * 11) % 200));
  }
  struct Run {
    std::vector<std::pair<int64_t, int64_t>> evictions;  // {first position, next position}.
    uint64_t saved = 0, resident = 0, pending = 0;
  };
  auto run = [&](const std::string& mode) -> Run {
    Run out;
    llama_context_params p;
    ContextPtr ctx = MakeContext(512, nullptr, &p);
    EXPECT_NE(ctx, nullptr);
    llama::AdapterOptions ao = TestAdapterOptions("policy-test", "many-" + mode);
    absl::StatusOr<std::unique_ptr<KvAdapter>> adapter =
        KvAdapter::Open(ctx.get(), p, client_.get(), ao);
    EXPECT_TRUE(adapter.ok()) << adapter.status();
    llama::SessionOptions so;
    so.policy = "streaming_llm";
    so.params.block_tokens = kBlock;
    so.budget_tokens = kBudget;
    so.adopt = mode == "adopt";
    size_t from = 0;
    if (so.adopt) {  // The first 100 tokens decoded before the session.
      from = 100;
      EXPECT_TRUE(llama::DecodeTokens(ctx.get(), absl::MakeConstSpan(tokens).subspan(0, from), 0));
    }
    auto session = llama::LlamaPolicySession::Create(ctx.get(), nullptr, adapter->get(),
                                                     client_.get(), ao.ns, ao.session_id, so);
    EXPECT_TRUE(session.ok()) << session.status();
    if (!session.ok()) return out;
    llama::LlamaPolicySession& s = **session;
    s.engine().set_observer([&](policy::BlockHandle, int64_t first, uint32_t, bool bring) {
      if (!bring) out.evictions.push_back({first, s.next_position()});
    });
    if (so.adopt) {
      EXPECT_EQ(s.Decode(tokens[0]).code(), absl::StatusCode::kFailedPrecondition)
          << "decoding before Adopt";
      EXPECT_OK(s.Adopt(absl::MakeConstSpan(tokens).subspan(0, from)));
    }
    absl::Span<const llama_token> rest = absl::MakeConstSpan(tokens).subspan(from);
    if (mode == "one") {
      for (llama_token t : rest) EXPECT_OK(s.Decode(t));
    } else {
      // Uneven pieces, so that runs start and end everywhere.
      for (size_t i = 0, piece = 1; i < rest.size(); i += piece, piece = piece % 37 + 5) {
        EXPECT_OK(s.DecodeMany(rest.subspan(i, std::min(piece, rest.size() - i))));
      }
    }
    EXPECT_LE(s.max_cells_used(), kBudget);
    out.saved = s.driver_stats().blocks_saved;
    out.resident = s.driver().resident_tokens();
    out.pending = s.pending_tokens();
    // Rolling the unfinished block back leaves a boundary and its cells gone.
    absl::StatusOr<uint64_t> dropped = s.DropPending();
    EXPECT_TRUE(dropped.ok()) << dropped.status();
    EXPECT_EQ(dropped.value_or(0), out.pending);
    EXPECT_EQ(s.pending_tokens(), 0u);
    EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(ctx.get()), 0) + 1, s.next_position());
    return out;
  };
  const Run one = run("one");
  const Run many = run("many");
  const Run adopt = run("adopt");
  ASSERT_GT(one.saved, 3u);
  ASSERT_GT(one.pending, 0u);
  EXPECT_EQ(many.evictions, one.evictions);
  EXPECT_EQ(many.saved, one.saved);
  EXPECT_EQ(many.resident, one.resident);
  EXPECT_EQ(adopt.saved, one.saved);
  EXPECT_EQ(adopt.resident, one.resident);
  // Adopt takes the tokens in as Decode would have decoded them.
  EXPECT_EQ(adopt.evictions, one.evictions);
}

// A budget of the sinks, one block and a little: the policy evicts the
// block before the unfinished one while its tokens are held, so dropping
// them leaves the sequence's last position far before them. The next token
// must go right after it (llama.cpp refuses a gap), and decoding goes on.
TEST_F(LlamaPolicyTest, DropPendingAfterItsBlockLeftContinuesAfterTheLastHeldPosition) {
  llama_context_params p;
  ContextPtr ctx = MakeContext(256, nullptr, &p);
  ASSERT_NE(ctx, nullptr);
  llama::AdapterOptions ao = TestAdapterOptions("policy-test", "drop-gap");
  absl::StatusOr<std::unique_ptr<KvAdapter>> adapter =
      KvAdapter::Open(ctx.get(), p, client_.get(), ao);
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  llama::SessionOptions so;
  so.policy = "streaming_llm";
  so.params.block_tokens = kBlock;
  so.budget_tokens = so.params.sink_tokens + kBlock + 8;
  auto session = llama::LlamaPolicySession::Create(ctx.get(), nullptr, adapter->get(),
                                                   client_.get(), ao.ns, ao.session_id, so);
  ASSERT_TRUE(session.ok()) << session.status();
  llama::LlamaPolicySession& s = **session;
  // The sinks make a block of their own, then blocks of kBlock.
  for (uint32_t i = 0; i < so.params.sink_tokens + 3 * kBlock + 20; ++i) {
    ASSERT_OK(s.Decode(static_cast<llama_token>(i % 90 + 1)));
  }
  ASSERT_EQ(s.pending_tokens(), 20u);
  const int64_t before = s.next_position();
  absl::StatusOr<uint64_t> dropped = s.DropPending();
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(*dropped, 20u);
  const llama_pos last = llama_memory_seq_pos_max(llama_get_memory(ctx.get()), 0);
  EXPECT_LT(last + 20, before) << "the block before the tail had been evicted";
  EXPECT_EQ(s.next_position(), last + 1);
  for (uint32_t i = 0; i < 2 * kBlock; ++i) ASSERT_OK(s.Decode(7));
  EXPECT_LE(s.max_cells_used(), so.budget_tokens);
}

TEST_F(LlamaPolicyTest, RefusesBudgetsAndPoliciesItCannotRun) {
  llama::AttentionCapture capture;
  llama_context_params p;
  ContextPtr ctx = MakeContext(256, &capture, &p);
  ASSERT_NE(ctx, nullptr);
  absl::StatusOr<std::unique_ptr<KvAdapter>> adapter =
      KvAdapter::Open(ctx.get(), p, client_.get(), TestAdapterOptions("policy-test", "refusals"));
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  llama::SessionOptions so;
  so.policy = "streaming_llm";
  so.params.block_tokens = 32;
  so.budget_tokens = 20;  // Below sinks + one block.
  absl::Status st = llama::LlamaPolicySession::Create(ctx.get(), &capture, adapter->get(),
                                                      client_.get(), "policy-test", "r", so)
                        .status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(st.message(), ::testing::HasSubstr("budget_tokens"));
  so.policy = "no-such-policy";
  so.budget_tokens = 256;
  st = llama::LlamaPolicySession::Create(ctx.get(), &capture, adapter->get(), client_.get(),
                                         "policy-test", "r", so)
           .status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  so.policy = "h2o";
  st = llama::LlamaPolicySession::Create(ctx.get(), nullptr, adapter->get(), client_.get(),
                                         "policy-test", "r", so)
           .status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(st.message(), ::testing::HasSubstr("AttentionCapture"));
  // A recovering policy whose capture records no query of the summary layer
  // would never recover: refused.
  so.policy = "evoke";
  so.summary_layer = 0;
  st = llama::LlamaPolicySession::Create(ctx.get(), &capture, adapter->get(), client_.get(),
                                         "policy-test", "r", so)
           .status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(st.message(), ::testing::HasSubstr("query_layer"));
}

}  // namespace
}  // namespace evoke::testing
