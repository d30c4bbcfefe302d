#include "daemon/request_validation.h"

#include "common/chain_hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::HasSubstr;

v1::SaveBlock Block(uint64_t seq) {
  v1::SaveBlock b;
  v1::BlockMeta* m = b.mutable_meta();
  v1::LayoutFingerprint* fp = m->mutable_fingerprint();
  fp->set_namespace_("ns");
  fp->set_model_id("m");
  fp->set_k_dtype(v1::DTYPE_OPAQUE);
  fp->set_v_dtype(v1::DTYPE_OPAQUE);
  fp->set_n_layers(1);
  fp->set_n_kv_heads(1);
  fp->set_head_dim(1);
  fp->set_layout(v1::LAYOUT_OPAQUE);
  m->set_kind(v1::BLOCK_KIND_SESSION);
  m->set_session_id("s");
  m->set_sequence(seq);
  m->set_id(SessionBlockId("ns", "s", seq).ToBytes());
  m->set_n_tokens(1);
  m->set_layer_end(1);
  b.set_inline_bytes("payload");
  return b;
}

TEST(RequestValidationTest, Save) {
  v1::SaveRequest r;
  EXPECT_THAT(ValidateSaveRequest(r, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("blocks: has 0")));
  *r.add_blocks() = Block(0);
  *r.add_blocks() = Block(1);
  EXPECT_OK(ValidateSaveRequest(r, {}));
  *r.add_blocks() = Block(0);
  EXPECT_THAT(ValidateSaveRequest(r, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("blocks[2].meta.id: duplicate of blocks[0]")));
  r.mutable_blocks()->RemoveLast();
  r.mutable_blocks(1)->clear_inline_bytes();
  EXPECT_THAT(ValidateSaveRequest(r, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("blocks[1].payload: is required")));
  r.mutable_blocks(1)->clear_meta();
  r.mutable_blocks(1)->set_inline_bytes("x");
  EXPECT_THAT(ValidateSaveRequest(r, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("blocks[1].meta: is required")));
  RequestLimits small;
  small.max_batch_blocks = 1;
  EXPECT_THAT(ValidateSaveRequest(r, small),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected 1..1")));
}

TEST(RequestValidationTest, LoadAndIds) {
  v1::LoadRequest r;
  EXPECT_THAT(ValidateLoadRequest(r, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ids: has 0")));
  r.add_ids(BlockId(1, 2).ToBytes());
  EXPECT_THAT(ValidateLoadRequest(r, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("fingerprint: is required")));
  *r.mutable_fingerprint() = Block(0).meta().fingerprint();
  ASSERT_OK_AND_ASSIGN(std::vector<BlockId> ids, ValidateLoadRequest(r, {}));
  EXPECT_EQ(ids[0], BlockId(1, 2));
  r.add_ids("short");
  EXPECT_THAT(ValidateLoadRequest(r, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("ids[1]: must be 16 bytes, got 5")));
  r.set_ids(1, BlockId(1, 2).ToBytes());
  EXPECT_THAT(ValidateLoadRequest(r, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("ids[1]: duplicate of ids[0]")));
  r.mutable_ids()->RemoveLast();
  r.mutable_fingerprint()->set_head_dim(0);
  EXPECT_THAT(ValidateLoadRequest(r, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("fingerprint.head_dim")));
}

}  // namespace
}  // namespace evoke
