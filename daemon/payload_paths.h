// Payload paths of the gRPC service: where Save reads payloads from and
// where Load writes them to, for inline bytes, shared-memory regions and
// CUDA regions. Region slices are resolved and bounds-checked here.
#ifndef EVOKE_DAEMON_PAYLOAD_PATHS_H_
#define EVOKE_DAEMON_PAYLOAD_PATHS_H_

#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/rope.h"
#include "daemon/lease_manager.h"
#include "daemon/region.h"
#include "evoke/v1/kvtier.pb.h"
#include "gpu/cuda_ipc.h"
#include "gpu/device_ops.h"
#include "storage/tier_manager.h"

namespace evoke {

// DeviceCopiers: one DeviceOps (gpu/device_ops.h) per device, opened on
// first use. Thread-safe.
class DeviceCopiers {
 public:
  // The process's CUDA devices (CudaDeviceOps).
  DeviceCopiers() : DeviceCopiers(CudaDeviceOps()) {}
  // Devices opened through `factory` (not null; must outlive this), e.g.
  // host-memory fakes in tests.
  explicit DeviceCopiers(DeviceOpsFactory* factory) : factory_(factory) {}

  // Get errors: UNAVAILABLE (no CUDA, no such device); a failed open is
  // retried on the next Get.
  absl::StatusOr<DeviceOps*> Get(int device);

 private:
  DeviceOpsFactory* const factory_;
  absl::Mutex mu_;
  absl::flat_hash_map<int, std::unique_ptr<DeviceOps>> copiers_ ABSL_GUARDED_BY(mu_);
};

// SaveRequestSource serves the payloads of a validated SaveRequest. Host
// payloads (inline, shared memory) are read in place; CUDA slices are
// fetched in one batch per device, coalesced.
class SaveRequestSource final : public SaveSource {
 public:
  // Create resolves every region slice of the request against `lease`
  // (which must be set when any block names a region): NOT_FOUND for a
  // region that is not the lease's, INVALID_ARGUMENT for a slice outside it.
  static absl::StatusOr<std::unique_ptr<SaveRequestSource>> Create(
      const v1::SaveRequest& request, const std::optional<Lease>& lease,
      const LeaseManager& leases, DeviceCopiers* copiers);

  absl::string_view HostBytes(size_t i) override;
  // CUDA slices: copied device to host first, then session blocks are
  // checksummed on the GPU from the client's device memory (their bytes are
  // private to their owner: a client that changes them mid-save only fails
  // its own save); prefix blocks, shared by every client, are checksummed
  // from the daemon's own copy in tier 1.
  absl::Status Fetch(absl::Span<const size_t> items, absl::Span<uint8_t* const> dsts,
                     absl::Span<std::optional<uint64_t>> checksums) override;

 private:
  SaveRequestSource(const v1::SaveRequest& request, DeviceCopiers* copiers)
      : request_(request), copiers_(copiers) {}
  const v1::SaveRequest& request_;
  DeviceCopiers* const copiers_;
  std::vector<std::shared_ptr<Region>> regions_;  // Per block; null when inline.
};

// LoadResponseSink writes a Load's payloads inline into the response (under
// a byte budget: RESOURCE_EXHAUSTED past it) or into the request's
// destination slices (shared memory: copied in place; CUDA: one batch of
// host-to-device copies per device at Finish).
class LoadResponseSink final : public LoadSink {
 public:
  static absl::StatusOr<std::unique_ptr<LoadResponseSink>> Create(
      const v1::LoadRequest& request, v1::LoadResponse* response,
      uint64_t inline_budget, const std::optional<Lease>& lease,
      const LeaseManager& leases, DeviceCopiers* copiers);

  absl::Status Prepare(absl::Span<const v1::BlockMeta> metas) override;
  uint8_t* HostDestination(size_t i) override;
  absl::Status AfterHostCopy(size_t i, uint8_t* dest, uint64_t n) override;
  absl::Status Deliver(size_t i, const uint8_t* bytes, uint64_t n, uint64_t checksum) override;
  // Blocks bound for a GPU are verified there, after the copy (before any
  // re-anchoring).
  bool VerifiesDeliveries() const override { return true; }
  absl::Status Finish() override;

  // ApplyNewPositions writes each re-anchored block's new positions into its
  // returned metadata.
  void ApplyNewPositions(std::vector<v1::BlockMeta>* metas) const;

 private:
  // A block to re-anchor: its plan, per-token deltas and new positions.
  struct Reanchoring {
    RopePlan plan;
    std::vector<int64_t> delta;
    bool contiguous = true;  // New positions are first, first + 1, ...
    int32_t first = 0;
    std::vector<int32_t> positions;
    v1::BlockMeta meta;
  };
  absl::Status PrepareReanchor(size_t i, const v1::BlockMeta& meta);
  // Where block i lands in its destination region (device address).
  uint8_t* DestinationOnDevice(size_t i) const;

  LoadResponseSink(const v1::LoadRequest& request, v1::LoadResponse* response,
                   uint64_t budget, DeviceCopiers* copiers)
      : request_(request), response_(response), budget_(budget), copiers_(copiers) {}
  const v1::LoadRequest& request_;
  v1::LoadResponse* const response_;
  const uint64_t budget_;
  DeviceCopiers* const copiers_;
  std::vector<std::shared_ptr<Region>> regions_;  // Empty: inline.
  absl::flat_hash_map<int, std::vector<CopyOp>> device_ops_;
  struct Delivered {
    size_t index;
    const uint8_t* host;  // The verified-on-arrival source (tier 1 or staging).
    uint64_t bytes;
    uint64_t checksum;
  };
  std::vector<Delivered> delivered_;
  std::vector<std::optional<Reanchoring>> reanchor_;  // Per block.
  std::vector<size_t> device_reanchor_;  // Blocks to re-anchor on the device.
};

}  // namespace evoke

#endif  // EVOKE_DAEMON_PAYLOAD_PATHS_H_
