// The command ring end to end: a real evoked, the client library's ring, and
// a hand-driven ring for what the library would never write.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/fd_passing.h"
#include "common/futex.h"
#include "common/ring_format.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "tests/e2e_fixture.h"

namespace evoke::testing {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Client> ConnectWith(const std::string& socket, ClientOptions options) {
  options.target = socket;
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(options);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(c).value() : nullptr;
}

class RingTest : public E2eTest {
 protected:
  void SetUp() override { StartDaemon(); }
};

TEST_F(RingTest, SaveAndLoadGoThroughTheRing) {
  ASSERT_OK_AND_ASSIGN(auto region, client_->CreateSharedRegion(8 << 20));
  ASSERT_TRUE(client_->has_ring());
  const v1::StatResponse before = Stat();
  EXPECT_EQ(before.leases().rings(), 1u);
  std::vector<TestBlock> blocks;
  std::vector<BlockToSave> batch;
  std::vector<BlockId> ids;
  uint64_t offset = 0;
  for (int i = 0; i < 16; ++i) {
    blocks.push_back(SessionBlock("ring", i, 32));
    std::memcpy(region->data() + offset, blocks.back().payload.data(),
                blocks.back().payload.size());
    batch.emplace_back(blocks.back().meta, region->Slice(offset, blocks.back().payload.size()));
    ids.push_back(blocks.back().id());
    offset += blocks.back().payload.size();
  }
  ASSERT_OK_AND_ASSIGN(std::vector<v1::SaveResult> saved, client_->Save(batch));
  ASSERT_EQ(saved.size(), blocks.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    EXPECT_EQ(saved[i].id(), blocks[i].meta.id());
    EXPECT_EQ(saved[i].checksum(),
              PayloadChecksum(blocks[i].payload.data(), blocks[i].payload.size()));
    EXPECT_FALSE(saved[i].deduplicated());
  }
  // Loaded into the second half of the region, through the ring.
  std::vector<v1::RegionSlice> into;
  const uint64_t base = 4 << 20;
  for (size_t i = 0; i < blocks.size(); ++i) {
    into.push_back(region->Slice(base + i * 65536, 65536));
  }
  ASSERT_OK_AND_ASSIGN(std::vector<LoadedBlock> loaded,
                       client_->LoadInto(ids, SmallFingerprint(), into));
  ASSERT_EQ(loaded.size(), blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(loaded[i].meta.id(), blocks[i].meta.id());
    EXPECT_EQ(loaded[i].meta.payload_bytes(), blocks[i].payload.size());
    EXPECT_EQ(loaded[i].served_from, v1::TIER_PINNED_HOST);
    EXPECT_EQ(std::memcmp(region->data() + base + i * 65536, blocks[i].payload.data(),
                          blocks[i].payload.size()),
              0)
        << i;
  }
  const v1::StatResponse after = Stat();
  // Every block went through the ring: 16 saves and 16 loads.
  EXPECT_EQ(after.leases().ring_ops() - before.leases().ring_ops(), 32u);
  EXPECT_EQ(after.counters().saves() - before.counters().saves(), 16u);
  EXPECT_EQ(after.counters().loads() - before.counters().loads(), 16u);
}

TEST_F(RingTest, ManyInFlightPastTheQueueLength) {
  ClientOptions options;
  options.ring_entries = 8;  // 16 completions: 300 in flight must wait for room.
  std::unique_ptr<Client> client = ConnectWith(daemon_->socket(), options);
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->OpenLease("ring-async"));
  ASSERT_OK_AND_ASSIGN(auto region, client->CreateSharedRegion(8 << 20));
  ASSERT_TRUE(client->has_ring());
  constexpr int kBlocks = 300;
  constexpr uint64_t kBytes = 4096;  // Two tokens of the small layout.
  std::vector<TestBlock> blocks;
  std::vector<uint64_t> tickets;
  for (int i = 0; i < kBlocks; ++i) {
    blocks.push_back(SessionBlock("async", i, 2));
    ASSERT_EQ(blocks.back().payload.size(), kBytes);
    std::memcpy(region->data() + i * kBytes, blocks.back().payload.data(), kBytes);
    ASSERT_OK_AND_ASSIGN(uint64_t t, client->SubmitSave(BlockToSave(
                                         blocks.back().meta, region->Slice(i * kBytes, kBytes))));
    tickets.push_back(t);
  }
  for (int i = 0; i < kBlocks; ++i) {
    ASSERT_OK_AND_ASSIGN(RingCompletion c, client->Wait(tickets[i]));
    ASSERT_OK(c.status) << i;
    EXPECT_EQ(c.checksum, PayloadChecksum(blocks[i].payload.data(), kBytes));
  }
  EXPECT_THAT(client->Wait(tickets[0]), StatusIs(absl::StatusCode::kNotFound));
  tickets.clear();
  const uint64_t base = 4 << 20;
  std::memset(region->data() + base, 0, kBlocks * kBytes);
  for (int i = 0; i < kBlocks; ++i) {
    const v1::RegionSlice dst = region->Slice(base + i * kBytes, kBytes);
    ASSERT_OK_AND_ASSIGN(uint64_t t,
                         client->SubmitLoad(blocks[i].id(), SmallFingerprint(), {dst}));
    tickets.push_back(t);
  }
  // Waited in reverse: completions of others are kept for their waiters.
  for (int i = kBlocks - 1; i >= 0; --i) {
    ASSERT_OK_AND_ASSIGN(RingCompletion c, client->Wait(tickets[i]));
    ASSERT_OK(c.status) << i;
    EXPECT_EQ(c.payload_bytes, kBytes);
    EXPECT_FALSE(c.meta.has_value());  // Not asked for.
  }
  for (int i = 0; i < kBlocks; ++i) {
    ASSERT_EQ(std::memcmp(region->data() + base + i * kBytes, blocks[i].payload.data(), kBytes),
              0)
        << i;
  }
}

TEST_F(RingTest, ReanchoredLoadEqualsTheRpcs) {
  ASSERT_OK_AND_ASSIGN(auto region, client_->CreateSharedRegion(1 << 20));
  ASSERT_TRUE(client_->has_ring());
  const TestBlock b = SessionBlock("reanchor", 0, 16);
  ASSERT_OK(SaveBlocks(*client_, {b}));
  // Inline, through the RPC.
  ASSERT_OK_AND_ASSIGN(std::vector<LoadedBlock> rpc,
                       client_->LoadReanchored({b.id()}, SmallFingerprint(), {1000}));
  ASSERT_EQ(rpc.size(), 1u);
  // Into the region, through the ring.
  v1::Reanchor re;
  re.set_first_position(1000);
  ASSERT_OK_AND_ASSIGN(
      std::vector<LoadedBlock> ring,
      client_->LoadWith({b.id()}, SmallFingerprint(), {re}, {region->Slice(0, 1 << 20)}));
  ASSERT_EQ(ring.size(), 1u);
  EXPECT_NE(rpc[0].payload, b.payload);  // K was rotated.
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(region->data()), b.payload.size()),
            rpc[0].payload);
  EXPECT_EQ(ring[0].meta.SerializeAsString(), rpc[0].meta.SerializeAsString());
}

// A block whose meta does not fit in a completion's message slot (4 KiB:
// here 2,048 tokens): the client asks for the meta alone (Describe), not
// for the bytes again, and shapes it as the Load RPC returns it.
TEST_F(RingTest, AMetaTooLargeForItsCompletionComesFromDescribe) {
  ASSERT_OK_AND_ASSIGN(auto region, client_->CreateSharedRegion(4 << 20));
  ASSERT_TRUE(client_->has_ring());
  TestBlock b = SessionBlock("big-meta", 0, 2048);
  for (int t = 0; t < 2048; ++t) b.meta.add_tokens(100000 + t);
  ASSERT_GT(b.meta.ByteSizeLong(), 4096u);
  ASSERT_LE(b.payload.size(), 4u << 20);
  ASSERT_OK(SaveBlocks(*client_, {b}));
  ASSERT_OK_AND_ASSIGN(std::vector<LoadedBlock> rpc,
                       client_->LoadReanchored({b.id()}, SmallFingerprint(), {7000}));
  auto calls = [&](absl::string_view method) -> uint64_t {
    const v1::StatResponse stat = Stat();
    for (const v1::RpcStat& r : stat.rpcs()) {
      if (r.method() == method) return r.calls();
    }
    return 0;
  };
  const uint64_t loads = calls("Load"), describes = calls("Describe");
  v1::Reanchor re;
  re.set_first_position(7000);
  ASSERT_OK_AND_ASSIGN(
      std::vector<LoadedBlock> ring,
      client_->LoadWith({b.id()}, SmallFingerprint(), {re}, {region->Slice(0, 4 << 20)}));
  ASSERT_EQ(ring.size(), 1u);
  EXPECT_EQ(ring[0].meta.SerializeAsString(), rpc[0].meta.SerializeAsString());
  EXPECT_EQ(ring[0].meta.tokens_size(), 2048);
  EXPECT_EQ(ring[0].meta.first_position(), 7000);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(region->data()), b.payload.size()),
            rpc[0].payload);
  EXPECT_EQ(calls("Describe"), describes + 1);
  EXPECT_EQ(calls("Load"), loads);  // The bytes came once, through the ring.
}

TEST_F(RingTest, EachEntryGetsItsOwnErrorAndTheRingKeepsServing) {
  ASSERT_OK_AND_ASSIGN(auto region, client_->CreateSharedRegion(1 << 20));
  ASSERT_TRUE(client_->has_ring());
  const TestBlock good0 = SessionBlock("errors", 0, 8);
  const TestBlock good1 = SessionBlock("errors", 1, 8);
  std::memcpy(region->data(), good0.payload.data(), good0.payload.size());
  std::memcpy(region->data() + 65536, good1.payload.data(), good1.payload.size());
  v1::BlockMeta bad = good0.meta;
  bad.clear_session_id();
  // Good, bad, good, out of the region: run as one batch by the daemon,
  // then one at a time; each answered on its own.
  ASSERT_OK_AND_ASSIGN(uint64_t t0, client_->SubmitSave(BlockToSave(
                                        good0.meta, region->Slice(0, good0.payload.size()))));
  ASSERT_OK_AND_ASSIGN(uint64_t t1,
                       client_->SubmitSave(BlockToSave(bad, region->Slice(0, good0.payload.size()))));
  ASSERT_OK_AND_ASSIGN(uint64_t t2, client_->SubmitSave(BlockToSave(
                                        good1.meta, region->Slice(65536, good1.payload.size()))));
  v1::RegionSlice outside = region->Slice((1 << 20) - 100, good1.payload.size());
  ASSERT_OK_AND_ASSIGN(uint64_t t3,
                       client_->SubmitSave(BlockToSave(SessionBlock("errors", 2, 8).meta, outside)));
  ASSERT_OK_AND_ASSIGN(RingCompletion c0, client_->Wait(t0));
  ASSERT_OK_AND_ASSIGN(RingCompletion c1, client_->Wait(t1));
  ASSERT_OK_AND_ASSIGN(RingCompletion c2, client_->Wait(t2));
  ASSERT_OK_AND_ASSIGN(RingCompletion c3, client_->Wait(t3));
  EXPECT_OK(c0.status);
  EXPECT_THAT(c1.status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("session_id")));
  EXPECT_OK(c2.status);
  EXPECT_THAT(c3.status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("region")));

  const v1::RegionSlice dst = region->Slice(1 << 19, 65536);
  ASSERT_OK_AND_ASSIGN(uint64_t l0,
                       client_->SubmitLoad(SessionBlock("absent", 0, 8).id(), SmallFingerprint(),
                                           {dst}));
  ASSERT_OK_AND_ASSIGN(uint64_t l1, client_->SubmitLoad(good0.id(), SmallFingerprint("other"),
                                                        {dst}));
  ASSERT_OK_AND_ASSIGN(uint64_t l2, client_->SubmitLoad(good1.id(), SmallFingerprint(), {dst},
                                                        std::nullopt, /*want_meta=*/true));
  ASSERT_OK_AND_ASSIGN(RingCompletion d0, client_->Wait(l0));
  ASSERT_OK_AND_ASSIGN(RingCompletion d1, client_->Wait(l1));
  ASSERT_OK_AND_ASSIGN(RingCompletion d2, client_->Wait(l2));
  EXPECT_THAT(d0.status, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(d1.status, StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_OK(d2.status);
  ASSERT_TRUE(d2.meta.has_value());
  EXPECT_EQ(d2.meta->id(), good1.meta.id());
  EXPECT_EQ(std::memcmp(region->data() + (1 << 19), good1.payload.data(), good1.payload.size()),
            0);
}

// A ring driven by hand: a lease and a region made with the raw protocols,
// so that the test can write anything into the ring.
class RawRing {
 public:
  static absl::StatusOr<std::unique_ptr<RawRing>> Open(const std::string& socket,
                                                       uint64_t bytes) {
    auto r = std::unique_ptr<RawRing>(new RawRing());
    r->stub_ = RawStub(socket);
    v1::OpenLeaseRequest open;
    open.set_client_name("raw-ring");
    r->lease_ctx_ = std::make_unique<grpc::ClientContext>();
    r->lease_ = r->stub_->OpenLease(r->lease_ctx_.get(), open);
    v1::LeaseEvent event;
    if (!r->lease_->Read(&event) || !event.has_grant()) {
      return absl::UnavailableError("no lease");
    }
    r->lease_id_ = event.grant().lease_id();
    const int fd = memfd_create("raw-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
      return absl::InternalError("memfd");
    }
    r->fd_ = fd;
    r->bytes_ = bytes;
    r->base_ = static_cast<uint8_t*>(
        mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    EVOKE_ASSIGN_OR_RETURN(FdChannelReply reply,
                           SendFdChannelRequest(event.grant().fd_socket(),
                                                EncodeFdChannelRequest(r->lease_id_, bytes), {fd}));
    EVOKE_RETURN_IF_ERROR(reply.status);
    r->region_id_ = reply.region_id;
    return r;
  }
  ~RawRing() {
    lease_ctx_->TryCancel();
    munmap(base_, bytes_);
    close(fd_);
  }

  void WriteHeader(const ring::RingGeometry& g) {
    auto* h = header();
    h->magic = ring::kMagic;
    h->version = ring::kVersion;
    h->sq_entries = g.sq_entries;
    h->cq_entries = g.cq_entries;
    h->arg_bytes = g.arg_bytes;
    h->msg_bytes = g.msg_bytes;
    g_ = g;
  }
  absl::Status Attach() {
    v1::AttachRingRequest request;
    request.set_lease_id(lease_id_);
    request.set_region_id(region_id_);
    v1::AttachRingResponse response;
    grpc::ClientContext context;
    const grpc::Status s = stub_->AttachRing(&context, request, &response);
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
  // Submit writes `sqe` (and `args`) at sq_tail and publishes it.
  void Submit(ring::RingSqe sqe, absl::string_view args = {}) {
    auto* h = header();
    const uint32_t slot = tail_ & (g_.sq_entries - 1);
    std::memcpy(base_ + g_.arg_offset() + uint64_t{slot} * g_.arg_bytes, args.data(),
                args.size());
    std::memcpy(base_ + g_.sq_offset() + uint64_t{slot} * sizeof(sqe), &sqe, sizeof(sqe));
    h->sq_tail.value.store(++tail_);
    h->sq_need_wake.value.store(0);
    FutexWake(&h->sq_need_wake.value);
  }
  bool WaitCqTail(uint32_t n, absl::Duration timeout = absl::Seconds(5)) {
    return WaitUntil([&] { return header()->cq_tail.value.load() >= n; }, timeout,
                     absl::Milliseconds(1));
  }
  ring::RingCqe Cqe(uint32_t index) const {
    ring::RingCqe c;
    std::memcpy(&c, base_ + g_.cq_offset() + uint64_t{index & (g_.cq_entries - 1)} * sizeof(c),
                sizeof(c));
    return c;
  }
  std::string Message(uint32_t index) const {
    const ring::RingCqe c = Cqe(index);
    return std::string(reinterpret_cast<const char*>(
                           base_ + g_.msg_offset() +
                           uint64_t{index & (g_.cq_entries - 1)} * g_.msg_bytes),
                       c.msg_len);
  }
  ring::RingHeader* header() const { return reinterpret_cast<ring::RingHeader*>(base_); }
  uint32_t tail() const { return tail_; }
  void set_tail(uint32_t t) { tail_ = t; }

 private:
  RawRing() = default;
  std::unique_ptr<v1::KvTier::Stub> stub_;
  std::unique_ptr<grpc::ClientContext> lease_ctx_;
  std::unique_ptr<grpc::ClientReader<v1::LeaseEvent>> lease_;
  std::string lease_id_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
  uint8_t* base_ = nullptr;
  uint64_t region_id_ = 0;
  ring::RingGeometry g_;
  uint32_t tail_ = 0;
};

ring::RingGeometry SmallGeometry() {
  ring::RingGeometry g;
  g.sq_entries = 4;
  g.cq_entries = 4;
  g.arg_bytes = 1024;
  g.msg_bytes = 256;
  return g;
}

// The ring's handler keeps the regions its entries name resolved from one
// submission to the next; a region the client unregisters is refused on the
// next entry that names it, and the others keep serving.
TEST_F(RingTest, AnUnregisteredRegionIsRefusedOnTheNextEntry) {
  ASSERT_OK_AND_ASSIGN(auto keep, client_->CreateSharedRegion(1 << 20));
  ASSERT_OK_AND_ASSIGN(auto gone, client_->CreateSharedRegion(1 << 20));
  ASSERT_TRUE(client_->has_ring());
  const TestBlock a = SessionBlock("unregistered", 0, 8);
  const TestBlock b = SessionBlock("unregistered", 1, 8);
  const uint64_t n = a.payload.size();
  std::memcpy(keep->data(), a.payload.data(), n);
  std::memcpy(gone->data(), b.payload.data(), n);
  ASSERT_OK(client_->Save({BlockToSave(a.meta, keep->Slice(0, n)),
                           BlockToSave(b.meta, gone->Slice(0, n))})
                .status());
  const v1::RegionSlice stale = gone->Slice(65536, 65536);
  ASSERT_OK(client_->UnregisterRegion(stale.region_id()));
  ASSERT_OK_AND_ASSIGN(uint64_t t, client_->SubmitLoad(b.id(), SmallFingerprint(), {stale}));
  ASSERT_OK_AND_ASSIGN(RingCompletion c, client_->Wait(t));
  EXPECT_THAT(c.status, StatusIs(absl::StatusCode::kNotFound,
                                 HasSubstr(absl::StrCat("region ", stale.region_id()))));
  ASSERT_OK_AND_ASSIGN(std::vector<LoadedBlock> loaded,
                       client_->LoadInto({a.id()}, SmallFingerprint(), {keep->Slice(65536, n)}));
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(std::memcmp(keep->data() + 65536, a.payload.data(), n), 0);
}

TEST_F(RingTest, AttachRefusesBadHeadersNamingTheField) {
  ASSERT_OK_AND_ASSIGN(auto raw, RawRing::Open(daemon_->socket(), 1 << 20));
  EXPECT_THAT(raw->Attach(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("magic")));
  ring::RingGeometry g = SmallGeometry();
  g.sq_entries = 3;
  raw->WriteHeader(g);
  EXPECT_THAT(raw->Attach(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sq_entries")));
  g = SmallGeometry();
  g.cq_entries = 2;  // Fewer than sq_entries.
  raw->WriteHeader(g);
  EXPECT_THAT(raw->Attach(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cq_entries")));
  g = SmallGeometry();
  g.arg_bytes = 1u << 30;
  raw->WriteHeader(g);
  EXPECT_THAT(raw->Attach(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("arg_bytes")));
  g = SmallGeometry();
  g.sq_entries = g.cq_entries = 4096;
  g.arg_bytes = 4096;  // 16 MiB of arguments in a 1 MiB region.
  raw->WriteHeader(g);
  EXPECT_THAT(raw->Attach(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs")));
  raw->WriteHeader(SmallGeometry());
  raw->header()->sq_tail.value.store(7);
  EXPECT_THAT(raw->Attach(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sq_tail")));
  raw->header()->sq_tail.value.store(0);
  ASSERT_OK(raw->Attach());
  EXPECT_THAT(raw->Attach(), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("already")));
  EXPECT_EQ(Stat().leases().rings(), 1u);
}

TEST_F(RingTest, HostileEntriesGetErrorsNamingTheField) {
  ASSERT_OK_AND_ASSIGN(auto raw, RawRing::Open(daemon_->socket(), 1 << 20));
  raw->WriteHeader(SmallGeometry());
  ASSERT_OK(raw->Attach());
  ring::RingSqe e{};
  e.user_data = 1;
  e.opcode = 99;
  raw->Submit(e);
  e = {};
  e.user_data = 2;
  e.opcode = ring::kOpSave;
  e.arg_len = 4096;  // Past arg_bytes (1024).
  raw->Submit(e);
  e = {};
  e.user_data = 3;
  e.opcode = ring::kOpLoad;
  e.arg_len = 64;
  e.meta_len = 8;
  e.n_slices = 100;  // 2400 bytes of slices in 64.
  raw->Submit(e);
  e = {};
  e.user_data = 4;
  e.opcode = ring::kOpSave;
  e.arg_len = 16;
  e.meta_len = 16;  // Not a BlockMeta.
  raw->Submit(e, std::string(16, '\xff'));
  ASSERT_TRUE(raw->WaitCqTail(4));
  EXPECT_EQ(raw->Cqe(0).user_data, 1u);
  EXPECT_EQ(raw->Cqe(0).status, static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(raw->Message(0), HasSubstr("sqe.opcode"));
  EXPECT_THAT(raw->Message(1), HasSubstr("sqe.arg_len"));
  EXPECT_THAT(raw->Message(2), HasSubstr("sqe.n_slices"));
  EXPECT_THAT(raw->Message(3), HasSubstr("BlockMeta"));
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(raw->Cqe(i).status, static_cast<int>(absl::StatusCode::kInvalidArgument)) << i;
  }
  raw->header()->cq_head.value.store(4);
  // Acquire and Release: ids not whole, a handle of 0, a handle unknown.
  e = {};
  e.user_data = 10;
  e.opcode = ring::kOpAcquire;
  e.arg_len = 24;
  e.meta_len = 24;
  raw->Submit(e, std::string(24, '\x01'));
  e = {};
  e.user_data = 11;
  e.opcode = ring::kOpRelease;
  raw->Submit(e);
  e = {};
  e.user_data = 12;
  e.opcode = ring::kOpRelease;
  e.id[0] = 77;
  raw->Submit(e);
  e = {};
  e.user_data = 13;
  e.opcode = ring::kOpAcquire;
  e.arg_len = 16;
  e.meta_len = 16;
  raw->Submit(e, std::string(16, '\x02'));  // Not stored: nothing held, handle 0.
  ASSERT_TRUE(raw->WaitCqTail(8));
  EXPECT_EQ(raw->Cqe(4).status, static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(raw->Message(4), HasSubstr("sqe.meta_len"));
  EXPECT_EQ(raw->Cqe(5).status, static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(raw->Message(5), HasSubstr("handle"));
  EXPECT_EQ(raw->Cqe(6).status, static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_THAT(raw->Message(6), HasSubstr("handle"));
  EXPECT_EQ(raw->Cqe(7).status, 0);
  EXPECT_EQ(raw->Cqe(7).checksum, 0u);       // The handle.
  EXPECT_EQ(raw->Cqe(7).payload_bytes, 0u);  // Held.
  raw->header()->cq_head.value.store(8);
  // A NOP still completes: the ring serves on.
  e = {};
  e.user_data = 5;
  raw->Submit(e);
  ASSERT_TRUE(raw->WaitCqTail(9));
  EXPECT_EQ(raw->Cqe(8).user_data, 5u);
  EXPECT_EQ(raw->Cqe(8).status, 0);
}

TEST_F(RingTest, ACorruptIndexBreaksOnlyThatRing) {
  ASSERT_OK_AND_ASSIGN(auto raw, RawRing::Open(daemon_->socket(), 1 << 20));
  raw->WriteHeader(SmallGeometry());
  ASSERT_OK(raw->Attach());
  raw->set_tail(1000);  // Far past the 4 entries of the queue.
  raw->Submit(ring::RingSqe{});
  ASSERT_TRUE(WaitUntil([&] { return raw->header()->broken.value.load() != 0; }));
  EXPECT_EQ(raw->header()->broken.value.load(), ring::kBrokenSqIndex);
  ASSERT_TRUE(WaitUntil([&] { return Stat().leases().rings() == 0; }));
  EXPECT_EQ(Stat().leases().rings_broken(), 1u);
  // The daemon serves everyone else.
  const TestBlock b = SessionBlock("after-broken", 0, 8);
  ASSERT_OK(SaveBlocks(*client_, {b}));
  ASSERT_OK_AND_ASSIGN(std::vector<LoadedBlock> loaded, client_->Load({b.id()}, SmallFingerprint()));
  EXPECT_EQ(loaded[0].payload, b.payload);
}

TEST_F(RingTest, AClientThatTakesNoCompletionsStallsOnlyItself) {
  ASSERT_OK_AND_ASSIGN(auto raw, RawRing::Open(daemon_->socket(), 1 << 20));
  raw->WriteHeader(SmallGeometry());
  ASSERT_OK(raw->Attach());
  for (int i = 0; i < 4; ++i) raw->Submit(ring::RingSqe{});
  ASSERT_TRUE(raw->WaitCqTail(4));
  // The completion queue is full: the next four wait in the submission queue.
  for (int i = 0; i < 4; ++i) raw->Submit(ring::RingSqe{});
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(raw->header()->cq_tail.value.load(), 4u);
  EXPECT_EQ(raw->header()->sq_head.value.load(), 4u);
  const TestBlock b = SessionBlock("others", 0, 8);
  ASSERT_OK(SaveBlocks(*client_, {b}));
  // Taking the completions lets the rest through.
  raw->header()->cq_head.value.store(4);
  ASSERT_TRUE(raw->WaitCqTail(8));
  EXPECT_EQ(raw->header()->broken.value.load(), 0u);
}

TEST_F(RingTest, TheRingEndsWithItsLease) {
  {
    ASSERT_OK_AND_ASSIGN(auto raw, RawRing::Open(daemon_->socket(), 1 << 20));
    raw->WriteHeader(SmallGeometry());
    ASSERT_OK(raw->Attach());
    EXPECT_EQ(Stat().leases().rings(), 1u);
  }  // The lease stream is cancelled: the lease, its region and ring go.
  ASSERT_TRUE(WaitUntil([&] { return Stat().leases().rings() == 0; }, absl::Seconds(5)));
  EXPECT_EQ(Stat().leases().rings_broken(), 0u);
}

TEST_F(RingTest, DaemonRestartFailsWaitersAndANewRingWorks) {
  std::unique_ptr<Client> client = ConnectWith(daemon_->socket(), ClientOptions());
  ASSERT_OK(client->OpenLease("restart"));
  ASSERT_OK_AND_ASSIGN(auto region, client->CreateSharedRegion(1 << 20));
  ASSERT_TRUE(client->has_ring());
  const TestBlock b = SessionBlock("restart", 0, 8);
  std::memcpy(region->data(), b.payload.data(), b.payload.size());
  ASSERT_OK(client->Save({BlockToSave(b.meta, region->Slice(0, b.payload.size()))}, true));
  daemon_->KillHard();
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(WaitUntil([&] { return !client->has_ring(); }, absl::Seconds(5)));
  EXPECT_LT(absl::Now() - killed, absl::Seconds(5));
  EXPECT_THAT(client->SubmitLoad(b.id(), SmallFingerprint(), {region->Slice(0, 65536)}),
              StatusIs(absl::StatusCode::kUnavailable));
  region.reset();
  client_.reset();
  StartDaemon(flags_);
  // The same client: a new lease, a new region, a new ring.
  ASSERT_TRUE(WaitUntil([&] { return client->OpenLease("restart").ok(); }, absl::Seconds(10),
                        absl::Milliseconds(100)));
  ASSERT_OK_AND_ASSIGN(region, client->CreateSharedRegion(1 << 20));
  ASSERT_TRUE(client->has_ring());
  ASSERT_OK_AND_ASSIGN(std::vector<LoadedBlock> loaded,
                       client->LoadInto({b.id()}, SmallFingerprint(), {region->Slice(0, 65536)}));
  EXPECT_EQ(std::memcmp(region->data(), b.payload.data(), b.payload.size()), 0);
}

}  // namespace
}  // namespace evoke::testing

namespace evoke::testing {
namespace {

// A refused AttachRing after another ring ended must not take the daemon
// down (it once destroyed the ended ring's unjoined thread: std::terminate;
// found by fuzz_ring).
TEST_F(RingTest, ARefusedAttachAfterARingEndedKeepsTheDaemonUp) {
  ASSERT_OK_AND_ASSIGN(auto second, RawRing::Open(daemon_->socket(), 1 << 20));
  second->WriteHeader(SmallGeometry());
  ASSERT_OK(second->Attach());
  {
    ASSERT_OK_AND_ASSIGN(auto first, RawRing::Open(daemon_->socket(), 1 << 20));
    first->WriteHeader(SmallGeometry());
    ASSERT_OK(first->Attach());
  }  // Its lease ends, and with it the ring.
  ASSERT_TRUE(WaitUntil([&] { return Stat().leases().rings() == 1; }, absl::Seconds(5)));
  EXPECT_THAT(second->Attach(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_OK(client_->HealthCheck());
  EXPECT_EQ(Stat().leases().rings(), 1u);
}

}  // namespace
}  // namespace evoke::testing
