#include "testing/host_device_copier.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/checksum.h"
#include "common/rope.h"
#include "gpu/transfer_plan.h"

namespace evoke::testing {
namespace {

constexpr char kHandleMagic[] = "evoke-host-ipc:";

struct Buffer {
  int device = 0;
  std::unique_ptr<uint8_t[]> data;
  uint64_t bytes = 0;
  uint64_t serial = 0;
};

struct Fault {
  int remaining = 0;  // -1: every call.
  absl::Status status;
};

int Index(DeviceOp op) { return static_cast<int>(op); }

std::string MakeHandle(uint64_t serial) {
  std::string h(kCudaIpcHandleBytes, '\0');
  const std::string text = absl::StrCat(kHandleMagic, serial);
  std::memcpy(h.data(), text.data(), std::min(text.size(), h.size()));
  return h;
}

}  // namespace

struct HostDevices::State {
  State(int n, const PipelineOptions& o, uint64_t s) : devices(n), options(o), seed(s) {}
  const int devices;
  const PipelineOptions options;

  mutable absl::Mutex mu;
  // By base address, so that the allocation holding a pointer is found with
  // upper_bound.
  std::map<uintptr_t, Buffer> buffers ABSL_GUARDED_BY(mu);
  uint64_t next_serial ABSL_GUARDED_BY(mu) = 1;
  std::array<Fault, kDeviceOpCount> faults ABSL_GUARDED_BY(mu);
  int corrupt_landings ABSL_GUARDED_BY(mu) = 0;
  uint64_t seed ABSL_GUARDED_BY(mu);  // Of the next plan's interleaving.
  Counters counters ABSL_GUARDED_BY(mu);

  absl::Status CheckDevice(int device) const {
    if (device < 0 || device >= devices) {
      return absl::UnavailableError(absl::StrCat("CUDA device ", device, " does not exist (",
                                                 devices, " visible)"));
    }
    return absl::OkStatus();
  }

  // Enter counts a call and returns its injected failure, if any.
  absl::Status Enter(DeviceOp op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ++counters.calls[Index(op)];
    Fault& f = faults[Index(op)];
    if (f.remaining == 0) return absl::OkStatus();
    if (f.remaining > 0) --f.remaining;
    return f.status;
  }

  // Inside: [p, p + n) lies inside one allocation of `device` (what the
  // device may touch without faulting). `what` names the range in errors.
  absl::Status Inside(int device, const void* p, uint64_t n, absl::string_view what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = buffers.upper_bound(a);
    if (it != buffers.begin()) {
      --it;
      const Buffer& b = it->second;
      if (b.device == device && a >= it->first && n <= b.bytes &&
          a - it->first <= b.bytes - n) {
        return absl::OkStatus();
      }
    }
    return absl::InternalError(absl::StrCat(
        what, ": cudaErrorIllegalAddress (an illegal memory access was encountered): [",
        absl::Hex(a), ", +", n, ") is not inside an allocation of device ", device));
  }
};

namespace {

class HostOps final : public DeviceOps {
 public:
  HostOps(std::shared_ptr<HostDevices::State> state, int device)
      : state_(std::move(state)), device_(device) {}

  int device() const override { return device_; }

  absl::Status DeviceToHost(absl::Span<const CopyOp> ops) override {
    const TransferPlan plan = PlanCopies(ops, CopyDirection::kToHost, state_->options);
    return Run(DeviceOp::kDeviceToHost, plan, ops.size(), {});
  }

  absl::Status HostToDevice(absl::Span<const CopyOp> ops) override {
    const TransferPlan plan = PlanCopies(ops, CopyDirection::kToDevice, state_->options);
    return Run(DeviceOp::kHostToDevice, plan, ops.size(), {});
  }

  absl::Status ChunkChecksums(absl::Span<const DeviceRange> ranges,
                              absl::Span<uint64_t> out) override {
    {
      absl::MutexLock lock(&state_->mu);
      if (absl::Status s = state_->Enter(DeviceOp::kChecksums); !s.ok()) return s;
      // The checks of DeviceChunkChecksums.
      if (absl::Status s = CheckChecksumRanges(ranges, out.size()); !s.ok()) return s;
      for (size_t i = 0; i < ranges.size(); ++i) {
        const DeviceRange& r = ranges[i];
        if (absl::Status s =
                state_->Inside(device_, r.ptr, r.bytes, absl::StrCat("ranges[", i, "]"));
            !s.ok()) {
          return s;
        }
      }
      state_->counters.checksum_ranges += ranges.size();
      if (!ranges.empty()) ++state_->counters.checksum_steps;
    }
    for (size_t i = 0; i < ranges.size(); ++i) {
      out[i] = ChunkChecksum(ranges[i].ptr, ranges[i].bytes);
    }
    return absl::OkStatus();
  }

  absl::Status ReanchorCanonicalBlocks(absl::Span<const DeviceReanchorJob> jobs) override {
    // As ReanchorCanonicalBlocksOnDevice (gpu/rope_device.cc): every job is
    // checked before any is started; no-op jobs touch nothing.
    std::vector<const DeviceReanchorJob*> ready;
    absl::MutexLock lock(&state_->mu);
    if (absl::Status s = state_->Enter(DeviceOp::kReanchor); !s.ok()) return s;
    if (absl::Status s = CheckJobs(jobs, &ready); !s.ok()) return s;
    // Under the lock: a fake device runs one kernel at a time.
    for (const DeviceReanchorJob* job : ready) {
      if (absl::Status s = ReanchorCanonicalBlock(
              *job->plan, *job->meta, static_cast<uint8_t*>(job->device_payload),
              job->payload_bytes, job->delta);
          !s.ok()) {
        return s;
      }
      ++state_->counters.reanchor_jobs;
    }
    return absl::OkStatus();
  }

  absl::Status FetchBlocks(absl::Span<const FetchBlock> blocks,
                           absl::Span<uint64_t> checksums) override {
    if (checksums.size() != blocks.size()) {
      return absl::InvalidArgumentError(absl::StrCat("checksums: ", checksums.size(),
                                                     " slots for ", blocks.size(), " blocks"));
    }
    const TransferPlan plan = PlanFetch(blocks, state_->options);
    std::vector<uint64_t> sums(plan.ranges.size());
    if (absl::Status s = Run(DeviceOp::kFetchBlocks, plan, blocks.size(), absl::MakeSpan(sums));
        !s.ok()) {
      return s;
    }
    const std::vector<uint64_t> out = BlockChecksums(plan, sums, blocks);
    std::copy(out.begin(), out.end(), checksums.begin());
    return absl::OkStatus();
  }

  absl::Status LandBlocks(absl::Span<const LandingBlock> blocks,
                          absl::Span<uint64_t> checksums) override {
    if (checksums.size() != blocks.size()) {
      return absl::InvalidArgumentError(absl::StrCat("checksums: ", checksums.size(),
                                                     " slots for ", blocks.size(), " blocks"));
    }
    absl::StatusOr<TransferPlan> plan = PlanLanding(blocks, state_->options);
    if (!plan.ok()) return plan.status();
    std::vector<uint64_t> sums(plan->ranges.size());
    if (absl::Status s = Run(DeviceOp::kLandBlocks, *plan, blocks.size(), absl::MakeSpan(sums));
        !s.ok()) {
      return s;
    }
    const std::vector<uint64_t> out = BlockChecksums(*plan, sums, blocks);
    std::copy(out.begin(), out.end(), checksums.begin());
    return absl::OkStatus();
  }

 private:
  // CheckJobs: the checks of ReanchorCanonicalBlocksOnDevice; `ready` gets
  // the jobs that rotate something.
  absl::Status CheckJobs(absl::Span<const DeviceReanchorJob> jobs,
                         std::vector<const DeviceReanchorJob*>* ready) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    for (const DeviceReanchorJob& job : jobs) {
      absl::StatusOr<CanonicalKSections> sections =
          CheckCanonicalReanchor(*job.plan, *job.meta, job.payload_bytes, job.delta);
      if (!sections.ok()) return sections.status();
      if (job.plan->type == v1::ROPE_NONE ||
          std::all_of(job.delta.begin(), job.delta.end(), [](int64_t d) { return d == 0; })) {
        continue;
      }
      if (job.device_payload == nullptr) {
        return absl::InvalidArgumentError("device_payload: is null");
      }
      ready->push_back(&job);
    }
    for (const DeviceReanchorJob* job : *ready) {
      if (absl::Status s = state_->Inside(device_, job->device_payload, job->payload_bytes,
                                          "device_payload");
          !s.ok()) {
        // CheckDeviceMemory's answer for memory that is not the device's.
        return absl::InvalidArgumentError(s.message());
      }
    }
    return absl::OkStatus();
  }

  // Run: what DeviceCopier::Execute does, in host memory. Everything is
  // checked first (a fault on a real device would leave the context
  // unusable; here it is an error before any byte moves), then the steps run
  // in a random interleaving that respects the plan's streams and events.
  absl::Status Run(DeviceOp op, const TransferPlan& plan, size_t asked,
                   absl::Span<uint64_t> sums) {
    const bool to_device = plan.direction == CopyDirection::kToDevice;
    std::vector<bool> rotates(plan.jobs.size(), false);
    bool corrupt = false;
    uint64_t seed = 0;
    {
      absl::MutexLock lock(&state_->mu);
      if (absl::Status s = state_->Enter(op); !s.ok()) return s;
      for (const CopyOp& c : plan.copies) {
        const void* on_device = to_device ? c.dst : c.src;
        if (absl::Status s = state_->Inside(device_, on_device, c.bytes,
                                            to_device ? "HostToDevice destination"
                                                      : "DeviceToHost source");
            !s.ok()) {
          return s;
        }
      }
      if (absl::Status s = CheckChecksumRanges(plan.ranges, sums.size()); !s.ok()) return s;
      for (size_t i = 0; i < plan.ranges.size(); ++i) {
        const DeviceRange& r = plan.ranges[i];
        if (absl::Status s =
                state_->Inside(device_, r.ptr, r.bytes, absl::StrCat("ranges[", i, "]"));
            !s.ok()) {
          return s;
        }
      }
      std::vector<const DeviceReanchorJob*> ready;
      if (absl::Status s = CheckJobs(plan.jobs, &ready); !s.ok()) return s;
      // Last: a plan that races is a bug of the planner, not of the call.
      if (absl::Status s = CheckPlanOrdering(plan); !s.ok()) return s;
      for (const DeviceReanchorJob* job : ready) {
        rotates[static_cast<size_t>(job - plan.jobs.data())] = true;
      }
      Counters& c = state_->counters;
      c.copy_ops += asked;
      c.copies += plan.copies.size();
      for (const CopyOp& op : plan.copies) (to_device ? c.bytes_to_device : c.bytes_to_host) += op.bytes;
      c.copy_steps += plan.steps_of(StepKind::kCopy);
      c.checksum_steps += plan.steps_of(StepKind::kChecksum);
      c.reanchor_steps += plan.steps_of(StepKind::kReanchor);
      c.checksum_ranges += plan.ranges.size();
      c.reanchor_jobs += ready.size();
      ++c.plans;
      c.max_streams = std::max<uint64_t>(c.max_streams, static_cast<uint64_t>(plan.streams));
      if (to_device && !plan.copies.empty() && state_->corrupt_landings > 0) {
        --state_->corrupt_landings;
        corrupt = true;
      }
      seed = state_->seed++;
    }
    // The first piece of the batch lands with one bit flipped.
    const void* corrupt_at = corrupt ? plan.copies[0].dst : nullptr;
    return SimulatePlan(plan, seed, [&](const PlanStep& step) -> absl::Status {
      for (size_t k = step.begin; k < step.end; ++k) {
        switch (step.kind) {
          case StepKind::kCopy:
            std::memcpy(plan.copies[k].dst, plan.copies[k].src, plan.copies[k].bytes);
            if (plan.copies[k].dst == corrupt_at) static_cast<uint8_t*>(plan.copies[k].dst)[0] ^= 1;
            break;
          case StepKind::kChecksum:
            sums[k] = ChunkChecksum(plan.ranges[k].ptr, plan.ranges[k].bytes);
            break;
          case StepKind::kReanchor:
            if (!rotates[k]) break;
            if (absl::Status s = ReanchorCanonicalBlock(
                    *plan.jobs[k].plan, *plan.jobs[k].meta,
                    static_cast<uint8_t*>(plan.jobs[k].device_payload),
                    plan.jobs[k].payload_bytes, plan.jobs[k].delta);
                !s.ok()) {
              return s;
            }
            break;
          default:
            break;
        }
      }
      return absl::OkStatus();
    });
  }

  using Counters = HostDevices::Counters;
  const std::shared_ptr<HostDevices::State> state_;
  const int device_;
};

}  // namespace

HostDevices::HostDevices(int devices, const PipelineOptions& options, uint64_t seed)
    : state_(std::make_shared<State>(devices, options, seed)) {}
HostDevices::~HostDevices() = default;

absl::StatusOr<std::unique_ptr<DeviceOps>> HostDevices::Open(int device) {
  absl::MutexLock lock(&state_->mu);
  if (absl::Status s = state_->Enter(DeviceOp::kOpen); !s.ok()) return s;
  if (absl::Status s = state_->CheckDevice(device); !s.ok()) return s;
  return std::unique_ptr<DeviceOps>(new HostOps(state_, device));
}

absl::StatusOr<HostDevices::Allocation> HostDevices::Allocate(int device, uint64_t bytes) {
  if (absl::Status s = state_->CheckDevice(device); !s.ok()) return s;
  if (bytes == 0) return absl::InvalidArgumentError("bytes: must be > 0");
  Buffer b;
  b.device = device;
  b.bytes = bytes;
  b.data = std::make_unique<uint8_t[]>(bytes);  // Zeroed.
  Allocation a{device, b.data.get(), bytes, {}};
  absl::MutexLock lock(&state_->mu);
  b.serial = state_->next_serial++;
  a.ipc_handle = MakeHandle(b.serial);
  state_->buffers.emplace(reinterpret_cast<uintptr_t>(a.ptr), std::move(b));
  return a;
}

absl::Status HostDevices::Free(const void* ptr) {
  absl::MutexLock lock(&state_->mu);
  if (state_->buffers.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
    return absl::NotFoundError("ptr: not the base of a live allocation");
  }
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> HostDevices::OpenIpc(absl::string_view handle, int device,
                                              uint64_t size) const {
  if (handle.size() != kCudaIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ipc_handle: must be ", kCudaIpcHandleBytes, " bytes, got ", handle.size()));
  }
  if (size == 0) return absl::InvalidArgumentError("size: must be > 0");
  if (absl::Status s = state_->CheckDevice(device); !s.ok()) return s;
  absl::MutexLock lock(&state_->mu);
  for (auto& [base, b] : state_->buffers) {
    if (b.device != device || MakeHandle(b.serial) != handle) continue;
    if (size > b.bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "size: ", size, " bytes exceed the exported allocation (", b.bytes, " bytes)"));
    }
    return b.data.get();
  }
  return absl::InvalidArgumentError(
      "ipc_handle: the driver rejected it (no live allocation of this device has it)");
}

void HostDevices::FailNext(DeviceOp op, int n, absl::Status status) {
  absl::MutexLock lock(&state_->mu);
  state_->faults[Index(op)] = Fault{n, std::move(status)};
}

void HostDevices::CorruptNextHostToDevice(int n) {
  absl::MutexLock lock(&state_->mu);
  state_->corrupt_landings = n;
}

void HostDevices::ClearFaults() {
  absl::MutexLock lock(&state_->mu);
  state_->faults = {};
  state_->corrupt_landings = 0;
}

HostDevices::Counters HostDevices::counters() const {
  absl::MutexLock lock(&state_->mu);
  return state_->counters;
}

void HostDevices::ResetCounters() {
  absl::MutexLock lock(&state_->mu);
  state_->counters = {};
}

}  // namespace evoke::testing
