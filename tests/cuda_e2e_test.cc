// CUDA IPC end to end: this process is the engine (device KV pool exported
// by IPC handle), evoked the daemon. Needs a GPU; skips with the reason
// otherwise. gpu/device_check.sh runs it on a GPU machine.
#include <cuda_runtime_api.h>

#include <cstring>
#include <random>

#include "common/block_validation.h"
#include "gmock/gmock.h"
#include "tests/e2e_fixture.h"

namespace evoke::testing {
namespace {

using ::testing::HasSubstr;

bool HaveGpu(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    *why = std::string("no CUDA device: ") + cudaGetErrorString(e);
    return false;
  }
  return true;
}

class CudaE2eTest : public E2eTest {
 protected:
  void SetUp() override {
    std::string why;
    if (!HaveGpu(&why)) GTEST_SKIP() << why;
    StartDaemon({"--pinned-bytes", "256MiB"});
    ASSERT_TRUE(Stat().cuda_available()) << daemon_->Log();
  }
  void TearDown() override {
    if (pool_ != nullptr) cudaFree(pool_);
  }
  // A device pool of `bytes`, host pattern copied in, IPC-registered.
  uint64_t MakePool(uint64_t bytes) {
    EXPECT_EQ(cudaMalloc(&pool_, bytes), cudaSuccess);
    host_.resize(bytes);
    FillPayload(42, host_.data(), bytes);
    EXPECT_EQ(cudaMemcpy(pool_, host_.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    cudaIpcMemHandle_t h;
    EXPECT_EQ(cudaIpcGetMemHandle(&h, pool_), cudaSuccess);
    handle_.assign(reinterpret_cast<const char*>(&h), sizeof(h));
    absl::StatusOr<uint64_t> id = client_->RegisterCudaRegion(handle_, 0, bytes);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : 0;
  }
  v1::RegionSlice Slice(uint64_t region, uint64_t offset, uint64_t length) {
    v1::RegionSlice s;
    s.set_region_id(region);
    s.set_offset(offset);
    s.set_length(length);
    return s;
  }

  void* pool_ = nullptr;
  std::vector<uint8_t> host_;
  std::string handle_;
};

TEST_F(CudaE2eTest, SaveFromDeviceLoadToDeviceByteIdentical) {
  constexpr uint64_t kPool = 64 << 20, kBlock = 1 << 20;  // 512 tokens x 2 KiB.
  const uint64_t region = MakePool(kPool);
  EXPECT_EQ(Stat().leases().cuda_regions(), 1u);
  std::vector<TestBlock> blocks;
  std::vector<BlockToSave> batch;
  for (int i = 0; i < 16; ++i) {
    blocks.push_back(SessionBlock("gpu", i, 512));
    ASSERT_EQ(blocks.back().payload.size(), kBlock);
    // The payload is whatever the device holds at that offset.
    blocks.back().payload.assign(reinterpret_cast<const char*>(host_.data() + i * kBlock), kBlock);
    batch.emplace_back(blocks.back().meta, Slice(region, i * kBlock, kBlock));
  }
  ASSERT_OK(client_->Save(batch));
  // Inline load: the bytes that left the device are the ones stored.
  std::vector<BlockId> ids;
  for (const TestBlock& b : blocks) ids.push_back(b.id());
  ASSERT_OK_AND_ASSIGN(std::vector<LoadedBlock> back, client_->Load(ids, SmallFingerprint()));
  for (size_t i = 0; i < blocks.size(); ++i) ASSERT_EQ(back[i].payload, blocks[i].payload) << i;
  // Device load into the second half, reversed; then check on the device.
  std::vector<v1::RegionSlice> dests;
  for (size_t i = 0; i < blocks.size(); ++i) {
    dests.push_back(Slice(region, kPool / 2 + (blocks.size() - 1 - i) * kBlock, kBlock));
  }
  ASSERT_EQ(cudaMemset(static_cast<char*>(pool_) + kPool / 2, 0, kPool / 2), cudaSuccess);
  ASSERT_OK_AND_ASSIGN(std::vector<LoadedBlock> loaded,
                       client_->LoadInto(ids, SmallFingerprint(), dests));
  std::vector<uint8_t> check(kPool / 2);
  ASSERT_EQ(cudaMemcpy(check.data(), static_cast<char*>(pool_) + kPool / 2, kPool / 2,
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_EQ(std::memcmp(check.data() + dests[i].offset() - kPool / 2,
                          blocks[i].payload.data(), kBlock),
              0)
        << i;
  }
  // From tier 2 straight to the device too.
  ASSERT_OK(client_->Flush(/*evict=*/true));
  ASSERT_EQ(cudaMemset(static_cast<char*>(pool_) + kPool / 2, 0, kPool / 2), cudaSuccess);
  ASSERT_OK_AND_ASSIGN(loaded, client_->LoadInto(ids, SmallFingerprint(), dests));
  EXPECT_EQ(loaded[0].served_from, v1::TIER_SPILL);
  ASSERT_EQ(cudaMemcpy(check.data(), static_cast<char*>(pool_) + kPool / 2, kPool / 2,
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_EQ(std::memcmp(check.data() + dests[i].offset() - kPool / 2,
                          blocks[i].payload.data(), kBlock),
              0)
        << i;
  }
  ASSERT_OK(client_->UnregisterRegion(region));
  EXPECT_EQ(Stat().leases().cuda_regions(), 0u);
}

TEST_F(CudaE2eTest, SpliceOnTheGpuMatchesTheHostSplice) {
  // Canonical f16 blocks (SmallFingerprint: NEOX) saved from the device as
  // session blocks (checksummed on the GPU) and as a prefix block
  // (checksummed from tier 1); loaded back to the device re-anchored (K
  // rotated on the GPU) and compared with the same load done on the host.
  constexpr uint32_t kTokens = 64;
  const uint64_t block = CanonicalPayloadBytes(SmallFingerprint(), kTokens, 4).value();
  const uint64_t region = MakePool(8 * block);
  // Make the pool hold finite f16 values: 0x3800 + i % 1024 in [0.5, 1).
  std::vector<uint16_t> halves(4 * block / 2);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(0x3800 + i % 1024);
  ASSERT_EQ(cudaMemcpy(pool_, halves.data(), 4 * block, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<BlockToSave> batch;
  std::vector<BlockId> ids;
  for (int i = 0; i < 3; ++i) {
    batch.emplace_back(SessionBlockMeta(SmallFingerprint(), "splice", i, kTokens, 0, 4, i * kTokens),
                       Slice(region, i * block, block));
    ids.push_back(BlockIdOf(batch.back().meta));
  }
  std::vector<int32_t> tokens(kTokens);
  for (uint32_t t = 0; t < kTokens; ++t) tokens[t] = 5 + t;
  batch.emplace_back(PrefixBlockMeta(SmallFingerprint(), BlockId(), tokens, 0, 4, 0),
                     Slice(region, 3 * block, block));
  ids.push_back(BlockIdOf(batch.back().meta));
  ASSERT_OK(client_->Save(batch));
  std::vector<int32_t> new_first = {1000, 2000, 70, 0};  // The prefix block stays put.
  ASSERT_OK_AND_ASSIGN(std::vector<LoadedBlock> host,
                       client_->LoadReanchored(ids, SmallFingerprint(), new_first));
  std::vector<v1::Reanchor> reanchor(4);
  std::vector<v1::RegionSlice> dests;
  for (int i = 0; i < 4; ++i) {
    reanchor[i].set_first_position(new_first[i]);
    dests.push_back(Slice(region, (4 + i) * block, block));
  }
  ASSERT_OK_AND_ASSIGN(std::vector<LoadedBlock> device,
                       client_->LoadWith(ids, SmallFingerprint(), reanchor, dests));
  EXPECT_EQ(device[0].meta.first_position(), 1000);
  std::vector<uint16_t> got(4 * block / 2);
  ASSERT_EQ(cudaMemcpy(got.data(), static_cast<char*>(pool_) + 4 * block, 4 * block,
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  // GPU and CPU rotations agree to within one f16 ulp.
  int worse_than_one_ulp = 0;
  for (int b = 0; b < 4; ++b) {
    const auto* h = reinterpret_cast<const uint16_t*>(host[b].payload.data());
    for (uint64_t i = 0; i < block / 2; ++i) {
      const int d = std::abs(static_cast<int>(got[b * block / 2 + i]) - static_cast<int>(h[i]));
      if (d > 1) ++worse_than_one_ulp;
    }
  }
  EXPECT_EQ(worse_than_one_ulp, 0);
  // Delta 0 (the prefix block at its place): byte-identical to what was saved.
  EXPECT_EQ(std::memcmp(got.data() + 3 * block / 2, halves.data() + 3 * block / 2, block), 0);
}

TEST_F(CudaE2eTest, BatchedSmallBlocksCoalesce) {
  constexpr uint64_t kBlock = 64 << 10;  // 32 tokens x 2 KiB.
  const uint64_t region = MakePool(32 << 20);
  std::vector<BlockToSave> batch;
  std::vector<BlockId> ids;
  std::vector<v1::RegionSlice> dests;
  for (int i = 0; i < 128; ++i) {
    const TestBlock b = SessionBlock("small", i, 32);
    batch.emplace_back(b.meta, Slice(region, i * kBlock, kBlock));
    ids.push_back(b.id());
    dests.push_back(Slice(region, (16 << 20) + i * kBlock, kBlock));
  }
  ASSERT_OK(client_->Save(batch));
  ASSERT_OK(client_->LoadInto(ids, SmallFingerprint(), dests));
  std::vector<uint8_t> check(128 * kBlock);
  ASSERT_EQ(cudaMemcpy(check.data(), static_cast<char*>(pool_) + (16 << 20), check.size(),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(std::memcmp(check.data(), host_.data(), check.size()), 0);
}

TEST_F(CudaE2eTest, BadHandlesDevicesAndSlicesAreRefused) {
  const uint64_t region = MakePool(8 << 20);
  std::string bogus(64, '\0');
  std::mt19937 rng(1);
  for (char& c : bogus) c = static_cast<char>(rng());
  absl::StatusOr<uint64_t> r = client_->RegisterCudaRegion(bogus, 0, 4096);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().code(), absl::StatusCode::kInternal) << r.status();
  EXPECT_THAT(client_->RegisterCudaRegion(handle_, 99, 4096),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("does not exist")));
  EXPECT_THAT(client_->RegisterCudaRegion(handle_, 0, 64 << 20),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exceed")));
  EXPECT_THAT(client_->RegisterCudaRegion(handle_.substr(0, 10), 0, 4096),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ipc_handle")));
  const TestBlock b = SessionBlock("bad", 0, 512);
  EXPECT_THAT(client_->Save({BlockToSave(b.meta, Slice(region, 8 << 20, 1 << 20))}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside the region")));
  // Still serving, still copying.
  ASSERT_OK(client_->Save({BlockToSave(b.meta, Slice(region, 0, 1 << 20))}));
  EXPECT_OK(client_->HealthCheck());
}

TEST_F(CudaE2eTest, LeaseEndClosesTheMapping) {
  MakePool(8 << 20);
  EXPECT_EQ(Stat().leases().cuda_regions(), 1u);
  std::unique_ptr<Client> watcher = daemon_->Connect();
  client_.reset();  // Ends the lease.
  WaitUntil(
      [&] {
        absl::StatusOr<v1::StatResponse> s = watcher->Stat();
        return s.ok() && s->leases().cuda_regions() == 0;
      },
      absl::Seconds(5));
  absl::StatusOr<v1::StatResponse> s = watcher->Stat();
  ASSERT_OK(s);
  EXPECT_EQ(s->leases().cuda_regions(), 0u);
  EXPECT_EQ(s->leases().leases(), 0u);
  // A new client registers the same allocation again.
  client_ = daemon_->Connect();
  ASSERT_OK(client_->OpenLease("again"));
  EXPECT_OK(client_->RegisterCudaRegion(handle_, 0, 8 << 20));
}

}  // namespace
}  // namespace evoke::testing
