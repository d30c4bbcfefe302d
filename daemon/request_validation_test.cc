#include "daemon/request_validation.h"

#include "common/chain_hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::AllOf;
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
                       HasSubstr("blocks[1].payload: is required (inline_bytes, region or "
                                 "gather)")));
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

v1::RegionSlice Slice(uint64_t region, uint64_t offset, uint64_t length) {
  v1::RegionSlice s;
  s.set_region_id(region);
  s.set_offset(offset);
  s.set_length(length);
  return s;
}

TEST(RequestValidationTest, Gather) {
  v1::SaveRequest r;
  *r.add_blocks() = Block(0);
  *r.add_blocks() = Block(1);
  v1::RegionSlices* gather = r.mutable_blocks(1)->mutable_gather();
  for (uint64_t j = 0; j < 8; ++j) *gather->add_slices() = Slice(1 + j % 2, j * 100, 10 + j);
  EXPECT_EQ(PayloadLength(r.blocks(1)), 10u * 8 + 28);
  EXPECT_THAT(ValidateSaveRequest(r, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("lease_id: is required when blocks[1].gather names regions")));
  r.set_lease_id(std::string(16, 'l'));
  EXPECT_OK(ValidateSaveRequest(r, {}));

  gather->mutable_slices(7)->set_length(0);
  EXPECT_THAT(ValidateSaveRequest(r, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("blocks[1].gather.slices[7].length: must be > 0")));
  gather->mutable_slices(7)->set_length(1);

  // The total is the payload: checked against the block limits.
  RequestLimits small;
  small.block.max_block_bytes = 50;
  EXPECT_THAT(ValidateSaveRequest(r, small),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("blocks[1].gather.slices (their total length): "),
                             HasSubstr("exceeds the maximum block size"))));
  // Lengths that wrap around uint64 saturate instead of passing the limit.
  gather->mutable_slices(0)->set_length(UINT64_MAX);
  EXPECT_EQ(PayloadLength(r.blocks(1)), UINT64_MAX);
  EXPECT_THAT(ValidateSaveRequest(r, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("blocks[1].gather.slices")));
  gather->mutable_slices(0)->set_length(10);

  // 1..max_slices slices.
  RequestLimits few;
  few.max_slices = 7;
  EXPECT_THAT(ValidateSaveRequest(r, few),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("blocks[1].gather.slices: has 8 slices, expected 1..7")));
  gather->clear_slices();
  EXPECT_THAT(ValidateSaveRequest(r, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("blocks[1].gather.slices: has 0 slices, expected 1..4096")));
  for (int j = 0; j < 4097; ++j) *gather->add_slices() = Slice(1, j, 1);
  EXPECT_THAT(ValidateSaveRequest(r, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("blocks[1].gather.slices: has 4097 slices, expected 1..4096")));
  gather->mutable_slices()->RemoveLast();
  EXPECT_OK(ValidateSaveRequest(r, {}));

  // A canonical block: the total must be the shape's exact length.
  v1::SaveRequest canonical;
  canonical.set_lease_id(std::string(16, 'l'));
  v1::SaveBlock* b = canonical.add_blocks();
  *b = Block(0);
  v1::LayoutFingerprint* fp = b->mutable_meta()->mutable_fingerprint();
  fp->set_layout(v1::LAYOUT_CANONICAL_V1);
  fp->set_k_dtype(v1::DTYPE_F16);
  fp->set_v_dtype(v1::DTYPE_F16);
  fp->set_head_dim(8);  // 1 layer x 1 token x 1 head x 8 x (2 + 2) = 32 bytes.
  *b->mutable_gather()->add_slices() = Slice(1, 0, 16);
  *b->mutable_gather()->add_slices() = Slice(1, 64, 15);
  EXPECT_THAT(ValidateSaveRequest(canonical, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("blocks[0].gather.slices (their total length): length 31 does "
                                 "not match the canonical layout")));
  b->mutable_gather()->mutable_slices(1)->set_length(16);
  EXPECT_OK(ValidateSaveRequest(canonical, {}));
}

TEST(RequestValidationTest, Scatter) {
  v1::LoadRequest r;
  r.add_ids(BlockId(1, 2).ToBytes());
  r.add_ids(BlockId(3, 4).ToBytes());
  *r.mutable_fingerprint() = Block(0).meta().fingerprint();
  for (int i = 0; i < 2; ++i) {
    v1::RegionSlices* list = r.add_scatter();
    for (uint64_t j = 0; j < 4; ++j) *list->add_slices() = Slice(1, j * 64, 16);
  }
  EXPECT_THAT(ValidateLoadRequest(r, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("lease_id: is required with scatter")));
  r.set_lease_id(std::string(16, 'l'));
  EXPECT_OK(ValidateLoadRequest(r, {}).status());

  // Not both.
  *r.add_destinations() = Slice(1, 0, 64);
  *r.add_destinations() = Slice(1, 64, 64);
  EXPECT_THAT(ValidateLoadRequest(r, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("scatter: give destinations or scatter, not both")));
  r.clear_destinations();

  // One list per id.
  *r.add_scatter() = r.scatter(0);
  EXPECT_THAT(ValidateLoadRequest(r, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("scatter: has 3 lists, expected none or one per id (2)")));
  r.mutable_scatter()->RemoveLast();

  r.mutable_scatter(1)->mutable_slices(3)->set_length(0);
  EXPECT_THAT(ValidateLoadRequest(r, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("scatter[1].slices[3].length: must be > 0")));
  r.mutable_scatter(1)->mutable_slices(3)->set_length(16);

  RequestLimits few;
  few.max_slices = 3;
  EXPECT_THAT(ValidateLoadRequest(r, few),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("scatter[0].slices: has 4 slices, expected 1..3")));
  r.mutable_scatter(0)->clear_slices();
  EXPECT_THAT(ValidateLoadRequest(r, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("scatter[0].slices: has 0 slices, expected 1..4096")));
  *r.mutable_scatter(0)->add_slices() = Slice(1, 0, 64);

  // No list longer than any block (wrap-around included); the exact length
  // is checked against the payload once it is known.
  RequestLimits small;
  small.block.max_block_bytes = 63;
  EXPECT_THAT(ValidateLoadRequest(r, small),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("scatter[0].slices: lengths add up to 64 bytes, more than any "
                                 "block (63 bytes")));
  r.mutable_scatter(1)->mutable_slices(0)->set_length(UINT64_MAX);
  EXPECT_THAT(ValidateLoadRequest(r, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("scatter[1].slices: lengths add up to 18446744073709551615")));
}

}  // namespace
}  // namespace evoke
