// The real KvTierService in this process, over gRPC's in-process channel:
// the real TierManager on a MemoryTier (testing/memory_tier.h) and fake GPUs
// in host memory (testing/host_device_copier.h), so that the service's CUDA
// save and load paths and the tier's failures are exercised without a GPU,
// a disk or a daemon process. Label: unit (it starts no process).
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/block_validation.h"
#include "common/chain_hash.h"
#include "common/checksum.h"
#include "common/fingerprint.h"
#include "common/rope.h"
#include "daemon/executor.h"
#include "daemon/kvtier_service.h"
#include "daemon/lease_manager.h"
#include "daemon/payload_paths.h"
#include "daemon/region.h"
#include "evoke/v1/kvtier.grpc.pb.h"
#include "gmock/gmock.h"
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

using ::evoke::testing::DeviceOp;
using ::evoke::testing::HostDevices;
using ::evoke::testing::MemoryTier;
using ::evoke::testing::StatusIs;
using ::evoke::testing::TierOp;
using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint32_t kTokens = 16;

// 4 layers, 2 KV heads, head_dim 64, f16 K and V, NEOX RoPE: 2 KiB a token,
// 32 KiB a block of kTokens.
v1::LayoutFingerprint Fingerprint() { return evoke::testing::SmallFingerprint(); }
const uint64_t kBlockBytes = CanonicalPayloadBytes(Fingerprint(), kTokens, 4).value();

v1::BlockMeta SessionMeta(uint64_t seq) {
  v1::BlockMeta m;
  *m.mutable_fingerprint() = Fingerprint();
  m.set_kind(v1::BLOCK_KIND_SESSION);
  m.set_session_id("s");
  m.set_sequence(seq);
  m.set_id(SessionBlockId("test", "s", seq).ToBytes());
  m.set_n_tokens(kTokens);
  m.set_layer_begin(0);
  m.set_layer_end(4);
  m.set_first_position(static_cast<int32_t>(seq * kTokens));
  return m;
}

v1::BlockMeta PrefixMeta(int32_t first_token) {
  std::vector<int32_t> tokens(kTokens);
  for (uint32_t t = 0; t < kTokens; ++t) tokens[t] = first_token + static_cast<int32_t>(t);
  v1::BlockMeta m;
  *m.mutable_fingerprint() = Fingerprint();
  m.set_kind(v1::BLOCK_KIND_PREFIX);
  m.mutable_tokens()->Add(tokens.begin(), tokens.end());
  m.set_id(PrefixBlockId(BlockId(), tokens, DigestFingerprint(Fingerprint())).ToBytes());
  m.set_n_tokens(kTokens);
  m.set_layer_begin(0);
  m.set_layer_end(4);
  m.set_first_position(0);
  return m;
}

BlockId IdOf(const v1::BlockMeta& meta) { return BlockId::FromBytes(meta.id()).value(); }

// Small finite f16 values (exponent below 15), so that RoPE stays finite.
std::string Payload(uint64_t seed) {
  std::string s(kBlockBytes, '\0');
  uint64_t x = 0x9e3779b97f4a7c15ULL ^ (seed * 0xbf58476d1ce4e5b9ULL);
  for (uint64_t i = 0; i < s.size(); i += 2) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const uint16_t h = static_cast<uint16_t>((x & 0x83ff) | 0x3400);  // |v| in [0.25, 0.5)
    std::memcpy(&s[i], &h, 2);
  }
  return s;
}

// A CUDA region whose device memory is a HostDevices allocation, opened by
// its IPC handle as the daemon opens a client's.
class FakeCudaRegion final : public Region {
 public:
  FakeCudaRegion(uint8_t* ptr, int device, uint64_t size)
      : ptr_(ptr), device_(device), size_(size) {}
  Kind kind() const override { return Kind::kCuda; }
  uint64_t size() const override { return size_; }
  void* device_ptr() const override { return ptr_; }
  int device() const override { return device_; }

 private:
  uint8_t* ptr_;
  int device_;
  uint64_t size_;
};

// A shared-memory region stand-in: host memory of this process.
class FakeHostRegion final : public Region {
 public:
  explicit FakeHostRegion(uint64_t size) : bytes_(new uint8_t[size]()), size_(size) {}
  Kind kind() const override { return Kind::kSharedMemory; }
  uint64_t size() const override { return size_; }
  uint8_t* host_data() const override { return bytes_.get(); }

 private:
  std::unique_ptr<uint8_t[]> bytes_;
  uint64_t size_;
};

class KvTierServiceInProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PinnedArenaOptions arena_options;
    arena_options.capacity_bytes = 8 * kMiB;
    arena_options.lock_memory = false;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PinnedArena> arena,
                         PinnedArena::Create(arena_options));
    arena_ = arena.get();
    TierManagerOptions tier_options;
    tier_options.max_wait_for_room = absl::Milliseconds(300);
    ASSERT_OK_AND_ASSIGN(tiers_,
                         TierManager::Open(tier_options, std::move(arena), disk_.Share()));
    leases_ = std::make_unique<LeaseManager>(LeaseManagerOptions(), tiers_.get());
    copiers_ = std::make_unique<DeviceCopiers>(&gpus_);
    executor_ = std::make_unique<Executor>(2);
    KvTierServiceOptions options;
    options.version = "in-process";
    options.data_dir = "(memory)";
    service_ = std::make_unique<KvTierService>(tiers_.get(), executor_.get(), leases_.get(),
                                               copiers_.get(), &recovery_, options);
    grpc::ServerBuilder builder;  // No listening port: in-process only.
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::KvTier::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }

  void TearDown() override {
    if (lease_reader_ != nullptr) lease_context_.TryCancel();
    if (service_ != nullptr) service_->CloseLeases();
    if (lease_reader_ != nullptr) lease_reader_->Finish().ok();
    lease_reader_.reset();
    stub_.reset();
    if (server_ != nullptr) server_->Shutdown();
    server_.reset();
    service_.reset();
    executor_.reset();  // Runs what is queued, before what it uses goes.
  }

  // OpenLease opens a lease over the stream, as a client does, and keeps it.
  void OpenLease() {
    v1::OpenLeaseRequest request;
    request.set_client_name("in-process");
    lease_reader_ = stub_->OpenLease(&lease_context_, request);
    v1::LeaseEvent event;
    ASSERT_TRUE(lease_reader_->Read(&event));
    ASSERT_TRUE(event.has_grant());
    lease_id_ = event.grant().lease_id();
    ASSERT_OK_AND_ASSIGN(lease_, leases_->Find(lease_id_));
  }

  // AddCudaRegion registers `alloc` (opened by its IPC handle) under the
  // lease and returns the region id.
  uint64_t AddCudaRegion(const HostDevices::Allocation& alloc) {
    absl::StatusOr<uint8_t*> ptr = gpus_.OpenIpc(alloc.ipc_handle, alloc.device, alloc.bytes);
    EXPECT_TRUE(ptr.ok()) << ptr.status();
    absl::StatusOr<uint64_t> id = leases_->AddRegion(
        lease_.id, std::make_shared<FakeCudaRegion>(*ptr, alloc.device, alloc.bytes));
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or(0);
  }

  // AddHostRegion registers `size` bytes of host memory under the lease and
  // returns the region id and its bytes.
  std::pair<uint64_t, uint8_t*> AddHostRegion(uint64_t size) {
    auto region = std::make_shared<FakeHostRegion>(size);
    uint8_t* data = region->host_data();
    absl::StatusOr<uint64_t> id = leases_->AddRegion(lease_.id, std::move(region));
    EXPECT_TRUE(id.ok()) << id.status();
    return {id.value_or(0), data};
  }

  grpc::Status Save(const std::vector<v1::BlockMeta>& metas,
                    const std::vector<std::string>& payloads, v1::SaveResponse* response,
                    bool durable = false) {
    v1::SaveRequest request;
    for (size_t i = 0; i < metas.size(); ++i) {
      v1::SaveBlock* b = request.add_blocks();
      *b->mutable_meta() = metas[i];
      b->set_inline_bytes(payloads[i]);
    }
    request.set_durable(durable);
    grpc::ClientContext context;
    return stub_->Save(&context, request, response);
  }

  grpc::Status Load(const std::vector<BlockId>& ids, v1::LoadResponse* response) {
    v1::LoadRequest request;
    for (const BlockId& id : ids) request.add_ids(id.ToBytes());
    *request.mutable_fingerprint() = Fingerprint();
    grpc::ClientContext context;
    return stub_->Load(&context, request, response);
  }

  grpc::Status Describe(const BlockId& id, v1::BlockInfo* info) {
    v1::DescribeRequest request;
    request.set_id(id.ToBytes());
    grpc::ClientContext context;
    return stub_->Describe(&context, request, info);
  }

  v1::StatResponse Stat() {
    grpc::ClientContext context;
    v1::StatResponse response;
    const grpc::Status s = stub_->Stat(&context, v1::StatRequest(), &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response;
  }

  grpc::Status Flush(bool evict, v1::FlushResponse* response) {
    v1::FlushRequest request;
    request.set_evict(evict);
    grpc::ClientContext context;
    return stub_->Flush(&context, request, response);
  }

  // CorruptTier1 flips one bit of the tier-1 copy of `payload` (found by
  // its bytes in the arena): bad memory under a block the daemon holds.
  void CorruptTier1(const std::string& payload) {
    uint8_t* begin = arena_->base();
    uint8_t* end = begin + arena_->capacity_bytes();
    uint8_t* at = std::search(begin, end, payload.begin(), payload.end(),
                              [](uint8_t a, char b) { return a == static_cast<uint8_t>(b); });
    ASSERT_NE(at, end) << "the payload is not in tier 1";
    at[payload.size() / 2] ^= 1;
  }

  MemoryTier disk_;
  HostDevices gpus_{2};
  PinnedArena* arena_ = nullptr;  // Owned by tiers_.
  RecoveryIndex recovery_;
  std::unique_ptr<TierManager> tiers_;
  std::unique_ptr<LeaseManager> leases_;
  std::unique_ptr<DeviceCopiers> copiers_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<KvTierService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::KvTier::Stub> stub_;
  grpc::ClientContext lease_context_;
  std::unique_ptr<grpc::ClientReader<v1::LeaseEvent>> lease_reader_;
  std::string lease_id_;
  Lease lease_;
};

::testing::AssertionResult GrpcOk(const grpc::Status& s) {
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "gRPC status " << s.error_code() << ": " << s.error_message();
}

MATCHER_P2(GrpcIs, code, substring, "") {
  *result_listener << "gRPC status " << arg.error_code() << ": " << arg.error_message();
  return arg.error_code() == code && arg.error_message().find(substring) != std::string::npos;
}

TEST_F(KvTierServiceInProcessTest, InlineRoundTrips) {
  std::vector<v1::BlockMeta> metas = {SessionMeta(0), SessionMeta(1), PrefixMeta(100)};
  std::vector<std::string> payloads = {Payload(0), Payload(1), Payload(2)};
  v1::SaveResponse saved;
  ASSERT_TRUE(GrpcOk(Save(metas, payloads, &saved)));
  ASSERT_EQ(saved.results_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(saved.results(i).checksum(),
              PayloadChecksum(payloads[i].data(), payloads[i].size()));
    EXPECT_EQ(saved.results(i).tier(), v1::TIER_PINNED_HOST);
    EXPECT_FALSE(saved.results(i).deduplicated());
  }
  // Saving the same bytes again is deduplicated.
  ASSERT_TRUE(GrpcOk(Save({metas[0]}, {payloads[0]}, &saved)));
  EXPECT_TRUE(saved.results(0).deduplicated());

  const std::vector<BlockId> ids = {IdOf(metas[0]), IdOf(metas[1]),
                                    IdOf(metas[2])};
  v1::LoadResponse loaded;
  ASSERT_TRUE(GrpcOk(Load(ids, &loaded)));
  ASSERT_EQ(loaded.blocks_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(loaded.blocks(i).inline_bytes(), payloads[i]) << i;
    EXPECT_EQ(loaded.blocks(i).served_from(), v1::TIER_PINNED_HOST);
    EXPECT_EQ(loaded.blocks(i).meta().payload_bytes(), kBlockBytes);
  }

  // Lookup: the longest present run.
  v1::LookupRequest lookup;
  lookup.add_ids(ids[0].ToBytes());
  lookup.add_ids(ids[1].ToBytes());
  lookup.add_ids(BlockId(9, 9).ToBytes());
  lookup.add_ids(ids[2].ToBytes());
  v1::LookupResponse present;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(GrpcOk(stub_->Lookup(&context, lookup, &present)));
  }
  EXPECT_EQ(present.n_present(), 2u);
  ASSERT_EQ(present.tiers_size(), 2);
  EXPECT_EQ(present.tiers(0), v1::TIER_PINNED_HOST);

  v1::BlockInfo info;
  ASSERT_TRUE(GrpcOk(Describe(ids[1], &info)));
  EXPECT_EQ(info.meta().session_id(), "s");
  EXPECT_EQ(info.tier(), v1::TIER_PINNED_HOST);
  EXPECT_TRUE(info.bytes_available());
  EXPECT_FALSE(info.on_disk());

  // List: a session's blocks, in pages.
  v1::ListRequest list;
  list.set_namespace_("test");
  list.set_session_id("s");
  list.set_page_size(1);
  v1::ListResponse page;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(GrpcOk(stub_->List(&context, list, &page)));
  }
  ASSERT_EQ(page.blocks_size(), 1);
  EXPECT_FALSE(page.next_page_token().empty());
  list.set_page_token(page.next_page_token());
  v1::ListResponse rest;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(GrpcOk(stub_->List(&context, list, &rest)));
  }
  ASSERT_EQ(rest.blocks_size(), 1);
  EXPECT_TRUE(rest.next_page_token().empty());
  EXPECT_NE(page.blocks(0).meta().id(), rest.blocks(0).meta().id());

  v1::StatResponse stat = Stat();
  EXPECT_EQ(stat.version(), "in-process");
  EXPECT_EQ(stat.pinned().blocks(), 3u);
  EXPECT_EQ(stat.pinned().payload_bytes(), 3 * kBlockBytes);
  EXPECT_EQ(stat.counters().dedups(), 1u);

  // Flush puts every block in the tier below; Delete removes it there too.
  v1::FlushResponse flushed;
  ASSERT_TRUE(GrpcOk(Flush(/*evict=*/true, &flushed)));
  EXPECT_EQ(flushed.blocks_written(), 3u);
  EXPECT_EQ(flushed.blocks_evicted(), 3u);
  EXPECT_TRUE(disk_.HasPayload(ids[0]));
  ASSERT_TRUE(GrpcOk(Load({ids[0]}, &loaded)));
  EXPECT_EQ(loaded.blocks(0).served_from(), v1::TIER_SPILL);
  EXPECT_EQ(loaded.blocks(0).inline_bytes(), payloads[0]);

  v1::DeleteRequest del;
  del.add_ids(ids[0].ToBytes());
  v1::DeleteResponse deleted;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(GrpcOk(stub_->Delete(&context, del, &deleted)));
  }
  EXPECT_EQ(deleted.n_deleted(), 1u);
  EXPECT_FALSE(disk_.HasRecord(ids[0]));
  EXPECT_THAT(Describe(ids[0], &info), GrpcIs(grpc::StatusCode::NOT_FOUND, ""));
}

TEST_F(KvTierServiceInProcessTest, BadInputAndMissingBlocks) {
  v1::SaveResponse saved;
  // A payload of the wrong length for the canonical shape.
  EXPECT_THAT(Save({SessionMeta(0)}, {std::string(100, 'x')}, &saved),
              GrpcIs(grpc::StatusCode::INVALID_ARGUMENT, "blocks[0]"));
  v1::BlockMeta no_tokens = SessionMeta(1);
  no_tokens.set_n_tokens(0);
  EXPECT_THAT(Save({SessionMeta(0), no_tokens}, {Payload(0), Payload(1)}, &saved),
              GrpcIs(grpc::StatusCode::INVALID_ARGUMENT, "blocks[1].meta.n_tokens"));
  // All-or-nothing: the valid first block was not stored.
  v1::BlockInfo info;
  EXPECT_THAT(Describe(IdOf(SessionMeta(0)), &info),
              GrpcIs(grpc::StatusCode::NOT_FOUND, ""));

  {
    v1::DescribeRequest request;
    request.set_id("short");
    grpc::ClientContext context;
    EXPECT_THAT(stub_->Describe(&context, request, &info),
                GrpcIs(grpc::StatusCode::INVALID_ARGUMENT, "id:"));
  }
  {
    v1::LoadRequest request;
    request.add_ids("abc");
    *request.mutable_fingerprint() = Fingerprint();
    v1::LoadResponse response;
    grpc::ClientContext context;
    EXPECT_THAT(stub_->Load(&context, request, &response),
                GrpcIs(grpc::StatusCode::INVALID_ARGUMENT, "ids[0]"));
  }
  {
    v1::ListRequest request;
    request.set_page_size(5000);
    v1::ListResponse response;
    grpc::ClientContext context;
    EXPECT_THAT(stub_->List(&context, request, &response),
                GrpcIs(grpc::StatusCode::INVALID_ARGUMENT, "page_size"));
  }
  {
    // A region slice without a lease.
    v1::SaveRequest request;
    v1::SaveBlock* b = request.add_blocks();
    *b->mutable_meta() = SessionMeta(0);
    b->mutable_region()->set_region_id(1);
    b->mutable_region()->set_length(kBlockBytes);
    v1::SaveResponse response;
    grpc::ClientContext context;
    EXPECT_THAT(stub_->Save(&context, request, &response),
                GrpcIs(grpc::StatusCode::INVALID_ARGUMENT, "lease_id"));
  }
  v1::LoadResponse loaded;
  EXPECT_THAT(Load({BlockId(1, 2)}, &loaded), GrpcIs(grpc::StatusCode::NOT_FOUND, ""));
  v1::DeleteRequest del;
  del.add_ids(BlockId(1, 2).ToBytes());
  v1::DeleteResponse deleted;
  grpc::ClientContext context;
  EXPECT_THAT(stub_->Delete(&context, del, &deleted),
              GrpcIs(grpc::StatusCode::NOT_FOUND, "ids[0]"));
  // Still serving.
  EXPECT_TRUE(GrpcOk(Save({SessionMeta(0)}, {Payload(0)}, &saved)));
}

TEST_F(KvTierServiceInProcessTest, CudaSlicesSaveAndLoadWithReanchorOnTheDevice) {
  ASSERT_NO_FATAL_FAILURE(OpenLease());
  // The engine's KV in device 1: three session blocks and a prefix block,
  // back to back.
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation src, gpus_.Allocate(1, 4 * kBlockBytes));
  std::vector<v1::BlockMeta> metas = {SessionMeta(0), SessionMeta(1), SessionMeta(2),
                                      PrefixMeta(7)};
  std::vector<std::string> payloads;
  for (int i = 0; i < 4; ++i) {
    payloads.push_back(Payload(10 + i));
    std::memcpy(src.ptr + i * kBlockBytes, payloads[i].data(), kBlockBytes);
  }
  const uint64_t src_region = AddCudaRegion(src);

  v1::SaveRequest save;
  save.set_lease_id(lease_id_);
  for (int i = 0; i < 4; ++i) {
    v1::SaveBlock* b = save.add_blocks();
    *b->mutable_meta() = metas[i];
    b->mutable_region()->set_region_id(src_region);
    b->mutable_region()->set_offset(i * kBlockBytes);
    b->mutable_region()->set_length(kBlockBytes);
  }
  v1::SaveResponse saved;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(GrpcOk(stub_->Save(&context, save, &saved)));
  }
  ASSERT_EQ(saved.results_size(), 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(saved.results(i).checksum(),
              PayloadChecksum(payloads[i].data(), payloads[i].size()))
        << i;
  }
  HostDevices::Counters c = gpus_.counters();
  // One FetchBlocks (one plan): the copies to the host coalesced (adjacent
  // slices into adjacent tier-1 extents) and, in the same plan, the session
  // blocks hashed on the device beside the copies (one checksum launch, no
  // separate ChunkChecksums call); the prefix block from tier 1's copy.
  EXPECT_EQ(c.calls_of(DeviceOp::kFetchBlocks), 1u);
  EXPECT_EQ(c.calls_of(DeviceOp::kDeviceToHost), 0u);
  EXPECT_EQ(c.calls_of(DeviceOp::kChecksums), 0u);
  EXPECT_EQ(c.plans, 1u);
  EXPECT_EQ(c.copy_ops, 4u);
  EXPECT_EQ(c.copies, 1u);
  EXPECT_EQ(c.bytes_to_host, 4 * kBlockBytes);
  EXPECT_EQ(c.checksum_ranges, 3u);
  EXPECT_EQ(c.checksum_steps, 1u);

  // Load three of them into device 0, re-anchoring the second to position
  // 1000 on the device.
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation dst, gpus_.Allocate(0, 3 * kBlockBytes));
  const uint64_t dst_region = AddCudaRegion(dst);
  gpus_.ResetCounters();
  v1::LoadRequest load;
  load.set_lease_id(lease_id_);
  *load.mutable_fingerprint() = Fingerprint();
  for (int i = 0; i < 3; ++i) {
    load.add_ids(metas[i].id());
    v1::RegionSlice* d = load.add_destinations();
    d->set_region_id(dst_region);
    d->set_offset(i * kBlockBytes);
    d->set_length(kBlockBytes);
    v1::Reanchor* r = load.add_reanchor();
    if (i == 1) r->set_first_position(1000);
  }
  v1::LoadResponse loaded;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(GrpcOk(stub_->Load(&context, load, &loaded)));
  }
  ASSERT_EQ(loaded.blocks_size(), 3);
  EXPECT_EQ(loaded.blocks(0).meta().first_position(), 0);
  EXPECT_EQ(loaded.blocks(1).meta().first_position(), 1000);
  EXPECT_EQ(loaded.blocks(1).inline_bytes(), "");
  EXPECT_EQ(std::memcmp(dst.ptr, payloads[0].data(), kBlockBytes), 0);
  EXPECT_EQ(std::memcmp(dst.ptr + 2 * kBlockBytes, payloads[2].data(), kBlockBytes), 0);
  // The re-anchored block is what the CPU reference makes of the original.
  ASSERT_OK_AND_ASSIGN(const RopePlan plan, MakeRopePlan(Fingerprint()));
  std::string expect = payloads[1];
  std::vector<int64_t> delta(kTokens);
  for (uint32_t t = 0; t < kTokens; ++t) delta[t] = 1000 - static_cast<int64_t>(kTokens);
  ASSERT_OK(ReanchorCanonicalBlock(plan, metas[1], reinterpret_cast<uint8_t*>(expect.data()),
                                   expect.size(), delta));
  ASSERT_NE(expect, payloads[1]);
  EXPECT_EQ(std::memcmp(dst.ptr + kBlockBytes, expect.data(), kBlockBytes), 0);
  c = gpus_.counters();
  // One LandBlocks (one plan): copied, verified where they landed and the
  // second block re-anchored in place, pipelined; no separate copy,
  // checksum or re-anchor calls.
  EXPECT_EQ(c.calls_of(DeviceOp::kLandBlocks), 1u);
  EXPECT_EQ(c.calls_of(DeviceOp::kHostToDevice), 0u);
  EXPECT_EQ(c.calls_of(DeviceOp::kChecksums), 0u);
  EXPECT_EQ(c.calls_of(DeviceOp::kReanchor), 0u);
  EXPECT_EQ(c.plans, 1u);
  EXPECT_EQ(c.bytes_to_device, 3 * kBlockBytes);
  EXPECT_EQ(c.checksum_ranges, 3u);  // Verified where they landed.
  EXPECT_EQ(c.reanchor_jobs, 1u);
  EXPECT_EQ(c.reanchor_steps, 1u);
  // Device 0 opened on first use; device 1 (the save) was opened before.
  EXPECT_EQ(c.calls_of(DeviceOp::kOpen), 1u);

  // A slice outside its region, a region that is not the lease's.
  v1::SaveRequest bad = save;
  bad.mutable_blocks(2)->mutable_region()->set_offset(4 * kBlockBytes - 8);
  {
    grpc::ClientContext context;
    EXPECT_THAT(stub_->Save(&context, bad, &saved),
                GrpcIs(grpc::StatusCode::INVALID_ARGUMENT, "blocks[2].region"));
  }
  bad = save;
  bad.mutable_blocks(1)->mutable_region()->set_region_id(999);
  {
    grpc::ClientContext context;
    EXPECT_THAT(stub_->Save(&context, bad, &saved),
                GrpcIs(grpc::StatusCode::NOT_FOUND, "blocks[1].region.region_id"));
  }
  // The daemon's own RegisterCudaRegion has no real driver to open a handle
  // with here (no CUDA build or no GPU; a real driver rejects a fake handle).
  v1::RegisterCudaRegionRequest reg;
  reg.set_lease_id(lease_id_);
  reg.set_ipc_handle(src.ipc_handle);
  reg.set_size(src.bytes);
  v1::RegisterRegionResponse reg_response;
  grpc::ClientContext context;
  const grpc::Status reg_status = stub_->RegisterCudaRegion(&context, reg, &reg_response);
  EXPECT_TRUE(reg_status.error_code() == grpc::StatusCode::UNAVAILABLE ||
              reg_status.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
      << reg_status.error_message();
}

TEST_F(KvTierServiceInProcessTest, DeviceFailuresAreReportedAndNothingIsStored) {
  ASSERT_NO_FATAL_FAILURE(OpenLease());
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation src, gpus_.Allocate(0, kBlockBytes));
  const std::string payload = Payload(3);
  std::memcpy(src.ptr, payload.data(), kBlockBytes);
  const uint64_t region = AddCudaRegion(src);
  v1::SaveRequest save;
  save.set_lease_id(lease_id_);
  v1::SaveBlock* b = save.add_blocks();
  *b->mutable_meta() = SessionMeta(0);
  b->mutable_region()->set_region_id(region);
  b->mutable_region()->set_length(kBlockBytes);
  v1::SaveResponse saved;

  gpus_.FailNext(DeviceOp::kFetchBlocks, 1,
                 absl::UnavailableError("injected: cudaErrorDevicesUnavailable"));
  {
    grpc::ClientContext context;
    EXPECT_THAT(stub_->Save(&context, save, &saved),
                GrpcIs(grpc::StatusCode::UNAVAILABLE, "injected"));
  }
  v1::BlockInfo info;
  EXPECT_THAT(Describe(IdOf(SessionMeta(0)), &info),
              GrpcIs(grpc::StatusCode::NOT_FOUND, ""));
  EXPECT_EQ(Stat().pinned().used_bytes(), 0u);
  {
    grpc::ClientContext context;
    ASSERT_TRUE(GrpcOk(stub_->Save(&context, save, &saved)));
  }

  // A transfer that goes bad on the way to the device is caught where it
  // lands: DATA_LOSS, and the good tier-1 copy keeps serving.
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation dst, gpus_.Allocate(0, kBlockBytes));
  const uint64_t dst_region = AddCudaRegion(dst);
  v1::LoadRequest load;
  load.set_lease_id(lease_id_);
  *load.mutable_fingerprint() = Fingerprint();
  load.add_ids(SessionMeta(0).id());
  v1::RegionSlice* d = load.add_destinations();
  d->set_region_id(dst_region);
  d->set_length(kBlockBytes);
  gpus_.CorruptNextHostToDevice(1);
  v1::LoadResponse loaded;
  {
    grpc::ClientContext context;
    EXPECT_THAT(stub_->Load(&context, load, &loaded),
                GrpcIs(grpc::StatusCode::DATA_LOSS, "the copy on the GPU fails its checksum"));
  }
  EXPECT_EQ(gpus_.counters().calls_of(DeviceOp::kLandBlocks), 1u);
  EXPECT_EQ(Stat().counters().checksum_failures(), 0u);  // Tier 1 was good: kept.
  // A device that fails the landing: reported, nothing quarantined.
  gpus_.FailNext(DeviceOp::kLandBlocks, 1, absl::UnavailableError("injected: device lost"));
  {
    grpc::ClientContext context;
    EXPECT_THAT(stub_->Load(&context, load, &loaded),
                GrpcIs(grpc::StatusCode::UNAVAILABLE, "injected"));
  }
  {
    grpc::ClientContext context;
    ASSERT_TRUE(GrpcOk(stub_->Load(&context, load, &loaded)));
  }
  EXPECT_EQ(loaded.blocks(0).served_from(), v1::TIER_PINNED_HOST);
  EXPECT_EQ(std::memcmp(dst.ptr, payload.data(), kBlockBytes), 0);
  EXPECT_EQ(Stat().counters().checksum_failures(), 0u);
}

TEST_F(KvTierServiceInProcessTest, TierFailuresAreReportedAndTheServiceKeepsServing) {
  std::vector<v1::BlockMeta> metas;
  std::vector<std::string> payloads;
  for (int i = 0; i < 4; ++i) {
    metas.push_back(SessionMeta(i));
    payloads.push_back(Payload(20 + i));
  }
  v1::SaveResponse saved;
  ASSERT_TRUE(GrpcOk(Save(metas, payloads, &saved)));

  v1::FlushResponse flushed;
  disk_.FailAlways(TierOp::kPut, absl::ResourceExhaustedError("injected: no space"));
  EXPECT_THAT(Flush(false, &flushed), GrpcIs(grpc::StatusCode::RESOURCE_EXHAUSTED, "no space"));
  disk_.FailAlways(TierOp::kPut, absl::UnavailableError("injected: tier down"));
  EXPECT_THAT(Flush(false, &flushed), GrpcIs(grpc::StatusCode::UNAVAILABLE, "tier down"));
  // Still serving: stat, loads, new saves.
  EXPECT_EQ(Stat().pinned().blocks(), 4u);
  v1::LoadResponse loaded;
  ASSERT_TRUE(GrpcOk(Load({IdOf(metas[3])}, &loaded)));
  EXPECT_EQ(loaded.blocks(0).inline_bytes(), payloads[3]);
  ASSERT_TRUE(GrpcOk(Save({SessionMeta(9)}, {Payload(9)}, &saved)));
  EXPECT_THAT(disk_.Ids(), ::testing::IsEmpty());
  v1::BlockInfo info;
  ASSERT_TRUE(GrpcOk(Describe(IdOf(metas[0]), &info)));
  EXPECT_FALSE(info.on_disk());

  // A durable save needs the tier.
  EXPECT_THAT(Save({SessionMeta(10)}, {Payload(10)}, &saved, /*durable=*/true),
              GrpcIs(grpc::StatusCode::UNAVAILABLE, ""));

  disk_.ClearFaults();
  ASSERT_TRUE(GrpcOk(Flush(/*evict=*/true, &flushed)));
  EXPECT_GE(flushed.blocks_written(), 5u);
  EXPECT_TRUE(disk_.HasPayload(IdOf(metas[0])));

  // A corrupt copy below: DATA_LOSS once, then a breadcrumb that is never
  // served; counted.
  ASSERT_OK(disk_.CorruptPayload(IdOf(metas[0]), 12345));
  EXPECT_THAT(Load({IdOf(metas[0])}, &loaded),
              GrpcIs(grpc::StatusCode::DATA_LOSS, "checksum"));
  ASSERT_TRUE(GrpcOk(Describe(IdOf(metas[0]), &info)));
  EXPECT_EQ(info.tier(), v1::TIER_BREADCRUMB);
  EXPECT_FALSE(info.bytes_available());
  EXPECT_THAT(Load({IdOf(metas[0])}, &loaded), GrpcIs(grpc::StatusCode::NOT_FOUND, ""));
  EXPECT_EQ(Stat().counters().checksum_failures(), 1u);
  // A read that fails for the tier's own reasons is UNAVAILABLE and harmless.
  disk_.FailNext(TierOp::kRead, 1, absl::UnavailableError("injected: tier down"));
  EXPECT_THAT(Load({IdOf(metas[1])}, &loaded), GrpcIs(grpc::StatusCode::UNAVAILABLE, ""));
  ASSERT_TRUE(GrpcOk(Load({IdOf(metas[1])}, &loaded)));
  EXPECT_EQ(loaded.blocks(0).inline_bytes(), payloads[1]);
}

// ---------------------------------------------------------------- Gather/scatter

// The pages of a paged cache: per layer, a block's K rows and its V rows
// (kTokens tokens each, one page) are pieces of kPageBytes, in the order of
// the canonical layout (layer 0 K, layer 0 V, layer 1 K, ...).
constexpr uint64_t kPagesPerBlock = 8;  // 4 layers x (K, V).
const uint64_t kPageBytes = kBlockBytes / kPagesPerBlock;

// Pages `pages[k]` of a pool at `base`, as a list of slices of `region`.
v1::RegionSlices PageSlices(uint64_t region, const std::vector<uint64_t>& pages) {
  v1::RegionSlices list;
  for (uint64_t page : pages) {
    v1::RegionSlice* s = list.add_slices();
    s->set_region_id(region);
    s->set_offset(page * kPageBytes);
    s->set_length(kPageBytes);
  }
  return list;
}

// Writes `payload` into the pages of `pool` that `pages` names.
void ScatterInto(uint8_t* pool, const std::vector<uint64_t>& pages, const std::string& payload) {
  for (size_t k = 0; k < pages.size(); ++k) {
    std::memcpy(pool + pages[k] * kPageBytes, payload.data() + k * kPageBytes, kPageBytes);
  }
}

// Reads the pages of `pool` that `pages` names, in order.
std::string GatherFrom(const uint8_t* pool, const std::vector<uint64_t>& pages) {
  std::string out;
  for (uint64_t page : pages) {
    out.append(reinterpret_cast<const char*>(pool + page * kPageBytes), kPageBytes);
  }
  return out;
}

// A permutation of 0..n-1 (deterministic), so that a block's pages are
// spread through the pool in no order.
std::vector<uint64_t> Shuffled(uint64_t n, uint64_t seed) {
  std::vector<uint64_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = i;
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (uint64_t i = n - 1; i > 0; --i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::swap(v[i], v[x % (i + 1)]);
  }
  return v;
}

std::string Reanchored(const v1::BlockMeta& meta, std::string payload, int32_t first) {
  const RopePlan plan = MakeRopePlan(meta.fingerprint()).value();
  std::vector<int64_t> delta(meta.n_tokens());
  for (uint32_t t = 0; t < meta.n_tokens(); ++t) {
    delta[t] = static_cast<int64_t>(first) - meta.first_position();
  }
  EXPECT_OK(ReanchorCanonicalBlock(plan, meta, reinterpret_cast<uint8_t*>(payload.data()),
                                   payload.size(), delta));
  return payload;
}

TEST_F(KvTierServiceInProcessTest, CudaGatherAndScatterOneBatchPerDevice) {
  ASSERT_NO_FATAL_FAILURE(OpenLease());
  // Three blocks (two session, one prefix) whose pages lie shuffled through
  // a pool on device 1; the first block's first two pages are adjacent, so
  // that the batch has something to coalesce.
  constexpr uint64_t kPoolPages = 32;
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation pool,
                       gpus_.Allocate(1, kPoolPages * kPageBytes));
  const uint64_t pool_region = AddCudaRegion(pool);
  // Pages 10 and 11 (block 0's first two) are adjacent: the only pair.
  const std::vector<std::vector<uint64_t>> pages = {{10, 11, 3, 27, 0, 19, 6, 30},
                                                    {4, 22, 15, 8, 29, 1, 13, 25},
                                                    {31, 7, 18, 2, 24, 12, 20, 9}};
  std::vector<v1::BlockMeta> metas = {SessionMeta(0), SessionMeta(1), PrefixMeta(40)};
  std::vector<std::string> payloads;
  for (int i = 0; i < 3; ++i) payloads.push_back(Payload(30 + i));
  for (int i = 0; i < 3; ++i) ScatterInto(pool.ptr, pages[i], payloads[i]);

  v1::SaveRequest save;
  save.set_lease_id(lease_id_);
  for (int i = 0; i < 3; ++i) {
    v1::SaveBlock* b = save.add_blocks();
    *b->mutable_meta() = metas[i];
    *b->mutable_gather() = PageSlices(pool_region, pages[i]);
  }
  gpus_.ResetCounters();
  v1::SaveResponse saved;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(GrpcOk(stub_->Save(&context, save, &saved)));
  }
  ASSERT_EQ(saved.results_size(), 3);
  for (int i = 0; i < 3; ++i) {
    // The checksum of the gathered payload is that of the same bytes saved
    // contiguously.
    EXPECT_EQ(saved.results(i).checksum(),
              PayloadChecksum(payloads[i].data(), payloads[i].size()))
        << i;
  }
  HostDevices::Counters c = gpus_.counters();
  // One FetchBlocks for every slice of every block, the adjacent pair
  // coalesced; no per-slice calls. Checksums from tier 1 (nothing hashed on
  // the device: a gathered payload's chunks are not contiguous there).
  EXPECT_EQ(c.calls_of(DeviceOp::kFetchBlocks), 1u);
  EXPECT_EQ(c.calls_of(DeviceOp::kDeviceToHost), 0u);
  EXPECT_EQ(c.checksum_ranges, 0u);
  EXPECT_EQ(c.copy_ops, 3 * kPagesPerBlock);
  EXPECT_EQ(c.copies, 3 * kPagesPerBlock - 1);
  EXPECT_EQ(c.bytes_to_host, 3 * kBlockBytes);
  EXPECT_EQ(c.calls_of(DeviceOp::kChecksums), 0u);
  {
    v1::LoadResponse loaded;
    ASSERT_TRUE(GrpcOk(Load({IdOf(metas[0]), IdOf(metas[1]), IdOf(metas[2])}, &loaded)));
    for (int i = 0; i < 3; ++i) EXPECT_EQ(loaded.blocks(i).inline_bytes(), payloads[i]) << i;
  }

  // Scatter them back into other pages of another pool, on device 0; the
  // second block re-anchored to position 1000.
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation dst, gpus_.Allocate(0, kPoolPages * kPageBytes));
  const uint64_t dst_region = AddCudaRegion(dst);
  const std::vector<uint64_t> dst_order = Shuffled(kPoolPages, 99);
  std::vector<std::vector<uint64_t>> dst_pages;
  v1::LoadRequest load;
  load.set_lease_id(lease_id_);
  *load.mutable_fingerprint() = Fingerprint();
  for (int i = 0; i < 3; ++i) {
    dst_pages.emplace_back(dst_order.begin() + i * kPagesPerBlock,
                           dst_order.begin() + (i + 1) * kPagesPerBlock);
    load.add_ids(metas[i].id());
    *load.add_scatter() = PageSlices(dst_region, dst_pages[i]);
    v1::Reanchor* r = load.add_reanchor();
    if (i == 1) r->set_first_position(1000);
  }
  gpus_.ResetCounters();
  v1::LoadResponse loaded;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(GrpcOk(stub_->Load(&context, load, &loaded)));
  }
  ASSERT_EQ(loaded.blocks_size(), 3);
  EXPECT_EQ(loaded.blocks(1).meta().first_position(), 1000);
  EXPECT_EQ(loaded.blocks(0).inline_bytes(), "");
  EXPECT_EQ(GatherFrom(dst.ptr, dst_pages[0]), payloads[0]);
  EXPECT_EQ(GatherFrom(dst.ptr, dst_pages[2]), payloads[2]);
  const std::string expect = Reanchored(metas[1], payloads[1], 1000);
  ASSERT_NE(expect, payloads[1]);
  EXPECT_EQ(GatherFrom(dst.ptr, dst_pages[1]), expect);
  c = gpus_.counters();
  // One batch of host-to-device copies; verified on the host before it
  // (no device checksums), re-anchored on the host (no device jobs).
  EXPECT_EQ(c.calls_of(DeviceOp::kHostToDevice), 1u);
  EXPECT_EQ(c.copy_ops, 3 * kPagesPerBlock);
  EXPECT_EQ(c.bytes_to_device, 3 * kBlockBytes);
  EXPECT_EQ(c.calls_of(DeviceOp::kChecksums), 0u);
  EXPECT_EQ(c.reanchor_jobs, 0u);

  // The re-anchored K is what the contiguous CUDA path (re-anchoring on the
  // device) returns, V byte-identical.
  v1::LoadRequest contiguous;
  contiguous.set_lease_id(lease_id_);
  *contiguous.mutable_fingerprint() = Fingerprint();
  contiguous.add_ids(metas[1].id());
  v1::RegionSlice* d = contiguous.add_destinations();
  d->set_region_id(dst_region);
  d->set_length(kBlockBytes);
  contiguous.add_reanchor()->set_first_position(1000);
  {
    grpc::ClientContext context;
    ASSERT_TRUE(GrpcOk(stub_->Load(&context, contiguous, &loaded)));
  }
  EXPECT_EQ(gpus_.counters().reanchor_jobs, 1u);
  EXPECT_EQ(gpus_.counters().calls_of(DeviceOp::kLandBlocks), 1u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(dst.ptr), kBlockBytes), expect);

  // From tier 2 (the Deliver path's staging or promotion) as well.
  v1::FlushResponse flushed;
  ASSERT_TRUE(GrpcOk(Flush(/*evict=*/true, &flushed)));
  std::memset(dst.ptr, 0, dst.bytes);
  {
    grpc::ClientContext context;
    ASSERT_TRUE(GrpcOk(stub_->Load(&context, load, &loaded)));
  }
  EXPECT_EQ(loaded.blocks(0).served_from(), v1::TIER_SPILL);
  EXPECT_EQ(GatherFrom(dst.ptr, dst_pages[0]), payloads[0]);
  EXPECT_EQ(GatherFrom(dst.ptr, dst_pages[1]), expect);
  EXPECT_EQ(GatherFrom(dst.ptr, dst_pages[2]), payloads[2]);
}

TEST_F(KvTierServiceInProcessTest, GatherAndScatterRefuseBadListsAndDeviceFaults) {
  ASSERT_NO_FATAL_FAILURE(OpenLease());
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation gpu0, gpus_.Allocate(0, 16 * kPageBytes));
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation gpu1, gpus_.Allocate(1, 16 * kPageBytes));
  const uint64_t r0 = AddCudaRegion(gpu0);
  const uint64_t r1 = AddCudaRegion(gpu1);
  const auto [host, host_bytes] = AddHostRegion(16 * kPageBytes);
  const std::vector<uint64_t> pages = {3, 9, 0, 12, 5, 6, 15, 1};
  const std::string payload = Payload(50);
  ScatterInto(gpu0.ptr, pages, payload);
  ScatterInto(host_bytes, pages, payload);

  v1::SaveRequest save;
  save.set_lease_id(lease_id_);
  v1::SaveBlock* b = save.add_blocks();
  *b->mutable_meta() = SessionMeta(0);
  *b->mutable_gather() = PageSlices(r0, pages);
  v1::SaveResponse saved;
  auto save_status = [&](const v1::SaveRequest& request) {
    grpc::ClientContext context;
    return stub_->Save(&context, request, &saved);
  };
  // A list that mixes devices, or a device and the host.
  v1::SaveRequest bad = save;
  bad.mutable_blocks(0)->mutable_gather()->mutable_slices(5)->set_region_id(r1);
  EXPECT_THAT(save_status(bad),
              GrpcIs(grpc::StatusCode::INVALID_ARGUMENT,
                     absl::StrCat("blocks[0].gather.slices[5]: region ", r1,
                                  " is on CUDA device 1, slices[0] on CUDA device 0")));
  bad.mutable_blocks(0)->mutable_gather()->mutable_slices(5)->set_region_id(host);
  EXPECT_THAT(save_status(bad),
              GrpcIs(grpc::StatusCode::INVALID_ARGUMENT,
                     "blocks[0].gather.slices[5]: region " + absl::StrCat(host) +
                         " is on the host, slices[0] on CUDA device 0"));
  // Outside the region; not the lease's.
  bad = save;
  bad.mutable_blocks(0)->mutable_gather()->mutable_slices(7)->set_offset(16 * kPageBytes - 8);
  EXPECT_THAT(save_status(bad), GrpcIs(grpc::StatusCode::INVALID_ARGUMENT,
                                       "blocks[0].gather.slices[7]: ["));
  bad = save;
  bad.mutable_blocks(0)->mutable_gather()->mutable_slices(2)->set_region_id(4242);
  EXPECT_THAT(save_status(bad), GrpcIs(grpc::StatusCode::NOT_FOUND,
                                       "blocks[0].gather.slices[2].region_id: region 4242"));
  // A device that fails the batch: nothing stored.
  gpus_.FailNext(DeviceOp::kFetchBlocks, 1, absl::UnavailableError("injected: device lost"));
  EXPECT_THAT(save_status(save), GrpcIs(grpc::StatusCode::UNAVAILABLE, "injected"));
  v1::BlockInfo info;
  EXPECT_THAT(Describe(IdOf(SessionMeta(0)), &info), GrpcIs(grpc::StatusCode::NOT_FOUND, ""));
  EXPECT_EQ(Stat().pinned().used_bytes(), 0u);
  ASSERT_TRUE(GrpcOk(save_status(save)));

  v1::LoadRequest load;
  load.set_lease_id(lease_id_);
  *load.mutable_fingerprint() = Fingerprint();
  load.add_ids(SessionMeta(0).id());
  const std::vector<uint64_t> back = {8, 2, 14, 4, 11, 7, 13, 10};
  *load.add_scatter() = PageSlices(r1, back);
  v1::LoadResponse loaded;
  auto load_status = [&](const v1::LoadRequest& request) {
    grpc::ClientContext context;
    return stub_->Load(&context, request, &loaded);
  };
  // Lengths that do not add up to the payload, either way.
  v1::LoadRequest wrong = load;
  wrong.mutable_scatter(0)->mutable_slices(3)->set_length(kPageBytes - 2);
  EXPECT_THAT(load_status(wrong),
              GrpcIs(grpc::StatusCode::INVALID_ARGUMENT,
                     absl::StrCat("scatter[0].slices: lengths add up to ", kBlockBytes - 2,
                                  " bytes, the block's payload is ", kBlockBytes)));
  *wrong.mutable_scatter(0)->add_slices() = wrong.scatter(0).slices(0);
  EXPECT_THAT(load_status(wrong), GrpcIs(grpc::StatusCode::INVALID_ARGUMENT,
                                         "scatter[0].slices: lengths add up to"));
  // Mixed host and device.
  wrong = load;
  wrong.mutable_scatter(0)->mutable_slices(1)->set_region_id(host);
  EXPECT_THAT(load_status(wrong), GrpcIs(grpc::StatusCode::INVALID_ARGUMENT,
                                         "scatter[0].slices[1]: region"));
  // A failed batch to the device is reported.
  gpus_.FailNext(DeviceOp::kHostToDevice, 1, absl::UnavailableError("injected: device lost"));
  EXPECT_THAT(load_status(load), GrpcIs(grpc::StatusCode::UNAVAILABLE, "injected"));
  ASSERT_TRUE(GrpcOk(load_status(load)));
  EXPECT_EQ(GatherFrom(gpu1.ptr, back), payload);
  // Host scatter, in the same request shape.
  std::memset(host_bytes, 0, 16 * kPageBytes);
  *load.mutable_scatter(0) = PageSlices(host, back);
  ASSERT_TRUE(GrpcOk(load_status(load)));
  EXPECT_EQ(GatherFrom(host_bytes, back), payload);
  // Still serving.
  ASSERT_TRUE(GrpcOk(Load({IdOf(SessionMeta(0))}, &loaded)));
  EXPECT_EQ(loaded.blocks(0).inline_bytes(), payload);
}

// A block whose payload is fetched (CUDA slices, gather lists) and whose id
// is already stored: deduplicated, as an inline save of it is. (It was
// disabled while TierManagerImpl::CopyIn took the reservation's data of a
// block that is not fresh, which has none: the daemon died with SIGSEGV.)
TEST_F(KvTierServiceInProcessTest, FetchedSaveOfAStoredIdIsDeduplicated) {
  ASSERT_NO_FATAL_FAILURE(OpenLease());
  // Pages 0..15 hold the scattered copy, pages 16..23 the contiguous one.
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation gpu, gpus_.Allocate(0, 24 * kPageBytes));
  const uint64_t device_region = AddCudaRegion(gpu);
  const auto [host, host_bytes] = AddHostRegion(16 * kPageBytes);
  const std::vector<uint64_t> pages = {3, 9, 0, 12, 5, 6, 15, 1};
  const std::string payload = Payload(51);
  ScatterInto(gpu.ptr, pages, payload);
  ScatterInto(host_bytes, pages, payload);
  std::memcpy(gpu.ptr + 16 * kPageBytes, payload.data(), kBlockBytes);
  v1::SaveResponse saved;
  ASSERT_TRUE(GrpcOk(Save({SessionMeta(0)}, {payload}, &saved)));
  const uint64_t checksum = saved.results(0).checksum();
  std::vector<v1::SaveRequest> requests(3);
  for (v1::SaveRequest& r : requests) {
    r.set_lease_id(lease_id_);
    *r.add_blocks()->mutable_meta() = SessionMeta(0);
  }
  // The existing CUDA region path first, then the gather lists.
  *requests[1].mutable_blocks(0)->mutable_gather() = PageSlices(host, pages);
  *requests[2].mutable_blocks(0)->mutable_gather() = PageSlices(device_region, pages);
  v1::RegionSlice* slice = requests[0].mutable_blocks(0)->mutable_region();
  slice->set_region_id(device_region);
  slice->set_offset(16 * kPageBytes);
  slice->set_length(kBlockBytes);
  for (const v1::SaveRequest& r : requests) {
    grpc::ClientContext context;
    ASSERT_TRUE(GrpcOk(stub_->Save(&context, r, &saved)));
    EXPECT_TRUE(saved.results(0).deduplicated());
    EXPECT_EQ(saved.results(0).checksum(), checksum);
  }
}

// The sink verifies what it scatters (tier 1 is not hashed first for it):
// bytes that do not match the stored checksum are DATA_LOSS, on the host
// and on the way to a device.
TEST_F(KvTierServiceInProcessTest, ScatterSinkVerifiesDeliveredBytes) {
  ASSERT_NO_FATAL_FAILURE(OpenLease());
  const auto [host, host_bytes] = AddHostRegion(16 * kPageBytes);
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation gpu, gpus_.Allocate(0, 16 * kPageBytes));
  const uint64_t device_region = AddCudaRegion(gpu);
  const std::vector<uint64_t> pages = {5, 1, 9, 3, 0, 14, 7, 2};
  const std::string payload = Payload(60);
  const uint64_t checksum = PayloadChecksum(payload.data(), payload.size());
  std::string corrupt = payload;
  corrupt[kBlockBytes / 2] ^= 1;
  v1::BlockMeta meta = SessionMeta(0);
  meta.set_payload_bytes(kBlockBytes);
  for (const uint64_t region : {host, device_region}) {
    for (const bool reanchor : {false, true}) {
      SCOPED_TRACE(absl::StrCat("region ", region, " reanchor ", reanchor));
      v1::LoadRequest request;
      request.set_lease_id(lease_id_);
      *request.mutable_fingerprint() = Fingerprint();
      request.add_ids(meta.id());
      *request.add_scatter() = PageSlices(region, pages);
      if (reanchor) request.add_reanchor()->set_first_position(500);
      LoadCommand command;
      ASSERT_OK(DecodeLoadRequest(request, RequestLimits(), &command));
      LeaseRegions regions(lease_.id, leases_.get());
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<LoadResponseSink> sink,
                           LoadResponseSink::Create(command, /*inline_out=*/nullptr, 1 << 20,
                                                    &regions, copiers_.get()));
      ASSERT_OK(sink->Prepare({meta}));
      EXPECT_EQ(sink->HostDestination(0), nullptr);
      EXPECT_TRUE(sink->VerifiesDeliveries());
      EXPECT_THAT(sink->Deliver(0, reinterpret_cast<const uint8_t*>(corrupt.data()),
                                kBlockBytes, checksum),
                  StatusIs(absl::StatusCode::kDataLoss, HasSubstr("ids[0]: the payload fails")));
      // The good bytes go through.
      ASSERT_OK_AND_ASSIGN(sink, LoadResponseSink::Create(command, /*inline_out=*/nullptr,
                                                          1 << 20, &regions, copiers_.get()));
      ASSERT_OK(sink->Prepare({meta}));
      ASSERT_OK(sink->Deliver(0, reinterpret_cast<const uint8_t*>(payload.data()),
                              kBlockBytes, checksum));
      ASSERT_OK(sink->Finish());
      const uint8_t* pool = region == host ? host_bytes : gpu.ptr;
      EXPECT_EQ(GatherFrom(pool, pages), reanchor ? Reanchored(meta, payload, 500) : payload);
    }
  }
}

// ---------------------------------------------------------------- The pipelined GPU path

// Save and Load over two devices, contiguous slices and a gather list on
// the same device: one FetchBlocks and one LandBlocks per device, whatever
// the number of blocks; checksums and re-anchored K as the CPU computes
// them.
TEST_F(KvTierServiceInProcessTest, CudaSaveAndLoadOneFetchAndOneLandingPerDevice) {
  ASSERT_NO_FATAL_FAILURE(OpenLease());
  // Device 0: session blocks 0 and 1 back to back, then session block 2 in
  // pages (gathered); device 1: session block 3 and prefix block 40.
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation gpu0,
                       gpus_.Allocate(0, 2 * kBlockBytes + 16 * kPageBytes));
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation gpu1, gpus_.Allocate(1, 2 * kBlockBytes));
  const uint64_t r0 = AddCudaRegion(gpu0);
  const uint64_t r1 = AddCudaRegion(gpu1);
  const std::vector<v1::BlockMeta> metas = {SessionMeta(0), SessionMeta(1), SessionMeta(2),
                                            SessionMeta(3), PrefixMeta(40)};
  std::vector<std::string> payloads;
  for (int i = 0; i < 5; ++i) payloads.push_back(Payload(70 + i));
  std::memcpy(gpu0.ptr, payloads[0].data(), kBlockBytes);
  std::memcpy(gpu0.ptr + kBlockBytes, payloads[1].data(), kBlockBytes);
  std::vector<uint64_t> pages = {21, 17, 30, 16, 25, 19, 28, 23};  // Of the pool at 2 blocks.
  ScatterInto(gpu0.ptr, pages, payloads[2]);
  std::memcpy(gpu1.ptr, payloads[3].data(), kBlockBytes);
  std::memcpy(gpu1.ptr + kBlockBytes, payloads[4].data(), kBlockBytes);

  v1::SaveRequest save;
  save.set_lease_id(lease_id_);
  for (int i = 0; i < 5; ++i) {
    v1::SaveBlock* b = save.add_blocks();
    *b->mutable_meta() = metas[i];
    if (i == 2) {
      *b->mutable_gather() = PageSlices(r0, pages);
      continue;
    }
    b->mutable_region()->set_region_id(i < 2 ? r0 : r1);
    b->mutable_region()->set_offset(i == 1 || i == 4 ? kBlockBytes : 0);
    b->mutable_region()->set_length(kBlockBytes);
  }
  gpus_.ResetCounters();
  v1::SaveResponse saved;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(GrpcOk(stub_->Save(&context, save, &saved)));
  }
  ASSERT_EQ(saved.results_size(), 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(saved.results(i).checksum(),
              PayloadChecksum(payloads[i].data(), payloads[i].size()))
        << i;
  }
  HostDevices::Counters c = gpus_.counters();
  EXPECT_EQ(c.calls_of(DeviceOp::kFetchBlocks), 2u);  // One per device.
  EXPECT_EQ(c.calls_of(DeviceOp::kDeviceToHost), 0u);
  EXPECT_EQ(c.calls_of(DeviceOp::kChecksums), 0u);
  EXPECT_EQ(c.plans, 2u);
  // Session blocks 0, 1 and 3 hashed on their devices (the gathered one and
  // the prefix block from tier 1's copy), one checksum launch per device.
  EXPECT_EQ(c.checksum_ranges, 3u);
  EXPECT_EQ(c.checksum_steps, 2u);
  EXPECT_EQ(c.bytes_to_host, 5 * kBlockBytes);
  EXPECT_EQ(c.copy_ops, 4 + kPagesPerBlock);

  // All five back, blocks 0..2 into device 1 and 3..4 into device 0, one
  // re-anchored on each device.
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation to0, gpus_.Allocate(0, 2 * kBlockBytes));
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation to1, gpus_.Allocate(1, 3 * kBlockBytes));
  const uint64_t d0 = AddCudaRegion(to0);
  const uint64_t d1 = AddCudaRegion(to1);
  v1::LoadRequest load;
  load.set_lease_id(lease_id_);
  *load.mutable_fingerprint() = Fingerprint();
  for (int i = 0; i < 5; ++i) {
    load.add_ids(metas[i].id());
    v1::RegionSlice* d = load.add_destinations();
    d->set_region_id(i < 3 ? d1 : d0);
    d->set_offset((i < 3 ? i : i - 3) * kBlockBytes);
    d->set_length(kBlockBytes);
    v1::Reanchor* r = load.add_reanchor();
    if (i == 1 || i == 4) r->set_first_position(2000 + i);
  }
  gpus_.ResetCounters();
  v1::LoadResponse loaded;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(GrpcOk(stub_->Load(&context, load, &loaded)));
  }
  ASSERT_EQ(loaded.blocks_size(), 5);
  c = gpus_.counters();
  EXPECT_EQ(c.calls_of(DeviceOp::kLandBlocks), 2u);  // One per device.
  EXPECT_EQ(c.calls_of(DeviceOp::kHostToDevice), 0u);
  EXPECT_EQ(c.calls_of(DeviceOp::kChecksums), 0u);
  EXPECT_EQ(c.calls_of(DeviceOp::kReanchor), 0u);
  EXPECT_EQ(c.plans, 2u);
  EXPECT_EQ(c.checksum_ranges, 5u);  // Every block verified where it landed.
  EXPECT_EQ(c.reanchor_jobs, 2u);
  EXPECT_EQ(c.reanchor_steps, 2u);
  EXPECT_EQ(c.bytes_to_device, 5 * kBlockBytes);
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE(i);
    const uint8_t* at = (i < 3 ? to1.ptr : to0.ptr) + (i < 3 ? i : i - 3) * kBlockBytes;
    const std::string want =
        (i == 1 || i == 4) ? Reanchored(metas[i], payloads[i], 2000 + i) : payloads[i];
    if (i == 1 || i == 4) {
      ASSERT_NE(want, payloads[i]);
    }
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(at), kBlockBytes), want);
    EXPECT_EQ(loaded.blocks(i).meta().first_position(),
              (i == 1 || i == 4) ? 2000 + i : metas[i].first_position());
  }
}

// A bad tier-1 copy is caught where it lands on the GPU (the sink verifies
// deliveries, so tier 1 is not hashed on the host first): DATA_LOSS for the
// call, even though the block was re-anchored in the same pipeline (its
// destination holds garbage, as after any failed load); the TierManager
// then finds the bad tier-1 copy and quarantines it, and the next load is
// served, verified and re-anchored from the disk copy.
TEST_F(KvTierServiceInProcessTest, CorruptLandingIsDataLossAndTheBadTier1CopyIsQuarantined) {
  ASSERT_NO_FATAL_FAILURE(OpenLease());
  const v1::BlockMeta meta = SessionMeta(5);
  const std::string payload = Payload(80);
  v1::SaveResponse saved;
  ASSERT_TRUE(GrpcOk(Save({meta}, {payload}, &saved)));
  v1::FlushResponse flushed;
  ASSERT_TRUE(GrpcOk(Flush(/*evict=*/false, &flushed)));  // A disk copy; tier 1 kept.
  v1::BlockInfo info;
  ASSERT_TRUE(GrpcOk(Describe(IdOf(meta), &info)));
  ASSERT_EQ(info.tier(), v1::TIER_PINNED_HOST);
  ASSERT_TRUE(info.on_disk());
  ASSERT_NO_FATAL_FAILURE(CorruptTier1(payload));

  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation dst, gpus_.Allocate(0, kBlockBytes));
  const uint64_t dst_region = AddCudaRegion(dst);
  v1::LoadRequest load;
  load.set_lease_id(lease_id_);
  *load.mutable_fingerprint() = Fingerprint();
  load.add_ids(meta.id());
  v1::RegionSlice* d = load.add_destinations();
  d->set_region_id(dst_region);
  d->set_length(kBlockBytes);
  load.add_reanchor()->set_first_position(300);
  gpus_.ResetCounters();
  v1::LoadResponse loaded;
  {
    grpc::ClientContext context;
    EXPECT_THAT(stub_->Load(&context, load, &loaded),
                GrpcIs(grpc::StatusCode::DATA_LOSS, "ids[0]: the copy on the GPU fails"));
  }
  HostDevices::Counters c = gpus_.counters();
  EXPECT_EQ(c.calls_of(DeviceOp::kLandBlocks), 1u);
  EXPECT_EQ(c.calls_of(DeviceOp::kHostToDevice), 0u);
  EXPECT_EQ(Stat().counters().checksum_failures(), 1u);
  ASSERT_TRUE(GrpcOk(Describe(IdOf(meta), &info)));
  EXPECT_EQ(info.tier(), v1::TIER_SPILL);  // The tier-1 copy is gone.
  EXPECT_TRUE(info.bytes_available());

  std::memset(dst.ptr, 0, kBlockBytes);
  {
    grpc::ClientContext context;
    ASSERT_TRUE(GrpcOk(stub_->Load(&context, load, &loaded)));
  }
  EXPECT_EQ(loaded.blocks(0).served_from(), v1::TIER_SPILL);
  EXPECT_EQ(loaded.blocks(0).meta().first_position(), 300);
  const std::string expect = Reanchored(meta, payload, 300);
  ASSERT_NE(expect, payload);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(dst.ptr), kBlockBytes), expect);
}

}  // namespace
}  // namespace evoke
