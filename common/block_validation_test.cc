#include "common/block_validation.h"

#include <cmath>
#include <functional>

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

TEST(BlockValidationTest, OverflowingShapeIsRejected) {
  v1::LayoutFingerprint fp = SessionBlock().fingerprint();
  fp.set_n_kv_heads(1u << 31);
  fp.set_head_dim(1u << 31);
  EXPECT_THAT(CanonicalPayloadBytes(fp, 1u << 31, 1u << 20),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overflows")));
}

}  // namespace
}  // namespace evoke
