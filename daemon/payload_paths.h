// Payload paths of the data plane: where a SaveCommand's payloads are read
// from and where a LoadCommand's are written to (daemon/block_commands.h),
// for inline bytes, shared-memory regions and CUDA regions, whatever the
// transport. Region slices are resolved and bounds-checked here.
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
#include "daemon/block_commands.h"
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

// LeaseRegions resolves against a lease's regions in the LeaseManager,
// each region once (it keeps them mapped for as long as it lives, or until
// Drop).
class LeaseRegions final : public RegionResolver {
 public:
  LeaseRegions(const BlockId& lease, const LeaseManager* leases)
      : lease_(lease), leases_(leases) {}
  absl::StatusOr<std::shared_ptr<Region>> Get(uint64_t region_id,
                                              absl::string_view field) override;
  // Drop forgets every region (they unmap once no copy holds them).
  void Drop() { cache_.clear(); }

 private:
  const BlockId lease_;
  const LeaseManager* const leases_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Region>> cache_;
};

// A gather or scatter list resolved against a lease's regions:
// where each slice's bytes are (the daemon's mapping of a shared-memory
// region, or a device pointer of a CUDA region), all on the host or all on
// one device.
struct SliceList {
  struct Piece {
    uint8_t* ptr;  // Host address, or device pointer when device >= 0.
    uint64_t length;
  };
  int device = -1;  // -1: the host.
  std::vector<Piece> pieces;
  uint64_t total = 0;  // Sum of the lengths.
  bool empty() const { return pieces.empty(); }
};

// SaveRequestSource serves the payloads of a validated SaveCommand. Host
// payloads (inline, shared memory) are read in place; CUDA slices are
// fetched with one DeviceOps::FetchBlocks per device (coalesced copies, the
// session blocks hashed on the device beside them); gather lists are copied
// slice by slice into tier 1 (host) or in the same FetchBlocks (CUDA).
// Inline payloads left in pieces in the transport's buffers are HostPieces.
class SaveRequestSource final : public SaveSource {
 public:
  // Create resolves every region slice of the command (region slices and
  // every slice of a gather list) through `regions` (which must be set when
  // any block names a region, and outlive the source): NOT_FOUND for a
  // region that is not the lease's, INVALID_ARGUMENT for a slice outside
  // its region or a gather list that mixes the host and a device (or two
  // devices). Errors name the slice: "blocks[2].gather.slices[7]". The
  // command must outlive the source.
  static absl::StatusOr<std::unique_ptr<SaveRequestSource>> Create(
      const SaveCommand& command, RegionResolver* regions, DeviceCopiers* copiers);

  // Empty for CUDA slices, for gathered blocks (host or CUDA: the
  // TierManager then calls Fetch) and for inline pieces.
  absl::string_view HostBytes(size_t i) override;
  // An inline payload's pieces (PayloadRef::inline_pieces).
  absl::Span<const absl::string_view> HostPieces(size_t i) override;
  // CUDA slices: one FetchBlocks per device copies them device to host
  // and, in the same plan, checksums the session blocks on the GPU from the
  // client's device memory while the copies run (their bytes are private to
  // their owner: a client that changes them mid-save only fails its own
  // save); prefix blocks, shared by every client, are checksummed from the
  // daemon's own copy in tier 1. Gathered blocks: host slices are copied one
  // after the other into the destination, which is hashed chunk by chunk as
  // it fills (the daemon's copy, as the TierManager would hash it, but while
  // in cache); CUDA slices join their device's FetchBlocks, one block per
  // slice (adjacent slices coalesced), not hashed there: their checksums are
  // left to the TierManager (the device's chunk checksums need each 1 MiB
  // chunk contiguous in device memory, which a gathered payload is not).
  absl::Status Fetch(absl::Span<const size_t> items, absl::Span<uint8_t* const> dsts,
                     absl::Span<std::optional<uint64_t>> checksums) override;

 private:
  SaveRequestSource(const SaveCommand& command, DeviceCopiers* copiers)
      : command_(command), copiers_(copiers) {}
  const SaveCommand& command_;
  DeviceCopiers* const copiers_;
  std::vector<std::shared_ptr<Region>> regions_;  // Per block; null unless kRegion.
  std::vector<SliceList> gathers_;                // Per block; empty unless kGather.
};

// CheckInlineBudget refuses (RESOURCE_EXHAUSTED) a Load whose payloads
// would take more than `budget` bytes inline in the response.
absl::Status CheckInlineBudget(absl::Span<const v1::BlockMeta> metas, uint64_t budget);

// LoadResponseSink writes a Load's payloads inline into `inline_out` (under
// a byte budget: RESOURCE_EXHAUSTED past it), into the command's
// destination slices (shared memory: copied in place; CUDA: one
// DeviceOps::LandBlocks per device at Finish), or scattered into the
// command's scatter lists (shared memory: at Deliver, hashing each 1 MiB
// chunk of the source before scattering it; CUDA: verified on the host at
// Deliver, then one batch of host-to-device copies per device at Finish).
//
// CUDA destinations: LandBlocks copies each block in pieces over several
// streams, verifies each piece where it landed (the checksum of the bytes
// on the device, before any re-anchoring, compared with the stored one) and
// re-anchors the block in place once all its pieces are verified, while
// later pieces are still in flight. So a block that fails verification may
// already have been rotated (its destination holds garbage, as after any
// failed load): Finish returns DATA_LOSS all the same, nothing is served,
// and the TierManager, seeing DATA_LOSS from a sink that verifies its
// deliveries, re-hashes the tier-1 copies it delivered and quarantines a bad
// one (the next load comes from disk).
//
// CUDA scatter lists do not go through LandBlocks: its verification hashes
// a block's 1 MiB chunks where they land, which needs the block contiguous
// in device memory (a scattered block's pieces are pages anywhere, chunk
// boundaries fall inside them, pieces may be shorter than the device's
// smallest checksum range), and it returns whole-block checksums only, so
// per-piece landings could not be combined into the block's checksum; the
// device re-anchor job, too, takes one contiguous payload. They are verified
// on the host before the copy instead (a transfer that goes bad on the bus
// is not caught) and re-anchored on the host.
//
// Re-anchoring a scattered block: its verified bytes are copied into a
// staging buffer, K is rotated there (on the host, also for a CUDA
// destination: the device kernel needs the block contiguous) and the result
// is scattered; V is byte-identical and K equals what the contiguous paths
// return.
class LoadResponseSink final : public LoadSink {
 public:
  // Create resolves `destinations` or every slice of `scatter` through
  // `regions` as SaveRequestSource::Create does ("scatter[1].slices[3]").
  // A command with neither has its payloads returned in `inline_out` (one
  // string per id), which must then be set. `command`, `inline_out` and
  // `regions` must outlive the sink.
  static absl::StatusOr<std::unique_ptr<LoadResponseSink>> Create(
      const LoadCommand& command, std::vector<std::string>* inline_out,
      uint64_t inline_budget, RegionResolver* regions, DeviceCopiers* copiers);

  // Prepare refuses (INVALID_ARGUMENT) a destination shorter than its
  // block's payload and a scatter list whose lengths do not add up to
  // exactly the payload.
  absl::Status Prepare(absl::Span<const v1::BlockMeta> metas) override;
  // Null for CUDA destinations and for scattered blocks (they come through
  // Deliver).
  uint8_t* HostDestination(size_t i) override;
  absl::Status AfterHostCopy(size_t i, uint8_t* dest, uint64_t n) override;
  absl::Status Deliver(size_t i, const uint8_t* bytes, uint64_t n, uint64_t checksum) override;
  // Every delivered block is verified by the sink: contiguous blocks bound
  // for a GPU there, as they land (DATA_LOSS from Finish); scattered blocks
  // on the host as they are scattered or staged (DATA_LOSS from Deliver).
  bool VerifiesDeliveries() const override { return true; }
  // Drain runs the device copies and landings of the blocks delivered so far
  // (each verified) and frees the sink's own staging; Finish is the last
  // Drain.
  absl::Status Drain() override;
  absl::Status Finish() override { return Drain(); }

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
  // Deliver for a block of a scatter list.
  absl::Status DeliverScattered(size_t i, const uint8_t* bytes, uint64_t n, uint64_t checksum);

  LoadResponseSink(const LoadCommand& command, std::vector<std::string>* inline_out,
                   uint64_t budget, DeviceCopiers* copiers)
      : command_(command), inline_out_(inline_out), budget_(budget), copiers_(copiers) {}
  const LoadCommand& command_;
  std::vector<std::string>* const inline_out_;
  const uint64_t budget_;
  DeviceCopiers* const copiers_;
  enum class Mode { kInline, kDestinations, kScatter };
  Mode mode_ = Mode::kInline;
  std::vector<std::shared_ptr<Region>> regions_;  // kDestinations: one per id.
  std::vector<SliceList> scatter_;                // kScatter: one per id.
  // Host staging for re-anchoring scattered blocks: one buffer reused for
  // every host-bound block; one per CUDA-bound block (its copy runs at
  // Finish). Not zero-filled: every byte is written before it is read.
  std::unique_ptr<uint8_t[]> staging_;
  uint64_t staging_bytes_ = 0;
  std::vector<std::unique_ptr<uint8_t[]>> device_staging_;
  uint64_t device_staging_bytes_ = 0;  // Past kMaxDeviceStaging: Drain first.
  static constexpr uint64_t kMaxDeviceStaging = 32ull << 20;
  uint64_t scattered_to_devices_ = 0;  // Blocks, for the log.
  // Scattered CUDA blocks: their slices, one batch per device.
  absl::flat_hash_map<int, std::vector<CopyOp>> device_ops_;
  // Contiguous CUDA destinations, landed at Finish.
  struct Delivered {
    size_t index;
    const uint8_t* host;  // The verified-on-arrival source (tier 1 or staging).
    uint64_t bytes;
    uint64_t checksum;
  };
  std::vector<Delivered> delivered_;
  std::vector<std::optional<Reanchoring>> reanchor_;  // Per block.
};

}  // namespace evoke

#endif  // EVOKE_DAEMON_PAYLOAD_PATHS_H_
