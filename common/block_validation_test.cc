#include "common/block_validation.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "common/chain_hash.h"
#include "common/fingerprint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::HasSubstr;

v1::BlockMeta SessionBlock() {
  v1::BlockMeta m;
  v1::LayoutFingerprint* fp = m.mutable_fingerprint();
  fp->set_namespace_("ns");
  fp->set_model_id("tiny");
  fp->set_k_dtype(v1::DTYPE_F16);
  fp->set_v_dtype(v1::DTYPE_F32);
  fp->set_n_layers(4);
  fp->set_n_kv_heads(2);
  fp->set_head_dim(8);
  fp->set_layout(v1::LAYOUT_CANONICAL_V1);
  fp->mutable_rope()->set_type(v1::ROPE_NEOX);
  fp->mutable_rope()->set_freq_base(10000);
  m.set_kind(v1::BLOCK_KIND_SESSION);
  m.set_session_id("s");
  m.set_sequence(3);
  m.set_id(SessionBlockId("ns", "s", 3).ToBytes());
  m.set_n_tokens(16);
  m.set_layer_begin(1);
  m.set_layer_end(3);
  return m;
}

// 2 layers * 16 tokens * 2 heads * 8 dims * (2 + 4) bytes.
constexpr uint64_t kPayload = 2 * 16 * 2 * 8 * 6;

TEST(BlockValidationTest, CanonicalSize) {
  ASSERT_OK_AND_ASSIGN(uint64_t n, CanonicalPayloadBytes(SessionBlock().fingerprint(), 16, 2));
  EXPECT_EQ(n, kPayload);
}

TEST(BlockValidationTest, AcceptsValidBlocks) {
  EXPECT_OK(ValidateBlockForSave(SessionBlock(), kPayload, {}, "blocks[0]"));

  v1::BlockMeta prefix = SessionBlock();
  prefix.set_kind(v1::BLOCK_KIND_PREFIX);
  std::vector<int32_t> tokens(16);
  for (int i = 0; i < 16; ++i) tokens[i] = 100 + i;
  prefix.mutable_tokens()->Assign(tokens.begin(), tokens.end());
  prefix.set_id(
      PrefixBlockId(BlockId(), tokens, DigestFingerprint(prefix.fingerprint()))
          .ToBytes());
  EXPECT_OK(ValidateBlockForSave(prefix, kPayload, {}, "blocks[0]"));

  v1::BlockMeta opaque = SessionBlock();
  opaque.mutable_fingerprint()->set_layout(v1::LAYOUT_OPAQUE);
  opaque.mutable_fingerprint()->set_k_dtype(v1::DTYPE_OPAQUE);
  EXPECT_OK(ValidateBlockForSave(opaque, 12345, {}, "blocks[0]"));
}

struct BadCase {
  const char* name;
  std::function<void(v1::BlockMeta*)> mutate;
  uint64_t payload;
  const char* field;
};

TEST(BlockValidationTest, RejectsEachProblemNamingTheField) {
  const BadCase cases[] = {
      {"short id", [](v1::BlockMeta* m) { m->set_id("abc"); }, kPayload,
       "blocks[2].meta.id: must be 16 bytes"},
      {"wrong session id",
       [](v1::BlockMeta* m) { m->set_id(SessionBlockId("ns", "s", 4).ToBytes()); },
       kPayload, "blocks[2].meta.id: does not match SessionBlockId"},
      {"no fingerprint", [](v1::BlockMeta* m) { m->clear_fingerprint(); }, kPayload,
       "blocks[2].meta.fingerprint: is required"},
      {"no namespace",
       [](v1::BlockMeta* m) { m->mutable_fingerprint()->clear_namespace_(); },
       kPayload, "blocks[2].meta.fingerprint.namespace: is required"},
      {"unknown dtype",
       [](v1::BlockMeta* m) {
         m->mutable_fingerprint()->set_k_dtype(static_cast<v1::DType>(17));
       },
       kPayload, "blocks[2].meta.fingerprint.k_dtype: unknown dtype 17"},
      {"opaque dtype in canonical",
       [](v1::BlockMeta* m) { m->mutable_fingerprint()->set_v_dtype(v1::DTYPE_OPAQUE); },
       kPayload, "blocks[2].meta.fingerprint.v_dtype: opaque is not allowed"},
      {"unknown layout",
       [](v1::BlockMeta* m) {
         m->mutable_fingerprint()->set_layout(static_cast<v1::Layout>(9));
       },
       kPayload, "blocks[2].meta.fingerprint.layout: unknown layout version 9"},
      {"zero heads",
       [](v1::BlockMeta* m) { m->mutable_fingerprint()->set_n_kv_heads(0); },
       kPayload, "blocks[2].meta.fingerprint.n_kv_heads: 0 is out of range"},
      {"absurd head_dim",
       [](v1::BlockMeta* m) { m->mutable_fingerprint()->set_head_dim(1u << 30); },
       kPayload, "blocks[2].meta.fingerprint.head_dim: 1073741824 is out of range"},
      {"odd rotary dim",
       [](v1::BlockMeta* m) { m->mutable_fingerprint()->mutable_rope()->set_rotary_dim(3); },
       kPayload, "blocks[2].meta.fingerprint.rope.rotary_dim"},
      {"zero freq base",
       [](v1::BlockMeta* m) { m->mutable_fingerprint()->mutable_rope()->set_freq_base(0); },
       kPayload, "blocks[2].meta.fingerprint.rope.freq_base"},
      {"tp rank",
       [](v1::BlockMeta* m) { m->mutable_fingerprint()->set_tp_rank(1); }, kPayload,
       "blocks[2].meta.fingerprint.tp_rank: 1 must be < tp_size 1"},
      {"zero tokens", [](v1::BlockMeta* m) { m->set_n_tokens(0); }, kPayload,
       "blocks[2].meta.n_tokens: 0 is out of range"},
      {"layer range", [](v1::BlockMeta* m) { m->set_layer_end(5); }, kPayload,
       "blocks[2].meta.layer_end"},
      {"empty layer range", [](v1::BlockMeta* m) { m->set_layer_end(1); }, kPayload,
       "blocks[2].meta.layer_end"},
      {"positions count", [](v1::BlockMeta* m) { m->add_positions(1); }, kPayload,
       "blocks[2].meta.positions: has 1 entries"},
      {"position overflow",
       [](v1::BlockMeta* m) { m->set_first_position(2147483640); }, kPayload,
       "blocks[2].meta.first_position"},
      {"no kind", [](v1::BlockMeta* m) { m->set_kind(v1::BLOCK_KIND_UNSPECIFIED); },
       kPayload, "blocks[2].meta.kind: is required"},
      {"no session", [](v1::BlockMeta* m) { m->clear_session_id(); }, kPayload,
       "blocks[2].meta.session_id: is required"},
      {"summary heads",
       [](v1::BlockMeta* m) {
         v1::Summary* s = m->add_summaries();
         s->set_kind(v1::SUMMARY_MEAN_KEYS);
         s->set_layer(1);
         s->set_heads(3);
         s->set_dim(8);
       },
       kPayload, "blocks[2].meta.summaries[0].heads: 3 must equal n_kv_heads 2"},
      {"summary layer",
       [](v1::BlockMeta* m) {
         v1::Summary* s = m->add_summaries();
         s->set_kind(v1::SUMMARY_MEAN_KEYS);
         s->set_layer(3);
         s->set_heads(2);
         s->set_dim(8);
       },
       kPayload, "blocks[2].meta.summaries[0].layer: 3 is outside the block's layers [1, 3)"},
      {"summary values",
       [](v1::BlockMeta* m) {
         v1::Summary* s = m->add_summaries();
         s->set_kind(v1::SUMMARY_EMBEDDING);
         s->set_heads(1);
         s->set_dim(4);
         s->add_values(1);
       },
       kPayload, "blocks[2].meta.summaries[0].values: has 1 floats"},
      {"summary nan",
       [](v1::BlockMeta* m) {
         v1::Summary* s = m->add_summaries();
         s->set_kind(v1::SUMMARY_EMBEDDING);
         s->set_heads(1);
         s->set_dim(1);
         s->add_values(std::nanf(""));
       },
       kPayload, "blocks[2].meta.summaries[0].values: must all be finite"},
      {"summary duplicate",
       [](v1::BlockMeta* m) {
         for (int k = 0; k < 2; ++k) {
           v1::Summary* s = m->add_summaries();
           s->set_kind(v1::SUMMARY_EMBEDDING);
           s->set_heads(1);
           s->set_dim(1);
           s->add_values(1);
         }
       },
       kPayload, "blocks[2].meta.summaries[1].kind: duplicates"},
      {"summary kind",
       [](v1::BlockMeta* m) { m->add_summaries()->set_kind(static_cast<v1::SummaryKind>(9)); },
       kPayload, "blocks[2].meta.summaries[0].kind: unknown summary kind 9"},
      {"empty payload", [](v1::BlockMeta*) {}, 0, "blocks[2].payload: is empty"},
      {"oversized payload", [](v1::BlockMeta*) {}, (64ull << 20) + 1,
       "blocks[2].payload: 64.00 MiB exceeds the maximum block size 64 MiB"},
      {"length mismatch", [](v1::BlockMeta*) {}, kPayload - 2,
       "blocks[2].payload: length 3070 does not match the canonical layout"},
  };
  for (const BadCase& c : cases) {
    v1::BlockMeta m = SessionBlock();
    c.mutate(&m);
    EXPECT_THAT(ValidateBlockForSave(m, c.payload, {}, "blocks[2]"),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field)))
        << c.name;
  }
}

TEST(BlockValidationTest, PrefixChainVerifiedWhenTokensGiven) {
  v1::BlockMeta m = SessionBlock();
  m.set_kind(v1::BLOCK_KIND_PREFIX);
  for (int i = 0; i < 16; ++i) m.add_tokens(i);
  m.set_id(BlockId(1, 2).ToBytes());
  EXPECT_THAT(ValidateBlockForSave(m, kPayload, {}, "b"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("b.meta.id: does not match PrefixBlockId")));
  m.set_parent_id("xyz");
  EXPECT_THAT(ValidateBlockForSave(m, kPayload, {}, "b"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("b.meta.parent_id: must be 16 bytes")));
}

// A YaRN fingerprint as llama.cpp resolves it for Llama-2 extended 4x.
v1::BlockMeta YarnBlock() {
  v1::BlockMeta m = SessionBlock();
  v1::RopeParams* r = m.mutable_fingerprint()->mutable_rope();
  r->set_scaling(v1::ROPE_SCALING_YARN);
  r->set_freq_scale(0.25);
  r->set_yarn_ext_factor(1.0f);
  r->set_yarn_attn_factor(1.0f);
  r->set_yarn_beta_fast(32.0f);
  r->set_yarn_beta_slow(1.0f);
  r->set_n_ctx_orig(4096);
  return m;
}

// Issue #11: NaN/Inf YaRN parameters, beta_fast = beta_slow = 0,
// n_ctx_orig = 0 and ext_factor = -1 (llama.cpp's "not set") were accepted.
TEST(BlockValidationTest, YarnParametersAreDefinedOrRefused) {
  EXPECT_OK(ValidateBlockForSave(YarnBlock(), kPayload, {}, "b"));
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const struct {
    const char* name;
    std::function<void(v1::RopeParams*)> mutate;
    const char* field;  // Empty: accepted.
  } cases[] = {
      {"nan ext", [&](v1::RopeParams* r) { r->set_yarn_ext_factor(nan); },
       "b.meta.fingerprint.rope.yarn_ext_factor: nan must be finite"},
      {"inf ext", [&](v1::RopeParams* r) { r->set_yarn_ext_factor(inf); },
       "rope.yarn_ext_factor: inf must be finite"},
      {"nan attn", [&](v1::RopeParams* r) { r->set_yarn_attn_factor(nan); },
       "rope.yarn_attn_factor: nan must be finite"},
      {"-inf beta fast", [&](v1::RopeParams* r) { r->set_yarn_beta_fast(-inf); },
       "rope.yarn_beta_fast: -inf must be finite"},
      {"nan beta slow", [&](v1::RopeParams* r) { r->set_yarn_beta_slow(nan); },
       "rope.yarn_beta_slow: nan must be finite"},
      {"auto ext", [](v1::RopeParams* r) { r->set_yarn_ext_factor(-1.0f); },
       "rope.yarn_ext_factor: -1 is llama.cpp's \"not set\""},
      {"negative attn", [](v1::RopeParams* r) { r->set_yarn_attn_factor(-0.5f); },
       "rope.yarn_attn_factor: -0.5 must be >= 0"},
      {"zero betas",
       [](v1::RopeParams* r) {
         r->set_yarn_beta_fast(0);
         r->set_yarn_beta_slow(0);
       },
       "rope.yarn_beta_fast: 0 must be > 0"},
      {"zero beta slow", [](v1::RopeParams* r) { r->set_yarn_beta_slow(0); },
       "rope.yarn_beta_slow: 0 must be > 0"},
      {"zero n_ctx_orig", [](v1::RopeParams* r) { r->set_n_ctx_orig(0); },
       "rope.n_ctx_orig: must be > 0"},
      {"base 1", [](v1::RopeParams* r) { r->set_freq_base(1); },
       "rope.freq_base: 1 has no YaRN ramp"},
      // Without the ramp (ext_factor 0: pure interpolation) betas, n_ctx_orig
      // and base 1 are not used: accepted.
      {"no ramp",
       [](v1::RopeParams* r) {
         r->set_yarn_ext_factor(0);
         r->set_yarn_beta_fast(0);
         r->set_yarn_beta_slow(0);
         r->set_n_ctx_orig(0);
         r->set_freq_base(1);
       },
       ""},
      // Not YaRN: the YaRN fields are ignored but part of the identity, so
      // they must still be finite; -1 is fine.
      {"linear with -1 ext",
       [](v1::RopeParams* r) {
         r->set_scaling(v1::ROPE_SCALING_LINEAR);
         r->set_yarn_ext_factor(-1);
         r->set_n_ctx_orig(0);
       },
       ""},
      {"linear with nan beta",
       [&](v1::RopeParams* r) {
         r->set_scaling(v1::ROPE_SCALING_LINEAR);
         r->set_yarn_beta_fast(nan);
       },
       "rope.yarn_beta_fast: nan must be finite"},
  };
  for (const auto& c : cases) {
    v1::BlockMeta m = YarnBlock();
    c.mutate(m.mutable_fingerprint()->mutable_rope());
    if (std::string(c.field).empty()) {
      EXPECT_OK(ValidateBlockForSave(m, kPayload, {}, "b")) << c.name;
      EXPECT_OK(ValidateFingerprint(m.fingerprint(), {}, "f")) << c.name;
    } else {
      EXPECT_THAT(ValidateBlockForSave(m, kPayload, {}, "b"),
                  StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field)))
          << c.name;
    }
  }
  // A rope of type NONE carries no parameters at all.
  v1::BlockMeta none = YarnBlock();
  none.mutable_fingerprint()->mutable_rope()->set_type(v1::ROPE_NONE);
  none.mutable_fingerprint()->mutable_rope()->set_yarn_ext_factor(nan);
  EXPECT_OK(ValidateBlockForSave(none, kPayload, {}, "b"));
}

// Issue #11 ("Memory"): 8 Saves of 1-byte payloads with large summaries
// grew RSS by 517 MiB. Summaries, tokens and positions are capped per block.
TEST(BlockValidationTest, MetadataIsCappedPerBlock) {
  // One MEAN_KEYS summary per layer of a wide block: 8 heads x 4096 dims =
  // 128 KiB each; 4 of them (512 KiB) fit, a 5th does not.
  v1::BlockMeta m = SessionBlock();
  v1::LayoutFingerprint* fp = m.mutable_fingerprint();
  fp->set_layout(v1::LAYOUT_OPAQUE);
  fp->set_k_dtype(v1::DTYPE_OPAQUE);
  fp->set_v_dtype(v1::DTYPE_OPAQUE);
  fp->set_n_layers(8);
  fp->set_n_kv_heads(8);
  fp->set_head_dim(4096);
  m.set_layer_begin(0);
  m.set_layer_end(8);
  for (uint32_t layer = 0; layer < 5; ++layer) {
    v1::Summary* s = m.add_summaries();
    s->set_kind(v1::SUMMARY_MEAN_KEYS);
    s->set_layer(layer);
    s->set_heads(8);
    s->set_dim(4096);
    s->mutable_values()->Resize(8 * 4096, 0.5f);
    if (layer == 3) {
      EXPECT_OK(ValidateBlockForSave(m, 1, {}, "b"));
    }
  }
  EXPECT_THAT(ValidateBlockForSave(m, 1, {}, "b"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("b.meta.summaries: hold 640 KiB of values, above the "
                                 "per-block cap of 512 KiB")));
  // The stored path does not look at summaries (nor at the caps).
  EXPECT_OK(ValidateStoredBlock(m, 1, {}, "b"));
  BlockLimits wide;
  wide.max_summary_bytes = 1 << 20;
  EXPECT_OK(ValidateBlockForSave(m, 1, wide, "b"));

  // The 517 MiB reproduction: 8 summaries of 1024 heads x 4096 dims, 16 MiB
  // each, refused before anything walks them.
  v1::BlockMeta flood = SessionBlock();
  flood.mutable_fingerprint()->set_n_kv_heads(1024);
  flood.mutable_fingerprint()->set_head_dim(4096);
  flood.mutable_fingerprint()->set_layout(v1::LAYOUT_OPAQUE);
  flood.mutable_fingerprint()->set_k_dtype(v1::DTYPE_OPAQUE);
  flood.mutable_fingerprint()->set_v_dtype(v1::DTYPE_OPAQUE);
  v1::Summary* big = flood.add_summaries();
  big->set_kind(v1::SUMMARY_MEAN_KEYS);
  big->set_layer(1);
  big->set_heads(1024);
  big->set_dim(4096);
  big->mutable_values()->Resize(1024 * 4096, 1.0f);
  EXPECT_THAT(ValidateBlockForSave(flood, 1, {}, "b"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("b.meta.summaries: hold 16 MiB")));

  // Tokens and positions: 262144 entries each fit, one more does not.
  BlockLimits limits;
  v1::BlockMeta many = SessionBlock();
  many.mutable_fingerprint()->set_layout(v1::LAYOUT_OPAQUE);
  many.mutable_fingerprint()->set_k_dtype(v1::DTYPE_OPAQUE);
  many.mutable_fingerprint()->set_v_dtype(v1::DTYPE_OPAQUE);
  const int n = static_cast<int>(limits.max_position_bytes / 4);
  many.set_n_tokens(n);
  for (int i = 0; i < n; ++i) many.add_positions(i);
  EXPECT_OK(ValidateBlockForSave(many, 1, limits, "b"));
  many.set_n_tokens(n + 1);
  many.add_positions(n);
  EXPECT_THAT(ValidateBlockForSave(many, 1, limits, "b"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("b.meta.positions: has 262145 entries (1.00 MiB), above "
                                 "the per-block cap of 1 MiB")));
  EXPECT_OK(ValidateStoredBlock(many, 1, limits, "b"));

  v1::BlockMeta prefix = many;
  prefix.clear_positions();
  prefix.set_kind(v1::BLOCK_KIND_PREFIX);
  for (int i = 0; i < n + 1; ++i) prefix.add_tokens(i);
  prefix.set_id(PrefixBlockId(BlockId(), absl::MakeConstSpan(prefix.tokens().data(), n + 1),
                              DigestFingerprint(prefix.fingerprint()))
                    .ToBytes());
  EXPECT_THAT(ValidateBlockForSave(prefix, 1, limits, "b"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("b.meta.tokens: has 262145 entries (1.00 MiB), above the "
                                 "per-block cap of 1 MiB")));
  EXPECT_OK(ValidateStoredBlock(prefix, 1, limits, "b"));
  prefix.mutable_tokens()->RemoveLast();
  prefix.set_n_tokens(n);
  prefix.set_id(PrefixBlockId(BlockId(), absl::MakeConstSpan(prefix.tokens().data(), n),
                              DigestFingerprint(prefix.fingerprint()))
                    .ToBytes());
  EXPECT_OK(ValidateBlockForSave(prefix, 1, limits, "b"));
}

TEST(BlockValidationTest, OverflowingShapeIsRejected) {
  v1::LayoutFingerprint fp = SessionBlock().fingerprint();
  fp.set_n_kv_heads(1u << 31);
  fp.set_head_dim(1u << 31);
  EXPECT_THAT(CanonicalPayloadBytes(fp, 1u << 31, 1u << 20),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overflows")));
}

}  // namespace
}  // namespace evoke
