// The inline data path's wire format (daemon/inline_wire.h, client/
// inline_calls.h) against protobuf's own, for many shapes of request and
// response, split over slices in every way; and the raw Save and Load
// handlers of the real KvTierService over gRPC's in-process channel (a
// corrupt tier-1 copy is still refused). Label: unit (starts no process).
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/inline_calls.h"
#include "common/checksum.h"
#include "daemon/executor.h"
#include "daemon/inline_wire.h"
#include "daemon/kvtier_service.h"
#include "daemon/lease_manager.h"
#include "daemon/payload_paths.h"
#include "evoke/v1/kvtier.grpc.pb.h"
#include "gtest/gtest.h"
#include "recovery/recovery_index.h"
#include "storage/pinned_arena.h"
#include "storage/tier_manager.h"
#include "testing/blocks.h"
#include "testing/host_device_copier.h"
#include "testing/memory_tier.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

using inline_wire::InlineLoadSink;
using inline_wire::StringPool;

constexpr uint64_t kKiB = 1 << 10;
constexpr uint64_t kMiB = 1 << 20;

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// `bytes` as a ByteBuffer of slices of `piece` bytes (0: one slice).
grpc::ByteBuffer Split(const std::string& bytes, size_t piece) {
  std::vector<grpc::Slice> slices;
  if (piece == 0) piece = std::max<size_t>(bytes.size(), 1);
  for (size_t at = 0; at < bytes.size(); at += piece) {
    slices.emplace_back(bytes.data() + at, std::min(piece, bytes.size() - at));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

v1::BlockMeta Meta(int seed, bool with_summaries = false) {
  v1::BlockMeta m = testing::SessionMeta(testing::OpaqueFingerprint("ns", "m"), "s", seed, 1, 0,
                                         1, seed);
  if (with_summaries) {
    v1::Summary* s = m.add_summaries();
    s->set_kind(v1::SUMMARY_MEAN_KEYS);
    s->add_values(1.5f);
  }
  m.set_checksum(0x1234 + seed);
  return m;
}

// ------------------------------------------------------------ Load encoding

struct LoadShape {
  std::vector<v1::BlockMeta> metas;  // payload_bytes set.
  std::vector<v1::Tier> tiers;
};

// Encodes through the sink (payloads written at HostDestination) and
// returns the bytes; `expected` is the same response built with protobuf.
std::string EncodeWithSink(StringPool& pool, const LoadShape& shape,
                           v1::LoadResponse* expected) {
  InlineLoadSink sink(&pool, 1ull << 40);
  EXPECT_OK(sink.Prepare(shape.metas));
  expected->Clear();
  for (size_t i = 0; i < shape.metas.size(); ++i) {
    const std::string payload = testing::Payload(i + 7, shape.metas[i].payload_bytes());
    if (!payload.empty()) std::memcpy(sink.HostDestination(i), payload.data(), payload.size());
    v1::LoadedBlock* b = expected->add_blocks();
    *b->mutable_meta() = shape.metas[i];
    b->mutable_meta()->clear_summaries();
    b->set_inline_bytes(payload);
    b->set_served_from(shape.tiers[i]);
  }
  grpc::ByteBuffer out;
  sink.Encode(shape.tiers, &out);
  return Flatten(out);
}

TEST(InlineWireTest, LoadResponseIsProtobufsEncodingByteForByte) {
  StringPool pool;
  std::vector<LoadShape> shapes;
  auto meta_of = [](v1::BlockMeta m, uint64_t bytes) {
    m.set_payload_bytes(bytes);
    return m;
  };
  // Empty meta fields (only payload_bytes), one block of each size class.
  for (uint64_t bytes : std::vector<uint64_t>{1, 127, 128, 64 * kKiB - 1, 64 * kKiB, 3 * kMiB + 5}) {
    shapes.push_back({{meta_of(v1::BlockMeta(), bytes)}, {v1::TIER_PINNED_HOST}});
    shapes.push_back({{meta_of(Meta(1, /*with_summaries=*/true), bytes)}, {v1::TIER_SPILL}});
  }
  // Many blocks, small and large mixed, both tiers.
  {
    LoadShape s;
    const uint64_t sizes[] = {4 * kKiB, 200 * kKiB, 1, 64 * kKiB, 16 * kKiB, 2 * kMiB, 7};
    for (int i = 0; i < 7; ++i) {
      s.metas.push_back(meta_of(Meta(i, i % 2 == 0), sizes[i]));
      s.tiers.push_back(i % 3 == 0 ? v1::TIER_SPILL : v1::TIER_PINNED_HOST);
    }
    shapes.push_back(s);
  }
  // Many small blocks (one framing buffer, large enough to be pooled).
  {
    LoadShape s;
    for (int i = 0; i < 300; ++i) {
      s.metas.push_back(meta_of(Meta(i), 1 * kKiB));
      s.tiers.push_back(v1::TIER_PINNED_HOST);
    }
    shapes.push_back(s);
  }
  shapes.push_back({});  // No blocks.
  for (size_t k = 0; k < shapes.size(); ++k) {
    v1::LoadResponse expected;
    const std::string got = EncodeWithSink(pool, shapes[k], &expected);
    EXPECT_EQ(got, expected.SerializeAsString()) << "shape " << k;
    v1::LoadResponse parsed;
    ASSERT_TRUE(parsed.ParseFromString(got)) << "shape " << k;
    EXPECT_EQ(parsed.SerializeAsString(), expected.SerializeAsString()) << "shape " << k;
  }
}

TEST(InlineWireTest, LoadSinkRefusesOverItsBudget) {
  StringPool pool;
  InlineLoadSink sink(&pool, 1 * kMiB);
  v1::BlockMeta a = Meta(0), b = Meta(1);
  a.set_payload_bytes(600 * kKiB);
  b.set_payload_bytes(600 * kKiB);
  EXPECT_THAT(sink.Prepare({a, b}), testing::StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_OK(sink.Prepare({a}));
}

TEST(InlineWireTest, PooledBuffersComeBackWhenGrpcDropsTheSlices) {
  StringPool pool;
  v1::BlockMeta m = Meta(0);
  m.set_payload_bytes(1 * kMiB);
  for (int round = 0; round < 3; ++round) {
    InlineLoadSink sink(&pool, 1ull << 40);
    ASSERT_OK(sink.Prepare({m}));
    grpc::ByteBuffer out;
    sink.Encode({v1::TIER_PINNED_HOST}, &out);
    EXPECT_EQ(pool.counters().pooled_bytes, 0u);  // Held by the slices.
    out.Clear();
  }
  const StringPool::Counters c = pool.counters();
  EXPECT_EQ(c.takes, 3u);
  EXPECT_EQ(c.reused, 2u);
  EXPECT_GE(c.pooled_bytes, 1 * kMiB);
}

TEST(InlineWireTest, PoolIsBounded) {
  StringPool pool(StringPool::Options{2 * kMiB, 16});
  std::vector<std::unique_ptr<std::string>> taken;
  for (int i = 0; i < 4; ++i) taken.push_back(pool.Take(1 * kMiB));
  for (auto& s : taken) pool.Give(std::move(s));
  EXPECT_LE(pool.counters().pooled_bytes, 2 * kMiB);
  // Growing within a pooled string's capacity keeps its bytes' pages.
  std::unique_ptr<std::string> s = pool.Take(100);
  EXPECT_EQ(s->size(), 100u);
  EXPECT_GE(s->capacity(), 1 * kMiB);
}

// ------------------------------------------------------------ Save parsing

std::vector<v1::SaveRequest> SaveShapes() {
  std::vector<v1::SaveRequest> out;
  const uint64_t sizes[] = {1, 100, 64 * kKiB - 1, 64 * kKiB, 300 * kKiB, 2 * kMiB + 3};
  for (uint64_t n : sizes) {
    v1::SaveRequest r;
    v1::SaveBlock* b = r.add_blocks();
    *b->mutable_meta() = Meta(1);
    b->set_inline_bytes(testing::Payload(n, n));
    out.push_back(r);
  }
  {  // Many blocks of every kind, pins, durable, a lease.
    v1::SaveRequest r;
    r.set_durable(true);
    r.set_lease_id(std::string(16, 'L'));
    for (int i = 0; i < 6; ++i) {
      v1::SaveBlock* b = r.add_blocks();
      *b->mutable_meta() = Meta(i, i == 2);
      b->set_pin(i % 2 == 1);
      if (i == 3) {
        b->mutable_region()->set_region_id(9);
        b->mutable_region()->set_length(4096);
      } else if (i == 4) {
        b->mutable_gather()->add_slices()->set_length(10);
      } else {
        b->set_inline_bytes(testing::Payload(i, i == 0 ? 100 * kKiB : 3000));
      }
    }
    out.push_back(r);
  }
  {  // A block without meta, a block without payload, an empty payload.
    v1::SaveRequest r;
    r.add_blocks()->set_inline_bytes("abc");
    *r.add_blocks()->mutable_meta() = Meta(2);
    r.add_blocks()->set_inline_bytes("");
    out.push_back(r);
  }
  out.push_back(v1::SaveRequest());  // Empty.
  return out;
}

void ExpectSameParse(const std::string& wire, const std::string& label) {
  v1::SaveRequest expected;
  const bool protobuf_ok = expected.ParseFromString(wire);
  for (size_t piece : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{16384}}) {
    v1::SaveRequest got;
    inline_wire::SavePayloadViews views;
    const bool ok = inline_wire::ParseSaveRequest(Split(wire, piece), &got, &views);
    if (!ok) {
      // Declined: the caller parses with protobuf. Never a request that
      // protobuf would parse differently.
      EXPECT_EQ(got.ByteSizeLong(), 0u) << label;
      EXPECT_TRUE(views.blocks.empty()) << label;
      continue;
    }
    ASSERT_TRUE(protobuf_ok) << label << ": parsed what protobuf refuses";
    ASSERT_EQ(views.blocks.size(), static_cast<size_t>(got.blocks_size())) << label;
    inline_wire::MaterializePayloads(views.blocks, &got);
    EXPECT_EQ(got.SerializeAsString(), expected.SerializeAsString()) << label << " piece " << piece;
  }
}

TEST(InlineWireTest, SaveRequestParsesAsProtobufParsesIt) {
  int k = 0;
  for (const v1::SaveRequest& r : SaveShapes()) {
    const std::string wire = r.SerializeAsString();
    v1::SaveRequest got;
    inline_wire::SavePayloadViews views;
    ASSERT_TRUE(inline_wire::ParseSaveRequest(Split(wire, 5000), &got, &views)) << k;
    inline_wire::MaterializePayloads(views.blocks, &got);
    EXPECT_EQ(got.SerializeAsString(), wire) << k;
    ExpectSameParse(wire, absl::StrCat("shape ", k++));
  }
}

// A large payload is not copied: the parse leaves it in the received
// slices (its block keeps an empty inline_bytes) and returns views of them;
// a small one is copied into the message.
TEST(InlineWireTest, LargeSavePayloadsStayInTheReceivedSlices) {
  v1::SaveRequest r;
  v1::SaveBlock* big = r.add_blocks();
  *big->mutable_meta() = Meta(1);
  big->set_inline_bytes(testing::Payload(3, 16 * kMiB + 5));
  v1::SaveBlock* small = r.add_blocks();
  *small->mutable_meta() = Meta(2);
  small->set_inline_bytes(testing::Payload(4, inline_wire::kPooledPayloadBytes - 1));
  const std::string wire = r.SerializeAsString();
  const grpc::ByteBuffer received = Split(wire, 16384);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(received.Dump(&slices).ok());
  v1::SaveRequest got;
  inline_wire::SavePayloadViews views;
  ASSERT_TRUE(inline_wire::ParseSaveRequest(received, &got, &views));
  ASSERT_EQ(views.blocks.size(), 2u);
  EXPECT_EQ(got.blocks(0).payload_case(), v1::SaveBlock::kInlineBytes);
  EXPECT_TRUE(got.blocks(0).inline_bytes().empty());
  EXPECT_TRUE(views.blocks[1].empty());
  EXPECT_EQ(got.blocks(1).inline_bytes(), r.blocks(1).inline_bytes());
  // Every piece points into a received slice, and together they are the
  // payload.
  std::string joined;
  for (absl::string_view piece : views.blocks[0]) {
    const bool inside = std::any_of(slices.begin(), slices.end(), [&](const grpc::Slice& s) {
      const char* b = reinterpret_cast<const char*>(s.begin());
      return piece.data() >= b && piece.data() + piece.size() <= b + s.size();
    });
    EXPECT_TRUE(inside);
    joined.append(piece.data(), piece.size());
  }
  EXPECT_TRUE(joined == r.blocks(0).inline_bytes());
  EXPECT_GE(views.blocks[0].size(), 16 * kMiB / 16384);
}

TEST(InlineWireTest, SaveRequestOddEncodingsAreDeclinedOrEqual) {
  const std::string block_a = [] {
    v1::SaveBlock b;
    *b.mutable_meta() = Meta(3);
    b.set_inline_bytes(testing::Payload(1, 70 * kKiB));
    return b.SerializeAsString();
  }();
  auto field = [](int number, const std::string& value) {
    std::string out;
    inline_wire::AppendVarint(&out, (number << 3) | 2);
    inline_wire::AppendVarint(&out, value.size());
    return out + value;
  };
  std::vector<std::string> odd = {
      // lease_id before the blocks, an unknown field between them.
      field(3, std::string(16, 'x')) + field(1, block_a) + field(9, "zz") + field(1, block_a),
      // inline_bytes twice in a block (the last wins), then a region after it.
      field(1, block_a + field(2, "second")),
      field(1, block_a + field(3, "")),
      field(1, field(3, "") + block_a),
      // meta split in two (merged), pin before meta.
      field(1, std::string("\x28\x01", 2) + field(1, Meta(1).SerializeAsString()) +
                   field(2, "p") + field(1, "\x40\x05")),
      // Truncated: a block longer than the buffer, a payload longer than its block.
      block_a.substr(0, 10),
      field(1, block_a).substr(0, 40000),
      field(1, std::string("\x12\x7f", 2) + "short"),
      // A group (wire type 3) and a bad wire type.
      std::string("\x0b\x0c", 2),
      std::string("\x0f", 1),
      // A payload length whose varint runs past its block's end (found by
      // fuzz_inline_save: the remaining length underflowed, and these 12
      // bytes asked for an allocation of exabytes).
      std::string("\x0a\x06\x12\xed\xff\xff\xff\xff\xff\x7a\xed\xea", 12),
      // A tag in a 6-byte varint (value under 2^32): protobuf refuses it; the
      // parser used to re-encode it and accept (also found by the fuzzer).
      field(1, std::string("\x80\x81\x80\x80\x80\x00", 6) + "\x01"),  // Field 16, varint.
      // Lengths in 6-byte varints (values under 2^32): protobuf refuses
      // them; the parser re-encoded them and accepted (fuzz_inline_save, CI):
      // a block's, an inline payload's, and an unknown field's in a block.
      std::string("\x0a\x83\x80\x80\x80\x80\x00\x12\x01\x41", 10),
      field(1, std::string("\x12\x81\x80\x80\x80\x80\x00\x41", 8)),
      field(1, std::string("\x3a\x81\x80\x80\x80\x80\x00\x41", 8)),
      field(9, "") + std::string("\x3a\x81\x80\x80\x80\x80\x00\x41", 8),
      // The same lengths in 5-byte varints, which protobuf accepts.
      std::string("\x0a\x83\x80\x80\x80\x00\x12\x01\x41", 9),
      field(1, std::string("\x12\x81\x80\x80\x80\x00\x41", 7)),
  };
  // Unknown groups nested inside a block's meta, around protobuf's recursion
  // limit (100): the parser hands each block to protobuf on its own, one
  // level shallower than in the whole request.
  for (int depth : {96, 97, 98, 99, 100, 101}) {
    std::string groups;  // Field 20: start-group tags, then end-group tags.
    for (int i = 0; i < depth; ++i) groups += "\xa3\x01";
    for (int i = 0; i < depth; ++i) groups += "\xa4\x01";
    odd.push_back(field(1, field(1, groups)));
  }
  for (size_t i = 0; i < odd.size(); ++i) ExpectSameParse(odd[i], absl::StrCat("odd ", i));
}

// ------------------------------------------------------------ client side

TEST(InlineCallsTest, SaveEncodingIsProtobufsByteForByte) {
  int k = 0;
  for (const v1::SaveRequest& full : SaveShapes()) {
    // The request without inline payloads, and the payloads beside it.
    v1::SaveRequest bare = full;
    std::vector<std::string> owned(full.blocks_size());
    std::vector<absl::string_view> payloads(full.blocks_size());
    for (int i = 0; i < bare.blocks_size(); ++i) {
      if (bare.blocks(i).payload_case() != v1::SaveBlock::kInlineBytes) continue;
      owned[i] = bare.blocks(i).inline_bytes();
      payloads[i] = owned[i];
      bare.mutable_blocks(i)->clear_payload();
    }
    int released = 0;
    {
      std::vector<grpc::Slice> slices = InlineCalls::EncodeSaveRequest(
          bare, payloads, +[](void* n) { ++*static_cast<int*>(n); }, &released);
      grpc::ByteBuffer buffer(slices.data(), slices.size());
      // An empty payload is still sent (and refused by the daemon as before).
      v1::SaveRequest expected = bare;
      for (int i = 0; i < bare.blocks_size(); ++i) {
        if (bare.blocks(i).payload_case() == v1::SaveBlock::PAYLOAD_NOT_SET) {
          expected.mutable_blocks(i)->set_inline_bytes(owned[i]);
        }
      }
      EXPECT_EQ(Flatten(buffer), expected.SerializeAsString()) << "shape " << k;
    }
    int referenced = 0;
    for (int i = 0; i < bare.blocks_size(); ++i) {
      referenced += bare.blocks(i).payload_case() == v1::SaveBlock::PAYLOAD_NOT_SET &&
                    !payloads[i].empty();
    }
    EXPECT_EQ(released, referenced) << "shape " << k;
    ++k;
  }
}

TEST(InlineCallsTest, LoadDecodingMatchesProtobuf) {
  v1::LoadResponse r;
  for (int i = 0; i < 5; ++i) {
    v1::LoadedBlock* b = r.add_blocks();
    *b->mutable_meta() = Meta(i, i == 1);
    b->set_inline_bytes(testing::Payload(i, i == 2 ? 1 * kMiB + 1 : 100 * i + 1));
    b->set_served_from(i % 2 ? v1::TIER_SPILL : v1::TIER_PINNED_HOST);
  }
  r.add_blocks();  // Empty block: no meta, no payload.
  const std::string wire = r.SerializeAsString();
  for (size_t piece : {size_t{0}, size_t{1}, size_t{3}, size_t{16384}}) {
    std::vector<LoadedBlock> got;
    ASSERT_TRUE(InlineCalls::DecodeLoadResponse(Split(wire, piece), &got));
    ASSERT_EQ(got.size(), static_cast<size_t>(r.blocks_size()));
    for (int i = 0; i < r.blocks_size(); ++i) {
      EXPECT_EQ(got[i].meta.SerializeAsString(), r.blocks(i).meta().SerializeAsString());
      EXPECT_EQ(got[i].payload, r.blocks(i).inline_bytes());
      EXPECT_EQ(got[i].served_from, r.blocks(i).served_from());
    }
  }
  std::vector<LoadedBlock> got;
  EXPECT_FALSE(InlineCalls::DecodeLoadResponse(Split(wire.substr(0, wire.size() - 3), 0), &got));
  EXPECT_TRUE(got.empty());
  // A block's length in 5 bytes (protobuf takes it) and in 6 (it refuses).
  for (const std::string& odd : {std::string("\x0a\x82\x80\x80\x80\x00\x28\x03", 8),
                                 std::string("\x0a\x82\x80\x80\x80\x80\x00\x28\x03", 9)}) {
    v1::LoadResponse expected;
    const bool protobuf_ok = expected.ParseFromString(odd);
    EXPECT_EQ(protobuf_ok, odd.size() == 8);
    got.clear();
    EXPECT_EQ(InlineCalls::DecodeLoadResponse(Split(odd, 0), &got), protobuf_ok) << odd.size();
    EXPECT_EQ(got.size(), protobuf_ok ? 1u : 0u);
  }
}

// ------------------------------------------------------------ the service

class InlineServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PinnedArenaOptions arena_options;
    arena_options.capacity_bytes = 64 * kMiB;
    arena_options.lock_memory = false;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PinnedArena> arena, PinnedArena::Create(arena_options));
    arena_ = arena.get();
    TierManagerOptions tier_options;
    tier_options.max_wait_for_room = absl::Milliseconds(300);
    ASSERT_OK_AND_ASSIGN(tiers_, TierManager::Open(tier_options, std::move(arena), disk_.Share()));
    leases_ = std::make_unique<LeaseManager>(LeaseManagerOptions(), tiers_.get());
    copiers_ = std::make_unique<DeviceCopiers>(&gpus_);
    executor_ = std::make_unique<Executor>(2);
    KvTierServiceOptions options;
    options.max_message_bytes = 40 * kMiB;
    service_ = std::make_unique<KvTierService>(tiers_.get(), executor_.get(), leases_.get(),
                                               copiers_.get(), &recovery_, options);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    builder.SetMaxReceiveMessageSize(40 * kMiB);
    builder.SetMaxSendMessageSize(40 * kMiB);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(40 * kMiB);
    args.SetMaxSendMessageSize(40 * kMiB);
    channel_ = server_->InProcessChannel(args);
    stub_ = v1::KvTier::NewStub(channel_);
    calls_ = std::make_unique<InlineCalls>(channel_);
  }
  void TearDown() override {
    stub_.reset();
    calls_.reset();
    if (service_ != nullptr) service_->CloseLeases();
    if (server_ != nullptr) server_->Shutdown();
    server_.reset();
    service_.reset();
    executor_.reset();
  }

  grpc::Status SaveInline(const std::vector<v1::BlockMeta>& metas,
                          const std::vector<std::string>& payloads) {
    v1::SaveRequest request;
    std::vector<absl::string_view> views;
    for (size_t i = 0; i < metas.size(); ++i) {
      *request.add_blocks()->mutable_meta() = metas[i];
      views.push_back(payloads[i]);
    }
    grpc::ClientContext context;
    v1::SaveResponse response;
    return calls_->Save(&context, request, views, &response);
  }
  v1::LoadRequest LoadRequestFor(const std::vector<v1::BlockMeta>& metas) {
    v1::LoadRequest request;
    for (const v1::BlockMeta& m : metas) request.add_ids(m.id());
    *request.mutable_fingerprint() = metas[0].fingerprint();
    return request;
  }

  testing::MemoryTier disk_;
  testing::HostDevices gpus_{1};
  RecoveryIndex recovery_;
  PinnedArena* arena_ = nullptr;
  std::unique_ptr<TierManager> tiers_;
  std::unique_ptr<LeaseManager> leases_;
  std::unique_ptr<DeviceCopiers> copiers_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<KvTierService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KvTier::Stub> stub_;
  std::unique_ptr<InlineCalls> calls_;
};

TEST_F(InlineServiceTest, RawAndStubPathsAnswerTheSame) {
  std::vector<v1::BlockMeta> metas;
  std::vector<std::string> payloads;
  const uint64_t sizes[] = {4 * kKiB, 1 * kMiB, 100 * kKiB, 16 * kMiB};
  for (int i = 0; i < 4; ++i) {
    metas.push_back(Meta(i));
    metas.back().clear_checksum();
    payloads.push_back(testing::Payload(i, sizes[i]));
  }
  ASSERT_TRUE(SaveInline(metas, payloads).ok());
  for (int round = 0; round < 2; ++round) {  // The second from pooled buffers.
    grpc::ClientContext c1, c2;
    v1::LoadResponse via_stub;
    ASSERT_TRUE(stub_->Load(&c1, LoadRequestFor(metas), &via_stub).ok());
    std::vector<LoadedBlock> via_calls;
    ASSERT_TRUE(calls_->Load(&c2, LoadRequestFor(metas), &via_calls).ok());
    ASSERT_EQ(via_stub.blocks_size(), 4);
    ASSERT_EQ(via_calls.size(), 4u);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(via_stub.blocks(i).inline_bytes(), payloads[i]);
      EXPECT_EQ(via_calls[i].payload, payloads[i]);
      EXPECT_EQ(via_stub.blocks(i).meta().SerializeAsString(),
                via_calls[i].meta.SerializeAsString());
      EXPECT_EQ(via_calls[i].meta.checksum(), PayloadChecksum(payloads[i].data(), sizes[i]));
      EXPECT_EQ(via_calls[i].served_from, v1::TIER_PINNED_HOST);
    }
  }
}

TEST_F(InlineServiceTest, CorruptTier1BytesAreDataLossOnTheInlinePath) {
  const v1::BlockMeta meta = [] {
    v1::BlockMeta m = Meta(5);
    m.clear_checksum();
    return m;
  }();
  const std::string payload = testing::Payload(5, 2 * kMiB);
  ASSERT_TRUE(SaveInline({meta}, {payload}).ok());
  // Flip every byte of tier 1: the only copy is bad (no disk copy).
  for (uint64_t i = 0; i < arena_->capacity_bytes(); ++i) arena_->base()[i] ^= 0x5a;
  grpc::ClientContext context;
  std::vector<LoadedBlock> got;
  const grpc::Status s = calls_->Load(&context, LoadRequestFor({meta}), &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << s.error_message();
  EXPECT_TRUE(got.empty());
}

TEST_F(InlineServiceTest, RawSaveKeepsValidationAndChecksums) {
  v1::BlockMeta meta = Meta(6);
  meta.set_checksum(12345);  // Not the payload's.
  const std::string payload = testing::Payload(6, 256 * kKiB);
  grpc::Status s = SaveInline({meta}, {payload});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << s.error_message();
  EXPECT_NE(s.error_message().find("blocks[0].meta.checksum"), std::string::npos)
      << s.error_message();
  // An empty inline payload: INVALID_ARGUMENT naming the block.
  meta.clear_checksum();
  s = SaveInline({meta}, {std::string()});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("blocks[0]"), std::string::npos) << s.error_message();
  // Garbage bytes: what the generated handler answered (UNIMPLEMENTED). The
  // second is a payload length whose varint runs past its block: it used to
  // make the parser allocate exabytes (std::bad_alloc, the daemon gone).
  grpc::GenericStub generic(channel_);
  for (const std::string& junk : {std::string("\x0a\xff\xff\xff\xff\x0f"),
                                 std::string("\x0a\x06\x12\xed\xff\xff\xff\xff\xff\x7a\xed\xea",
                                             12)}) {
    grpc::Slice slice(junk.data(), junk.size());
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext context;
    grpc::Status result;
    absl::Notification done;
    generic.UnaryCall(&context, "/evoke.v1.KvTier/Save", grpc::StubOptions(), &request,
                      &response, [&](grpc::Status st) {
                        result = st;
                        done.Notify();
                      });
    done.WaitForNotification();
    EXPECT_EQ(result.error_code(), grpc::StatusCode::UNIMPLEMENTED) << result.error_message();
  }
  // And the service still saves.
  meta.set_checksum(PayloadChecksum(payload.data(), payload.size()));
  EXPECT_TRUE(SaveInline({meta}, {payload}).ok());
}

TEST_F(InlineServiceTest, LoadOverTheResponseLimitIsResourceExhausted) {
  std::vector<v1::BlockMeta> metas;
  std::vector<std::string> payloads;
  for (int i = 0; i < 3; ++i) {
    metas.push_back(Meta(10 + i));
    metas.back().clear_checksum();
    payloads.push_back(testing::Payload(i, 16 * kMiB));
  }
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(SaveInline({metas[i]}, {payloads[i]}).ok());
  grpc::ClientContext context;
  std::vector<LoadedBlock> got;
  const grpc::Status s = calls_->Load(&context, LoadRequestFor(metas), &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("--max-message-bytes"), std::string::npos) << s.error_message();
}

}  // namespace
}  // namespace evoke
