// gpu/cuda_ipc.h for builds without CUDA: every factory says so.
#include "gpu/cuda_ipc.h"

namespace evoke {
namespace {
absl::Status NoCuda() {
  return absl::UnavailableError("evoke was built without CUDA (nvcc not found)");
}
}  // namespace

absl::StatusOr<std::unique_ptr<CudaIpcMapping>> CudaIpcMapping::Open(
    absl::string_view, int, uint64_t) {
  return NoCuda();
}
CudaIpcMapping::~CudaIpcMapping() = default;

class DeviceCopier::Impl {};
absl::StatusOr<std::unique_ptr<DeviceCopier>> DeviceCopier::Create(int, int,
                                                                  const PipelineOptions&) {
  return NoCuda();
}
DeviceCopier::DeviceCopier(int device, std::unique_ptr<Impl> impl)
    : device_(device), impl_(std::move(impl)) {}
DeviceCopier::~DeviceCopier() = default;
absl::Status DeviceCopier::DeviceToHost(absl::Span<const CopyOp>) { return NoCuda(); }
absl::Status DeviceCopier::HostToDevice(absl::Span<const CopyOp>) { return NoCuda(); }
absl::Status DeviceCopier::Execute(const TransferPlan&, absl::Span<uint64_t>) { return NoCuda(); }

absl::StatusOr<std::unique_ptr<HostRegistration>> HostRegistration::Start(
    void*, uint64_t, uint64_t) {
  return NoCuda();
}
HostRegistration::HostRegistration(void* base, uint64_t size, uint64_t chunk)
    : base_(static_cast<uint8_t*>(base)), size_(size), chunk_(chunk) {}
HostRegistration::~HostRegistration() = default;
void HostRegistration::Run() {}
absl::Status HostRegistration::status() const { return NoCuda(); }

}  // namespace evoke
