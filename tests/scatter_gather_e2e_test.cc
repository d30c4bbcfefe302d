// Scatter/gather against a real evoked (issue #12): a paged KV cache (vLLM
// keeps 16-token pages per layer scattered through one pool) saved by
// gathering every layer's K and V page of a block into one block, and loaded
// back by scattering it into other pages, through a shared-memory region.
// Raw gRPC calls: the client library's gather/scatter API comes with the
// command ring; the lease is opened here so that the test knows its id.
//
// EVOKE_SG_BENCH=1 also times gather+scatter of 64 blocks against memcpy of
// the same pages (figures printed, nothing asserted).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/fd_passing.h"
#include "common/rope.h"
#include "gmock/gmock.h"
#include "tests/e2e_fixture.h"

namespace evoke::testing {
namespace {

using ::testing::HasSubstr;

// The canonical block of a Llama-3-8B-shaped cache: 16 tokens (one page),
// 32 layers, 8 KV heads, head_dim 128, f16. One page of one layer's K (or
// V) is 16 x 8 x 128 x 2 = 32 KiB; a block is 64 of them, 2 MiB.
constexpr uint32_t kTokens = 16;
constexpr uint32_t kLayers = 32;
constexpr uint64_t kPageBytes = uint64_t{kTokens} * 8 * 128 * 2;
constexpr uint64_t kSlicesPerBlock = 2 * kLayers;
constexpr uint64_t kBlockBytes = kSlicesPerBlock * kPageBytes;

v1::LayoutFingerprint PagedFingerprint() {
  return WithRope(CanonicalFingerprint("sg", "test/llama-8b-shape", kLayers, 8, 128),
                  v1::ROPE_NEOX, 500000);
}

// A pool laid out as a paged engine keeps it: per layer, a K cache and a V
// cache of `pages` pages each. Page p of layer l's K is at
// ((2 l) pages + p) * kPageBytes, its V at ((2 l + 1) pages + p) * kPageBytes.
// A block lives in one page index of every layer (the block table's entry).
struct Pool {
  uint64_t region = 0;
  uint8_t* data = nullptr;
  uint64_t pages = 0;
  uint64_t bytes() const { return 2 * kLayers * pages * kPageBytes; }
  uint64_t Offset(uint32_t layer, bool v, uint64_t page) const {
    return ((2 * uint64_t{layer} + (v ? 1 : 0)) * pages + page) * kPageBytes;
  }
  // The block in page `page` in canonical order (layer 0 K, layer 0 V, ...).
  v1::RegionSlices Slices(uint64_t page) const {
    v1::RegionSlices list;
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (const bool v : {false, true}) {
        v1::RegionSlice* s = list.add_slices();
        s->set_region_id(region);
        s->set_offset(Offset(l, v, page));
        s->set_length(kPageBytes);
      }
    }
    return list;
  }
  void Write(uint64_t page, const std::string& payload) const {
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (const bool v : {false, true}) {
        std::memcpy(data + Offset(l, v, page), payload.data() + (2 * l + v) * kPageBytes,
                    kPageBytes);
      }
    }
  }
  std::string Read(uint64_t page) const {
    std::string out;
    out.reserve(kBlockBytes);
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (const bool v : {false, true}) {
        out.append(reinterpret_cast<const char*>(data + Offset(l, v, page)), kPageBytes);
      }
    }
    return out;
  }
};

// Deterministic finite f16 values, |v| in [0.25, 0.5), so that RoPE stays
// finite and comparable byte for byte.
std::string F16Payload(uint64_t seed) {
  std::string s(kBlockBytes, '\0');
  uint64_t x = 0x9e3779b97f4a7c15ULL ^ (seed * 0xbf58476d1ce4e5b9ULL);
  for (uint64_t i = 0; i < s.size(); i += 2) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const uint16_t h = static_cast<uint16_t>((x & 0x83ff) | 0x3400);
    std::memcpy(&s[i], &h, 2);
  }
  return s;
}

// True when the V sections of two canonical payloads of this shape are
// byte-identical.
bool SameV(const std::string& a, const std::string& b) {
  for (uint32_t l = 0; l < kLayers; ++l) {
    const uint64_t off = (2 * l + 1) * kPageBytes;
    if (std::memcmp(a.data() + off, b.data() + off, kPageBytes) != 0) return false;
  }
  return true;
}

class ScatterGatherTest : public E2eTest {
 protected:
  virtual std::vector<std::string> DaemonFlags() const { return {"--pinned-bytes", "256MiB"}; }
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartDaemon(DaemonFlags()));
    stub_ = RawStub(daemon_->socket());
    lease_reader_ = stub_->OpenLease(&lease_context_, v1::OpenLeaseRequest());
    v1::LeaseEvent grant;
    ASSERT_TRUE(lease_reader_->Read(&grant));
    ASSERT_TRUE(grant.has_grant());
    lease_ = grant.grant().lease_id();
    fd_socket_ = grant.grant().fd_socket();
  }
  void TearDown() override {
    if (lease_reader_ != nullptr) {
      lease_context_.TryCancel();
      lease_reader_->Finish().ok();
    }
    for (const auto& [data, size] : mappings_) munmap(data, size);
  }

  // A shared-memory region of this test's lease, as the client library
  // makes one: a sealed memfd handed over on the fd socket.
  absl::StatusOr<Pool> CreatePool(uint64_t pages) {
    Pool pool;
    pool.pages = pages;
    const int fd = memfd_create("evoke-region-sg", MFD_ALLOW_SEALING | MFD_CLOEXEC);
    if (fd < 0) return absl::InternalError("memfd_create");
    if (ftruncate(fd, static_cast<off_t>(pool.bytes())) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
      close(fd);
      return absl::InternalError("ftruncate or seal");
    }
    void* data = mmap(nullptr, pool.bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) {
      close(fd);
      return absl::InternalError("mmap");
    }
    mappings_.emplace_back(data, pool.bytes());
    pool.data = static_cast<uint8_t*>(data);
    const int fds[] = {fd};
    absl::StatusOr<FdChannelReply> reply =
        SendFdChannelRequest(fd_socket_, EncodeFdChannelRequest(lease_, pool.bytes()), fds);
    close(fd);
    if (!reply.ok()) return reply.status();
    if (!reply->status.ok()) return reply->status;
    pool.region = reply->region_id;
    return pool;
  }

  v1::BlockMeta Meta(const std::string& session, uint64_t seq) const {
    return SessionMeta(PagedFingerprint(), session, seq, kTokens);
  }

  grpc::Status Save(const v1::SaveRequest& request, v1::SaveResponse* response) {
    grpc::ClientContext context;
    return stub_->Save(&context, request, response);
  }
  grpc::Status Load(const v1::LoadRequest& request, v1::LoadResponse* response) {
    grpc::ClientContext context;
    return stub_->Load(&context, request, response);
  }

  // A gather save of `metas[i]` from `pool` page `pages[i]`.
  v1::SaveRequest GatherSave(const std::vector<v1::BlockMeta>& metas, const Pool& pool,
                             const std::vector<uint64_t>& pages) const {
    v1::SaveRequest r;
    r.set_lease_id(lease_);
    for (size_t i = 0; i < metas.size(); ++i) {
      v1::SaveBlock* b = r.add_blocks();
      *b->mutable_meta() = metas[i];
      *b->mutable_gather() = pool.Slices(pages[i]);
    }
    return r;
  }
  // A scatter load of `metas[i]` into `pool` page `pages[i]`.
  v1::LoadRequest ScatterLoad(const std::vector<v1::BlockMeta>& metas, const Pool& pool,
                              const std::vector<uint64_t>& pages) const {
    v1::LoadRequest r;
    r.set_lease_id(lease_);
    *r.mutable_fingerprint() = PagedFingerprint();
    for (size_t i = 0; i < metas.size(); ++i) {
      r.add_ids(metas[i].id());
      *r.add_scatter() = pool.Slices(pages[i]);
    }
    return r;
  }

  std::unique_ptr<v1::KvTier::Stub> stub_;
  grpc::ClientContext lease_context_;
  std::unique_ptr<grpc::ClientReader<v1::LeaseEvent>> lease_reader_;
  std::string lease_;
  std::string fd_socket_;
  std::vector<std::pair<void*, uint64_t>> mappings_;
};

::testing::AssertionResult GrpcOk(const grpc::Status& s) {
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "gRPC status " << s.error_code() << ": "
                                       << s.error_message();
}

MATCHER_P2(GrpcIs, code, substring, "") {
  *result_listener << "gRPC status " << arg.error_code() << ": " << arg.error_message();
  return arg.error_code() == code &&
         arg.error_message().find(std::string(substring)) != std::string::npos;
}

std::vector<uint64_t> Permutation(uint64_t n, uint64_t seed) {
  std::vector<uint64_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  std::shuffle(v.begin(), v.end(), std::mt19937_64(seed));
  return v;
}

constexpr uint64_t kBlocks = 8;
constexpr uint64_t kPoolPages = 16;

TEST_F(ScatterGatherTest, PagesGatheredIntoBlocksAndScatteredBackByteIdentical) {
  ASSERT_OK_AND_ASSIGN(Pool src, CreatePool(kPoolPages));
  ASSERT_OK_AND_ASSIGN(Pool dst, CreatePool(kPoolPages));
  // Each block in a shuffled page of the source pool (every layer's K and V
  // page apart from the others), saved in one request of 8 x 64 slices.
  const std::vector<uint64_t> src_pages = Permutation(kPoolPages, 1);
  const std::vector<uint64_t> dst_pages = Permutation(kPoolPages, 2);
  std::vector<v1::BlockMeta> metas;
  std::vector<std::string> payloads;
  for (uint64_t b = 0; b < kBlocks; ++b) {
    metas.push_back(Meta("paged", b));
    payloads.push_back(F16Payload(b));
    src.Write(src_pages[b], payloads.back());
  }
  v1::SaveResponse saved;
  ASSERT_TRUE(GrpcOk(Save(GatherSave(metas, src, src_pages), &saved)));
  ASSERT_EQ(saved.results_size(), static_cast<int>(kBlocks));
  // The same bytes saved contiguously (inline, as other blocks) get the same
  // checksum: the gathered payload is exactly their concatenation.
  v1::SaveRequest contiguous;
  for (uint64_t b = 0; b < kBlocks; ++b) {
    v1::SaveBlock* block = contiguous.add_blocks();
    *block->mutable_meta() = Meta("contiguous", b);
    block->set_inline_bytes(payloads[b]);
  }
  v1::SaveResponse contiguous_saved;
  ASSERT_TRUE(GrpcOk(Save(contiguous, &contiguous_saved)));
  for (uint64_t b = 0; b < kBlocks; ++b) {
    EXPECT_EQ(saved.results(b).checksum(), contiguous_saved.results(b).checksum()) << b;
    EXPECT_EQ(saved.results(b).checksum(), PayloadChecksum(payloads[b].data(), kBlockBytes));
    EXPECT_FALSE(saved.results(b).deduplicated());
  }

  // Scattered back into other pages of another pool: byte-identical; the
  // pages not named stay untouched.
  std::memset(dst.data, 0xee, dst.bytes());
  v1::LoadResponse loaded;
  ASSERT_TRUE(GrpcOk(Load(ScatterLoad(metas, dst, dst_pages), &loaded)));
  ASSERT_EQ(loaded.blocks_size(), static_cast<int>(kBlocks));
  for (uint64_t b = 0; b < kBlocks; ++b) {
    EXPECT_EQ(loaded.blocks(b).meta().payload_bytes(), kBlockBytes);
    EXPECT_TRUE(loaded.blocks(b).inline_bytes().empty());
    EXPECT_TRUE(dst.Read(dst_pages[b]) == payloads[b]) << "block " << b;
  }
  for (uint64_t p = kBlocks; p < kPoolPages; ++p) {
    EXPECT_EQ(dst.Read(dst_pages[p]), std::string(kBlockBytes, '\xee')) << "page " << p;
  }
  // Inline, the gathered blocks are the contiguous bytes.
  v1::LoadRequest inline_load;
  *inline_load.mutable_fingerprint() = PagedFingerprint();
  inline_load.add_ids(metas[3].id());
  ASSERT_TRUE(GrpcOk(Load(inline_load, &loaded)));
  EXPECT_TRUE(loaded.blocks(0).inline_bytes() == payloads[3]);

  // From the spill store as well (the daemon's staging or promotion path).
  v1::FlushRequest flush;
  flush.set_evict(true);
  v1::FlushResponse flushed;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(GrpcOk(stub_->Flush(&context, flush, &flushed)));
  }
  std::memset(dst.data, 0, dst.bytes());
  ASSERT_TRUE(GrpcOk(Load(ScatterLoad(metas, dst, dst_pages), &loaded)));
  EXPECT_EQ(loaded.blocks(0).served_from(), v1::TIER_SPILL);
  for (uint64_t b = 0; b < kBlocks; ++b) {
    EXPECT_TRUE(dst.Read(dst_pages[b]) == payloads[b]) << "block " << b;
  }
}

TEST_F(ScatterGatherTest, ReanchoredScatterEqualsReanchoredContiguous) {
  ASSERT_OK_AND_ASSIGN(Pool src, CreatePool(4));
  ASSERT_OK_AND_ASSIGN(Pool dst, CreatePool(4));
  std::vector<v1::BlockMeta> metas;
  std::vector<std::string> payloads;
  const std::vector<uint64_t> src_pages = {2, 0, 3};
  const std::vector<uint64_t> dst_pages = {1, 3, 0};
  for (uint64_t b = 0; b < 3; ++b) {
    metas.push_back(Meta("anchor", b));
    payloads.push_back(F16Payload(100 + b));
    src.Write(src_pages[b], payloads.back());
  }
  v1::SaveResponse saved;
  ASSERT_TRUE(GrpcOk(Save(GatherSave(metas, src, src_pages), &saved)));

  // Block 0 moves to 4096, block 1 keeps its positions, block 2 gets
  // explicit positions (a gap in the middle).
  auto with_reanchor = [&](v1::LoadRequest r) {
    r.add_reanchor()->set_first_position(4096);
    r.add_reanchor();
    v1::Reanchor* explicit_positions = r.add_reanchor();
    for (uint32_t t = 0; t < kTokens; ++t) {
      explicit_positions->add_positions(static_cast<int32_t>(7000 + t + (t >= 8 ? 100 : 0)));
    }
    return r;
  };
  v1::LoadResponse scattered;
  ASSERT_TRUE(GrpcOk(Load(with_reanchor(ScatterLoad(metas, dst, dst_pages)), &scattered)));
  v1::LoadRequest inline_load;
  *inline_load.mutable_fingerprint() = PagedFingerprint();
  for (const v1::BlockMeta& m : metas) inline_load.add_ids(m.id());
  v1::LoadResponse contiguous;
  ASSERT_TRUE(GrpcOk(Load(with_reanchor(inline_load), &contiguous)));
  for (uint64_t b = 0; b < 3; ++b) {
    const std::string got = dst.Read(dst_pages[b]);
    EXPECT_TRUE(got == contiguous.blocks(b).inline_bytes()) << "block " << b;
    EXPECT_TRUE(SameV(got, payloads[b])) << "block " << b;
    EXPECT_EQ(scattered.blocks(b).meta().first_position(),
              contiguous.blocks(b).meta().first_position());
  }
  EXPECT_EQ(scattered.blocks(0).meta().first_position(), 4096);
  EXPECT_FALSE(dst.Read(dst_pages[0]) == payloads[0]);  // K did move.
  EXPECT_TRUE(dst.Read(dst_pages[1]) == payloads[1]);   // Delta 0: unchanged.
  EXPECT_EQ(scattered.blocks(2).meta().positions_size(), static_cast<int>(kTokens));
}

TEST_F(ScatterGatherTest, BadListsAreRefusedNamingTheFieldAndTheDaemonKeepsServing) {
  ASSERT_OK_AND_ASSIGN(Pool pool, CreatePool(2));
  const v1::BlockMeta meta = Meta("bad", 0);
  const std::string payload = F16Payload(7);
  pool.Write(0, payload);
  const v1::SaveRequest good = GatherSave({meta}, pool, {0});
  v1::SaveResponse saved;
  // Another lease's region (the fixture client's own lease).
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> others,
                       client_->CreateSharedRegion(4 << 20));

  struct SaveCase {
    const char* name;
    std::function<void(v1::SaveRequest*)> mutate;
    grpc::StatusCode code;
    std::string message;
  };
  const SaveCase save_cases[] = {
      {"outside the region",
       [&](v1::SaveRequest* r) {
         r->mutable_blocks(0)->mutable_gather()->mutable_slices(5)->set_offset(
             pool.bytes() - kPageBytes + 1);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "blocks[0].gather.slices[5]: ["},
      {"offset past the end",
       [&](v1::SaveRequest* r) {
         r->mutable_blocks(0)->mutable_gather()->mutable_slices(63)->set_offset(UINT64_MAX);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "blocks[0].gather.slices[63]: ["},
      {"another lease's region",
       [&](v1::SaveRequest* r) {
         r->mutable_blocks(0)->mutable_gather()->mutable_slices(3)->set_region_id(others->id());
       },
       grpc::StatusCode::NOT_FOUND,
       absl::StrCat("blocks[0].gather.slices[3].region_id: region ", others->id(),
                    " is not registered by this lease")},
      {"a zero-length slice",
       [&](v1::SaveRequest* r) {
         r->mutable_blocks(0)->mutable_gather()->mutable_slices(9)->set_length(0);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "blocks[0].gather.slices[9].length: must be > 0"},
      {"lengths not adding up to the shape",
       [&](v1::SaveRequest* r) {
         r->mutable_blocks(0)->mutable_gather()->mutable_slices()->RemoveLast();
       },
       grpc::StatusCode::INVALID_ARGUMENT,
       "blocks[0].gather.slices (their total length): length 2064384 does not match"},
      {"too many slices",
       [&](v1::SaveRequest* r) {
         v1::RegionSlices* g = r->mutable_blocks(0)->mutable_gather();
         g->clear_slices();
         for (int j = 0; j < 4097; ++j) {
           v1::RegionSlice* s = g->add_slices();
           s->set_region_id(pool.region);
           s->set_offset(j * 512);
           s->set_length(512);
         }
       },
       grpc::StatusCode::INVALID_ARGUMENT,
       "blocks[0].gather.slices: has 4097 slices, expected 1..4096"},
      {"no lease",
       [&](v1::SaveRequest* r) { r->clear_lease_id(); },
       grpc::StatusCode::INVALID_ARGUMENT,
       "lease_id: is required when blocks[0].gather names regions"},
  };
  for (const SaveCase& c : save_cases) {
    v1::SaveRequest r = good;
    c.mutate(&r);
    EXPECT_THAT(Save(r, &saved), GrpcIs(c.code, c.message)) << c.name;
  }
  // Nothing of it was stored.
  {
    v1::DescribeRequest describe;
    describe.set_id(meta.id());
    v1::BlockInfo info;
    grpc::ClientContext context;
    EXPECT_EQ(stub_->Describe(&context, describe, &info).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  ASSERT_TRUE(GrpcOk(Save(good, &saved)));

  const v1::LoadRequest load = ScatterLoad({meta}, pool, {1});
  v1::LoadResponse loaded;
  struct LoadCase {
    const char* name;
    std::function<void(v1::LoadRequest*)> mutate;
    grpc::StatusCode code;
    std::string message;
  };
  const LoadCase load_cases[] = {
      {"lengths short of the payload",
       [&](v1::LoadRequest* r) { r->mutable_scatter(0)->mutable_slices()->RemoveLast(); },
       grpc::StatusCode::INVALID_ARGUMENT,
       absl::StrCat("scatter[0].slices: lengths add up to ", kBlockBytes - kPageBytes,
                    " bytes, the block's payload is ", kBlockBytes, " bytes")},
      {"lengths past the payload",
       [&](v1::LoadRequest* r) {
         r->mutable_scatter(0)->mutable_slices(0)->set_length(kPageBytes + 1);
       },
       grpc::StatusCode::INVALID_ARGUMENT,
       absl::StrCat("scatter[0].slices: lengths add up to ", kBlockBytes + 1)},
      {"both destinations and scatter",
       [&](v1::LoadRequest* r) {
         v1::RegionSlice* d = r->add_destinations();
         d->set_region_id(pool.region);
         d->set_length(kBlockBytes);
       },
       grpc::StatusCode::INVALID_ARGUMENT,
       "scatter: give destinations or scatter, not both"},
      {"outside the region",
       [&](v1::LoadRequest* r) {
         r->mutable_scatter(0)->mutable_slices(40)->set_offset(pool.bytes() - 10);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "scatter[0].slices[40]: ["},
      {"another lease's region",
       [&](v1::LoadRequest* r) {
         r->mutable_scatter(0)->mutable_slices(2)->set_region_id(others->id());
       },
       grpc::StatusCode::NOT_FOUND, "scatter[0].slices[2].region_id"},
      {"too many slices",
       [&](v1::LoadRequest* r) {
         v1::RegionSlices* s = r->mutable_scatter(0);
         s->clear_slices();
         for (int j = 0; j < 4097; ++j) {
           v1::RegionSlice* slice = s->add_slices();
           slice->set_region_id(pool.region);
           slice->set_offset(j);
           slice->set_length(1);
         }
       },
       grpc::StatusCode::INVALID_ARGUMENT, "scatter[0].slices: has 4097 slices"},
      {"a list per id",
       [&](v1::LoadRequest* r) { *r->add_scatter() = r->scatter(0); },
       grpc::StatusCode::INVALID_ARGUMENT,
       "scatter: has 2 lists, expected none or one per id (1)"},
  };
  const std::string before = pool.Read(1);
  for (const LoadCase& c : load_cases) {
    v1::LoadRequest r = load;
    c.mutate(&r);
    EXPECT_THAT(Load(r, &loaded), GrpcIs(c.code, c.message)) << c.name;
  }
  EXPECT_TRUE(pool.Read(1) == before);  // Nothing was written.
  // Still serving, the good request as well.
  EXPECT_OK(client_->HealthCheck());
  ASSERT_TRUE(GrpcOk(Load(load, &loaded)));
  EXPECT_TRUE(pool.Read(1) == payload);
}

// Slices of odd lengths, so that 1 MiB checksum chunks start and end inside
// slices (and one slice spans a whole chunk): the checksum is still that of
// the concatenation, and the scatter puts every byte back in place.
TEST_F(ScatterGatherTest, OddSlicesAcrossChecksumChunks) {
  ASSERT_OK_AND_ASSIGN(Pool pool, CreatePool(4));  // 8 MiB.
  const std::vector<uint64_t> lengths = {1, 777777, 3, (1 << 20) + 5, 65536, 1234567, 7, 99};
  const uint64_t total = std::accumulate(lengths.begin(), lengths.end(), uint64_t{0});
  const std::string payload = Payload(11, total);
  // Gathered from the first 4 MiB, in reverse order of where they lie (with
  // gaps); scattered into the last 4 MiB, in another order of lengths.
  v1::SaveRequest save;
  save.set_lease_id(lease_);
  v1::SaveBlock* block = save.add_blocks();
  *block->mutable_meta() = SessionMeta(OpaqueFingerprint("sg"), "odd", 0, 1);
  uint64_t end = 4 << 20, at = 0;
  for (const uint64_t n : lengths) {
    end -= n + 13;
    std::memcpy(pool.data + end, payload.data() + at, n);
    at += n;
    v1::RegionSlice* s = block->mutable_gather()->add_slices();
    s->set_region_id(pool.region);
    s->set_offset(end);
    s->set_length(n);
  }
  v1::SaveResponse saved;
  ASSERT_TRUE(GrpcOk(Save(save, &saved)));
  EXPECT_EQ(saved.results(0).checksum(), PayloadChecksum(payload.data(), total));

  v1::LoadRequest load;
  load.set_lease_id(lease_);
  *load.mutable_fingerprint() = OpaqueFingerprint("sg");
  load.add_ids(block->meta().id());
  v1::RegionSlices* scatter = load.add_scatter();
  std::vector<std::pair<uint64_t, uint64_t>> places;  // (offset, length)
  uint64_t offset = 4 << 20;
  for (auto it = lengths.rbegin(); it != lengths.rend(); ++it) {
    v1::RegionSlice* s = scatter->add_slices();
    s->set_region_id(pool.region);
    s->set_offset(offset);
    s->set_length(*it);
    places.emplace_back(offset, *it);
    offset += *it + 5;
  }
  v1::LoadResponse loaded;
  ASSERT_TRUE(GrpcOk(Load(load, &loaded)));
  std::string back;
  for (const auto& [off, n] : places) back.append(reinterpret_cast<char*>(pool.data + off), n);
  EXPECT_TRUE(back == payload);
}

// Figures for the notes: gather-save plus scatter-load of 64 blocks of 2 MiB
// (64 pages of 32 KiB each) against memcpy of the same pages into a
// contiguous buffer and back. EVOKE_SG_BENCH=1.
// Memory per call (issue #25): with tier 1 full, blocks read from disk for a
// scatter list went through one heap copy each, held until the call
// returned, and overlapping slices let a client ask for any number of
// blocks with a 32 KiB region: one call of 4,096 ids could hold 4,096 x 64
// MiB. Now such reads go through the staging budget (--staging-bytes): four
// concurrent calls, each scattering every block into the same 32 KiB, keep
// the daemon's peak RSS within tier 1 + the budget + 64 MiB of where it was.
class ScatterMemoryTest : public ScatterGatherTest {
 protected:
  std::vector<std::string> DaemonFlags() const override {
    return {"--pinned-bytes", "32MiB", "--staging-bytes", "16MiB", "--max-block-bytes", "4MiB",
            "--max-message-bytes", "8MiB"};
  }
};

uint64_t StatusKiB(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1));
  }
  return 0;
}

TEST_F(ScatterMemoryTest, ScatterLoadsStayWithinTierOnePlusTheStagingBudget) {
  constexpr uint64_t kMany = 96;  // 192 MiB of blocks: most of them on disk.
  absl::StatusOr<Pool> pool = CreatePool(1);
  ASSERT_TRUE(pool.ok()) << pool.status();
  pool->Write(0, std::string(kBlockBytes, '\x11'));
  std::vector<v1::BlockMeta> metas;
  for (uint64_t b = 0; b < kMany; ++b) {
    metas.push_back(Meta("mem", b));
    v1::SaveResponse saved;
    ASSERT_TRUE(GrpcOk(Save(GatherSave({metas.back()}, *pool, {0}), &saved)));
  }
  // Every block scattered onto the same 32 KiB (its 64 slices overlap).
  v1::RegionSlices onto;
  for (uint64_t s = 0; s < kSlicesPerBlock; ++s) {
    v1::RegionSlice* slice = onto.add_slices();
    slice->set_region_id(pool->region);
    slice->set_offset(0);
    slice->set_length(kPageBytes);
  }
  v1::LoadRequest load;
  load.set_lease_id(lease_);
  *load.mutable_fingerprint() = PagedFingerprint();
  for (const v1::BlockMeta& m : metas) {
    load.add_ids(m.id());
    *load.add_scatter() = onto;
  }
  const pid_t pid = daemon_->pid();
  // Peak RSS from here on (writing 5 to clear_refs resets VmHWM).
  std::ofstream(absl::StrCat("/proc/", pid, "/clear_refs")) << "5";
  const uint64_t before_kib = StatusKiB(pid, "VmRSS");
  ASSERT_GT(before_kib, 0u);
  std::vector<std::thread> callers;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      for (int round = 0; round < 2; ++round) {
        v1::LoadResponse response;
        const grpc::Status s = Load(load, &response);
        EXPECT_TRUE(GrpcOk(s));
        if (s.ok()) ++ok;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(ok.load(), 8);
  const uint64_t peak_kib = StatusKiB(pid, "VmHWM");
  const uint64_t bound_kib = (32 + 16 + 64) << 10;
  EXPECT_LE(peak_kib, before_kib + bound_kib)
      << "peak RSS " << peak_kib / 1024 << " MiB, " << before_kib / 1024
      << " MiB before the loads";
  // The bytes that landed are the blocks' (the last block's last slice).
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(pool->data), 16), std::string(16, '\x11'));
}

TEST_F(ScatterGatherTest, Bench) {
  if (std::getenv("EVOKE_SG_BENCH") == nullptr) GTEST_SKIP() << "set EVOKE_SG_BENCH=1";
  constexpr uint64_t kN = 64;
  ASSERT_OK_AND_ASSIGN(Pool src, CreatePool(kN));
  ASSERT_OK_AND_ASSIGN(Pool dst, CreatePool(kN));
  const std::vector<uint64_t> src_pages = Permutation(kN, 3);
  const std::vector<uint64_t> dst_pages = Permutation(kN, 4);
  std::vector<v1::BlockMeta> metas;
  for (uint64_t b = 0; b < kN; ++b) metas.push_back(Meta("bench", b));
  for (uint64_t b = 0; b < kN; ++b) src.Write(src_pages[b], F16Payload(b));
  std::memset(dst.data, 1, dst.bytes());  // Fault the pages in.
  std::string staging(kN * kBlockBytes, '\0');
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  // Round 0 warms up (the daemon's first touch of the regions' pages) and
  // is not counted.
  const int rounds = 8;
  std::vector<v1::RegionSlices> src_lists, dst_lists;  // Built once, outside the timing.
  for (uint64_t b = 0; b < kN; ++b) {
    src_lists.push_back(src.Slices(src_pages[b]));
    dst_lists.push_back(dst.Slices(dst_pages[b]));
  }
  std::vector<double> gather_s, scatter_s, save_s, load_s;
  for (int round = 0; round < rounds; ++round) {
    Clock::time_point t0 = Clock::now();
    for (uint64_t b = 0; b < kN; ++b) {
      uint64_t off = b * kBlockBytes;
      for (const v1::RegionSlice& s : src_lists[b].slices()) {
        std::memcpy(&staging[off], src.data + s.offset(), s.length());
        off += s.length();
      }
    }
    Clock::time_point t1 = Clock::now();
    for (uint64_t b = 0; b < kN; ++b) {
      uint64_t off = b * kBlockBytes;
      for (const v1::RegionSlice& s : dst_lists[b].slices()) {
        std::memcpy(dst.data + s.offset(), &staging[off], s.length());
        off += s.length();
      }
    }
    const Clock::time_point t2 = Clock::now();
    // Save fresh ids each round (a repeated id would be deduplicated), in
    // requests of 8 blocks; then load them back scattered.
    std::vector<v1::BlockMeta> round_metas;
    for (uint64_t b = 0; b < kN; ++b) round_metas.push_back(Meta(absl::StrCat("bench", round), b));
    const Clock::time_point t3 = Clock::now();
    for (uint64_t b = 0; b < kN; b += 8) {
      std::vector<v1::BlockMeta> m(round_metas.begin() + b, round_metas.begin() + b + 8);
      std::vector<uint64_t> p(src_pages.begin() + b, src_pages.begin() + b + 8);
      v1::SaveResponse saved;
      ASSERT_TRUE(GrpcOk(Save(GatherSave(m, src, p), &saved)));
    }
    const Clock::time_point t4 = Clock::now();
    for (uint64_t b = 0; b < kN; b += 8) {
      std::vector<v1::BlockMeta> m(round_metas.begin() + b, round_metas.begin() + b + 8);
      std::vector<uint64_t> p(dst_pages.begin() + b, dst_pages.begin() + b + 8);
      v1::LoadResponse loaded;
      ASSERT_TRUE(GrpcOk(Load(ScatterLoad(m, dst, p), &loaded)));
    }
    const Clock::time_point t5 = Clock::now();
    if (round > 0) {
      gather_s.push_back(seconds(t1 - t0));
      scatter_s.push_back(seconds(t2 - t1));
      save_s.push_back(seconds(t4 - t3));
      load_s.push_back(seconds(t5 - t4));
    }
    v1::DropSessionRequest drop;
    drop.set_namespace_("sg");
    drop.set_session_id(absl::StrCat("bench", round));
    v1::DropSessionResponse dropped;
    grpc::ClientContext context;
    ASSERT_TRUE(GrpcOk(stub_->DropSession(&context, drop, &dropped)));
  }
  // Ratios per round (memcpy time / evoked time): min, median, max.
  auto spread = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return absl::StrCat(absl::SixDigits(v[v.size() / 2]), "x (", absl::SixDigits(v.front()),
                        "x .. ", absl::SixDigits(v.back()), "x)");
  };
  std::vector<double> save_ratio, load_ratio, both_ratio;
  for (size_t r = 0; r < save_s.size(); ++r) {
    save_ratio.push_back(gather_s[r] / save_s[r]);
    load_ratio.push_back(scatter_s[r] / load_s[r]);
    both_ratio.push_back((gather_s[r] + scatter_s[r]) / (save_s[r] + load_s[r]));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double gib = kN * kBlockBytes / double(1ull << 30);
  std::printf("scatter/gather bench: %llu blocks x %llu slices of %llu bytes, 8 blocks a call, "
              "%zu rounds (after one warm-up)\n",
              static_cast<unsigned long long>(kN), static_cast<unsigned long long>(kSlicesPerBlock),
              static_cast<unsigned long long>(kPageBytes), save_s.size());
  std::printf("  memcpy gather:  median %.2f ms (%.2f GiB/s)\n", median(gather_s) * 1e3,
              gib / median(gather_s));
  std::printf("  memcpy scatter: median %.2f ms (%.2f GiB/s)\n", median(scatter_s) * 1e3,
              gib / median(scatter_s));
  std::printf("  gather-save:    median %.2f ms (%.2f GiB/s); vs memcpy %s\n",
              median(save_s) * 1e3, gib / median(save_s), spread(save_ratio).c_str());
  std::printf("  scatter-load:   median %.2f ms (%.2f GiB/s); vs memcpy %s\n",
              median(load_s) * 1e3, gib / median(load_s), spread(load_ratio).c_str());
  std::printf("  save+load vs memcpy gather+scatter: %s\n", spread(both_ratio).c_str());
}

}  // namespace
}  // namespace evoke::testing
