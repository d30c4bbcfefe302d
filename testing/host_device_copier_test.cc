#include "testing/host_device_copier.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/rope.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke::testing {
namespace {

using ::testing::HasSubstr;

std::vector<uint8_t> Bytes(uint64_t seed, size_t n) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(seed);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// A canonical-v1 block with NEOX RoPE and f32 K/V: 2 layers, 2 heads,
// head_dim 8, 4 tokens at positions 10..13.
v1::BlockMeta CanonicalMeta() {
  v1::BlockMeta m;
  v1::LayoutFingerprint* fp = m.mutable_fingerprint();
  fp->set_namespace_("ns");
  fp->set_model_id("model");
  fp->set_k_dtype(v1::DTYPE_F32);
  fp->set_v_dtype(v1::DTYPE_F32);
  fp->set_n_layers(2);
  fp->set_n_kv_heads(2);
  fp->set_head_dim(8);
  fp->set_layout(v1::LAYOUT_CANONICAL_V1);
  fp->mutable_rope()->set_type(v1::ROPE_NEOX);
  fp->mutable_rope()->set_freq_base(10000);
  m.set_n_tokens(4);
  m.set_layer_begin(0);
  m.set_layer_end(2);
  m.set_first_position(10);
  return m;
}
// layers * (K, V) * tokens * heads * head_dim * sizeof(float)
constexpr uint64_t kCanonicalBytes = 2 * 2 * 4 * 2 * 8 * 4;

TEST(HostDevicesTest, AllocateAndOpenIpcAsCudaWould) {
  HostDevices gpus(2);
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation a, gpus.Allocate(1, 4096));
  EXPECT_EQ(a.ipc_handle.size(), kCudaIpcHandleBytes);
  EXPECT_EQ(a.device, 1);
  EXPECT_EQ(a.ptr[0], 0);  // Zeroed.
  ASSERT_OK_AND_ASSIGN(uint8_t* p, gpus.OpenIpc(a.ipc_handle, 1, 4096));
  EXPECT_EQ(p, a.ptr);
  EXPECT_THAT(gpus.OpenIpc(a.ipc_handle, 1, 4097),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exceed")));
  EXPECT_THAT(gpus.OpenIpc(a.ipc_handle, 0, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ipc_handle")));
  EXPECT_THAT(gpus.OpenIpc("short", 1, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("64 bytes")));
  EXPECT_THAT(gpus.OpenIpc(a.ipc_handle, 1, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(gpus.OpenIpc(a.ipc_handle, 2, 16), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(gpus.Allocate(2, 16), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(gpus.Allocate(0, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK(gpus.Free(a.ptr));
  EXPECT_THAT(gpus.OpenIpc(a.ipc_handle, 1, 16), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(gpus.Free(a.ptr), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(gpus.Open(2), StatusIs(absl::StatusCode::kUnavailable));
}

TEST(HostDevicesTest, CopiesCoalesceAndStayInsideAllocations) {
  HostDevices gpus;
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation dev, gpus.Allocate(0, 3000));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceOps> ops, gpus.Open(0));
  EXPECT_EQ(ops->device(), 0);
  const std::vector<uint8_t> src = Bytes(1, 3000);
  // Three adjacent ops: one copy.
  const CopyOp up[] = {{dev.ptr, src.data(), 1000},
                       {dev.ptr + 1000, src.data() + 1000, 1000},
                       {dev.ptr + 2000, src.data() + 2000, 1000}};
  ASSERT_OK(ops->HostToDevice(up));
  EXPECT_EQ(std::memcmp(dev.ptr, src.data(), 3000), 0);
  std::vector<uint8_t> back(3000);
  // Two non-adjacent ops: two copies.
  const CopyOp down[] = {{back.data() + 2000, dev.ptr + 2000, 1000},
                         {back.data(), dev.ptr, 2000}};
  ASSERT_OK(ops->DeviceToHost(down));
  EXPECT_EQ(back, src);
  HostDevices::Counters c = gpus.counters();
  EXPECT_EQ(c.copy_ops, 5u);
  EXPECT_EQ(c.copies, 3u);
  EXPECT_EQ(c.bytes_to_device, 3000u);
  EXPECT_EQ(c.bytes_to_host, 3000u);

  // A device range past the allocation, host memory taken for device
  // memory, or another device's memory: a fault, nothing copied.
  const CopyOp past[] = {{back.data(), dev.ptr + 2001, 1000}};
  EXPECT_THAT(ops->DeviceToHost(past),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("IllegalAddress")));
  std::vector<uint8_t> host(16);
  const CopyOp wrong_way[] = {{host.data(), src.data(), 16}};
  EXPECT_THAT(ops->HostToDevice(wrong_way), StatusIs(absl::StatusCode::kInternal));
  EXPECT_EQ(host, std::vector<uint8_t>(16));
  HostDevices two(2);
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation on1, two.Allocate(1, 64));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceOps> ops0, two.Open(0));
  const CopyOp other[] = {{on1.ptr, src.data(), 64}};
  EXPECT_THAT(ops0->HostToDevice(other), StatusIs(absl::StatusCode::kInternal));
}

TEST(HostDevicesTest, ChecksumsMatchTheHostAndCheckTheirArguments) {
  HostDevices gpus;
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation dev, gpus.Allocate(0, 2 * kChecksumChunkBytes));
  const std::vector<uint8_t> data = Bytes(2, 2 * kChecksumChunkBytes);
  std::memcpy(dev.ptr, data.data(), data.size());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceOps> ops, gpus.Open(0));
  const DeviceRange ranges[] = {{dev.ptr, kChecksumChunkBytes},
                                {dev.ptr + kChecksumChunkBytes, kDeviceChecksumMinBytes}};
  uint64_t out[2] = {};
  ASSERT_OK(ops->ChunkChecksums(ranges, absl::MakeSpan(out)));
  EXPECT_EQ(out[0], ChunkChecksum(data.data(), kChecksumChunkBytes));
  EXPECT_EQ(out[1], ChunkChecksum(data.data() + kChecksumChunkBytes, kDeviceChecksumMinBytes));
  EXPECT_EQ(gpus.counters().checksum_ranges, 2u);

  const DeviceRange too_short[] = {{dev.ptr, kDeviceChecksumMinBytes - 1}};
  EXPECT_THAT(ops->ChunkChecksums(too_short, absl::MakeSpan(out, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ranges[0]")));
  const DeviceRange too_long[] = {{dev.ptr, kChecksumChunkBytes + 1}};
  EXPECT_THAT(ops->ChunkChecksums(too_long, absl::MakeSpan(out, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ops->ChunkChecksums(ranges, absl::MakeSpan(out, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out")));
  const DeviceRange host_range[] = {{data.data(), 4096}};
  EXPECT_THAT(ops->ChunkChecksums(host_range, absl::MakeSpan(out, 1)),
              StatusIs(absl::StatusCode::kInternal));
  EXPECT_OK(ops->ChunkChecksums({}, {}));
}

TEST(HostDevicesTest, ReanchorIsTheCpuReferenceInPlace) {
  HostDevices gpus;
  const v1::BlockMeta meta = CanonicalMeta();
  ASSERT_OK_AND_ASSIGN(RopePlan plan, MakeRopePlan(meta.fingerprint()));
  // f32 values in [-1, 1).
  std::vector<uint8_t> payload(kCanonicalBytes);
  std::mt19937 rng(3);
  for (size_t i = 0; i < payload.size(); i += 4) {
    const float f = static_cast<float>(rng() % 2000) / 1000.0f - 1.0f;
    std::memcpy(&payload[i], &f, 4);
  }
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation dev, gpus.Allocate(0, kCanonicalBytes));
  std::memcpy(dev.ptr, payload.data(), payload.size());
  const std::vector<int64_t> delta = {5, 5, 5, 5};
  std::vector<uint8_t> expect = payload;
  ASSERT_OK(ReanchorCanonicalBlock(plan, meta, expect.data(), expect.size(), delta));
  ASSERT_NE(expect, payload);

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceOps> ops, gpus.Open(0));
  const DeviceReanchorJob job{&plan, &meta, dev.ptr, kCanonicalBytes, delta};
  ASSERT_OK(ops->ReanchorCanonicalBlocks({&job, 1}));
  EXPECT_EQ(std::memcmp(dev.ptr, expect.data(), expect.size()), 0);
  EXPECT_EQ(gpus.counters().reanchor_jobs, 1u);

  // Nothing to do: no delta. Bad shapes and host memory are refused before
  // any block is touched.
  const std::vector<int64_t> zero = {0, 0, 0, 0};
  const DeviceReanchorJob noop{&plan, &meta, nullptr, kCanonicalBytes, zero};
  EXPECT_OK(ops->ReanchorCanonicalBlocks({&noop, 1}));
  EXPECT_EQ(gpus.counters().reanchor_jobs, 1u);
  std::memcpy(dev.ptr, payload.data(), payload.size());
  const std::vector<int64_t> short_delta = {1, 2};
  const DeviceReanchorJob jobs[] = {{&plan, &meta, dev.ptr, kCanonicalBytes, delta},
                                    {&plan, &meta, dev.ptr, kCanonicalBytes, short_delta}};
  EXPECT_THAT(ops->ReanchorCanonicalBlocks(jobs), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(std::memcmp(dev.ptr, payload.data(), payload.size()), 0);
  const DeviceReanchorJob on_host{&plan, &meta, payload.data(), kCanonicalBytes, delta};
  EXPECT_THAT(ops->ReanchorCanonicalBlocks({&on_host, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device_payload")));
}

TEST(HostDevicesTest, InjectedFailuresAndBadLandings) {
  HostDevices gpus;
  gpus.FailNext(DeviceOp::kOpen, 1, absl::UnavailableError("injected: driver gone"));
  EXPECT_THAT(gpus.Open(0), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("injected")));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceOps> ops, gpus.Open(0));
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation dev, gpus.Allocate(0, 256));
  const std::vector<uint8_t> src = Bytes(4, 256);
  const CopyOp up[] = {{dev.ptr, src.data(), 256}};
  gpus.FailNext(DeviceOp::kHostToDevice, -1, absl::InternalError("injected: ECC"));
  EXPECT_THAT(ops->HostToDevice(up), StatusIs(absl::StatusCode::kInternal));
  EXPECT_THAT(ops->HostToDevice(up), StatusIs(absl::StatusCode::kInternal));
  EXPECT_EQ(dev.ptr[0], 0);  // Nothing copied.
  gpus.ClearFaults();
  gpus.CorruptNextHostToDevice(1);
  ASSERT_OK(ops->HostToDevice(up));
  EXPECT_EQ(dev.ptr[0], src[0] ^ 1);
  EXPECT_EQ(std::memcmp(dev.ptr + 1, src.data() + 1, 255), 0);
  ASSERT_OK(ops->HostToDevice(up));  // Only the next one.
  EXPECT_EQ(std::memcmp(dev.ptr, src.data(), 256), 0);
  EXPECT_EQ(gpus.counters().calls_of(DeviceOp::kHostToDevice), 4u);
  EXPECT_EQ(gpus.counters().calls_of(DeviceOp::kOpen), 2u);
}


// Forwards the batch primitives and keeps DeviceOps' default FetchBlocks /
// LandBlocks (sequential: copy, then hash, then re-anchor).
class SequentialOps final : public DeviceOps {
 public:
  explicit SequentialOps(std::unique_ptr<DeviceOps> inner) : inner_(std::move(inner)) {}
  int device() const override { return inner_->device(); }
  absl::Status DeviceToHost(absl::Span<const CopyOp> ops) override {
    return inner_->DeviceToHost(ops);
  }
  absl::Status HostToDevice(absl::Span<const CopyOp> ops) override {
    return inner_->HostToDevice(ops);
  }
  absl::Status ChunkChecksums(absl::Span<const DeviceRange> r, absl::Span<uint64_t> o) override {
    return inner_->ChunkChecksums(r, o);
  }
  absl::Status ReanchorCanonicalBlocks(absl::Span<const DeviceReanchorJob> jobs) override {
    return inner_->ReanchorCanonicalBlocks(jobs);
  }

 private:
  std::unique_ptr<DeviceOps> inner_;
};

std::vector<uint8_t> CanonicalPayload(uint64_t seed) {
  std::vector<uint8_t> payload(kCanonicalBytes);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (size_t i = 0; i < payload.size(); i += 4) {
    const float f = static_cast<float>(rng() % 2000) / 1000.0f - 1.0f;
    std::memcpy(&payload[i], &f, 4);
  }
  return payload;
}

// A Load of 3 canonical blocks (two re-anchored) and a 5 MiB + 300 opaque
// block, through LandBlocks, against the CPU: what lands is the host's bytes
// re-anchored by ReanchorCanonicalBlock, and each checksum is the host's
// PayloadChecksum of the stored bytes. Every interleaving seed, and the
// sequential default, give the same.
TEST(HostDevicesTest, LandBlocksVerifiesAndReanchorsAsTheCpuDoes) {
  const v1::BlockMeta meta = CanonicalMeta();
  ASSERT_OK_AND_ASSIGN(RopePlan plan, MakeRopePlan(meta.fingerprint()));
  const std::vector<int64_t> delta = {5, 5, 5, 5};
  const uint64_t big = 5 * kChecksumChunkBytes + 300;
  std::vector<std::vector<uint8_t>> host = {CanonicalPayload(1), CanonicalPayload(2),
                                            CanonicalPayload(3), Bytes(9, big)};
  std::vector<std::vector<uint8_t>> expect = host;
  ASSERT_OK(ReanchorCanonicalBlock(plan, meta, expect[0].data(), kCanonicalBytes, delta));
  ASSERT_OK(ReanchorCanonicalBlock(plan, meta, expect[2].data(), kCanonicalBytes, delta));
  PipelineOptions options;
  options.chunk_bytes = kChecksumChunkBytes;  // More pieces, more interleavings.
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    HostDevices gpus(1, options, seed);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceOps> ops, gpus.Open(0));
    if (seed == 6) ops = std::make_unique<SequentialOps>(std::move(ops));
    ASSERT_OK_AND_ASSIGN(HostDevices::Allocation dev, gpus.Allocate(0, 8 << 20));
    uint8_t* dst[] = {dev.ptr, dev.ptr + 1024, dev.ptr + 2048, dev.ptr + (2 << 20) + 3};
    const DeviceReanchorJob jobs[] = {{&plan, &meta, dst[0], kCanonicalBytes, delta},
                                      {&plan, &meta, dst[2], kCanonicalBytes, delta}};
    const LandingBlock blocks[] = {
        {host[0].data(), dst[0], kCanonicalBytes, true, &jobs[0]},
        {host[1].data(), dst[1], kCanonicalBytes, true, nullptr},
        {host[2].data(), dst[2], kCanonicalBytes, true, &jobs[1]},
        {host[3].data(), dst[3], big, true, nullptr},
    };
    std::vector<uint64_t> sums(4);
    ASSERT_OK(ops->LandBlocks(blocks, absl::MakeSpan(sums)));
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(sums[i], PayloadChecksum(host[i].data(), host[i].size())) << i;
      EXPECT_EQ(std::memcmp(dst[i], expect[i].data(), expect[i].size()), 0) << i;
    }
    const HostDevices::Counters c = gpus.counters();
    EXPECT_EQ(c.reanchor_jobs, 2u);
    if (seed < 6) {
      EXPECT_EQ(c.plans, 1u);
      EXPECT_EQ(c.calls_of(DeviceOp::kLandBlocks), 1u);
      EXPECT_EQ(c.max_streams, 4u);  // checksum, re-anchor, 2 copy streams
      EXPECT_GE(c.checksum_steps, 5u);  // one per landed group
    }
  }
}

TEST(HostDevicesTest, LandBlocksReportsABadLandingAndRefusesBadJobs) {
  HostDevices gpus;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceOps> ops, gpus.Open(0));
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation dev, gpus.Allocate(0, 4096));
  const std::vector<uint8_t> src = Bytes(5, 4096);
  const LandingBlock block{src.data(), dev.ptr, 4096, true, nullptr};
  std::vector<uint64_t> sums(1);
  gpus.CorruptNextHostToDevice(1);
  ASSERT_OK(ops->LandBlocks({&block, 1}, absl::MakeSpan(sums)));
  EXPECT_NE(sums[0], PayloadChecksum(src.data(), src.size()));  // The caller sees it.
  ASSERT_OK(ops->LandBlocks({&block, 1}, absl::MakeSpan(sums)));
  EXPECT_EQ(sums[0], PayloadChecksum(src.data(), src.size()));
  // A job with a bad delta is refused before a byte moves.
  const v1::BlockMeta meta = CanonicalMeta();
  ASSERT_OK_AND_ASSIGN(RopePlan plan, MakeRopePlan(meta.fingerprint()));
  std::memset(dev.ptr, 0, 4096);
  const std::vector<int64_t> short_delta = {1};
  const DeviceReanchorJob bad{&plan, &meta, dev.ptr, kCanonicalBytes, short_delta};
  const LandingBlock with_bad{src.data(), dev.ptr, kCanonicalBytes, true, &bad};
  EXPECT_THAT(ops->LandBlocks({&with_bad, 1}, absl::MakeSpan(sums)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(dev.ptr[0], 0);
  // Past the allocation: the device would fault; nothing is copied.
  const LandingBlock past{src.data(), dev.ptr + 1, 4096, true, nullptr};
  EXPECT_THAT(ops->LandBlocks({&past, 1}, absl::MakeSpan(sums)),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("illegal")));
  EXPECT_EQ(dev.ptr[0], 0);
  EXPECT_THAT(ops->LandBlocks({&block, 1}, {}), StatusIs(absl::StatusCode::kInvalidArgument));
  gpus.FailNext(DeviceOp::kLandBlocks, 1, absl::UnavailableError("injected"));
  EXPECT_THAT(ops->LandBlocks({&block, 1}, absl::MakeSpan(sums)),
              StatusIs(absl::StatusCode::kUnavailable));
}

TEST(HostDevicesTest, FetchBlocksCopiesAndHashesTheDeviceBytes) {
  const std::vector<uint8_t> content = Bytes(1, 16 << 20);
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    HostDevices gpus(1, {}, seed);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceOps> ops, gpus.Open(0));
    if (seed == 3) ops = std::make_unique<SequentialOps>(std::move(ops));
    const uint64_t sizes[] = {100, 3 * kChecksumChunkBytes + 241, 9 << 20};
    ASSERT_OK_AND_ASSIGN(HostDevices::Allocation dev, gpus.Allocate(0, 16 << 20));
    std::memcpy(dev.ptr, content.data(), content.size());
    std::vector<uint8_t> host(16 << 20);
    const FetchBlock blocks[] = {
        {dev.ptr + 7, host.data(), sizes[0], true},
        {dev.ptr + 4096, host.data() + 4096, sizes[1], true},
        {dev.ptr + (5 << 20), host.data() + (5 << 20), sizes[2], false},
    };
    std::vector<uint64_t> sums(3);
    ASSERT_OK(ops->FetchBlocks(blocks, absl::MakeSpan(sums)));
    EXPECT_EQ(sums[0], PayloadChecksum(content.data() + 7, sizes[0]));
    EXPECT_EQ(sums[1], PayloadChecksum(content.data() + 4096, sizes[1]));
    EXPECT_EQ(sums[2], 0u);
    for (const FetchBlock& b : blocks) {
      EXPECT_EQ(std::memcmp(b.host_dst, b.device_src, b.bytes), 0);
    }
    if (seed < 3) {
      const HostDevices::Counters c = gpus.counters();
      EXPECT_EQ(c.checksum_steps, 1u);  // one launch beside the copies
      EXPECT_EQ(c.checksum_ranges, 4u);
      EXPECT_EQ(c.copies, 4u);  // the 9 MiB block in two pieces
    }
  }
  HostDevices gpus;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceOps> ops, gpus.Open(0));
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation dev, gpus.Allocate(0, 4096));
  std::vector<uint8_t> host(8192, 0);
  const FetchBlock past{dev.ptr, host.data(), 8192, true};
  std::vector<uint64_t> sums(1);
  EXPECT_THAT(ops->FetchBlocks({&past, 1}, absl::MakeSpan(sums)),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("illegal")));
}

TEST(HostDevicesTest, PagedCopiesAreOneBatchedCall) {
  // 64 scattered 16 KiB pages (a paged cache gathered into one block): one
  // batched copy call each way, never one per page.
  HostDevices gpus;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceOps> ops, gpus.Open(0));
  ASSERT_OK_AND_ASSIGN(HostDevices::Allocation dev, gpus.Allocate(0, 128 * 16384));
  const std::vector<uint8_t> src = Bytes(11, 64 * 16384);
  std::vector<CopyOp> up, down;
  std::vector<uint8_t> back(64 * 16384);
  for (int i = 0; i < 64; ++i) {
    up.push_back({dev.ptr + (127 - 2 * i) * 16384, src.data() + i * 16384, 16384});
    down.push_back({back.data() + i * 16384, dev.ptr + (127 - 2 * i) * 16384, 16384});
  }
  ASSERT_OK(ops->HostToDevice(up));
  ASSERT_OK(ops->DeviceToHost(down));
  EXPECT_EQ(back, src);
  const HostDevices::Counters c = gpus.counters();
  EXPECT_EQ(c.copy_ops, 128u);
  EXPECT_EQ(c.copies, 128u);
  EXPECT_EQ(c.copy_steps, 2u);
}

}  // namespace
}  // namespace evoke::testing
