// CUDA implementation of gpu/cuda_ipc.h.
#include "gpu/cuda_ipc.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/rope.h"
#include "gpu/cuda_status.h"
#include "gpu/cuda_util.h"
#include "gpu/xxh3_parallel.h"

namespace evoke {

absl::StatusOr<std::unique_ptr<CudaIpcMapping>> CudaIpcMapping::Open(
    absl::string_view handle, int device, uint64_t size) {
  if (handle.size() != kCudaIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ipc_handle: must be ", kCudaIpcHandleBytes, " bytes, got ", handle.size()));
  }
  if (size == 0) return absl::InvalidArgumentError("size: must be > 0");
  if (absl::Status s = CheckDeviceExists(device); !s.ok()) return s;
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return CudaStatus(e, "cudaSetDevice");
  }
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* ptr = nullptr;
  const cudaError_t err = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    cudaGetLastError();  // Clear the sticky-free error state.
    absl::Status s = CudaStatus(err, "cudaIpcOpenMemHandle");
    if (err == cudaErrorInvalidValue || err == cudaErrorMapBufferObjectFailed ||
        err == cudaErrorInvalidResourceHandle || err == cudaErrorInvalidDevicePointer ||
        err == cudaErrorUnknown) {
      return absl::InvalidArgumentError(
          absl::StrCat("ipc_handle: the driver rejected it (", s.message(), ")"));
    }
    return s;
  }
  // Bound the claimed size by the real allocation; refuse when the driver
  // cannot tell (the size was trusted then: issue #11).
  DeviceAddressRange range;
  if (GetAddressRangeFn query = AddressRangeFn(); query != nullptr) {
    CUdeviceptr base = 0;
    size_t alloc = 0;
    if (query(&base, &alloc, reinterpret_cast<CUdeviceptr>(ptr)) == CUDA_SUCCESS) {
      range = {true, static_cast<uint64_t>(base), static_cast<uint64_t>(alloc)};
    }
  }
  const absl::StatusOr<uint64_t> checked =
      CheckMappedRegion(reinterpret_cast<uint64_t>(ptr), size, range);
  if (!checked.ok()) {
    cudaIpcCloseMemHandle(ptr);
    return checked.status();
  }
  const uint64_t available = *checked;
  return std::unique_ptr<CudaIpcMapping>(new CudaIpcMapping(ptr, device, size, available));
}

CudaIpcMapping::~CudaIpcMapping() {
  cudaSetDevice(device_);
  cudaIpcCloseMemHandle(ptr_);
}

// Defined in gpu/xxh3_kernel.cu and gpu/rope_kernel.cu (kept free of absl).
namespace xxh3 {
cudaError_t LaunchChunkChecksumsAsync(const ChunkDesc* dev_descs, size_t n, uint64_t* dev_out,
                                      cudaStream_t stream);
}  // namespace xxh3
extern "C++" cudaError_t LaunchRopeReanchor(void* payload, uint64_t layer_stride_bytes,
                                            uint32_t n_layers, uint32_t n_tokens,
                                            uint32_t n_heads, uint32_t head_dim,
                                            uint32_t rotary_dim, int rope_type,
                                            int k_dtype, const double* omega,
                                            const int64_t* delta, cudaStream_t stream);

namespace {

constexpr int kMaxLaneStreams = TransferPlan::kFirstCopyStream + 8;

size_t Align16(size_t n) { return (n + 15) & ~size_t{15}; }

// A re-anchor job of a plan that has work to do: its shape and where its
// angle table and deltas are in the lane's staging buffer.
struct ReadyJob {
  const DeviceReanchorJob* job;
  CanonicalKSections sections;
  size_t table_offset;
};

}  // namespace

// Lane: what one call in flight owns: streams, events, a device buffer for
// checksum descriptors, results and re-anchor tables, and its pinned host
// staging twin. Made on demand, reused, never shared by two calls.
struct CopierLane {
  cudaStream_t streams[kMaxLaneStreams] = {};
  std::vector<cudaEvent_t> events;
  void* dev = nullptr;
  void* host = nullptr;  // Pinned.
  size_t capacity = 0;

  ~CopierLane() {
    for (cudaStream_t s : streams) {
      if (s != nullptr) cudaStreamDestroy(s);
    }
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    if (dev != nullptr) cudaFree(dev);
    if (host != nullptr) cudaFreeHost(host);
  }
  cudaError_t Prepare(int n_streams, int n_events, size_t bytes) {
    for (int i = 0; i < n_streams && i < kMaxLaneStreams; ++i) {
      if (streams[i] != nullptr) continue;
      if (cudaError_t e = cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking);
          e != cudaSuccess) {
        streams[i] = nullptr;
        return e;
      }
    }
    while (events.size() < static_cast<size_t>(n_events)) {
      cudaEvent_t e;
      if (cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
          err != cudaSuccess) {
        return err;
      }
      events.push_back(e);
    }
    if (bytes <= capacity) return cudaSuccess;
    size_t cap = 64 << 10;
    while (cap < bytes) cap *= 2;
    void* d = nullptr;
    void* h = nullptr;
    if (cudaError_t e = cudaMalloc(&d, cap); e != cudaSuccess) return e;
    if (cudaError_t e = cudaMallocHost(&h, cap); e != cudaSuccess) {
      cudaFree(d);
      return e;
    }
    if (dev != nullptr) cudaFree(dev);
    if (host != nullptr) cudaFreeHost(host);
    dev = d;
    host = h;
    capacity = cap;
    return cudaSuccess;
  }
  // Drain waits for every stream (after an error, so that nothing issued
  // outlives the call) and returns the first error seen.
  cudaError_t Drain(int n_streams) {
    cudaError_t first = cudaSuccess;
    for (int i = 0; i < n_streams && i < kMaxLaneStreams; ++i) {
      if (streams[i] == nullptr) continue;
      const cudaError_t e = cudaStreamSynchronize(streams[i]);
      if (first == cudaSuccess) first = e;
    }
    return first;
  }
};

class DeviceCopier::Impl {
 public:
  int device;
  absl::Mutex mu;
  std::vector<std::unique_ptr<CopierLane>> idle ABSL_GUARDED_BY(mu);
  // Cleared when the driver refuses cudaMemcpyBatchAsync (older than 12.8,
  // or a kind of memory it does not batch): then one cudaMemcpyAsync per
  // piece.
  std::atomic<bool> batch_ok{true};

  std::unique_ptr<CopierLane> Acquire() {
    absl::MutexLock lock(&mu);
    if (idle.empty()) return std::make_unique<CopierLane>();
    std::unique_ptr<CopierLane> lane = std::move(idle.back());
    idle.pop_back();
    return lane;
  }
  void Release(std::unique_ptr<CopierLane> lane) {
    absl::MutexLock lock(&mu);
    idle.push_back(std::move(lane));
  }

  // IssueCopies: pieces [begin, end) of the plan as one batched copy.
  cudaError_t IssueCopies(const TransferPlan& plan, const PlanStep& step, cudaStream_t stream) {
    const cudaMemcpyKind kind = plan.direction == CopyDirection::kToHost
                                    ? cudaMemcpyDeviceToHost
                                    : cudaMemcpyHostToDevice;
    const size_t n = step.end - step.begin;
#if CUDART_VERSION >= 12080
    if (n > 1 && batch_ok.load(std::memory_order_relaxed)) {
      std::vector<void*> dsts(n);
      std::vector<const void*> srcs(n);
      std::vector<size_t> sizes(n);
      for (size_t k = 0; k < n; ++k) {
        const CopyOp& op = plan.copies[step.begin + k];
        dsts[k] = op.dst;
        srcs[k] = op.src;
        sizes[k] = op.bytes;
      }
      cudaMemcpyAttributes attr = {};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      const cudaMemLocation host{cudaMemLocationTypeHost, 0};
      const cudaMemLocation dev{cudaMemLocationTypeDevice, device};
      attr.srcLocHint = kind == cudaMemcpyHostToDevice ? host : dev;
      attr.dstLocHint = kind == cudaMemcpyHostToDevice ? dev : host;
      attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
      size_t attr_index = 0;
#if CUDART_VERSION >= 13000
      const cudaError_t e = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), n,
                                                 &attr, &attr_index, 1, stream);
#else
      size_t fail_index = 0;
      const cudaError_t e = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), n,
                                                 &attr, &attr_index, 1, &fail_index, stream);
#endif
      if (e == cudaSuccess) return cudaSuccess;
      // Not batched: one copy per piece below (a real fault shows again
      // there). A driver without the call is not asked again; other refusals
      // (e.g. host memory it will not batch) only fall back for this step.
      cudaGetLastError();
      if (e == cudaErrorNotSupported || e == cudaErrorCallRequiresNewerDriver ||
          e == cudaErrorNotYetImplemented) {
        batch_ok.store(false, std::memory_order_relaxed);
      }
    }
#endif
    for (size_t k = step.begin; k < step.end; ++k) {
      const CopyOp& op = plan.copies[k];
      if (cudaError_t e = cudaMemcpyAsync(op.dst, op.src, op.bytes, kind, stream);
          e != cudaSuccess) {
        return e;
      }
    }
    return cudaSuccess;
  }

  absl::Status Execute(const TransferPlan& plan, absl::Span<uint64_t> sums) {
    if (absl::Status s = CheckChecksumRanges(plan.ranges, sums.size()); !s.ok()) return s;
    if (plan.streams > kMaxLaneStreams || plan.streams < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: ", plan.streams, " streams, at most ", kMaxLaneStreams));
    }
    if (plan.steps.empty()) return absl::OkStatus();
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      return CudaStatus(e, "cudaSetDevice");
    }
    // Re-anchor jobs are checked before anything is issued; their tables
    // go to the device once, behind the checksum descriptors.
    const size_t n_ranges = plan.ranges.size();
    size_t bytes = Align16(n_ranges * sizeof(xxh3::ChunkDesc)) + Align16(n_ranges * 8);
    std::vector<ReadyJob> ready(plan.jobs.size(), ReadyJob{nullptr, {}, 0});
    const size_t tables = bytes;
    for (size_t k = 0; k < plan.jobs.size(); ++k) {
      const DeviceReanchorJob& job = plan.jobs[k];
      absl::StatusOr<CanonicalKSections> sections =
          CheckCanonicalReanchor(*job.plan, *job.meta, job.payload_bytes, job.delta);
      if (!sections.ok()) return sections.status();
      if (job.plan->type == v1::ROPE_NONE ||
          std::all_of(job.delta.begin(), job.delta.end(), [](int64_t d) { return d == 0; })) {
        continue;  // Nothing to rotate: no launch.
      }
      if (job.device_payload == nullptr) {
        return absl::InvalidArgumentError("device_payload: is null");
      }
      if (absl::Status s =
              CheckDeviceMemory(job.device_payload, job.payload_bytes, device, "device_payload");
          !s.ok()) {
        return s;
      }
      ready[k] = ReadyJob{&job, *sections, bytes};
      bytes += Align16((job.plan->omega.size() + job.delta.size()) * 8);
    }
    std::unique_ptr<CopierLane> lane = Acquire();
    if (cudaError_t e = lane->Prepare(plan.streams, plan.events, bytes); e != cudaSuccess) {
      Release(std::move(lane));
      return CudaStatus(e, "DeviceCopier: lane");
    }
    uint8_t* host = static_cast<uint8_t*>(lane->host);
    uint8_t* dev = static_cast<uint8_t*>(lane->dev);
    auto* host_descs = reinterpret_cast<xxh3::ChunkDesc*>(host);
    const size_t out_offset = Align16(n_ranges * sizeof(xxh3::ChunkDesc));
    for (size_t k = 0; k < n_ranges; ++k) {
      host_descs[k] = xxh3::ChunkDesc{plan.ranges[k].ptr, plan.ranges[k].bytes};
    }
    for (const ReadyJob& r : ready) {
      if (r.job == nullptr) continue;
      const size_t n_pairs = r.job->plan->omega.size();
      std::memcpy(host + r.table_offset, r.job->plan->omega.data(), n_pairs * 8);
      std::memcpy(host + r.table_offset + n_pairs * 8, r.job->delta.data(),
                  r.job->delta.size() * 8);
    }
    cudaStream_t* st = lane->streams;
    const cudaStream_t sums_stream = st[TransferPlan::kChecksumStream];
    const cudaStream_t rope_stream = st[TransferPlan::kReanchorStream];
    cudaError_t err = cudaSuccess;
    const char* what = "";
    // Uploads first, each on the stream that will use it.
    if (n_ranges > 0) {
      err = cudaMemcpyAsync(dev, host, n_ranges * sizeof(xxh3::ChunkDesc),
                            cudaMemcpyHostToDevice, sums_stream);
      what = "cudaMemcpyAsync (checksum descriptors)";
    }
    if (err == cudaSuccess && bytes > tables) {
      err = cudaMemcpyAsync(dev + tables, host + tables, bytes - tables, cudaMemcpyHostToDevice,
                            rope_stream);
      what = "cudaMemcpyAsync (re-anchor tables)";
    }
    for (size_t i = 0; i < plan.steps.size() && err == cudaSuccess; ++i) {
      const PlanStep& step = plan.steps[i];
      const cudaStream_t stream = st[step.stream];
      switch (step.kind) {
        case StepKind::kCopy:
          err = IssueCopies(plan, step, stream);
          what = "copy";
          break;
        case StepKind::kChecksum:
          err = xxh3::LaunchChunkChecksumsAsync(
              reinterpret_cast<const xxh3::ChunkDesc*>(dev) + step.begin, step.end - step.begin,
              reinterpret_cast<uint64_t*>(dev + out_offset) + step.begin, stream);
          what = "checksum kernel launch";
          break;
        case StepKind::kReanchor:
          for (size_t k = step.begin; k < step.end && err == cudaSuccess; ++k) {
            const ReadyJob& r = ready[k];
            if (r.job == nullptr) continue;
            const uint8_t* base = dev + r.table_offset;
            err = LaunchRopeReanchor(
                r.job->device_payload, r.sections.layer_stride_bytes, r.sections.n_layers,
                r.sections.n_tokens, r.sections.n_heads, r.sections.head_dim,
                r.job->plan->rotary_dim, static_cast<int>(r.job->plan->type),
                static_cast<int>(r.sections.k_dtype), reinterpret_cast<const double*>(base),
                reinterpret_cast<const int64_t*>(base + r.job->plan->omega.size() * 8), stream);
          }
          what = "rope re-anchor kernel launch";
          break;
        case StepKind::kRecord:
          err = cudaEventRecord(lane->events[step.event], stream);
          what = "cudaEventRecord";
          break;
        case StepKind::kWait:
          err = cudaStreamWaitEvent(stream, lane->events[step.event], 0);
          what = "cudaStreamWaitEvent";
          break;
      }
    }
    if (err == cudaSuccess && n_ranges > 0) {
      err = cudaMemcpyAsync(host + out_offset, dev + out_offset, n_ranges * 8,
                            cudaMemcpyDeviceToHost, sums_stream);
      what = "cudaMemcpyAsync (checksums)";
    }
    const cudaError_t drained = lane->Drain(plan.streams);
    absl::Status status = CudaStatus(err, absl::StrCat("DeviceCopier: ", what));
    if (status.ok()) status = CudaStatus(drained, "DeviceCopier: cudaStreamSynchronize");
    if (status.ok()) {
      std::memcpy(sums.data(), host + out_offset, n_ranges * 8);
      Release(std::move(lane));
    } else {
      cudaGetLastError();  // A lane that saw an error is not reused.
    }
    return status;
  }
};

absl::StatusOr<std::unique_ptr<DeviceCopier>> DeviceCopier::Create(
    int device, int streams, const PipelineOptions& options) {
  if (absl::Status s = CheckPipelineOptions(options); !s.ok()) return s;
  if (absl::Status s = CheckDeviceExists(device); !s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return CudaStatus(e, "cudaSetDevice");
  }
  // Lanes made up front, so that the first calls do not pay for streams.
  for (int i = 0; i < streams; ++i) {
    auto lane = std::make_unique<CopierLane>();
    if (cudaError_t e = lane->Prepare(TransferPlan::kFirstCopyStream + options.copy_streams, 0, 0);
        e != cudaSuccess) {
      return CudaStatus(e, "cudaStreamCreate");
    }
    impl->Release(std::move(lane));
  }
  std::unique_ptr<DeviceCopier> copier(new DeviceCopier(device, std::move(impl)));
  copier->options_ = options;
  return copier;
}

DeviceCopier::DeviceCopier(int device, std::unique_ptr<Impl> impl)
    : device_(device), impl_(std::move(impl)) {}

DeviceCopier::~DeviceCopier() {
  cudaSetDevice(device_);
  absl::MutexLock lock(&impl_->mu);
  impl_->idle.clear();
}

absl::Status DeviceCopier::DeviceToHost(absl::Span<const CopyOp> ops) {
  const TransferPlan plan = PlanCopies(ops, CopyDirection::kToHost, options_);
  return impl_->Execute(plan, {});
}

absl::Status DeviceCopier::HostToDevice(absl::Span<const CopyOp> ops) {
  const TransferPlan plan = PlanCopies(ops, CopyDirection::kToDevice, options_);
  return impl_->Execute(plan, {});
}

absl::Status DeviceCopier::Execute(const TransferPlan& plan, absl::Span<uint64_t> sums) {
  return impl_->Execute(plan, sums);
}

absl::StatusOr<std::unique_ptr<HostRegistration>> HostRegistration::Start(
    void* base, uint64_t size, uint64_t chunk_bytes) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return CudaStatus(err, "cudaGetDeviceCount");
  if (count == 0) return absl::UnavailableError("no CUDA device");
  std::unique_ptr<HostRegistration> r(new HostRegistration(base, size, chunk_bytes));
  r->thread_ = std::thread([p = r.get()] { p->Run(); });
  return r;
}

HostRegistration::HostRegistration(void* base, uint64_t size, uint64_t chunk)
    : base_(static_cast<uint8_t*>(base)), size_(size), chunk_(chunk) {}

void HostRegistration::Run() {
  const absl::Time start = absl::Now();
  for (uint64_t off = 0; off < size_ && !stop_.load(); off += chunk_) {
    const uint64_t n = std::min(chunk_, size_ - off);
    // Portable: usable from every device and context.
    const cudaError_t e = cudaHostRegister(base_ + off, n, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
      error_code_ = static_cast<int>(e);
      cudaGetLastError();
      break;
    }
    registered_ += n;
  }
  elapsed_ns_ = absl::ToInt64Nanoseconds(absl::Now() - start);
  done_ = true;
}

absl::Status HostRegistration::status() const {
  const int code = error_code_.load();
  if (code == 0) return absl::OkStatus();
  return CudaStatus(static_cast<cudaError_t>(code), "cudaHostRegister");
}

HostRegistration::~HostRegistration() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  const uint64_t done = registered_.load();
  for (uint64_t off = 0; off < done; off += chunk_) cudaHostUnregister(base_ + off);
}

}  // namespace evoke
