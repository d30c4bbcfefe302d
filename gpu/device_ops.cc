// CudaDeviceOps: gpu/device_ops.h over the CUDA implementations (or, in a
// build without CUDA, over their stubs, which return UNAVAILABLE).
#include "gpu/device_ops.h"

#include <utility>

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

}  // namespace evoke
