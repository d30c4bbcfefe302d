// CUDA IPC and device copies for the daemon. Every class here is RAII and
// move-free (held by unique_ptr); CUDA errors become absl::Status at this
// edge (cuda_status.h). Builds without CUDA too: then every factory returns
// UNAVAILABLE ("built without CUDA").
#ifndef EVOKE_GPU_CUDA_IPC_H_
#define EVOKE_GPU_CUDA_IPC_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "gpu/copy_op.h"
#include "gpu/transfer_plan.h"

namespace evoke {

// Size of a cudaIpcMemHandle_t.
inline constexpr size_t kCudaIpcHandleBytes = 64;

// What the driver said about the allocation that holds a device pointer
// (cuMemGetAddressRange).
struct DeviceAddressRange {
  bool known = false;  // False: the query is missing or failed.
  uint64_t base = 0;
  uint64_t bytes = 0;
};

// CheckMappedRegion returns the bytes from `ptr` to the end of the
// allocation `range` describes, once [ptr, ptr + size) is known to lie inside
// it. FAILED_PRECONDITION "size: ..." when the range is not known: a client's
// size is never taken on trust (a mapping past the allocation would let the
// daemon read or write foreign device memory, and a fault there poisons the
// CUDA context of the whole process). INVALID_ARGUMENT "size: ..." when size
// is 0, ptr lies outside the range, or size runs past its end. Pure; used by
// CudaIpcMapping::Open.
inline absl::StatusOr<uint64_t> CheckMappedRegion(uint64_t ptr, uint64_t size,
                                                  const DeviceAddressRange& range) {
  if (size == 0) return absl::InvalidArgumentError("size: must be > 0");
  if (!range.known) {
    return absl::FailedPreconditionError(absl::StrCat(
        "size: the driver cannot report the exported allocation's extent "
        "(cuMemGetAddressRange unavailable or failed), so ",
        size, " bytes cannot be checked; refused"));
  }
  const uint64_t end = range.base + range.bytes;
  if (end < range.base || ptr < range.base || ptr >= end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "size: the mapping at 0x", absl::Hex(ptr), " is outside the allocation [0x",
        absl::Hex(range.base), ", +", range.bytes, ") the driver reports"));
  }
  const uint64_t available = end - ptr;
  if (size > available) {
    return absl::InvalidArgumentError(absl::StrCat(
        "size: ", size, " bytes exceed the exported allocation (", available, " bytes)"));
  }
  return available;
}

// CudaIpcMapping: a device allocation of another process, opened from its
// IPC handle (cudaIpcOpenMemHandle) and closed on destruction. Open checks
// that [base, base + size) lies inside the exported allocation (the driver's
// cuMemGetAddressRange), so a client cannot make the daemon copy past it;
// when the driver cannot tell, the mapping is refused (CheckMappedRegion).
class CudaIpcMapping {
 public:
  // Open errors: INVALID_ARGUMENT (handle not 64 bytes, handle the driver
  // rejects, size 0 or beyond the allocation), FAILED_PRECONDITION (the
  // driver cannot report the allocation's extent), UNAVAILABLE (no CUDA, no
  // such device ordinal, driver failure).
  static absl::StatusOr<std::unique_ptr<CudaIpcMapping>> Open(
      absl::string_view handle, int device, uint64_t size);
  ~CudaIpcMapping();
  CudaIpcMapping(const CudaIpcMapping&) = delete;
  CudaIpcMapping& operator=(const CudaIpcMapping&) = delete;

  void* device_ptr() const { return ptr_; }
  int device() const { return device_; }
  // The size asked for at Open.
  uint64_t size() const { return size_; }
  // Bytes from device_ptr() to the end of the exported allocation, as the
  // driver reports it (>= size()).
  uint64_t available() const { return available_; }

 private:
  CudaIpcMapping(void* ptr, int device, uint64_t size, uint64_t available)
      : ptr_(ptr), device_(device), size_(size), available_(available) {}
  void* ptr_;
  int device_;
  uint64_t size_;
  uint64_t available_;
};

// DeviceCopier copies batches between host and one device on its own CUDA
// streams (a pool of lanes, each a set of streams and events, so concurrent
// RPCs do not serialize), and returns when the batch is complete. Every call
// runs a TransferPlan (gpu/transfer_plan.h): adjacent ops coalesced, many
// small copies issued as one cudaMemcpyBatchAsync per step (one
// cudaMemcpyAsync per piece where the driver lacks it), large ones cut into
// pieces over several streams. Host memory should be registered
// (HostRegistration) for full speed; unregistered host memory still works,
// staged by the driver. Thread-safe.
class DeviceCopier {
 public:
  // Create errors: UNAVAILABLE (no CUDA, no such device).
  // `streams`: lanes made at once (more are made when concurrent calls
  // need them). `options` must pass CheckPipelineOptions (INVALID_ARGUMENT).
  static absl::StatusOr<std::unique_ptr<DeviceCopier>> Create(
      int device, int streams = 4, const PipelineOptions& options = {});
  ~DeviceCopier();
  DeviceCopier(const DeviceCopier&) = delete;
  DeviceCopier& operator=(const DeviceCopier&) = delete;

  // Copies device -> host (src device pointers, dst host pointers).
  absl::Status DeviceToHost(absl::Span<const CopyOp> ops);
  // Copies host -> device (src host pointers, dst device pointers).
  absl::Status HostToDevice(absl::Span<const CopyOp> ops);
  // Execute issues every step of `plan` on one lane's streams (events
  // between them as the plan says; CheckPlanOrdering holds for the plans of
  // gpu/transfer_plan.h), waits for all of them, and writes the checksum of
  // plan.ranges[k] to sums[k]. Copies, checksum ranges and re-anchor payloads
  // must be memory the device may touch (bounds-checked by the caller, as
  // for DeviceChunkChecksums); re-anchor jobs are checked first
  // (CheckCanonicalReanchor, CheckDeviceMemory) and nothing is issued when
  // one fails. On a CUDA error the lane's streams are drained before
  // returning, so no step outlives the call. INVALID_ARGUMENT for
  // sums.size() != plan.ranges.size() or a bad range; errors otherwise as
  // gpu/cuda_status.h.
  absl::Status Execute(const TransferPlan& plan, absl::Span<uint64_t> sums);
  int device() const { return device_; }
  const PipelineOptions& options() const { return options_; }

  class Impl;

 private:
  DeviceCopier(int device, std::unique_ptr<Impl> impl);
  int device_;
  PipelineOptions options_;
  std::unique_ptr<Impl> impl_;
};

// HostRegistration registers a host range with CUDA (cudaHostRegister) in
// chunks on a background thread, so that start-up is not stalled; the range
// is unregistered on destruction. Copies into a chunk registered later
// still work meanwhile (staged). Thread-safe.
class HostRegistration {
 public:
  // Start returns UNAVAILABLE when there is no CUDA device (nothing to do).
  static absl::StatusOr<std::unique_ptr<HostRegistration>> Start(
      void* base, uint64_t size, uint64_t chunk_bytes = 1ull << 30);
  ~HostRegistration();
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;

  uint64_t registered_bytes() const { return registered_.load(); }
  bool done() const { return done_.load(); }
  // Time the whole range took (valid once done()).
  absl::Duration elapsed() const { return absl::Nanoseconds(elapsed_ns_.load()); }
  // The first error, if a chunk failed (later chunks are skipped).
  absl::Status status() const;

 private:
  HostRegistration(void* base, uint64_t size, uint64_t chunk);
  void Run();
  uint8_t* base_;
  uint64_t size_;
  uint64_t chunk_;
  std::atomic<uint64_t> registered_{0};
  std::atomic<bool> done_{false};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> elapsed_ns_{0};
  std::atomic<int> error_code_{0};
  std::thread thread_;
};

}  // namespace evoke

#endif  // EVOKE_GPU_CUDA_IPC_H_
