// TransferPlan: how a batch of host<->device copies, the checksums of the
// bytes they move and the RoPE re-anchoring of what lands is spread over
// several streams, so that DMA overlaps verification and re-anchoring. The
// plan is plain data built on the host (no CUDA here): the CUDA executor
// (DeviceCopier::Execute, gpu/cuda_ipc.h) issues it on real streams with
// events, and the host-memory fake devices (testing/host_device_copier.h)
// run the very same plan in host memory, in any interleaving its stream
// order and events allow (SimulatePlan), so that chunking, ordering, ranges
// and checksums are tested on machines without a GPU. CheckPlanOrdering
// proves a plan free of races: every pair of steps that touch the same bytes
// (one of them writing) is ordered by stream order or events.
//
// The three shapes of plan:
//   PlanCopies   a batch of copies (DeviceToHost / HostToDevice): coalesced,
//                large copies cut into pieces spread over the copy streams,
//                small ones grouped so that each step is one batched copy
//                (cudaMemcpyBatchAsync), never one call per page.
//   PlanFetch    Save: device -> host copies, and the chunk checksums of the
//                device bytes on the checksum stream at the same time (both
//                only read device memory, so nothing orders them).
//   PlanLanding  Load: host -> device copies in pieces over the copy streams;
//                each piece's chunks are hashed on the checksum stream once
//                the piece has landed (an event), and each block is
//                re-anchored on the re-anchor stream once all its chunks are
//                hashed, while later pieces are still in flight.
#ifndef EVOKE_GPU_TRANSFER_PLAN_H_
#define EVOKE_GPU_TRANSFER_PLAN_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gpu/copy_op.h"
#include "gpu/rope_device.h"
#include "gpu/xxh3_device.h"

namespace evoke {

// How plans are cut. The defaults are what CudaDeviceOps uses.
struct PipelineOptions {
  // Pieces of a pipelined transfer (PlanLanding): a multiple of
  // kChecksumChunkBytes, so that no checksum chunk straddles two pieces.
  uint64_t chunk_bytes = 2ull << 20;
  // Plain copies (PlanCopies, PlanFetch) longer than this are cut into
  // pieces of this size, spread over the copy streams.
  uint64_t split_bytes = 8ull << 20;
  // Copy streams (>= 1). The checksum stream and the re-anchor stream come
  // on top of them.
  int copy_streams = 2;
  // At most this many pieces in one batched copy step.
  int max_batch_ops = 1024;
};

// CheckPipelineOptions: INVALID_ARGUMENT unless chunk_bytes is a positive
// multiple of kChecksumChunkBytes, split_bytes > 0, copy_streams in [1, 8]
// and max_batch_ops >= 1.
absl::Status CheckPipelineOptions(const PipelineOptions& options);

enum class CopyDirection : uint8_t { kToHost, kToDevice };

enum class StepKind : uint8_t {
  kCopy,      // copies[begin, end): one batched copy on `stream`
  kChecksum,  // ranges[begin, end): one checksum launch; results sums[begin, end)
  kReanchor,  // jobs[begin, end): one re-anchor launch per job
  kRecord,    // record `event` on `stream`
  kWait,      // `stream` waits for `event` (recorded by an earlier step)
};

struct PlanStep {
  StepKind kind = StepKind::kCopy;
  int stream = 0;
  size_t begin = 0;
  size_t end = 0;
  int event = -1;
};

// A plan: steps in the order the host issues them. Streams are numbered
// 0 .. streams - 1: kChecksumStream, kReanchorStream, then the copy streams.
// The executor synchronizes every stream at the end.
struct TransferPlan {
  static constexpr int kChecksumStream = 0;
  static constexpr int kReanchorStream = 1;
  static constexpr int kFirstCopyStream = 2;

  CopyDirection direction = CopyDirection::kToHost;
  int streams = kFirstCopyStream;
  int events = 0;
  std::vector<CopyOp> copies;          // Pieces (after coalescing and cutting).
  std::vector<DeviceRange> ranges;     // Device ranges to hash (241 B .. 1 MiB).
  std::vector<DeviceReanchorJob> jobs; // Blocks to re-anchor (device payloads).
  std::vector<PlanStep> steps;
  // PlanFetch / PlanLanding: for block i, chunk j (kChecksumChunkBytes each),
  // the index into `ranges` of its checksum, or -1 when the chunk is hashed
  // on the host (shorter than kDeviceChecksumMinBytes). Empty for a block
  // that is not hashed.
  std::vector<std::vector<int64_t>> chunk_index;

  // Counts, for tests and logs.
  size_t copy_steps() const;
  size_t steps_of(StepKind kind) const;
};

// PlanCopies: the plan of a DeviceToHost / HostToDevice batch: CoalesceCopies,
// copies longer than split_bytes cut into split_bytes pieces, pieces grouped
// in order into steps of about split_bytes (at most max_batch_ops pieces),
// step k on copy stream k % copy_streams. Options must pass
// CheckPipelineOptions.
TransferPlan PlanCopies(absl::Span<const CopyOp> ops, CopyDirection direction,
                        const PipelineOptions& options = {});

// One block of a Save from device memory.
struct FetchBlock {
  const void* device_src = nullptr;
  void* host_dst = nullptr;
  uint64_t bytes = 0;
  bool checksum = false;  // PayloadChecksum of the device bytes, on the device.
};

// PlanFetch: PlanCopies of the blocks (device -> host) and, on the checksum
// stream, one checksum step over every hashed block's chunks of at least
// kDeviceChecksumMinBytes (a short final chunk is hashed on the host, from
// host_dst, by FinishChecksums). No events: nothing writes what the other
// side reads.
TransferPlan PlanFetch(absl::Span<const FetchBlock> blocks, const PipelineOptions& options = {});

// One block of a Load into device memory.
struct LandingBlock {
  const void* host_src = nullptr;
  void* device_dst = nullptr;
  uint64_t bytes = 0;
  bool verify = false;  // PayloadChecksum of the landed bytes, on the device.
  // Re-anchoring of the landed block, after its verification hashing; its
  // device_payload must be device_dst and payload_bytes <= bytes. Null: none.
  const DeviceReanchorJob* reanchor = nullptr;
};

// PlanLanding: each block cut into pieces of chunk_bytes (from its own
// start), pieces grouped in order into groups of about chunk_bytes; group g
// is one copy step on copy stream g % copy_streams, then an event; the
// checksum stream waits for it and hashes the group's chunks; blocks whose
// last piece is in group g and that re-anchor are then re-anchored on the
// re-anchor stream after an event recorded behind that checksum step.
// INVALID_ARGUMENT for a re-anchor job that does not name its block's
// destination, or for bad options.
absl::StatusOr<TransferPlan> PlanLanding(absl::Span<const LandingBlock> blocks,
                                         const PipelineOptions& options = {});

// FinishChecksums: PayloadChecksum of each block the plan hashes, from the
// device's chunk sums (sums[k] for plan.ranges[k]) and, for a short final
// chunk, the host copy of block i's bytes at host_bytes[i] (sizes[i] bytes).
// 0 for blocks not hashed.
std::vector<uint64_t> FinishChecksums(const TransferPlan& plan,
                                      absl::Span<const uint64_t> sums,
                                      absl::Span<const uint8_t* const> host_bytes,
                                      absl::Span<const uint64_t> sizes);

// BlockChecksums: FinishChecksums of a PlanFetch plan (short final chunks
// hashed from host_dst) or of a PlanLanding plan (from host_src).
std::vector<uint64_t> BlockChecksums(const TransferPlan& plan, absl::Span<const uint64_t> sums,
                                     absl::Span<const FetchBlock> blocks);
std::vector<uint64_t> BlockChecksums(const TransferPlan& plan, absl::Span<const uint64_t> sums,
                                     absl::Span<const LandingBlock> blocks);

// CheckPlanOrdering returns OK when every pair of steps of `plan` whose
// memory accesses conflict (the same bytes, one of them a write) is ordered
// by stream order and events (happens-before), and every wait names an event
// recorded earlier; INTERNAL naming the first pair otherwise. Copies write
// their destinations and read their sources, checksums read their ranges,
// re-anchoring reads and writes its payloads.
absl::Status CheckPlanOrdering(const TransferPlan& plan);

// SimulatePlan runs `run` for every step of `plan` except records and waits,
// one at a time, in an order that respects stream order and events but is
// otherwise chosen at random from `seed`, as real streams may run them. It
// stops at the first error `run` returns, and returns INTERNAL if the plan
// deadlocks (a wait whose event is never recorded before it).
absl::Status SimulatePlan(const TransferPlan& plan, uint64_t seed,
                          const std::function<absl::Status(const PlanStep&)>& run);

}  // namespace evoke

#endif  // EVOKE_GPU_TRANSFER_PLAN_H_
