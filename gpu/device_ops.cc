// CudaDeviceOps: gpu/device_ops.h over the CUDA implementations (or, in a
// build without CUDA, over their stubs, which return UNAVAILABLE).
#include "gpu/device_ops.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/status_macros.h"

namespace evoke {
namespace {

absl::Status CheckSlots(size_t blocks, size_t slots) {
  if (blocks == slots) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("checksums: ", slots, " slots for ", blocks, " blocks"));
}

}  // namespace

// The defaults: the same plans, their steps run one kind after the other
// through the batch calls (no overlap). Implementations override them.
absl::Status DeviceOps::FetchBlocks(absl::Span<const FetchBlock> blocks,
                                    absl::Span<uint64_t> checksums) {
  EVOKE_RETURN_IF_ERROR(CheckSlots(blocks.size(), checksums.size()));
  const TransferPlan plan = PlanFetch(blocks);
  EVOKE_RETURN_IF_ERROR(DeviceToHost(plan.copies));
  std::vector<uint64_t> sums(plan.ranges.size());
  EVOKE_RETURN_IF_ERROR(ChunkChecksums(plan.ranges, absl::MakeSpan(sums)));
  const std::vector<uint64_t> out = BlockChecksums(plan, sums, blocks);
  std::copy(out.begin(), out.end(), checksums.begin());
  return absl::OkStatus();
}

absl::Status DeviceOps::LandBlocks(absl::Span<const LandingBlock> blocks,
                                   absl::Span<uint64_t> checksums) {
  EVOKE_RETURN_IF_ERROR(CheckSlots(blocks.size(), checksums.size()));
  EVOKE_ASSIGN_OR_RETURN(const TransferPlan plan, PlanLanding(blocks));
  EVOKE_RETURN_IF_ERROR(HostToDevice(plan.copies));
  std::vector<uint64_t> sums(plan.ranges.size());
  EVOKE_RETURN_IF_ERROR(ChunkChecksums(plan.ranges, absl::MakeSpan(sums)));
  EVOKE_RETURN_IF_ERROR(ReanchorCanonicalBlocks(plan.jobs));
  const std::vector<uint64_t> out = BlockChecksums(plan, sums, blocks);
  std::copy(out.begin(), out.end(), checksums.begin());
  return absl::OkStatus();
}

namespace {

class CudaOps final : public DeviceOps {
 public:
  explicit CudaOps(std::unique_ptr<DeviceCopier> copier) : copier_(std::move(copier)) {}

  int device() const override { return copier_->device(); }
  absl::Status DeviceToHost(absl::Span<const CopyOp> ops) override {
    return copier_->DeviceToHost(ops);
  }
  absl::Status HostToDevice(absl::Span<const CopyOp> ops) override {
    return copier_->HostToDevice(ops);
  }
  absl::Status ChunkChecksums(absl::Span<const DeviceRange> ranges,
                              absl::Span<uint64_t> out) override {
    return DeviceChunkChecksums(copier_->device(), ranges, out);
  }
  absl::Status ReanchorCanonicalBlocks(absl::Span<const DeviceReanchorJob> jobs) override {
    return ReanchorCanonicalBlocksOnDevice(jobs, copier_->device());
  }
  // The pipelined forms: the plan issued on the copier's streams at once.
  absl::Status FetchBlocks(absl::Span<const FetchBlock> blocks,
                           absl::Span<uint64_t> checksums) override {
    EVOKE_RETURN_IF_ERROR(CheckSlots(blocks.size(), checksums.size()));
    const TransferPlan plan = PlanFetch(blocks, copier_->options());
    std::vector<uint64_t> sums(plan.ranges.size());
    EVOKE_RETURN_IF_ERROR(copier_->Execute(plan, absl::MakeSpan(sums)));
    const std::vector<uint64_t> out = BlockChecksums(plan, sums, blocks);
    std::copy(out.begin(), out.end(), checksums.begin());
    return absl::OkStatus();
  }
  absl::Status LandBlocks(absl::Span<const LandingBlock> blocks,
                          absl::Span<uint64_t> checksums) override {
    EVOKE_RETURN_IF_ERROR(CheckSlots(blocks.size(), checksums.size()));
    EVOKE_ASSIGN_OR_RETURN(const TransferPlan plan, PlanLanding(blocks, copier_->options()));
    std::vector<uint64_t> sums(plan.ranges.size());
    EVOKE_RETURN_IF_ERROR(copier_->Execute(plan, absl::MakeSpan(sums)));
    const std::vector<uint64_t> out = BlockChecksums(plan, sums, blocks);
    std::copy(out.begin(), out.end(), checksums.begin());
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<DeviceCopier> copier_;
};

class CudaFactory final : public DeviceOpsFactory {
 public:
  absl::StatusOr<std::unique_ptr<DeviceOps>> Open(int device) override {
    absl::StatusOr<std::unique_ptr<DeviceCopier>> copier = DeviceCopier::Create(device);
    if (!copier.ok()) return copier.status();
    return std::unique_ptr<DeviceOps>(new CudaOps(std::move(copier).value()));
  }
};

}  // namespace

DeviceOpsFactory* CudaDeviceOps() {
  static CudaFactory* const factory = new CudaFactory();
  return factory;
}

absl::Status CheckChecksumRanges(absl::Span<const DeviceRange> ranges, size_t out_slots) {
  if (out_slots != ranges.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("out: ", out_slots, " slots for ", ranges.size(), " ranges"));
  }
  for (size_t i = 0; i < ranges.size(); ++i) {
    const DeviceRange& r = ranges[i];
    if (r.ptr == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("ranges[", i, "]: null pointer"));
    }
    if (r.bytes < kDeviceChecksumMinBytes || r.bytes > kChecksumChunkBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ranges[", i, "]: ", r.bytes, " bytes; the device hashes ", kDeviceChecksumMinBytes,
          " to ", kChecksumChunkBytes, " bytes (hash shorter ranges on the host)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace evoke
