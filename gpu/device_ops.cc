// CudaDeviceOps: gpu/device_ops.h over the CUDA implementations (or, in a
// build without CUDA, over their stubs, which return UNAVAILABLE).
#include "gpu/device_ops.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"

namespace evoke {
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
