// Recompute-free recovery against a real evoked: daemon-computed key
// summaries, Recover by similarity (sessions, models, embeddings, breadcrumbs,
// restarts), re-anchored loads (the splice), and the C API example.
#include <cmath>
#include <cstring>
#include <random>

#include "common/half.h"
#include "common/rope.h"
#include "evoke/summaries.h"
#include "gmock/gmock.h"
#include "tests/e2e_fixture.h"

namespace evoke::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kLayers = 4, kHeads = 2, kDim = 64, kTokens = 16;
constexpr uint32_t kSummaryLayer = 2;  // The middle of [0, 4).

v1::LayoutFingerprint Fp(const std::string& ns = "rec") {
  v1::LayoutFingerprint fp = SmallFingerprint(ns);  // f16, 4 layers, 2 heads, 64 dims, NEOX.
  return fp;
}

// A session of blocks whose keys point, per block, in their own random
// direction (plus noise), stored post-RoPE at positions 16*seq + t. Keeps the
// unrotated keys so that tests can compute K directly at any position.
struct Session {
  std::vector<std::vector<float>> directions;  // Per block: kHeads x kDim.
  std::vector<std::vector<float>> unrotated;   // Per block: layers x tokens x heads x dim.
  std::vector<TestBlock> blocks;
};

std::string Encode(const std::vector<float>& k_f32_rotated) {
  std::string out(k_f32_rotated.size() * 2, '\0');
  for (size_t i = 0; i < k_f32_rotated.size(); ++i) {
    const uint16_t h = FloatToHalf(k_f32_rotated[i]);
    std::memcpy(&out[i * 2], &h, 2);
  }
  return out;
}

Session MakeSession(const std::string& session, int n, uint32_t seed,
                    const v1::LayoutFingerprint& fp = Fp()) {
  Session s;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  const RopePlan plan = MakeRopePlan(fp).value();
  const size_t section = static_cast<size_t>(kTokens) * kHeads * kDim;
  for (int b = 0; b < n; ++b) {
    std::vector<float> dir(kHeads * kDim);
    for (float& v : dir) v = normal(rng);
    s.directions.push_back(dir);
    TestBlock block;
    block.meta = SessionBlockMeta(fp, session, b, kTokens, 0, kLayers, b * kTokens);
    std::vector<float> unrotated;
    std::string payload;
    for (uint32_t l = 0; l < kLayers; ++l) {
      std::vector<float> k(section);
      for (uint32_t t = 0; t < kTokens; ++t) {
        for (uint32_t i = 0; i < kHeads * kDim; ++i) {
          k[t * kHeads * kDim + i] = dir[i] + 0.3f * normal(rng);
        }
      }
      unrotated.insert(unrotated.end(), k.begin(), k.end());
      RotateKeys(plan, v1::DTYPE_F32, k.data(), kTokens, kHeads, OriginalPositions(block.meta));
      payload += Encode(k);
      std::vector<float> v(section);
      for (float& x : v) x = normal(rng);
      payload += Encode(v);
    }
    block.payload = payload;
    s.unrotated.push_back(unrotated);
    s.blocks.push_back(block);
  }
  return s;
}

class RecoveryTest : public E2eTest {
 protected:
  v1::RecoverRequest SessionQuery(const std::string& session, const std::vector<float>& dir,
                                  uint32_t k, uint32_t query_heads = 4) {
    v1::RecoverRequest r;
    r.mutable_session()->set_namespace_("rec");
    r.mutable_session()->set_session_id(session);
    r.set_kind(v1::SUMMARY_MEAN_KEYS);
    r.set_layer(kSummaryLayer);
    // GQA: query heads 2h and 2h+1 look at KV head h.
    for (uint32_t q = 0; q < query_heads; ++q) {
      const uint32_t h = q / (query_heads / kHeads);
      for (uint32_t d = 0; d < kDim; ++d) r.add_queries(dir[h * kDim + d]);
    }
    r.set_n_query_heads(query_heads);
    r.set_k(k);
    return r;
  }
};

TEST_F(RecoveryTest, DaemonSummarizesAndRecoversBySimilarity) {
  StartDaemon();
  const Session s = MakeSession("chat", 8, 1);
  ASSERT_OK(SaveBlocks(*client_, s.blocks));
  // The daemon computed a MEAN_KEYS summary of the middle layer.
  ASSERT_OK_AND_ASSIGN(v1::BlockInfo info, client_->Describe(s.blocks[5].id()));
  ASSERT_EQ(info.meta().summaries_size(), 1);
  EXPECT_EQ(info.meta().summaries(0).kind(), v1::SUMMARY_MEAN_KEYS);
  EXPECT_EQ(info.meta().summaries(0).layer(), kSummaryLayer);
  // It is the unrotated mean: close to block 5's direction.
  double err = 0, norm = 0;
  for (uint32_t i = 0; i < kHeads * kDim; ++i) {
    err += std::pow(info.meta().summaries(0).values(i) - s.directions[5][i], 2);
    norm += std::pow(s.directions[5][i], 2);
  }
  EXPECT_LT(std::sqrt(err / norm), 0.15);

  for (int target : {0, 5, 7}) {
    ASSERT_OK_AND_ASSIGN(v1::RecoverResponse r,
                         client_->Recover(SessionQuery("chat", s.directions[target], 3)));
    ASSERT_EQ(r.blocks_size(), 3);
    EXPECT_EQ(r.candidates(), 8u);
    EXPECT_EQ(BlockId::FromBytes(r.blocks(0).id()).value(), s.blocks[target].id()) << target;
    EXPECT_GE(r.blocks(0).score(), r.blocks(1).score());
    EXPECT_TRUE(r.blocks(0).bytes_available());
    EXPECT_EQ(r.blocks(0).tier(), v1::TIER_PINNED_HOST);
    EXPECT_EQ(r.blocks(0).meta().first_position(), target * static_cast<int>(kTokens));
    EXPECT_EQ(r.blocks(0).meta().summaries_size(), 0);  // Omitted in responses.
  }
  // min_score: only blocks that beat the best resident block.
  v1::RecoverRequest high = SessionQuery("chat", s.directions[5], 3);
  ASSERT_OK_AND_ASSIGN(v1::RecoverResponse top, client_->Recover(high));
  high.set_min_score(top.blocks(0).score() + 1);
  ASSERT_OK_AND_ASSIGN(v1::RecoverResponse none, client_->Recover(high));
  EXPECT_EQ(none.blocks_size(), 0);
  // A min_score that is not a number would pass every comparison's "below".
  high.set_min_score(std::nanf(""));
  EXPECT_THAT(client_->Recover(high),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("min_score: must be finite")));
  // Exclude what is still resident.
  v1::RecoverRequest excluding = SessionQuery("chat", s.directions[5], 1);
  excluding.add_exclude_ids(s.blocks[5].id().ToBytes());
  ASSERT_OK_AND_ASSIGN(v1::RecoverResponse other, client_->Recover(excluding));
  ASSERT_EQ(other.blocks_size(), 1);
  EXPECT_NE(BlockId::FromBytes(other.blocks(0).id()).value(), s.blocks[5].id());
  // Max aggregation works too.
  v1::RecoverRequest max = SessionQuery("chat", s.directions[3], 1);
  max.set_aggregation(v1::AGGREGATION_MAX);
  ASSERT_OK_AND_ASSIGN(v1::RecoverResponse by_max, client_->Recover(max));
  EXPECT_EQ(BlockId::FromBytes(by_max.blocks(0).id()).value(), s.blocks[3].id());
}

TEST_F(RecoveryTest, ClientReprKeysAreStoredBesideTheDaemonsMeanKeys) {
  StartDaemon();
  Session s = MakeSession("repr", 6, 5);
  // The engine saw tokens 2 and 9 of every block attract the most attention
  // in every KV head; it attaches representative keys (r = 2) before Save.
  std::vector<v1::Summary> attached;
  for (TestBlock& block : s.blocks) {
    std::vector<float> attention(kTokens * kHeads, 0.1f);
    for (uint32_t h = 0; h < kHeads; ++h) {
      attention[2 * kHeads + h] = 3;
      attention[9 * kHeads + h] = 2;
    }
    ASSERT_OK_AND_ASSIGN(
        v1::Summary repr,
        ReprKeysSummary(block.meta, reinterpret_cast<const uint8_t*>(block.payload.data()),
                        block.payload.size(), kSummaryLayer, attention, 2));
    attached.push_back(repr);
    *block.meta.add_summaries() = repr;
  }
  ASSERT_OK(SaveBlocks(*client_, s.blocks));

  // Stored as given, beside the MEAN_KEYS the daemon added; the values are
  // the un-rotated keys of tokens 2 and 9, averaged.
  ASSERT_OK_AND_ASSIGN(v1::BlockInfo info, client_->Describe(s.blocks[3].id()));
  ASSERT_EQ(info.meta().summaries_size(), 2);
  const v1::Summary& stored = info.meta().summaries(0).kind() == v1::SUMMARY_REPR_KEYS
                                  ? info.meta().summaries(0)
                                  : info.meta().summaries(1);
  EXPECT_EQ(stored.kind(), v1::SUMMARY_REPR_KEYS);
  EXPECT_EQ(stored.r(), 2u);
  ASSERT_EQ(stored.values_size(), attached[3].values_size());
  const size_t layer_off = static_cast<size_t>(kSummaryLayer) * kTokens * kHeads * kDim;
  for (int i = 0; i < stored.values_size(); ++i) {
    EXPECT_EQ(stored.values(i), attached[3].values(i));
    const float expected = (s.unrotated[3][layer_off + 2 * kHeads * kDim + i] +
                            s.unrotated[3][layer_off + 9 * kHeads * kDim + i]) / 2;
    EXPECT_NEAR(stored.values(i), expected, 0.02f) << i;  // f16 storage, rotation.
  }

  // Recover by REPR_KEYS: block 4's own tokens point the way.
  std::vector<float> dir(kHeads * kDim);
  for (uint32_t i = 0; i < kHeads * kDim; ++i) {
    dir[i] = s.unrotated[4][layer_off + 9 * kHeads * kDim + i];
  }
  v1::RecoverRequest by_repr = SessionQuery("repr", dir, 2);
  by_repr.set_kind(v1::SUMMARY_REPR_KEYS);
  ASSERT_OK_AND_ASSIGN(v1::RecoverResponse r, client_->Recover(by_repr));
  ASSERT_EQ(r.blocks_size(), 2);
  EXPECT_EQ(BlockId::FromBytes(r.blocks(0).id()).value(), s.blocks[4].id());
  EXPECT_EQ(r.candidates(), 6u);
}

TEST_F(RecoveryTest, ModelScopeEmbeddingsBreadcrumbsAndRestart) {
  StartDaemon({"--spill-bytes", "48KiB"});  // Room on disk for only a few blocks.
  const Session a = MakeSession("a", 6, 2);
  const Session b = MakeSession("b", 6, 3);
  ASSERT_OK(SaveBlocks(*client_, a.blocks));
  ASSERT_OK(SaveBlocks(*client_, b.blocks));
  // A client-provided embedding on one extra block.
  TestBlock e = MakeSession("emb", 1, 4).blocks[0];
  v1::Summary* emb = e.meta.add_summaries();
  emb->set_kind(v1::SUMMARY_EMBEDDING);
  emb->set_heads(1);
  emb->set_dim(3);
  for (float v : {0.0f, 1.0f, 0.0f}) emb->add_values(v);
  ASSERT_OK(SaveBlocks(*client_, {e}));

  // Model scope: both sessions are candidates.
  v1::RecoverRequest model = SessionQuery("unused", b.directions[4], 2);
  *model.mutable_model()->mutable_fingerprint() = Fp();
  ASSERT_OK_AND_ASSIGN(v1::RecoverResponse r, client_->Recover(model));
  EXPECT_EQ(r.candidates(), 13u);
  EXPECT_EQ(BlockId::FromBytes(r.blocks(0).id()).value(), b.blocks[4].id());
  v1::RecoverRequest by_embedding;
  by_embedding.mutable_session()->set_namespace_("rec");
  by_embedding.mutable_session()->set_session_id("emb");
  by_embedding.set_kind(v1::SUMMARY_EMBEDDING);
  for (float v : {0.1f, 0.9f, 0.0f}) by_embedding.add_queries(v);
  by_embedding.set_n_query_heads(1);
  by_embedding.set_k(1);
  ASSERT_OK_AND_ASSIGN(r, client_->Recover(by_embedding));
  ASSERT_EQ(r.blocks_size(), 1);
  EXPECT_NEAR(r.blocks(0).score(), 0.9f, 1e-5);

  // Drop the payloads past the small spill budget: summaries stay.
  ASSERT_OK(client_->Flush(/*evict=*/true));
  ASSERT_GT(Stat().breadcrumb_blocks(), 0u);
  const v1::RecoverRequest all_a = SessionQuery("a", a.directions[0], 6);
  ASSERT_OK_AND_ASSIGN(r, client_->Recover(all_a));
  ASSERT_EQ(r.blocks_size(), 6);
  int crumbs = 0;
  for (const auto& blk : r.blocks()) {
    if (!blk.bytes_available()) {
      ++crumbs;
      EXPECT_EQ(blk.tier(), v1::TIER_BREADCRUMB);
    }
  }
  EXPECT_GT(crumbs, 0);
  v1::RecoverRequest with_bytes = all_a;
  with_bytes.set_require_bytes(true);
  ASSERT_OK_AND_ASSIGN(v1::RecoverResponse held, client_->Recover(with_bytes));
  EXPECT_EQ(held.blocks_size(), 6 - crumbs);
  for (const auto& blk : held.blocks()) EXPECT_TRUE(blk.bytes_available());

  // Summaries survive a restart (they are stored with the metadata).
  client_.reset();
  ASSERT_OK(daemon_->Terminate());
  Restart();
  ASSERT_OK_AND_ASSIGN(v1::RecoverResponse after, client_->Recover(all_a));
  ASSERT_EQ(after.blocks_size(), 6);
  EXPECT_EQ(after.blocks(0).id(), r.blocks(0).id());
}

TEST_F(RecoveryTest, RecoverBadInput) {
  StartDaemon();
  const Session s = MakeSession("chat", 3, 5);
  ASSERT_OK(SaveBlocks(*client_, s.blocks));
  struct Case {
    const char* name;
    std::function<void(v1::RecoverRequest*)> mutate;
    absl::StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {"wrong dim", [](v1::RecoverRequest* r) { r->mutable_queries()->RemoveLast(); },
       absl::StatusCode::kInvalidArgument, "queries: has 255 floats"},
      {"heads not a multiple", [](v1::RecoverRequest* r) { r->set_n_query_heads(3); },
       absl::StatusCode::kInvalidArgument, "n_query_heads: 3"},
      {"k zero", [](v1::RecoverRequest* r) { r->set_k(0); }, absl::StatusCode::kInvalidArgument,
       "k: 0 is out of range"},
      {"k huge", [](v1::RecoverRequest* r) { r->set_k(100000); },
       absl::StatusCode::kInvalidArgument, "k: 100000"},
      {"unknown kind", [](v1::RecoverRequest* r) { r->set_kind(static_cast<v1::SummaryKind>(12)); },
       absl::StatusCode::kInvalidArgument, "kind: unknown summary kind 12"},
      {"no scope", [](v1::RecoverRequest* r) { r->clear_session(); },
       absl::StatusCode::kInvalidArgument, "scope: is required"},
      {"empty scope", [](v1::RecoverRequest* r) { r->mutable_session()->set_session_id("none"); },
       absl::StatusCode::kNotFound, "no block of this scope"},
      {"other layer", [](v1::RecoverRequest* r) { r->set_layer(0); },
       absl::StatusCode::kNotFound, "of layer 0"},
      {"no queries", [](v1::RecoverRequest* r) { r->clear_queries(); },
       absl::StatusCode::kInvalidArgument, "queries: is required"},
  };
  for (const Case& c : cases) {
    v1::RecoverRequest r = SessionQuery("chat", s.directions[0], 2);
    c.mutate(&r);
    EXPECT_THAT(client_->Recover(r), StatusIs(c.code, HasSubstr(c.message))) << c.name;
  }
  EXPECT_OK(client_->HealthCheck());
}

// Norm-relative error per head between K read from a payload and the
// reference, for one layer.
double WorstHeadError(const std::string& payload, uint32_t layer, const std::vector<float>& ref) {
  const size_t section = static_cast<size_t>(kTokens) * kHeads * kDim;
  const char* k = payload.data() + layer * section * 2;  // `layer`: the section index.
  double worst = 0;
  for (uint32_t t = 0; t < kTokens; ++t) {
    for (uint32_t h = 0; h < kHeads; ++h) {
      double err = 0, norm = 0;
      for (uint32_t d = 0; d < kDim; ++d) {
        const size_t i = (t * kHeads + h) * kDim + d;
        uint16_t bits;
        std::memcpy(&bits, k + i * 2, 2);
        err += std::pow(HalfToFloat(bits) - ref[i], 2);
        norm += std::pow(ref[i], 2);
      }
      worst = std::max(worst, std::sqrt(err / norm));
    }
  }
  return worst;
}

TEST_F(RecoveryTest, ReanchoredLoadMatchesKeysComputedAtTheNewPositions) {
  StartDaemon();
  const Session s = MakeSession("splice", 4, 6);
  ASSERT_OK(SaveBlocks(*client_, s.blocks));
  const TestBlock& b = s.blocks[2];  // Positions 32..47.
  const size_t section = static_cast<size_t>(kTokens) * kHeads * kDim;
  const RopePlan plan = MakeRopePlan(Fp()).value();
  ASSERT_OK_AND_ASSIGN(std::vector<LoadedBlock> moved,
                       client_->LoadReanchored({b.id()}, Fp(), {1000}));
  EXPECT_EQ(moved[0].meta.first_position(), 1000);
  for (uint32_t l = 0; l < kLayers; ++l) {
    // V is byte-identical.
    EXPECT_EQ(moved[0].payload.substr((2 * l + 1) * section * 2, section * 2),
              b.payload.substr((2 * l + 1) * section * 2, section * 2));
    // K equals the keys computed directly at positions 1000.. (f16 rounding).
    std::vector<float> ref(s.unrotated[2].begin() + l * section,
                           s.unrotated[2].begin() + (l + 1) * section);
    std::vector<int64_t> at(kTokens);
    for (uint32_t t = 0; t < kTokens; ++t) at[t] = 1000 + t;
    RotateKeys(plan, v1::DTYPE_F32, ref.data(), kTokens, kHeads, at);
    EXPECT_LT(WorstHeadError(moved[0].payload, 2 * l, ref), 2e-3) << "layer " << l;
  }
  // The stored block is unchanged.
  ASSERT_OK_AND_ASSIGN(std::vector<LoadedBlock> same, client_->Load({b.id()}, Fp()));
  EXPECT_EQ(same[0].payload, b.payload);
  EXPECT_EQ(same[0].meta.first_position(), 32);
  // Delta 0: byte-identical.
  ASSERT_OK_AND_ASSIGN(std::vector<LoadedBlock> zero,
                       client_->LoadReanchored({b.id()}, Fp(), {32}));
  EXPECT_EQ(zero[0].payload, b.payload);
  // Per-token positions (a gap in the middle) into shared memory.
  v1::Reanchor per_token;
  for (uint32_t t = 0; t < kTokens; ++t) per_token.add_positions(t < 8 ? 200 + t : 300 + t);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> region,
                       client_->CreateSharedRegion(b.payload.size()));
  ASSERT_OK_AND_ASSIGN(
      std::vector<LoadedBlock> gap,
      client_->LoadWith({b.id()}, Fp(), {per_token}, {region->Slice(0, b.payload.size())}));
  EXPECT_EQ(gap[0].meta.positions_size(), static_cast<int>(kTokens));
  EXPECT_EQ(gap[0].meta.positions(8), 308);
  std::vector<float> ref(s.unrotated[2].begin(), s.unrotated[2].begin() + section);
  std::vector<int64_t> at(per_token.positions().begin(), per_token.positions().end());
  RotateKeys(plan, v1::DTYPE_F32, ref.data(), kTokens, kHeads, at);
  EXPECT_LT(WorstHeadError(std::string(reinterpret_cast<const char*>(region->data()),
                                       b.payload.size()),
                           0, ref),
            2e-3);
}

TEST_F(RecoveryTest, ReanchorBadInput) {
  StartDaemon();
  const Session s = MakeSession("bad", 1, 7);
  ASSERT_OK(SaveBlocks(*client_, s.blocks));
  const BlockId id = s.blocks[0].id();
  EXPECT_THAT(client_->LoadReanchored({id}, Fp(), {INT32_MAX - 3}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("reanchor[0].first_position")));
  EXPECT_THAT(client_->LoadReanchored({id}, Fp(), {-5}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  v1::Reanchor short_list;
  short_list.add_positions(1);
  EXPECT_THAT(client_->LoadWith({id}, Fp(), {short_list}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("reanchor[0].positions: has 1 entries")));
  // Opaque blocks are stored, never transformed.
  v1::LayoutFingerprint opaque = Fp();
  opaque.set_layout(v1::LAYOUT_OPAQUE);
  TestBlock o = SessionBlock("opaque", 0, 8, opaque);
  ASSERT_OK(SaveBlocks(*client_, {o}));
  EXPECT_THAT(client_->LoadReanchored({o.id()}, opaque, {100}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("opaque layout")));
  // Dynamic NTK angles depend on sequence length: refused.
  v1::LayoutFingerprint ntk = Fp();
  ntk.mutable_rope()->set_scaling(v1::ROPE_SCALING_DYNAMIC_NTK);
  TestBlock n = MakeSession("ntk", 1, 8).blocks[0];  // Any bytes of the right size.
  n.meta = SessionBlockMeta(ntk, "ntk", 0, kTokens, 0, kLayers, 0);
  ASSERT_OK(SaveBlocks(*client_, {n}));
  EXPECT_THAT(client_->LoadReanchored({n.id()}, ntk, {100}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rope.scaling")));
  // RoPE parameters that do not match the block: the fingerprint refuses.
  v1::LayoutFingerprint other_base = Fp();
  other_base.mutable_rope()->set_freq_base(500000);
  EXPECT_THAT(client_->LoadReanchored({id}, other_base, {100}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rope.freq_base")));
  EXPECT_OK(client_->HealthCheck());
}

TEST_F(RecoveryTest, CExampleRunsAgainstTheDaemon) {
  StartDaemon();
  const CommandResult r =
      RunCommand({BinaryPath("EVOKE_C_EXAMPLE", EVOKE_C_EXAMPLE_PATH), daemon_->socket()});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("V byte-identical, K rotated"));
  EXPECT_THAT(r.out, HasSubstr("c_example: OK"));
}

TEST_F(RecoveryTest, DemoSpliceRunsAgainstTheDaemon) {
  // The README's demo step: recover evicted blocks by similarity and splice
  // two back at new positions, checked against a direct computation.
  StartDaemon();
  const CommandResult r = RunCommand({BinaryPath("EVOKE_DEMO", EVOKE_DEMO_PATH), "--socket",
                                      daemon_->socket(), "splice"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("block  5 loaded at positions 768-799 (delta +608)"));
  EXPECT_THAT(r.out, HasSubstr("V byte-identical"));
}

}  // namespace
}  // namespace evoke::testing
