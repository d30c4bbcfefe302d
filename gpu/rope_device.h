// RoPE re-anchoring on the GPU: the device twin of common/rope.h's
// ReanchorCanonicalBlock, for blocks already in device memory (a CUDA IPC
// region, an engine's cache). Same angle table (RopePlan, built on the host)
// and same numerics; gpu/rope_device_test.cc checks it against the CPU.
#ifndef EVOKE_GPU_ROPE_DEVICE_H_
#define EVOKE_GPU_ROPE_DEVICE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/rope.h"
#include "evoke/v1/block.pb.h"

namespace evoke {

// ReanchorCanonicalBlockOnDevice rotates, in place, every layer's K section of
// the canonical-v1 payload of block `meta` held in memory of CUDA device
// `device` at `device_payload` (payload_bytes bytes, any alignment), token t
// by delta[t] positions, exactly as ReanchorCanonicalBlock does on the host:
// V sections, dims >= rotary_dim and tokens with delta 0 are not written.
// `delta` is host memory. The caller keeps ownership of both buffers and must
// not use the payload from other streams until the call returns.
//
// Blocks the calling thread until the rotation is done, on a stream of its
// own (no other stream of the device is synchronized); the calling thread's
// current device is restored on return. Thread-safe.
//
// Returns OK, without touching the device, when there is nothing to do (a
// ROPE_NONE plan, every delta 0). Otherwise:
//   INVALID_ARGUMENT  as CheckCanonicalReanchor (common/rope.h); a null
//                     payload; a payload that is not device (or managed)
//                     memory of `device`, or that runs past its allocation;
//   UNAVAILABLE       no CUDA driver or device, `device` does not exist, or
//                     the build has no CUDA ("evoke was built without CUDA
//                     (nvcc not found)");
//   RESOURCE_EXHAUSTED / INTERNAL  CUDA allocation or launch failures
//                     (see gpu/cuda_status.h).
absl::Status ReanchorCanonicalBlockOnDevice(const RopePlan& plan,
                                            const v1::BlockMeta& meta,
                                            void* device_payload,
                                            uint64_t payload_bytes,
                                            absl::Span<const int64_t> delta,
                                            int device);

// One block of a batch for ReanchorCanonicalBlocksOnDevice.
struct DeviceReanchorJob {
  const RopePlan* plan = nullptr;
  const v1::BlockMeta* meta = nullptr;
  void* device_payload = nullptr;
  uint64_t payload_bytes = 0;
  absl::Span<const int64_t> delta;
};

// ReanchorCanonicalBlocksOnDevice does ReanchorCanonicalBlockOnDevice for a
// batch of blocks on one device: one stream, one upload of every angle and
// delta table, one launch per block, one synchronization. Errors as the
// single-block form; on error no further block is started.
absl::Status ReanchorCanonicalBlocksOnDevice(absl::Span<const DeviceReanchorJob> jobs,
                                             int device);

}  // namespace evoke

#endif  // EVOKE_GPU_ROPE_DEVICE_H_
