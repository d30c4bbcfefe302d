#include <cstdlib>
#include <filesystem>

#include "common/block_validation.h"
#include "evoke/client.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

v1::LayoutFingerprint Fp() {
  v1::LayoutFingerprint fp;
  fp.set_namespace_("ns");
  fp.set_model_id("m");
  fp.set_k_dtype(v1::DTYPE_F16);
  fp.set_v_dtype(v1::DTYPE_F16);
  fp.set_n_layers(2);
  fp.set_n_kv_heads(1);
  fp.set_head_dim(4);
  fp.set_layout(v1::LAYOUT_CANONICAL_V1);
  return fp;
}

TEST(ClientHelpersTest, ResolveTarget) {
  EXPECT_EQ(ResolveTarget("/run/e.sock"), "unix:/run/e.sock");
  EXPECT_EQ(ResolveTarget("unix:/x"), "unix:/x");
  EXPECT_EQ(ResolveTarget("localhost:7000"), "localhost:7000");
  EXPECT_EQ(ResolveTarget("rel.sock"),
            "unix:" + (std::filesystem::current_path() / "rel.sock").string());
  setenv("EVOKE_SOCKET", "/from/env.sock", 1);
  EXPECT_EQ(ResolveTarget(""), "unix:/from/env.sock");
  unsetenv("EVOKE_SOCKET");
  EXPECT_EQ(ResolveTarget(""),
            "unix:" + (std::filesystem::current_path() / "evoked.sock").string());
}

TEST(ClientHelpersTest, MetasValidate) {
  const v1::BlockMeta s = SessionBlockMeta(Fp(), "sess", 3, 8, 0, 2, 100);
  // 2 layers * 8 tokens * 1 head * 4 dims * (2 + 2) bytes.
  EXPECT_OK(ValidateBlockForSave(s, 256, {}, "b"));
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  const v1::BlockMeta p0 = PrefixBlockMeta(Fp(), BlockId(), tokens, 0, 2, 0);
  EXPECT_OK(ValidateBlockForSave(p0, 256, {}, "b"));
  const v1::BlockMeta p1 = PrefixBlockMeta(Fp(), BlockIdOf(p0), tokens, 0, 2, 8);
  EXPECT_OK(ValidateBlockForSave(p1, 256, {}, "b"));
  EXPECT_EQ(BlockIdOf(p1),
            PrefixChain({1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8}, 8,
                        DigestFingerprint(Fp()))[1]);
}

}  // namespace
}  // namespace evoke
