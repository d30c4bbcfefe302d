// The GPU side of gpu/xxh3_device.h: XXH3_64bits of many device ranges
// (241 bytes .. 1 MiB each) in one launch, bit-exact with the host, following
// the decomposition in gpu/xxh3_parallel.h. Kept free of absl and other heavy
// headers: it exposes one plain launcher returning cudaError_t, which
// gpu/xxh3_device.cc turns into absl::Status.
//
// Kernel organization, one thread block per chunk (range):
//   * 16 "sum" warps compute the 8 lane sums of each 1024-byte block of the
//     chunk (the last, partial block included): one warp per block, each lane
//     loading 2 x 16 bytes (offsets 16 L and 512 + 16 L: every load
//     instruction of the warp reads 512 contiguous bytes), adding them with
//     AccumulatePair, then a 3-step butterfly (6 32-bit shuffles) leaves the
//     block's 8 sums in lanes 0..7, which store them in shared memory. Each
//     warp handles 2 blocks per round (4 loads of 16 bytes in flight per lane).
//   * The sums go to shared memory in segments of 128 blocks, double-buffered
//     (2 x 128 x 64 bytes = 16 KiB static shared memory): while the sum warps
//     fill segment k, one "chain" warp (8 threads, one per accumulator lane)
//     runs the sequential add-and-scramble over segment k-1; a
//     __syncthreads() separates the rounds.
//   * The chain threads then add the last stripe, gather the 8 accumulators
//     with shuffles, and thread 0 merges, avalanches and writes the result.
// 16-byte-aligned ranges load with __ldg of 16 bytes; other ranges load the
// two aligned 16-byte granules around each piece and funnel-shift them (bytes
// of a granule outside the range are read one by one, so no load leaves the
// range).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "gpu/xxh3_parallel.h"

namespace evoke {
namespace xxh3 {
namespace {

constexpr int kSumWarps = 16;
constexpr int kThreads = (kSumWarps + 1) * kWarpSize;  // the last warp runs the chain
constexpr int kSegmentBlocks = 128;                    // blocks per shared-memory segment
constexpr unsigned kFullMask = 0xffffffffu;
constexpr unsigned kChainMask = 0xffu;  // lanes 0..7 of the chain warp
constexpr int kMaxDevices = 64;

static_assert(2 * kSegmentBlocks * kLanes * sizeof(uint64_t) <= 48 * 1024,
              "segments must fit in static shared memory");

__constant__ Secret kDeviceSecret = kDefaultSecret;
__constant__ InitAccs kDeviceInitAccs = kInitAccs;

// Piece: 16 input bytes, as two little-endian words.
struct Piece {
  uint64_t lo;
  uint64_t hi;
};

__device__ __forceinline__ Piece LoadAligned16(uintptr_t addr) {
  const ulonglong2 v = __ldg(reinterpret_cast<const ulonglong2*>(addr));
  return {v.x, v.y};
}

// LoadGranule reads the 16-byte-aligned granule at `g`; bytes outside
// [begin, end) read as 0 and are not touched.
__device__ __forceinline__ Piece LoadGranule(uintptr_t g, uintptr_t begin, uintptr_t end) {
  if (g >= begin && g + 16 <= end) return LoadAligned16(g);
  uint64_t w[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const uintptr_t a = g + i;
    if (a >= begin && a < end) {
      w[i / 8] |= static_cast<uint64_t>(*reinterpret_cast<const uint8_t*>(a)) << (8 * (i % 8));
    }
  }
  return {w[0], w[1]};
}

// LoadPiece reads the 16 bytes at `addr`, which lie in [begin, end).
// `misalign` is addr % 16, the same for every piece of a range.
template <bool kAligned>
__device__ __forceinline__ Piece LoadPiece(uintptr_t addr, int misalign, uintptr_t begin,
                                           uintptr_t end) {
  if (kAligned) return LoadAligned16(addr);
  const uintptr_t g = addr - misalign;
  const Piece a = LoadGranule(g, begin, end);
  const Piece b = LoadGranule(g + 16, begin, end);
  const bool high = misalign >= 8;
  const uint64_t x0 = high ? a.hi : a.lo;
  const uint64_t x1 = high ? b.lo : a.hi;
  const uint64_t x2 = high ? b.hi : b.lo;
  const int shift = 8 * (misalign & 7);
  if (shift == 0) return {x0, x1};
  return {(x0 >> shift) | (x1 << (64 - shift)), (x1 >> shift) | (x2 << (64 - shift))};
}

// StripesIn is how many stripes block `b` of the chunk contributes to the
// sums: 16 for full blocks, the tail's for the partial block, 0 past it.
__device__ __forceinline__ int StripesIn(uint64_t b, const LongLayout& layout) {
  if (b < layout.full_blocks) return static_cast<int>(kStripesPerBlock);
  return b == layout.full_blocks ? static_cast<int>(layout.tail_stripes) : 0;
}

// WarpReduce turns this lane's (s0, s1) into the block sum of accumulator
// WarpReducedLane(lane) (see gpu/xxh3_parallel.h).
__device__ __forceinline__ uint64_t WarpReduce(uint64_t s0, uint64_t s1, int lane) {
  const bool upper = (lane & 4) != 0;
  uint64_t keep = upper ? s1 : s0;
  const uint64_t send = upper ? s0 : s1;
  keep += __shfl_xor_sync(kFullMask, send, 4);
  keep += __shfl_xor_sync(kFullMask, keep, 8);
  keep += __shfl_xor_sync(kFullMask, keep, 16);
  return keep;
}

// SumSegment: the sum warps compute the lane sums of blocks
// [first, first + count) of the chunk into seg[0 .. count).
template <bool kAligned>
__device__ __forceinline__ void SumSegment(const uint8_t* chunk, uint64_t len,
                                           const LongLayout& layout, uint64_t first, int count,
                                           const uint64_t (&keys)[2][2], int warp, int lane,
                                           uint64_t (*seg)[kLanes]) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(chunk);
  const uintptr_t end = begin + len;
  const int misalign = static_cast<int>(begin & 15);
  const int stripe = WarpPieceStripe(lane);
  for (int i = warp; i < count; i += 2 * kSumWarps) {
    // Two blocks per round: all four loads are issued before any use.
    Piece piece[2][2];
    bool valid[2][2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int local = i + u * kSumWarps;
      const uint64_t b = first + local;
      const int stripes = local < count ? StripesIn(b, layout) : 0;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        valid[u][h] = stripe + 8 * h < stripes;
        const uintptr_t addr = begin + b * kBlockBytes + 512 * h + 16 * lane;
        piece[u][h] = valid[u][h] ? LoadPiece<kAligned>(addr, misalign, begin, end) : Piece{0, 0};
      }
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int local = i + u * kSumWarps;
      uint64_t s0 = 0, s1 = 0;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (valid[u][h]) {
          AccumulatePair(piece[u][h].lo, piece[u][h].hi, keys[h][0], keys[h][1], s0, s1);
        }
      }
      const uint64_t sum = WarpReduce(s0, s1, lane);  // the whole warp takes part
      if (local < count && lane < static_cast<int>(kLanes)) seg[local][WarpReducedLane(lane)] = sum;
    }
  }
}

__global__ void __launch_bounds__(kThreads) ChunkChecksumKernel(const ChunkDesc* descs,
                                                                uint64_t* out) {
  __shared__ uint64_t sums[2][kSegmentBlocks][kLanes];
  const ChunkDesc desc = descs[blockIdx.x];
  const uint8_t* chunk = static_cast<const uint8_t*>(desc.ptr);
  const uint64_t len = desc.bytes;
  if (len < kShortestLong) {  // the launcher's caller checks; never read out of range
    if (threadIdx.x == 0) out[blockIdx.x] = 0;
    return;
  }
  const uint8_t* secret = kDeviceSecret.bytes;
  const LongLayout layout = LayoutOf(len);
  const uint64_t n_sums = layout.full_blocks + 1;  // full blocks, then the partial one
  const int n_segments = static_cast<int>((n_sums + kSegmentBlocks - 1) / kSegmentBlocks);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const bool aligned = (reinterpret_cast<uintptr_t>(chunk) & 15) == 0;
  const bool chain = warp == kSumWarps && lane < static_cast<int>(kLanes);

  // Sum warps: this lane's secret words (stripes lane/4 and lane/4 + 8).
  // Chain threads: their lane's accumulator and scramble key.
  uint64_t keys[2][2] = {{0, 0}, {0, 0}};
  uint64_t acc = 0, scramble_key = 0;
  if (warp < kSumWarps) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint8_t* k = secret + kSecretConsumeRate * (WarpPieceStripe(lane) + 8 * h) +
                         8 * WarpPieceWord(lane);
      keys[h][0] = ReadLE64(k);
      keys[h][1] = ReadLE64(k + 8);
    }
  } else if (chain) {
    acc = kDeviceInitAccs.lane[lane];
    scramble_key = ReadLE64(secret + kScrambleSecretOffset + 8 * lane);
  }

  for (int s = 0; s <= n_segments; ++s) {
    if (warp < kSumWarps) {
      if (s < n_segments) {
        const uint64_t first = static_cast<uint64_t>(s) * kSegmentBlocks;
        const int count = static_cast<int>(n_sums - first < kSegmentBlocks ? n_sums - first
                                                                            : kSegmentBlocks);
        if (aligned) {
          SumSegment<true>(chunk, len, layout, first, count, keys, warp, lane, sums[s & 1]);
        } else {
          SumSegment<false>(chunk, len, layout, first, count, keys, warp, lane, sums[s & 1]);
        }
      }
    } else if (chain && s > 0) {
      const uint64_t first = static_cast<uint64_t>(s - 1) * kSegmentBlocks;
      const int count = static_cast<int>(n_sums - first < kSegmentBlocks ? n_sums - first
                                                                          : kSegmentBlocks);
      const uint64_t(*seg)[kLanes] = sums[(s - 1) & 1];
#pragma unroll 8
      for (int i = 0; i < count; ++i) {
        acc += seg[i][lane];
        if (first + i < layout.full_blocks) acc = ScrambleLane(acc, scramble_key);
      }
    }
    __syncthreads();
  }

  if (chain) {
    const uint8_t* last = chunk + len - kStripeBytes;
    acc += LastStripeLane(ReadLE64(last + 8 * lane), ReadLE64(last + 8 * (lane ^ 1)), lane, secret);
    uint64_t all[kLanes];
#pragma unroll
    for (int j = 0; j < static_cast<int>(kLanes); ++j) all[j] = __shfl_sync(kChainMask, acc, j);
    if (lane == 0) out[blockIdx.x] = MergeAccs(all, secret, len);
  }
}

// Workspace: what one launch needs besides the kernel: a stream, device
// buffers for descriptors and results, and pinned host staging for both.
struct Workspace {
  cudaStream_t stream = nullptr;
  size_t capacity = 0;            // chunks
  ChunkDesc* dev_descs = nullptr;  // capacity descriptors, then capacity results
  uint64_t* dev_out = nullptr;
  ChunkDesc* host_descs = nullptr;  // pinned, same layout
  uint64_t* host_out = nullptr;

  void FreeBuffers() {
    if (dev_descs != nullptr) cudaFree(dev_descs);
    if (host_descs != nullptr) cudaFreeHost(host_descs);
    dev_descs = nullptr;
    host_descs = nullptr;
    dev_out = nullptr;
    host_out = nullptr;
    capacity = 0;
  }
  void Destroy() {
    FreeBuffers();
    if (stream != nullptr) cudaStreamDestroy(stream);
    stream = nullptr;
  }
  cudaError_t Reserve(size_t n) {
    if (n <= capacity) return cudaSuccess;
    FreeBuffers();
    size_t cap = 256;
    while (cap < n) cap *= 2;
    const size_t bytes = cap * (sizeof(ChunkDesc) + sizeof(uint64_t));
    void* dev = nullptr;
    if (cudaError_t e = cudaMalloc(&dev, bytes); e != cudaSuccess) return e;
    void* host = nullptr;
    if (cudaError_t e = cudaMallocHost(&host, bytes); e != cudaSuccess) {
      cudaFree(dev);
      return e;
    }
    dev_descs = static_cast<ChunkDesc*>(dev);
    dev_out = reinterpret_cast<uint64_t*>(dev_descs + cap);
    host_descs = static_cast<ChunkDesc*>(host);
    host_out = reinterpret_cast<uint64_t*>(host_descs + cap);
    capacity = cap;
    return cudaSuccess;
  }
};

// WorkspacePool keeps idle workspaces of one device, so that concurrent
// calls do not share a stream and sequential ones reuse their buffers.
struct WorkspacePool {
  std::mutex mu;
  std::vector<Workspace*> idle;  // guarded by mu
};

// Pools live for the whole process (never destroyed: CUDA may be torn down
// before static destructors run).
WorkspacePool& PoolOf(int device) {
  static WorkspacePool* pools = new WorkspacePool[kMaxDevices];
  return pools[device];
}

cudaError_t Acquire(int device, Workspace** ws) {
  WorkspacePool& pool = PoolOf(device);
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    if (!pool.idle.empty()) {
      *ws = pool.idle.back();
      pool.idle.pop_back();
      return cudaSuccess;
    }
  }
  auto* fresh = new Workspace;
  if (cudaError_t e = cudaStreamCreateWithFlags(&fresh->stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    delete fresh;
    return e;
  }
  *ws = fresh;
  return cudaSuccess;
}

void Release(int device, Workspace* ws) {
  WorkspacePool& pool = PoolOf(device);
  std::lock_guard<std::mutex> lock(pool.mu);
  pool.idle.push_back(ws);
}

cudaError_t RunBatch(Workspace& ws, const ChunkDesc* host_descs, size_t n, uint64_t* host_out) {
  if (cudaError_t e = ws.Reserve(n); e != cudaSuccess) return e;
  std::memcpy(ws.host_descs, host_descs, n * sizeof(ChunkDesc));
  if (cudaError_t e = cudaMemcpyAsync(ws.dev_descs, ws.host_descs, n * sizeof(ChunkDesc),
                                      cudaMemcpyHostToDevice, ws.stream);
      e != cudaSuccess) {
    return e;
  }
  ChunkChecksumKernel<<<static_cast<unsigned>(n), kThreads, 0, ws.stream>>>(ws.dev_descs,
                                                                             ws.dev_out);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (cudaError_t e = cudaMemcpyAsync(ws.host_out, ws.dev_out, n * sizeof(uint64_t),
                                      cudaMemcpyDeviceToHost, ws.stream);
      e != cudaSuccess) {
    return e;
  }
  if (cudaError_t e = cudaStreamSynchronize(ws.stream); e != cudaSuccess) return e;
  std::memcpy(host_out, ws.host_out, n * sizeof(uint64_t));
  return cudaSuccess;
}

}  // namespace

// LaunchChunkChecksums computes XXH3_64bits of each of the `n` device
// ranges in host_descs (each kShortestLong .. 1 MiB bytes; checked by the
// caller) on `device`, in one launch on a stream of its own, writes them to
// host_out[0 .. n) and returns once they are there. Makes `device` the
// calling thread's current device. Thread-safe. Declared in
// gpu/xxh3_device.cc, its only caller.
cudaError_t LaunchChunkChecksums(const ChunkDesc* host_descs, size_t n, uint64_t* host_out,
                                 int device) {
  if (n == 0) return cudaSuccess;
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  if (n > 0x7fffffffu) return cudaErrorInvalidValue;  // grid size
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return e;
  Workspace* ws = nullptr;
  if (cudaError_t e = Acquire(device, &ws); e != cudaSuccess) return e;
  const cudaError_t e = RunBatch(*ws, host_descs, n, host_out);
  if (e == cudaSuccess || e == cudaErrorMemoryAllocation) {
    Release(device, ws);
  } else {
    // The stream may hold a failed launch or copy: do not reuse it.
    cudaStreamSynchronize(ws->stream);
    ws->Destroy();
    delete ws;
  }
  return e;
}

// LaunchChunkChecksumsAsync launches the kernel over `n` descriptors already
// in device memory (dev_descs), writing dev_out[0 .. n), on `stream`, and
// returns without waiting: the pipelined copier (gpu/cuda_ipc.cc) orders it
// after the copies it verifies with events. The caller checked the ranges.
cudaError_t LaunchChunkChecksumsAsync(const ChunkDesc* dev_descs, size_t n, uint64_t* dev_out,
                                      cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffffu) return cudaErrorInvalidValue;  // grid size
  ChunkChecksumKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(dev_descs, dev_out);
  return cudaGetLastError();
}

}  // namespace xxh3
}  // namespace evoke
