#include "common/fingerprint.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace evoke {
namespace {

using ::testing::HasSubstr;

v1::LayoutFingerprint Llama() {
  v1::LayoutFingerprint fp;
  fp.set_namespace_("prod");
  fp.set_model_id("meta-llama/Llama-3.1-8B");
  fp.set_model_revision("r1");
  fp.set_k_dtype(v1::DTYPE_BF16);
  fp.set_v_dtype(v1::DTYPE_BF16);
  fp.set_n_layers(32);
  fp.set_n_kv_heads(8);
  fp.set_head_dim(128);
  fp.set_layout(v1::LAYOUT_CANONICAL_V1);
  fp.mutable_rope()->set_type(v1::ROPE_NEOX);
  fp.mutable_rope()->set_freq_base(500000);
  return fp;
}

TEST(FingerprintTest, EqualMeaningEqualDigest) {
  v1::LayoutFingerprint a = Llama();
  v1::LayoutFingerprint b = Llama();
  b.mutable_rope()->set_freq_scale(1.0);  // Default made explicit.
  b.mutable_rope()->set_rotary_dim(128);  // Default made explicit.
  b.set_tp_size(1);
  EXPECT_EQ(DigestFingerprint(a), DigestFingerprint(b));
  EXPECT_EQ(FingerprintMismatch(a, b), "");
}

TEST(FingerprintTest, RopeNoneIgnoresRopeDetails) {
  v1::LayoutFingerprint a = Llama();
  a.mutable_rope()->Clear();
  v1::LayoutFingerprint b = a;
  b.mutable_rope()->set_type(v1::ROPE_NONE);
  b.mutable_rope()->set_freq_base(10000);
  EXPECT_EQ(DigestFingerprint(a), DigestFingerprint(b));
}

TEST(FingerprintTest, EveryFieldChangesTheDigestAndIsNamed) {
  const v1::LayoutFingerprint base = Llama();
  struct Case {
    const char* field;
    void (*mutate)(v1::LayoutFingerprint*);
  };
  const Case cases[] = {
      {"namespace", [](v1::LayoutFingerprint* f) { f->set_namespace_("dev"); }},
      {"model_id", [](v1::LayoutFingerprint* f) { f->set_model_id("m"); }},
      {"model_revision",
       [](v1::LayoutFingerprint* f) { f->set_model_revision("r2"); }},
      {"k_dtype", [](v1::LayoutFingerprint* f) { f->set_k_dtype(v1::DTYPE_F16); }},
      {"v_dtype", [](v1::LayoutFingerprint* f) { f->set_v_dtype(v1::DTYPE_F32); }},
      {"n_layers", [](v1::LayoutFingerprint* f) { f->set_n_layers(16); }},
      {"n_kv_heads", [](v1::LayoutFingerprint* f) { f->set_n_kv_heads(4); }},
      {"head_dim", [](v1::LayoutFingerprint* f) { f->set_head_dim(64); }},
      {"layout", [](v1::LayoutFingerprint* f) { f->set_layout(v1::LAYOUT_OPAQUE); }},
      {"rope.type",
       [](v1::LayoutFingerprint* f) { f->mutable_rope()->set_type(v1::ROPE_NORM); }},
      {"rope.rotary_dim",
       [](v1::LayoutFingerprint* f) { f->mutable_rope()->set_rotary_dim(64); }},
      {"rope.freq_base",
       [](v1::LayoutFingerprint* f) { f->mutable_rope()->set_freq_base(10000); }},
      {"rope.freq_scale",
       [](v1::LayoutFingerprint* f) { f->mutable_rope()->set_freq_scale(0.5); }},
      {"rope.scaling",
       [](v1::LayoutFingerprint* f) {
         f->mutable_rope()->set_scaling(v1::ROPE_SCALING_YARN);
       }},
      {"rope.freq_factors",
       [](v1::LayoutFingerprint* f) { f->mutable_rope()->add_freq_factors(2); }},
      {"rope.n_ctx_orig",
       [](v1::LayoutFingerprint* f) { f->mutable_rope()->set_n_ctx_orig(8192); }},
      {"tp_rank",
       [](v1::LayoutFingerprint* f) {
         f->set_tp_size(2);
         f->set_tp_rank(1);
       }},
      {"tp_size", [](v1::LayoutFingerprint* f) { f->set_tp_size(2); }},
      {"trust_group", [](v1::LayoutFingerprint* f) { f->set_trust_group("team"); }},
  };
  for (const Case& c : cases) {
    v1::LayoutFingerprint changed = base;
    c.mutate(&changed);
    EXPECT_NE(DigestFingerprint(base), DigestFingerprint(changed)) << c.field;
    EXPECT_THAT(FingerprintMismatch(base, changed),
                ::testing::StartsWith(std::string(c.field) + ":"))
        << c.field;
  }
}

TEST(FingerprintTest, MismatchShowsBothValues) {
  v1::LayoutFingerprint b = Llama();
  b.set_model_revision("r2");
  EXPECT_EQ(FingerprintMismatch(Llama(), b),
            "model_revision: stored \"r1\", requested \"r2\"");
}

TEST(FingerprintTest, Describe) {
  EXPECT_THAT(DescribeFingerprint(Llama()),
              HasSubstr("model=meta-llama/Llama-3.1-8B@r1 k=bf16 v=bf16 "
                        "layers=32 kv_heads=8 head_dim=128 layout=canonical_v1 "
                        "rope=neox tp=0/1"));
}

}  // namespace
}  // namespace evoke
