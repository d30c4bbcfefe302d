// The pipelined copier on a real GPU (DeviceCopier::Execute through
// CudaDeviceOps' FetchBlocks / LandBlocks and the batched DeviceToHost /
// HostToDevice), against the CPU: PayloadChecksum and ReanchorCanonicalBlock.
// The same plans run on the host fake in testing/host_device_copier_test.cc;
// here only what CUDA adds (streams, events, cudaMemcpyBatchAsync, the async
// kernels) is checked. Skips without a device.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/checksum.h"
#include "common/rope.h"
#include "gpu/cuda_test_util.h"
#include "gpu/device_ops.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

std::vector<uint8_t> Random(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t x = rng();
    std::memcpy(v.data() + i, &x, std::min<size_t>(8, n - i));
  }
  return v;
}

struct DeviceMemory {
  explicit DeviceMemory(size_t n) { EXPECT_EQ(cudaMalloc(&ptr, n), cudaSuccess); }
  ~DeviceMemory() { cudaFree(ptr); }
  uint8_t* get() const { return static_cast<uint8_t*>(ptr); }
  void* ptr = nullptr;
};

struct PinnedMemory {
  explicit PinnedMemory(size_t n) { EXPECT_EQ(cudaMallocHost(&ptr, n), cudaSuccess); }
  ~PinnedMemory() { cudaFreeHost(ptr); }
  uint8_t* get() const { return static_cast<uint8_t*>(ptr); }
  void* ptr = nullptr;
};

TEST(PipelinedCopierTest, FetchHashesOnTheDeviceWhileCopying) {
  EVOKE_REQUIRE_CUDA_DEVICE();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceOps> ops, CudaDeviceOps()->Open(0));
  const size_t total = 40 * kMiB;
  const std::vector<uint8_t> content = Random(total, 1);
  DeviceMemory dev(total);
  ASSERT_EQ(cudaMemcpy(dev.get(), content.data(), total, cudaMemcpyHostToDevice), cudaSuccess);
  PinnedMemory host(total);
  std::memset(host.get(), 0, total);
  const uint64_t sizes[] = {100, 3 * kMiB + 241, 16 * kMiB, 9 * kMiB + 5};
  const uint64_t offsets[] = {7, 4096, 8 * kMiB, 25 * kMiB};
  std::vector<FetchBlock> blocks;
  for (int i = 0; i < 4; ++i) {
    blocks.push_back({dev.get() + offsets[i], host.get() + offsets[i], sizes[i], i != 3});
  }
  std::vector<uint64_t> sums(blocks.size());
  ASSERT_OK(ops->FetchBlocks(blocks, absl::MakeSpan(sums)));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(std::memcmp(host.get() + offsets[i], content.data() + offsets[i], sizes[i]), 0);
    EXPECT_EQ(sums[i], i == 3 ? 0 : PayloadChecksum(content.data() + offsets[i], sizes[i])) << i;
  }
}

TEST(PipelinedCopierTest, PagedCopiesBatchBothWays) {
  EVOKE_REQUIRE_CUDA_DEVICE();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceOps> ops, CudaDeviceOps()->Open(0));
  constexpr size_t kPage = 16 << 10;
  DeviceMemory dev(512 * kPage);
  PinnedMemory host(256 * kPage);
  const std::vector<uint8_t> src = Random(256 * kPage, 2);
  std::vector<CopyOp> up, down;
  for (size_t i = 0; i < 256; ++i) {
    up.push_back({dev.get() + (511 - 2 * i) * kPage, src.data() + i * kPage, kPage});
    down.push_back({host.get() + i * kPage, dev.get() + (511 - 2 * i) * kPage, kPage});
  }
  ASSERT_OK(ops->HostToDevice(up));  // pageable source: staged by the driver
  ASSERT_OK(ops->DeviceToHost(down));
  EXPECT_EQ(std::memcmp(host.get(), src.data(), src.size()), 0);
}

TEST(PipelinedCopierTest, LandVerifiesAndReanchorsAsTheCpu) {
  EVOKE_REQUIRE_CUDA_DEVICE();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceOps> ops, CudaDeviceOps()->Open(0));
  // Canonical blocks of 8 layers, 4 heads of 128, 256 tokens, bf16 K/V: 4 MiB
  // each, so each lands in two pieces and is re-anchored while the next lands.
  const uint32_t layers = 8, heads = 4, dim = 128, tokens = 256;
  v1::BlockMeta meta;
  *meta.mutable_fingerprint() = testing::CanonicalFingerprint(
      v1::ROPE_NEOX, v1::DTYPE_BF16, v1::DTYPE_BF16, layers, heads, dim);
  meta.set_n_tokens(tokens);
  meta.set_layer_begin(0);
  meta.set_layer_end(layers);
  meta.set_first_position(100);
  const uint64_t bytes = uint64_t{layers} * 2 * tokens * heads * dim * 2;
  ASSERT_OK_AND_ASSIGN(const RopePlan plan, MakeRopePlan(meta.fingerprint()));
  const std::vector<int64_t> delta(tokens, 4000);
  constexpr int kBlocks = 5;
  std::vector<std::vector<uint8_t>> host(kBlocks), expect(kBlocks);
  for (int b = 0; b < kBlocks; ++b) {
    host[b].resize(bytes);
    std::mt19937 rng(b);
    for (uint64_t i = 0; i < bytes; i += 2) {
      testing::StoreAs(v1::DTYPE_BF16, host[b].data() + i,
                       static_cast<float>(rng() % 2000) / 1000.0f - 1.0f);
    }
    expect[b] = host[b];
    if (b != 2) {
      ASSERT_OK(ReanchorCanonicalBlock(plan, meta, expect[b].data(), bytes, delta));
    }
  }
  DeviceMemory dev(kBlocks * bytes + 4096);
  std::vector<DeviceReanchorJob> jobs(kBlocks);
  std::vector<LandingBlock> blocks;
  for (int b = 0; b < kBlocks; ++b) {
    uint8_t* dst = dev.get() + b * bytes + 16;
    jobs[b] = DeviceReanchorJob{&plan, &meta, dst, bytes, delta};
    blocks.push_back({host[b].data(), dst, bytes, true, b == 2 ? nullptr : &jobs[b]});
  }
  std::vector<uint64_t> sums(kBlocks);
  ASSERT_OK(ops->LandBlocks(blocks, absl::MakeSpan(sums)));
  std::vector<uint8_t> back(bytes);
  for (int b = 0; b < kBlocks; ++b) {
    EXPECT_EQ(sums[b], PayloadChecksum(host[b].data(), bytes)) << b;
    ASSERT_EQ(cudaMemcpy(back.data(), blocks[b].device_dst, bytes, cudaMemcpyDeviceToHost),
              cudaSuccess);
    // The GPU's rotation matches the CPU's within 1 ulp of bf16 at the pair
    // magnitude (rope_device_test.cc); magnitudes here are below 2, so 1/128.
    // V and unrotated blocks are byte-identical.
    size_t off = 0;
    for (; off < bytes; off += 2) {
      const double a = testing::LoadAs(v1::DTYPE_BF16, back.data() + off);
      const double e = testing::LoadAs(v1::DTYPE_BF16, expect[b].data() + off);
      if (std::fabs(a - e) > 1.0 / 128) break;
    }
    EXPECT_EQ(off, bytes) << "block " << b << " differs at byte " << off;
    if (b == 2) {
      EXPECT_EQ(back, host[b]);
    } else {
      EXPECT_NE(back, host[b]);
    }
  }
}

}  // namespace
}  // namespace evoke
