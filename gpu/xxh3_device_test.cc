// GPU tests of gpu/xxh3_device.h: checksums of device ranges must equal
// XXH3_64bits of the same bytes on the host. They need a CUDA device and
// skip, with the reason, when there is none; gpu/device_check.sh runs them on
// a GPU machine (in cuda_ipc_test). The CPU-side decomposition is tested in
// gpu/xxh3_parallel_test.cc.
#include "gpu/cuda_test_util.h"
#include "gpu/xxh3_device.h"

#include <cuda_runtime_api.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;

constexpr size_t kMiB = size_t{1} << 20;

// Xxh3DeviceData: `bytes` random bytes on device 0 and their host copy.
class Xxh3DeviceData {
 public:
  explicit Xxh3DeviceData(size_t bytes, uint64_t seed = 1) : host_(bytes) {
    std::mt19937_64 rng(seed);
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
      const uint64_t v = rng();
      std::memcpy(host_.data() + i, &v, 8);
    }
    for (size_t i = bytes & ~size_t{7}; i < bytes; ++i) host_[i] = static_cast<uint8_t>(rng());
    ok_ = cudaSetDevice(0) == cudaSuccess && cudaMalloc(&dev_, bytes) == cudaSuccess &&
          cudaMemcpy(dev_, host_.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess;
  }
  ~Xxh3DeviceData() {
    if (dev_ != nullptr) cudaFree(dev_);
  }
  Xxh3DeviceData(const Xxh3DeviceData&) = delete;
  Xxh3DeviceData& operator=(const Xxh3DeviceData&) = delete;

  bool ok() const { return ok_; }
  size_t size() const { return host_.size(); }
  DeviceRange Range(size_t offset, size_t bytes) const {
    return {static_cast<const uint8_t*>(dev_) + offset, bytes};
  }
  uint64_t HostHash(size_t offset, size_t bytes) const {
    return XXH3_64bits(host_.data() + offset, bytes);
  }

 private:
  std::vector<uint8_t> host_;
  void* dev_ = nullptr;
  bool ok_ = false;
};

const std::vector<size_t>& Xxh3Lengths() {
  static const auto* lengths = new std::vector<size_t>{
      241, 255, 256, 257, 319, 320, 1000, 1023, 1024, 1025, 1087, 1088, 1089, 2047, 2048, 2049,
      4095, 65536, 65537, 128 * 1024 + 1, kMiB - 1025, kMiB - 1024, kMiB - 1, kMiB};
  return *lengths;
}

constexpr size_t kXxh3Offsets[] = {0, 1, 3, 5, 8, 16, 255};

// Xxh3CheckBatch hashes `ranges` (offset, length into data) in one call and
// compares with the host.
void Xxh3CheckBatch(const Xxh3DeviceData& data,
                    const std::vector<std::pair<size_t, size_t>>& ranges) {
  std::vector<DeviceRange> dev;
  for (const auto& [offset, len] : ranges) dev.push_back(data.Range(offset, len));
  std::vector<uint64_t> out(ranges.size(), 0);
  ASSERT_OK(DeviceChunkChecksums(0, dev, absl::MakeSpan(out)));
  for (size_t i = 0; i < ranges.size(); ++i) {
    EXPECT_EQ(out[i], data.HostHash(ranges[i].first, ranges[i].second))
        << "range " << i << ": offset " << ranges[i].first << " len " << ranges[i].second;
  }
}

TEST(Xxh3DeviceTest, MatchesHostAtBoundaryLengthsAndOffsets) {
  EVOKE_REQUIRE_CUDA_DEVICE();
  Xxh3DeviceData data(2 * kMiB);
  ASSERT_TRUE(data.ok());
  for (const size_t offset : kXxh3Offsets) {
    std::vector<std::pair<size_t, size_t>> ranges;
    for (const size_t len : Xxh3Lengths()) ranges.emplace_back(offset, len);
    Xxh3CheckBatch(data, ranges);
  }
}

TEST(Xxh3DeviceTest, RangesEndingAtTheAllocationEnd) {
  EVOKE_REQUIRE_CUDA_DEVICE();
  // Misaligned ranges whose last byte is the allocation's last byte: the
  // kernel must not read past it (compute-sanitizer would say so).
  for (const size_t len : {size_t{241}, size_t{1000}, size_t{4097}, kMiB}) {
    for (const size_t offset : {size_t{0}, size_t{1}, size_t{7}, size_t{13}}) {
      Xxh3DeviceData data(len + offset, len + offset);
      ASSERT_TRUE(data.ok());
      Xxh3CheckBatch(data, {{offset, len}});
    }
  }
}

TEST(Xxh3DeviceTest, RandomBatchesOf1And7And300) {
  EVOKE_REQUIRE_CUDA_DEVICE();
  Xxh3DeviceData data(64 * kMiB, 2);
  ASSERT_TRUE(data.ok());
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<size_t> len_dist(241, kMiB);
  for (const size_t batch : {size_t{1}, size_t{7}, size_t{300}}) {
    for (int round = 0; round < 3; ++round) {
      std::vector<std::pair<size_t, size_t>> ranges;
      for (size_t i = 0; i < batch; ++i) {
        const size_t len = len_dist(rng);
        std::uniform_int_distribution<size_t> off_dist(0, data.size() - len);
        size_t offset = off_dist(rng);
        if (i % 3 == 0) offset &= ~size_t{255};  // aligned, the common case
        ranges.emplace_back(offset, len);
      }
      Xxh3CheckBatch(data, ranges);
    }
  }
}

TEST(Xxh3DeviceTest, EqualsChunkChecksumOfEveryChunkOfAPayload) {
  EVOKE_REQUIRE_CUDA_DEVICE();
  // A 5.5 MiB payload cut as common/checksum.h cuts it: the combined checksum
  // from device chunk checksums equals PayloadChecksum on the host.
  const size_t total = 5 * kMiB + kMiB / 2;
  Xxh3DeviceData data(total, 9);
  ASSERT_TRUE(data.ok());
  std::vector<DeviceRange> ranges;
  for (size_t off = 0; off < total; off += kChecksumChunkBytes) {
    ranges.push_back(data.Range(off, std::min(kChecksumChunkBytes, total - off)));
  }
  std::vector<uint64_t> chunks(ranges.size());
  ASSERT_OK(DeviceChunkChecksums(0, ranges, absl::MakeSpan(chunks)));
  std::vector<uint8_t> host(total);
  ASSERT_EQ(cudaMemcpy(host.data(), ranges[0].ptr, total, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(CombineChunkChecksums(chunks, total), PayloadChecksum(host.data(), total));
}

TEST(Xxh3DeviceTest, ConcurrentCallersGetTheirOwnResults) {
  EVOKE_REQUIRE_CUDA_DEVICE();
  Xxh3DeviceData data(16 * kMiB, 4);
  ASSERT_TRUE(data.ok());
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0), failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      std::uniform_int_distribution<size_t> len_dist(241, kMiB);
      for (int round = 0; round < 20; ++round) {
        std::vector<DeviceRange> ranges;
        std::vector<std::pair<size_t, size_t>> spans;
        for (int i = 0; i < 1 + t * 5; ++i) {
          const size_t len = len_dist(rng);
          const size_t off = std::uniform_int_distribution<size_t>(0, data.size() - len)(rng);
          ranges.push_back(data.Range(off, len));
          spans.emplace_back(off, len);
        }
        std::vector<uint64_t> out(ranges.size());
        if (!DeviceChunkChecksums(0, ranges, absl::MakeSpan(out)).ok()) {
          ++failures[t];
          continue;
        }
        for (size_t i = 0; i < out.size(); ++i) {
          if (out[i] != data.HostHash(spans[i].first, spans[i].second)) ++mismatches[t];
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(failures[t], 0) << "thread " << t;
    EXPECT_EQ(mismatches[t], 0) << "thread " << t;
  }
}

TEST(Xxh3DeviceTest, RejectsBadBatches) {
  EVOKE_REQUIRE_CUDA_DEVICE();
  Xxh3DeviceData data(2 * kMiB);
  ASSERT_TRUE(data.ok());
  uint64_t out[2] = {0, 0};
  for (const size_t len : {size_t{0}, size_t{1}, size_t{64}, size_t{240}, kMiB + 1}) {
    const DeviceRange ranges[] = {data.Range(0, 4096), data.Range(0, len)};
    EXPECT_THAT(DeviceChunkChecksums(0, ranges, absl::MakeSpan(out)),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << "len " << len;
  }
  const DeviceRange null_range[] = {{nullptr, 4096}};
  EXPECT_THAT(DeviceChunkChecksums(0, null_range, absl::MakeSpan(out, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  const DeviceRange one[] = {data.Range(0, 4096)};
  EXPECT_THAT(DeviceChunkChecksums(0, one, absl::MakeSpan(out, 2)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_THAT(DeviceChunkChecksums(count + 2, one, absl::MakeSpan(out, 1)),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_OK(DeviceChunkChecksums(0, {}, {}));
  // Still works afterwards.
  ASSERT_OK(DeviceChunkChecksums(0, one, absl::MakeSpan(out, 1)));
  EXPECT_EQ(out[0], data.HostHash(0, 4096));
}

// Not a pass/fail check: prints the speed (gpu/device_check.sh keeps the log).
TEST(Xxh3DeviceTest, ThroughputOf256ChunksOf1MiB) {
  EVOKE_REQUIRE_CUDA_DEVICE();
  constexpr size_t kChunks = 256;
  Xxh3DeviceData data(kChunks * kMiB, 6);
  ASSERT_TRUE(data.ok());
  for (const size_t offset : {size_t{0}, size_t{1}}) {
    std::vector<DeviceRange> ranges;
    for (size_t i = 0; i < kChunks; ++i) {
      const size_t len = offset == 0 ? kMiB : kMiB - 1;  // stay inside the buffer
      ranges.push_back(data.Range(i * kMiB + offset, len));
    }
    std::vector<uint64_t> out(kChunks);
    ASSERT_OK(DeviceChunkChecksums(0, ranges, absl::MakeSpan(out)));  // warm-up
    double best_s = 1e9;
    for (int rep = 0; rep < 10; ++rep) {
      const auto start = std::chrono::steady_clock::now();
      ASSERT_OK(DeviceChunkChecksums(0, ranges, absl::MakeSpan(out)));
      best_s = std::min(
          best_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    for (size_t i = 0; i < kChunks; i += 37) {
      EXPECT_EQ(out[i], data.HostHash(i * kMiB + offset, ranges[i].bytes)) << i;
    }
    const double bytes = static_cast<double>(kChunks) * static_cast<double>(ranges[0].bytes);
    std::printf("[ xxh3 ] device checksums, %zu x %zu B (pointer offset %zu): %.3f ms, %.1f GB/s\n",
                kChunks, static_cast<size_t>(ranges[0].bytes), offset, best_s * 1e3,
                bytes / best_s / 1e9);
  }
  // The host, one thread, for comparison.
  const auto start = std::chrono::steady_clock::now();
  uint64_t sink = 0;
  for (size_t i = 0; i < 32; ++i) sink ^= data.HostHash(i * kMiB, kMiB);
  const double host_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ xxh3 ] host XXH3_64bits, one thread: %.1f GB/s (%llx)\n",
              32.0 * kMiB / host_s / 1e9, static_cast<unsigned long long>(sink));
}

}  // namespace
}  // namespace evoke
