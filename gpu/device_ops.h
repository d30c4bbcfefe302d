// DeviceOps: the seam between the daemon's data paths and a GPU. Everything
// the Save and Load paths do with a device's memory goes through it: batched
// copies between host and device, chunk checksums where the bytes are, and
// RoPE re-anchoring in place. The CUDA implementation (CudaDeviceOps) wraps
// DeviceCopier (gpu/cuda_ipc.h), DeviceChunkChecksums (gpu/xxh3_device.h)
// and ReanchorCanonicalBlocksOnDevice (gpu/rope_device.h), unchanged; tests
// use a host-memory implementation (testing/host_device_copier.h), so that
// the CUDA branches of the data paths run on machines without a GPU.
#ifndef EVOKE_GPU_DEVICE_OPS_H_
#define EVOKE_GPU_DEVICE_OPS_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gpu/cuda_ipc.h"
#include "gpu/rope_device.h"
#include "gpu/transfer_plan.h"
#include "gpu/xxh3_device.h"

namespace evoke {

// DeviceOps: one device. Every call blocks until its work is complete.
// "Device pointers" are addresses that device() can read and write (its
// allocations, CUDA IPC mappings opened on it). Thread-safe.
class DeviceOps {
 public:
  virtual ~DeviceOps() = default;

  virtual int device() const = 0;
  // Copies device -> host (src device pointers, dst host pointers), as
  // DeviceCopier::DeviceToHost: adjacent ops coalesced, the batch issued as
  // PlanCopies cuts it (many small ops: a few batched copies, never one call
  // per op; large ones: pieces over several streams).
  virtual absl::Status DeviceToHost(absl::Span<const CopyOp> ops) = 0;
  // Copies host -> device (src host pointers, dst device pointers).
  virtual absl::Status HostToDevice(absl::Span<const CopyOp> ops) = 0;
  // ChunkChecksums: DeviceChunkChecksums on this device (ranges of
  // kDeviceChecksumMinBytes to kChecksumChunkBytes bytes; errors as there).
  virtual absl::Status ChunkChecksums(absl::Span<const DeviceRange> ranges,
                                      absl::Span<uint64_t> out) = 0;
  // ReanchorCanonicalBlocks: ReanchorCanonicalBlocksOnDevice on this device
  // (errors as there).
  virtual absl::Status ReanchorCanonicalBlocks(absl::Span<const DeviceReanchorJob> jobs) = 0;

  // FetchBlocks: a Save's copies of `blocks` device -> host and, for each
  // block with `checksum` set, PayloadChecksum (common/checksum.h) of its
  // device bytes, computed on the device while the copies run (PlanFetch:
  // no wait between the copy and the hashing). checksums[i] is block i's
  // (0 for a block not hashed); checksums.size() must be blocks.size()
  // (INVALID_ARGUMENT). Errors otherwise as DeviceToHost and ChunkChecksums.
  // The default runs DeviceToHost, then ChunkChecksums, one after the other.
  virtual absl::Status FetchBlocks(absl::Span<const FetchBlock> blocks,
                                   absl::Span<uint64_t> checksums);
  // LandBlocks: a Load's copies of `blocks` host -> device, pipelined
  // (PlanLanding): while piece k+1 is in flight, piece k's chunks are hashed
  // where they landed, and a block whose chunks are all hashed is
  // re-anchored in place (its `reanchor` job) while later pieces land.
  // checksums[i] is PayloadChecksum of what landed for each block with
  // `verify` (the bytes before re-anchoring; 0 for others): the caller
  // compares it with the stored checksum and must not serve a block that
  // differs. A block that fails has been re-anchored all the same, so its
  // destination holds garbage, as after any failed Load. Errors as
  // HostToDevice, ChunkChecksums and ReanchorCanonicalBlocks (a re-anchor
  // job is checked before anything is copied), INVALID_ARGUMENT for
  // checksums.size() != blocks.size() or a job that does not name its
  // block's destination. The default runs HostToDevice, ChunkChecksums and
  // ReanchorCanonicalBlocks one after the other.
  virtual absl::Status LandBlocks(absl::Span<const LandingBlock> blocks,
                                  absl::Span<uint64_t> checksums);
};

// DeviceOpsFactory opens a DeviceOps per device. Thread-safe.
class DeviceOpsFactory {
 public:
  virtual ~DeviceOpsFactory() = default;
  // Open errors: UNAVAILABLE (no CUDA, no such device).
  virtual absl::StatusOr<std::unique_ptr<DeviceOps>> Open(int device) = 0;
};

// CudaDeviceOps returns the factory of the process's CUDA devices (in a
// build without CUDA, Open returns UNAVAILABLE "built without CUDA"). Never
// null; lives for the whole process.
DeviceOpsFactory* CudaDeviceOps();

}  // namespace evoke

#endif  // EVOKE_GPU_DEVICE_OPS_H_
