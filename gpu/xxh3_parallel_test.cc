// CPU tests of gpu/xxh3_parallel.h against libxxhash's XXH3_64bits: the
// host assembly (Xxh3LongReference) and a host emulation of the exact
// decomposition gpu/xxh3_kernel.cu runs (warp lanes, their butterfly
// reduction, blocks summed out of order, then the 8-lane chain). They run
// everywhere, CI included; gpu/xxh3_device_test.cc checks the kernel itself.
#include "gpu/xxh3_parallel.h"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "gpu/device.h"
#include "gpu/xxh3_device.h"
#include "gtest/gtest.h"

namespace evoke {
namespace {

using xxh3::kBlockBytes;
using xxh3::kLanes;

constexpr size_t kMiB = size_t{1} << 20;

// Lengths around every boundary of hashLong: the 240-byte threshold, stripes,
// blocks (1024 bytes: a scramble) and the 1 MiB chunk size.
const std::vector<size_t>& FixedLengths() {
  static const auto* lengths = new std::vector<size_t>{
      241, 255, 256, 257, 319, 320, 1000, 1023, 1024, 1025, 1087, 1088, 1089, 2047, 2048,
      2049, 4095, 65536, 65537, 128 * 1024 + 1, kMiB - 1025, kMiB - 1024, kMiB - 1, kMiB};
  return *lengths;
}

// RandomLengths returns `n` lengths in (240, 1 MiB].
std::vector<size_t> RandomLengths(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> len(xxh3::kShortestLong, kMiB);
  std::vector<size_t> out(n);
  for (size_t& l : out) l = len(rng);
  return out;
}

// RandomBytes returns 1 MiB + 64 random bytes, enough for any length here at
// any of the offsets tested.
const std::vector<uint8_t>& RandomBytes() {
  static const auto* bytes = [] {
    auto* b = new std::vector<uint8_t>(kMiB + 64);
    std::mt19937_64 rng(42);
    for (uint8_t& x : *b) x = static_cast<uint8_t>(rng());
    return b;
  }();
  return *bytes;
}

constexpr size_t kOffsets[] = {0, 1, 3, 5, 8};

// EmulateKernel computes XXH3_64bits(input, len) the way xxh3_kernel.cu
// does: every block's lane sums (the partial block's too) come from 32 warp
// lanes and their butterfly reduction, in a shuffled block order; then one
// chain per lane adds them in block order, scrambling after each full block;
// then the last stripe, per lane, and the merge.
uint64_t EmulateKernel(const uint8_t* input, size_t len, std::mt19937_64& rng) {
  const uint8_t* secret = xxh3::kDefaultSecret.bytes;
  const xxh3::LongLayout layout = xxh3::LayoutOf(len);
  const size_t n_sums = layout.full_blocks + 1;
  std::vector<std::array<uint64_t, kLanes>> sums(n_sums);
  std::vector<size_t> order(n_sums);
  std::iota(order.begin(), order.end(), size_t{0});
  std::shuffle(order.begin(), order.end(), rng);
  constexpr int kW = xxh3::kWarpSize;
  for (const size_t b : order) {
    const size_t stripes = b < layout.full_blocks ? xxh3::kStripesPerBlock : layout.tail_stripes;
    uint64_t keep[kW], send[kW];
    for (int lane = 0; lane < kW; ++lane) {
      uint64_t s0 = 0, s1 = 0;
      const int word = xxh3::WarpPieceWord(lane);
      for (int half = 0; half < 2; ++half) {
        const size_t stripe = xxh3::WarpPieceStripe(lane) + 8 * half;
        if (stripe >= stripes) continue;
        const uint8_t* piece = input + b * kBlockBytes + 512 * half + 16 * lane;
        const uint8_t* key = secret + 8 * stripe + 8 * word;
        xxh3::AccumulatePair(xxh3::ReadLE64(piece), xxh3::ReadLE64(piece + 8),
                             xxh3::ReadLE64(key), xxh3::ReadLE64(key + 8), s0, s1);
      }
      const bool upper = (lane & 4) != 0;
      keep[lane] = upper ? s1 : s0;
      send[lane] = upper ? s0 : s1;
    }
    uint64_t v[kW];
    for (int lane = 0; lane < kW; ++lane) v[lane] = keep[lane] + send[lane ^ 4];
    for (const int mask : {8, 16}) {
      uint64_t next[kW];
      for (int lane = 0; lane < kW; ++lane) next[lane] = v[lane] + v[lane ^ mask];
      std::copy(next, next + kW, v);
    }
    for (int lane = 0; lane < kW; ++lane) {
      // Every lane holds its accumulator's full sum; lanes 0..7 store it.
      EXPECT_EQ(v[lane], v[lane & 7]) << "block " << b << " lane " << lane;
      if (lane < 8) sums[b][xxh3::WarpReducedLane(lane)] = v[lane];
    }
  }
  uint64_t acc[kLanes];
  for (size_t j = 0; j < kLanes; ++j) {
    // One chain per lane, as the kernel's 8 chain threads run them.
    uint64_t a = xxh3::kInitAccs.lane[j];
    const uint64_t key = xxh3::ReadLE64(secret + xxh3::kScrambleSecretOffset + 8 * j);
    for (size_t b = 0; b < n_sums; ++b) {
      a += sums[b][j];
      if (b < layout.full_blocks) a = xxh3::ScrambleLane(a, key);
    }
    const uint8_t* last = input + len - xxh3::kStripeBytes;
    a += xxh3::LastStripeLane(xxh3::ReadLE64(last + 8 * j), xxh3::ReadLE64(last + 8 * (j ^ 1)), j,
                              secret);
    acc[j] = a;
  }
  return xxh3::MergeAccs(acc, secret, len);
}

TEST(Xxh3ParallelTest, DefaultSecretIsLibrarys) {
  const std::vector<uint8_t>& data = RandomBytes();
  for (const size_t len : {size_t{241}, size_t{5000}, kMiB}) {
    EXPECT_EQ(XXH3_64bits_withSecret(data.data(), len, xxh3::kDefaultSecret.bytes,
                                     sizeof(xxh3::kDefaultSecret.bytes)),
              XXH3_64bits(data.data(), len))
        << "len " << len;
  }
}

TEST(Xxh3ParallelTest, ReferenceMatchesLibraryAtBoundaries) {
  const std::vector<uint8_t>& data = RandomBytes();
  for (const size_t offset : kOffsets) {
    for (const size_t len : FixedLengths()) {
      const uint8_t* p = data.data() + offset;
      EXPECT_EQ(xxh3::Xxh3LongReference(p, len), XXH3_64bits(p, len))
          << "len " << len << " offset " << offset;
    }
  }
}

TEST(Xxh3ParallelTest, ReferenceMatchesLibraryAtRandomLengths) {
  const std::vector<uint8_t>& data = RandomBytes();
  const std::vector<size_t> lengths = RandomLengths(200, 7);
  for (size_t i = 0; i < lengths.size(); ++i) {
    const size_t offset = kOffsets[i % std::size(kOffsets)];
    const uint8_t* p = data.data() + offset;
    EXPECT_EQ(xxh3::Xxh3LongReference(p, lengths[i]), XXH3_64bits(p, lengths[i]))
        << "len " << lengths[i] << " offset " << offset;
  }
}

TEST(Xxh3ParallelTest, ReferenceMatchesLibraryOnUniformData) {
  // Zeros and ones exercise the all-zero and all-ones products.
  for (const uint8_t fill : {uint8_t{0}, uint8_t{0xff}}) {
    const std::vector<uint8_t> data(kMiB, fill);
    for (const size_t len : FixedLengths()) {
      EXPECT_EQ(xxh3::Xxh3LongReference(data.data(), len), XXH3_64bits(data.data(), len))
          << "len " << len << " fill " << int{fill};
    }
  }
}

TEST(Xxh3ParallelTest, KernelDecompositionMatchesLibrary) {
  const std::vector<uint8_t>& data = RandomBytes();
  std::mt19937_64 rng(3);
  std::vector<size_t> lengths = FixedLengths();
  const std::vector<size_t> random = RandomLengths(60, 11);
  lengths.insert(lengths.end(), random.begin(), random.end());
  for (size_t i = 0; i < lengths.size(); ++i) {
    for (const size_t offset : kOffsets) {
      if (i >= FixedLengths().size() && offset != kOffsets[i % std::size(kOffsets)]) continue;
      const uint8_t* p = data.data() + offset;
      EXPECT_EQ(EmulateKernel(p, lengths[i], rng), XXH3_64bits(p, lengths[i]))
          << "len " << lengths[i] << " offset " << offset;
    }
  }
}

TEST(Xxh3ParallelTest, LayoutCutsLikeHashLong) {
  EXPECT_EQ(xxh3::kStripesPerBlock, 16u);
  EXPECT_EQ(xxh3::kBlockBytes, 1024u);
  // 1024 bytes: no full block (the last byte always falls past the loop),
  // 15 stripes, then the last stripe.
  EXPECT_EQ(xxh3::LayoutOf(1024).full_blocks, 0u);
  EXPECT_EQ(xxh3::LayoutOf(1024).tail_stripes, 15u);
  EXPECT_EQ(xxh3::LayoutOf(1025).full_blocks, 1u);
  EXPECT_EQ(xxh3::LayoutOf(1025).tail_stripes, 0u);
  EXPECT_EQ(xxh3::LayoutOf(kMiB).full_blocks, 1023u);
  EXPECT_EQ(xxh3::LayoutOf(kMiB).tail_stripes, 15u);
  EXPECT_EQ(xxh3::LayoutOf(241).full_blocks, 0u);
  EXPECT_EQ(xxh3::LayoutOf(241).tail_stripes, 3u);
}

// The device API without a device (a CPU-only build, or a machine without
// a GPU): a clear UNAVAILABLE, never a crash. gpu/xxh3_device_test.cc covers
// the GPU.
TEST(Xxh3DeviceApiTest, UnavailableWithoutDevice) {
  if (ListGpus().ok()) GTEST_SKIP() << "a GPU is present: cuda_ipc_test checks the kernel";
  const std::vector<uint8_t>& data = RandomBytes();
  const DeviceRange ranges[] = {{data.data(), 4096}};
  uint64_t out[1] = {0};
  const absl::Status s = DeviceChunkChecksums(0, ranges, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_FALSE(s.message().empty());
}

}  // namespace
}  // namespace evoke
