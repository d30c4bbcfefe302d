// Bad input against a real evoked: every malformed request gets the right
// status code with a message naming the field, and the daemon keeps serving.
#include <functional>

#include "gmock/gmock.h"
#include "tests/e2e_fixture.h"

namespace evoke::testing {
namespace {

using ::testing::HasSubstr;

class BadInputTest : public E2eTest {
 protected:
  void SetUp() override { StartDaemon({"--max-block-bytes", "48MiB"}); }

  grpc::Status RawSave(const v1::SaveRequest& request) {
    auto stub = RawStub(daemon_->socket());
    grpc::ClientContext context;
    v1::SaveResponse response;
    return stub->Save(&context, request, &response);
  }
  grpc::Status RawLoad(const v1::LoadRequest& request) {
    auto stub = RawStub(daemon_->socket());
    grpc::ClientContext context;
    v1::LoadResponse response;
    return stub->Load(&context, request, &response);
  }

  // The daemon still answers and still round-trips a block.
  void ExpectStillServing() {
    ASSERT_OK(client_->HealthCheck());
    static int n = 0;
    const TestBlock b = SessionBlock("alive", ++n, 4);
    ASSERT_OK(SaveBlocks(*client_, {b}));
    absl::StatusOr<std::vector<LoadedBlock>> got = client_->Load({b.id()}, SmallFingerprint());
    ASSERT_OK(got);
    EXPECT_EQ((*got)[0].payload, b.payload);
  }
};

v1::SaveRequest OneBlock(const TestBlock& b) {
  v1::SaveRequest r;
  v1::SaveBlock* sb = r.add_blocks();
  *sb->mutable_meta() = b.meta;
  sb->set_inline_bytes(b.payload);
  return r;
}

TEST_F(BadInputTest, SaveRequestsNameTheField) {
  struct Case {
    const char* name;
    std::function<void(v1::SaveRequest*)> mutate;
    grpc::StatusCode code;
    const char* message;
  };
  const TestBlock good = SessionBlock("s", 0, 8);
  const Case cases[] = {
      {"empty payload", [](v1::SaveRequest* r) { r->mutable_blocks(0)->set_inline_bytes(""); },
       grpc::INVALID_ARGUMENT, "blocks[0].payload: is empty"},
      {"no payload", [](v1::SaveRequest* r) { r->mutable_blocks(0)->clear_inline_bytes(); },
       grpc::INVALID_ARGUMENT, "blocks[0].payload: is required"},
      {"oversized payload",
       [](v1::SaveRequest* r) {
         r->mutable_blocks(0)->mutable_meta()->mutable_fingerprint()->set_layout(
             v1::LAYOUT_OPAQUE);
         r->mutable_blocks(0)->set_inline_bytes(std::string((48 << 20) + 1, 'x'));
       },
       grpc::INVALID_ARGUMENT, "blocks[0].payload: 48.00 MiB exceeds the maximum block size"},
      {"length does not match layout",
       [](v1::SaveRequest* r) { r->mutable_blocks(0)->mutable_inline_bytes()->pop_back(); },
       grpc::INVALID_ARGUMENT, "blocks[0].payload: length 16383 does not match"},
      {"unknown dtype",
       [](v1::SaveRequest* r) {
         r->mutable_blocks(0)->mutable_meta()->mutable_fingerprint()->set_k_dtype(
             static_cast<v1::DType>(42));
       },
       grpc::INVALID_ARGUMENT, "blocks[0].meta.fingerprint.k_dtype: unknown dtype 42"},
      {"unknown layout version",
       [](v1::SaveRequest* r) {
         r->mutable_blocks(0)->mutable_meta()->mutable_fingerprint()->set_layout(
             static_cast<v1::Layout>(7));
       },
       grpc::INVALID_ARGUMENT, "blocks[0].meta.fingerprint.layout: unknown layout version 7"},
      {"zero heads",
       [](v1::SaveRequest* r) {
         r->mutable_blocks(0)->mutable_meta()->mutable_fingerprint()->set_n_kv_heads(0);
       },
       grpc::INVALID_ARGUMENT, "blocks[0].meta.fingerprint.n_kv_heads: 0 is out of range"},
      {"absurd head_dim",
       [](v1::SaveRequest* r) {
         r->mutable_blocks(0)->mutable_meta()->mutable_fingerprint()->set_head_dim(1 << 20);
       },
       grpc::INVALID_ARGUMENT, "blocks[0].meta.fingerprint.head_dim: 1048576 is out of range"},
      {"absurd layers",
       [](v1::SaveRequest* r) {
         r->mutable_blocks(0)->mutable_meta()->mutable_fingerprint()->set_n_layers(1 << 30);
       },
       grpc::INVALID_ARGUMENT, "blocks[0].meta.fingerprint.n_layers"},
      {"zero tokens", [](v1::SaveRequest* r) { r->mutable_blocks(0)->mutable_meta()->set_n_tokens(0); },
       grpc::INVALID_ARGUMENT, "blocks[0].meta.n_tokens: 0 is out of range"},
      {"malformed id",
       [](v1::SaveRequest* r) { r->mutable_blocks(0)->mutable_meta()->set_id("not-an-id"); },
       grpc::INVALID_ARGUMENT, "blocks[0].meta.id: must be 16 bytes, got 9"},
      {"id not matching session address",
       [](v1::SaveRequest* r) {
         r->mutable_blocks(0)->mutable_meta()->set_sequence(99);
       },
       grpc::INVALID_ARGUMENT, "blocks[0].meta.id: does not match SessionBlockId"},
      {"duplicate ids",
       [](v1::SaveRequest* r) { *r->add_blocks() = r->blocks(0); },
       grpc::INVALID_ARGUMENT, "blocks[1].meta.id: duplicate of blocks[0]"},
      {"wrong client checksum",
       [](v1::SaveRequest* r) { r->mutable_blocks(0)->mutable_meta()->set_checksum(1); },
       grpc::DATA_LOSS, "blocks[0].meta.checksum"},
      {"no blocks", [](v1::SaveRequest* r) { r->clear_blocks(); }, grpc::INVALID_ARGUMENT,
       "blocks: has 0 blocks"},
  };
  for (const Case& c : cases) {
    v1::SaveRequest r = OneBlock(good);
    c.mutate(&r);
    const grpc::Status s = RawSave(r);
    EXPECT_EQ(s.error_code(), c.code) << c.name << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message)) << c.name;
  }
  // None of them stored anything.
  EXPECT_EQ(Stat().pinned().blocks(), 0u);
  ExpectStillServing();
}

TEST_F(BadInputTest, MessageOverTheGrpcLimitIsResourceExhausted) {
  TestBlock b = SessionBlock("s", 0, 8);
  v1::SaveRequest r = OneBlock(b);
  r.mutable_blocks(0)->mutable_meta()->mutable_fingerprint()->set_layout(v1::LAYOUT_OPAQUE);
  r.mutable_blocks(0)->set_inline_bytes(std::string(90 << 20, 'x'));  // > 80 MiB.
  const grpc::Status s = RawSave(r);
  EXPECT_EQ(s.error_code(), grpc::RESOURCE_EXHAUSTED) << s.error_message();
  ExpectStillServing();
}

TEST_F(BadInputTest, LoadErrors) {
  const TestBlock b = SessionBlock("s", 0, 8);
  ASSERT_OK(SaveBlocks(*client_, {b}));

  // Missing id.
  const BlockId missing = SessionBlockId("test", "s", 12345);
  EXPECT_THAT(client_->Load({missing}, SmallFingerprint()),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("ids[0]: block " + missing.ToHex() + " not found")));
  // A batch with one missing id returns nothing (all-or-nothing).
  EXPECT_THAT(client_->Load({b.id(), missing}, SmallFingerprint()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("ids[1]")));

  // Fingerprint mismatch, each kind of difference named.
  v1::LayoutFingerprint other = SmallFingerprint();
  other.set_model_revision("r2");
  EXPECT_THAT(client_->Load({b.id()}, other),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("model_revision: stored \"r1\", requested \"r2\"")));
  other = SmallFingerprint();
  other.set_k_dtype(v1::DTYPE_BF16);
  EXPECT_THAT(client_->Load({b.id()}, other),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("k_dtype: stored f16, requested bf16")));
  other = SmallFingerprint();
  other.set_tp_size(2);
  EXPECT_THAT(client_->Load({b.id()}, other),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("tp_size")));

  // Malformed and duplicate ids, missing fingerprint.
  v1::LoadRequest r;
  r.add_ids("short");
  *r.mutable_fingerprint() = SmallFingerprint();
  grpc::Status s = RawLoad(r);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("ids[0]: must be 16 bytes, got 5"));
  r.set_ids(0, b.id().ToBytes());
  r.add_ids(b.id().ToBytes());
  s = RawLoad(r);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("ids[1]: duplicate of ids[0]"));
  r.mutable_ids()->RemoveLast();
  r.clear_fingerprint();
  s = RawLoad(r);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("fingerprint: is required"));

  // Describe / Delete / Pin of malformed or missing ids.
  auto stub = RawStub(daemon_->socket());
  {
    grpc::ClientContext context;
    v1::DescribeRequest d;
    d.set_id("x");
    v1::BlockInfo info;
    s = stub->Describe(&context, d, &info);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("id: must be 16 bytes"));
  }
  EXPECT_THAT(client_->Delete({missing}), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(client_->Pin({missing}), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(client_->Unpin({b.id()}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not pinned")));
  {
    grpc::ClientContext context;
    v1::ListRequest l;
    l.set_page_token("zz");
    v1::ListResponse lr;
    s = stub->List(&context, l, &lr);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("page_token"));
  }
  ExpectStillServing();
}

TEST_F(BadInputTest, BlockLargerThanTier1) {
  // Tier 1 is 32 MiB; the protocol limit (48 MiB) lets a 40 MiB block through
  // validation, and the tier refuses it.
  v1::LayoutFingerprint fp = SmallFingerprint();
  fp.set_layout(v1::LAYOUT_OPAQUE);
  TestBlock b = SessionBlock("big", 0, 8, fp);
  b.payload = Payload(1, 40 << 20);
  EXPECT_THAT(SaveBlocks(*client_, {b}),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("larger than tier 1")));
  ExpectStillServing();
}

TEST_F(BadInputTest, SaveIntoTierFullOfPinnedBlocks) {
  // 32 MiB of tier 1, filled with pinned 1 MiB blocks (512 tokens x 2 KiB).
  int pinned = 0;
  for (int i = 0; i < 40; ++i) {
    const TestBlock b = SessionBlock("pinned", i, 512);
    absl::Status s = SaveBlocks(*client_, {b}, false, /*pin=*/true);
    if (!s.ok()) {
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted));
      break;
    }
    ++pinned;
  }
  EXPECT_GE(pinned, 30);
  const absl::Time start = absl::Now();
  EXPECT_THAT(SaveBlocks(*client_, {SessionBlock("other", 0, 512)}),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("pinned")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  const v1::StatResponse st = Stat();
  EXPECT_EQ(st.pinned_blocks(), static_cast<uint64_t>(pinned));
  EXPECT_LE(st.pinned().used_bytes(), st.pinned().capacity_bytes());
  // Unpinning makes room again.
  std::vector<BlockId> ids;
  for (int i = 0; i < pinned; ++i) ids.push_back(SessionBlock("pinned", i, 512).id());
  ASSERT_OK(client_->Unpin(ids));
  ASSERT_OK(SaveBlocks(*client_, {SessionBlock("other", 0, 512)}));
  ExpectStillServing();
}

}  // namespace
}  // namespace evoke::testing
