// XXH3_64bits for inputs longer than 240 bytes, cut into pieces that can be
// computed in parallel: on the GPU (gpu/xxh3_kernel.cu) and, as the CPU
// reference its tests compare against, on the host. Header-only and free of
// dependencies, so that both nvcc and the host compiler can use it.
//
// What is computed: XXH3's "hashLong" path (xxHash 0.8.1) with the default
// 192-byte secret and seed 0, which is what XXH3_64bits(input, len) does for
// every len > 240. That path keeps 8 64-bit accumulators (lanes) and reads
// the input in 1024-byte blocks of 16 stripes of 64 bytes:
//
//   acc = kInitAcc
//   for each full block b (there are (len - 1) / 1024):
//     for each stripe s of b: acc += Stripe(data, secret + 8 * s)   (add only)
//     acc = Scramble(acc, secret + 128)                               (lane-wise)
//   for each stripe s of the last, partial block: acc += Stripe(...)
//   acc += Stripe(last 64 bytes of the input, secret + 121)
//   return Avalanche(len * kPrime64_1 + sum of 4 Mix(acc pair, secret + 11 + 16 i))
//
// A stripe only ADDS to the accumulators, with a secret offset that depends
// on the stripe's index in its block and not on the accumulators, so the
// per-block lane sums S_b = sum of Stripe(...) over the block (BlockSums) can
// be computed independently, in any order, in parallel; only the chain
// acc = Scramble(acc + S_b) is sequential, and it is lane-wise: 8 independent
// chains (ScrambleLane).
//
// Every function here is usable on the host and in CUDA device code
// (EVOKE_XXH3_HD), except Xxh3LongReference, the host-side assembly of the
// pieces, equal to XXH3_64bits for every len > 240 (tested in
// gpu/xxh3_parallel_test.cc against libxxhash). Multi-byte reads are little
// endian and allow any alignment. Nothing here allocates or keeps state, so
// all of it is thread-safe.
#ifndef EVOKE_GPU_XXH3_PARALLEL_H_
#define EVOKE_GPU_XXH3_PARALLEL_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gpu/xxh3_parallel.h assumes a little-endian host"
#endif

#if defined(__CUDACC__)
#define EVOKE_XXH3_HD __host__ __device__
#else
#define EVOKE_XXH3_HD
#endif

namespace evoke {
namespace xxh3 {

// Shapes of the hashLong path with the default secret.
inline constexpr size_t kShortestLong = 241;  // shorter inputs take other paths
inline constexpr size_t kLanes = 8;           // accumulators
inline constexpr size_t kStripeBytes = 64;
inline constexpr size_t kSecretBytes = 192;
inline constexpr size_t kSecretConsumeRate = 8;  // secret advance per stripe
inline constexpr size_t kStripesPerBlock =
    (kSecretBytes - kStripeBytes) / kSecretConsumeRate;               // 16
inline constexpr size_t kBlockBytes = kStripeBytes * kStripesPerBlock;  // 1024

// Secret offsets of the scramble, the last stripe and the merge.
inline constexpr size_t kScrambleSecretOffset = kSecretBytes - kStripeBytes;  // 128
inline constexpr size_t kLastStripeSecretOffset = kSecretBytes - kStripeBytes - 7;  // 121
inline constexpr size_t kMergeSecretOffset = 11;

inline constexpr uint64_t kPrime32_1 = 0x9E3779B1U;
inline constexpr uint64_t kPrime32_2 = 0x85EBCA77U;
inline constexpr uint64_t kPrime32_3 = 0xC2B2AE3DU;
inline constexpr uint64_t kPrime64_1 = 0x9E3779B185EBCA87ULL;
inline constexpr uint64_t kPrime64_2 = 0xC2B2AE3D27D4EB4FULL;
inline constexpr uint64_t kPrime64_3 = 0x165667B19E3779F9ULL;
inline constexpr uint64_t kPrime64_4 = 0x85EBCA77C2B2AE63ULL;
inline constexpr uint64_t kPrime64_5 = 0x27D4EB2F165667C5ULL;

// The accumulators' starting values (XXH3_INIT_ACC).
struct InitAccs {
  uint64_t lane[kLanes];
};
inline constexpr InitAccs kInitAccs = {{kPrime32_3, kPrime64_1, kPrime64_2, kPrime64_3,
                                        kPrime64_4, kPrime32_2, kPrime64_5, kPrime32_1}};

// XXH3_kSecret, the default secret (xxhash.h 0.8.1), byte for byte. A struct
// so that device code can hold a copy (`__constant__ Secret s = kDefaultSecret;`).
struct Secret {
  uint8_t bytes[kSecretBytes];
};
inline constexpr Secret kDefaultSecret = {{
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
}};

// ChunkDesc is one device range for the launcher in gpu/xxh3_kernel.cu
// (declared where it is used, in gpu/xxh3_device.cc, to keep CUDA and absl
// headers apart). `bytes` is in [kShortestLong, 1 MiB].
struct ChunkDesc {
  const void* ptr;
  uint64_t bytes;
};

// ReadLE64 reads 8 little-endian bytes at `p` (any alignment).
EVOKE_XXH3_HD inline uint64_t ReadLE64(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
#else
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
#endif
}

// Mul32To64 multiplies the low and the high 32 bits of `x` (the product term
// of a stripe: lo32(data ^ key) * hi32(data ^ key)).
EVOKE_XXH3_HD inline uint64_t Mul32To64(uint64_t x) {
  return static_cast<uint64_t>(static_cast<uint32_t>(x)) * (x >> 32);
}

// Mul128Fold64 returns the low and high halves of the 128-bit product a * b,
// xored.
EVOKE_XXH3_HD inline uint64_t Mul128Fold64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return (a * b) ^ __umul64hi(a, b);
#elif defined(__SIZEOF_INT128__)
  using U128 = unsigned __int128;
  const U128 p = static_cast<U128>(a) * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
#else
  const uint64_t lo_lo = (a & 0xFFFFFFFF) * (b & 0xFFFFFFFF);
  const uint64_t hi_lo = (a >> 32) * (b & 0xFFFFFFFF);
  const uint64_t lo_hi = (a & 0xFFFFFFFF) * (b >> 32);
  const uint64_t hi_hi = (a >> 32) * (b >> 32);
  const uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xFFFFFFFF) + lo_hi;
  const uint64_t upper = (hi_lo >> 32) + (cross >> 32) + hi_hi;
  const uint64_t lower = (cross << 32) | (lo_lo & 0xFFFFFFFF);
  return lower ^ upper;
#endif
}

// AccumulatePair adds one 16-byte piece of a stripe, its words 2p and 2p+1
// (w0, w1, with secret words k0, k1 at the stripe's secret + 16p and + 16p+8),
// to the sums of lanes 2p (s0) and 2p+1 (s1). A stripe adds word i to lane
// i^1 and lo32*hi32 of (word i ^ key i) to lane i, so each aligned pair of
// words touches only its own pair of lanes.
EVOKE_XXH3_HD inline void AccumulatePair(uint64_t w0, uint64_t w1, uint64_t k0, uint64_t k1,
                                         uint64_t& s0, uint64_t& s1) {
  s0 += Mul32To64(w0 ^ k0) + w1;
  s1 += Mul32To64(w1 ^ k1) + w0;
}

// AccumulateStripe adds the stripe at `stripe` (64 bytes) with the secret at
// `secret` (64 bytes) to acc[0..7] (XXH3_accumulate_512).
EVOKE_XXH3_HD inline void AccumulateStripe(uint64_t* acc, const uint8_t* stripe,
                                           const uint8_t* secret) {
  for (size_t p = 0; p < kLanes / 2; ++p) {
    AccumulatePair(ReadLE64(stripe + 16 * p), ReadLE64(stripe + 16 * p + 8),
                   ReadLE64(secret + 16 * p), ReadLE64(secret + 16 * p + 8), acc[2 * p],
                   acc[2 * p + 1]);
  }
}

// BlockSums sets sums[0..7] to the lane sums of the first `n_stripes`
// (<= kStripesPerBlock) stripes of the block at `block`: what those stripes
// add to the accumulators, whatever the accumulators hold.
EVOKE_XXH3_HD inline void BlockSums(const uint8_t* block, size_t n_stripes, const uint8_t* secret,
                                    uint64_t* sums) {
  for (size_t i = 0; i < kLanes; ++i) sums[i] = 0;
  for (size_t s = 0; s < n_stripes; ++s) {
    AccumulateStripe(sums, block + s * kStripeBytes, secret + s * kSecretConsumeRate);
  }
}

// ScrambleLane is one lane of the scramble that ends each full block, with
// that lane's key (the secret's 64-bit word at kScrambleSecretOffset + 8 * lane).
EVOKE_XXH3_HD inline uint64_t ScrambleLane(uint64_t acc, uint64_t key) {
  acc ^= acc >> 47;
  acc ^= key;
  return acc * kPrime32_1;
}

// ScrambleStep adds a full block's sums to acc[0..7] and scrambles them: one
// link of the sequential chain.
EVOKE_XXH3_HD inline void ScrambleStep(uint64_t* acc, const uint64_t* sums, const uint8_t* secret) {
  for (size_t i = 0; i < kLanes; ++i) {
    acc[i] = ScrambleLane(acc[i] + sums[i], ReadLE64(secret + kScrambleSecretOffset + 8 * i));
  }
}

// LongLayout is how hashLong cuts an input of `len` (> 240) bytes: the full
// blocks, each followed by a scramble; the stripes of the last, partial block
// (0..15, never scrambled; they start at full_blocks * kBlockBytes); and the
// last stripe, the input's last 64 bytes (which may overlap the others).
struct LongLayout {
  uint64_t full_blocks;
  uint64_t tail_stripes;
};
EVOKE_XXH3_HD inline LongLayout LayoutOf(uint64_t len) {
  const uint64_t full_blocks = (len - 1) / kBlockBytes;
  return {full_blocks, ((len - 1) - full_blocks * kBlockBytes) / kStripeBytes};
}

// LastStripeLane is what the last stripe adds to lane `lane`, given the
// stripe's words `lane` (w) and `lane ^ 1` (w_pair).
EVOKE_XXH3_HD inline uint64_t LastStripeLane(uint64_t w, uint64_t w_pair, size_t lane,
                                             const uint8_t* secret) {
  return Mul32To64(w ^ ReadLE64(secret + kLastStripeSecretOffset + 8 * lane)) + w_pair;
}

// AccumulateLastStripe adds the last stripe of the `len`-byte input at
// `input` to acc[0..7].
EVOKE_XXH3_HD inline void AccumulateLastStripe(uint64_t* acc, const uint8_t* input, uint64_t len,
                                               const uint8_t* secret) {
  AccumulateStripe(acc, input + len - kStripeBytes, secret + kLastStripeSecretOffset);
}

// Avalanche is XXH3's final mix.
EVOKE_XXH3_HD inline uint64_t Avalanche(uint64_t h) {
  h ^= h >> 37;
  h *= 0x165667919E3779F9ULL;
  h ^= h >> 32;
  return h;
}

// MergeAccs folds the final accumulators of a `len`-byte input into the
// hash: XXH3_mergeAccs(acc, secret + 11, len * kPrime64_1), avalanche included.
EVOKE_XXH3_HD inline uint64_t MergeAccs(const uint64_t* acc, const uint8_t* secret, uint64_t len) {
  uint64_t result = len * kPrime64_1;
  const uint8_t* key = secret + kMergeSecretOffset;
  for (size_t i = 0; i < kLanes / 2; ++i) {
    result += Mul128Fold64(acc[2 * i] ^ ReadLE64(key + 16 * i),
                           acc[2 * i + 1] ^ ReadLE64(key + 16 * i + 8));
  }
  return Avalanche(result);
}

// The kernel's warp layout for one block (gpu/xxh3_kernel.cu, emulated by
// gpu/xxh3_parallel_test.cc): lane L of a 32-lane warp reads the 16-byte
// pieces at byte offsets 16 L and 512 + 16 L of the block, i.e. words
// 2p, 2p+1 (p = L % 4) of stripes L / 4 and L / 4 + 8, and adds them into
// (s0, s1) with AccumulatePair. The warp then reduces over the 8 lanes that
// share p: lanes with bit 2 set keep s1 and send s0 to their partner L ^ 4,
// the others keep s0 and send s1; then sums over L ^ 8 and L ^ 16.
// Afterwards lane L holds the block sum of accumulator WarpReducedLane(L).
inline constexpr int kWarpSize = 32;
EVOKE_XXH3_HD inline int WarpPieceWord(int warp_lane) { return 2 * (warp_lane & 3); }
EVOKE_XXH3_HD inline int WarpPieceStripe(int warp_lane) { return warp_lane >> 2; }
EVOKE_XXH3_HD inline int WarpReducedLane(int warp_lane) {
  return 2 * (warp_lane & 3) + ((warp_lane >> 2) & 1);
}

// Xxh3LongReference is XXH3_64bits(p, len) for len > 240 (kShortestLong and
// up), assembled from the pieces above in hashLong's order. Host only.
inline uint64_t Xxh3LongReference(const void* p, size_t len) {
  const auto* input = static_cast<const uint8_t*>(p);
  const uint8_t* secret = kDefaultSecret.bytes;
  const LongLayout layout = LayoutOf(len);
  uint64_t acc[kLanes];
  for (size_t i = 0; i < kLanes; ++i) acc[i] = kInitAccs.lane[i];
  uint64_t sums[kLanes];
  for (uint64_t b = 0; b < layout.full_blocks; ++b) {
    BlockSums(input + b * kBlockBytes, kStripesPerBlock, secret, sums);
    ScrambleStep(acc, sums, secret);
  }
  BlockSums(input + layout.full_blocks * kBlockBytes, layout.tail_stripes, secret, sums);
  for (size_t i = 0; i < kLanes; ++i) acc[i] += sums[i];
  AccumulateLastStripe(acc, input, len, secret);
  return MergeAccs(acc, secret, len);
}

}  // namespace xxh3
}  // namespace evoke

#endif  // EVOKE_GPU_XXH3_PARALLEL_H_
