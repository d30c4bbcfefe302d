// HostDevices: fake CUDA devices in host memory, behind gpu/device_ops.h, so
// that the CUDA branches of the daemon's data paths (device-to-host fetches,
// checksums on the device, host-to-device loads verified where they land,
// RoPE re-anchoring on the device) run and are tested without a GPU.
//
//   evoke::testing::HostDevices gpus(/*devices=*/2);
//   DeviceCopiers copiers(&gpus);                   // instead of CUDA
//   auto a = gpus.Allocate(/*device=*/0, 1 << 20);  // "device memory"
//   // a->ptr is what a CUDA IPC mapping of a->ipc_handle would give.
//
// A "device pointer" is host memory that Allocate handed out; an "IPC
// handle" (64 bytes, as cudaIpcMemHandle_t) names one allocation. What CUDA
// would fault on is an error here: every device-side range of a copy, a
// checksum or a re-anchor must lie inside one allocation of that device
// (INTERNAL "illegal address", as cudaErrorIllegalAddress), and arguments are
// checked as the CUDA implementations check them. Checksums are the host's
// ChunkChecksum and re-anchoring is the CPU reference, ReanchorCanonicalBlock
// (common/rope.h), which the CUDA kernels are tested against.
//
// Every batch runs as the CUDA copier runs it: the same TransferPlan
// (gpu/transfer_plan.h: PlanCopies for DeviceToHost / HostToDevice,
// PlanFetch for FetchBlocks, PlanLanding for LandBlocks), first checked for
// races (CheckPlanOrdering: a plan that could let a checksum read bytes
// before they land, or re-anchor them before they are hashed, fails with
// INTERNAL), then run step by step in an interleaving of its streams chosen
// at random (SimulatePlan), so that a plan that is only right in issue order
// gives wrong checksums here too.
#ifndef EVOKE_TESTING_HOST_DEVICE_COPIER_H_
#define EVOKE_TESTING_HOST_DEVICE_COPIER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gpu/device_ops.h"

namespace evoke::testing {

// The DeviceOps calls that can be made to fail.
enum class DeviceOp : int {
  kOpen = 0,
  kDeviceToHost,
  kHostToDevice,
  kChecksums,
  kReanchor,
  kFetchBlocks,
  kLandBlocks,
};
inline constexpr int kDeviceOpCount = 7;

// Thread-safe. Allocations live until Free or until the HostDevices and
// every DeviceOps it opened are gone.
class HostDevices final : public DeviceOpsFactory {
 public:
  // Devices 0 .. devices - 1 exist; plans are cut with `options` (which
  // must pass CheckPipelineOptions) and interleaved from `seed`.
  explicit HostDevices(int devices = 1, const PipelineOptions& options = {},
                       uint64_t seed = 1);
  ~HostDevices() override;
  HostDevices(const HostDevices&) = delete;
  HostDevices& operator=(const HostDevices&) = delete;

  // DeviceOpsFactory. UNAVAILABLE for a device that does not exist.
  absl::StatusOr<std::unique_ptr<DeviceOps>> Open(int device) override;

  struct Allocation {
    int device = 0;
    uint8_t* ptr = nullptr;  // The "device pointer" (host memory, zeroed).
    uint64_t bytes = 0;
    std::string ipc_handle;  // kCudaIpcHandleBytes bytes.
  };
  // Allocate makes `bytes` (> 0) of memory of `device`. INVALID_ARGUMENT
  // for 0 bytes, UNAVAILABLE for no such device.
  absl::StatusOr<Allocation> Allocate(int device, uint64_t bytes);
  // Free releases an allocation (by its base). NOT_FOUND when unknown.
  absl::Status Free(const void* ptr);

  // OpenIpc resolves an IPC handle as CudaIpcMapping::Open does and returns
  // the allocation's base: INVALID_ARGUMENT for a handle that is not 64
  // bytes or names no live allocation of `device`, for size 0 or past the
  // allocation; UNAVAILABLE for no such device.
  absl::StatusOr<uint8_t*> OpenIpc(absl::string_view handle, int device,
                                   uint64_t size) const;

  // FailNext makes the next `n` calls of `op` (on any device) fail with
  // `status` before doing anything; n < 0: every call, until ClearFaults.
  void FailNext(DeviceOp op, int n, absl::Status status);
  // CorruptNextHostToDevice makes the next `n` HostToDevice or LandBlocks
  // batches flip the lowest bit of the first byte each writes (a transfer
  // gone bad after the host copy was verified).
  void CorruptNextHostToDevice(int n);
  void ClearFaults();

  struct Counters {
    std::array<uint64_t, kDeviceOpCount> calls{};  // Per DeviceOp, failed included.
    uint64_t copies = 0;            // Copies issued after coalescing (pieces of a plan).
    uint64_t copy_steps = 0;        // Batched copy calls (one cudaMemcpyBatchAsync each).
    uint64_t checksum_steps = 0;    // Checksum kernel launches.
    uint64_t reanchor_steps = 0;    // Re-anchor steps (one launch per job in each).
    uint64_t plans = 0;             // Plans run.
    uint64_t max_streams = 0;       // Most streams one plan used.
    uint64_t copy_ops = 0;          // CopyOps asked for, before coalescing.
    uint64_t bytes_to_host = 0;
    uint64_t bytes_to_device = 0;
    uint64_t checksum_ranges = 0;   // Ranges hashed "on the device".
    uint64_t reanchor_jobs = 0;     // Blocks rotated (no-op jobs excluded).
    uint64_t calls_of(DeviceOp op) const { return calls[static_cast<int>(op)]; }
  };
  Counters counters() const;
  void ResetCounters();

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace evoke::testing

#endif  // EVOKE_TESTING_HOST_DEVICE_COPIER_H_
