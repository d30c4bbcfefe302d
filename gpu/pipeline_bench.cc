// gpu_pipeline_bench: the GPU data path of evoked without gRPC, against
// plain cudaMemcpyAsync of the same bytes in the same run (pinned host
// memory, as tier 1 is once registered). For each case it times, median of
// --runs after a warm-up:
//   memcpy      cudaMemcpyAsync of every block on one stream, one sync (the
//               DMA floor the goals are ratios to);
//   pipelined   DeviceOps::FetchBlocks (Save: copy + checksums of the device
//               bytes beside it) or LandBlocks (Load: copy, verification
//               where the bytes land, re-anchoring), as CudaDeviceOps runs them;
//   sequential  what daemon/payload_paths.cc did before: DeviceToHost /
//               HostToDevice, then ChunkChecksums, then
//               ReanchorCanonicalBlocks, one after the other.
// Cases: one 16 MiB session block (the "CUDA IPC 16 MiB" goal),
// the headline's 2,048 tokens of Llama-3.1-8B-shaped KV (16 canonical bf16
// blocks of 128 tokens, 16 MiB each, re-anchored on load), and 2,048 pages
// of 16 KiB scattered through a pool (a paged cache) as one batch against
// one cudaMemcpyAsync per page.
//
//   gpu_pipeline_bench [--runs N] [--json FILE] [--dry-run]
// Without a device it says why and exits 0 (--dry-run lists the cases and
// exits 0 without touching CUDA).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checksum.h"
#include "common/rope.h"
#include "gpu/cuda_test_util.h"
#include "gpu/device_ops.h"

namespace evoke {
namespace {

using Clock = std::chrono::steady_clock;

double MedianMs(int runs, const std::function<absl::Status()>& body, absl::Status* status) {
  std::vector<double> ms;
  for (int r = 0; r <= runs && status->ok(); ++r) {
    const auto t0 = Clock::now();
    *status = body();
    const double elapsed = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (r > 0) ms.push_back(elapsed);  // run 0 warms up
  }
  if (ms.empty()) return 0;
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

struct Result {
  std::string name;
  uint64_t bytes = 0;
  double memcpy_ms = 0, pipelined_ms = 0, sequential_ms = 0;
};

class Bench {
 public:
  explicit Bench(int runs) : runs_(runs) {}

  absl::Status Init() {
    absl::StatusOr<std::unique_ptr<DeviceOps>> ops = CudaDeviceOps()->Open(0);
    if (!ops.ok()) return ops.status();
    ops_ = std::move(ops).value();
    if (absl::Status s = Cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                              "cudaStreamCreate");
        !s.ok()) {
      return s;
    }
    return absl::OkStatus();
  }

  // Plain cudaMemcpyAsync of `ops` on one stream, one synchronize.
  absl::Status Memcpy(const std::vector<CopyOp>& ops, cudaMemcpyKind kind) {
    for (const CopyOp& op : ops) {
      if (cudaError_t e = cudaMemcpyAsync(op.dst, op.src, op.bytes, kind, stream_);
          e != cudaSuccess) {
        return Cuda(e, "cudaMemcpyAsync");
      }
    }
    return Cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  // Save and Load of `n` blocks of `bytes` (canonical `meta` when set: then
  // loads re-anchor every block).
  absl::Status SaveLoad(const std::string& name, int n, uint64_t bytes,
                        const v1::BlockMeta* meta, std::vector<Result>* out) {
    const uint64_t total = bytes * n;
    void* dev = nullptr;
    void* dst = nullptr;
    void* host = nullptr;
    absl::Status status = Cuda(cudaMalloc(&dev, total), "cudaMalloc");
    if (status.ok()) status = Cuda(cudaMalloc(&dst, total), "cudaMalloc");
    if (status.ok()) status = Cuda(cudaMallocHost(&host, total), "cudaMallocHost");
    if (status.ok()) {
      // Finite bf16-ish values everywhere (0x3c00 = 0.0078 in bf16).
      status = Cuda(cudaMemset(dev, 0x3c, total), "cudaMemset");
    }
    auto* d = static_cast<uint8_t*>(dev);
    auto* d2 = static_cast<uint8_t*>(dst);
    auto* h = static_cast<uint8_t*>(host);
    std::vector<CopyOp> down, up;
    std::vector<FetchBlock> fetch;
    std::vector<LandingBlock> land;
    std::vector<DeviceRange> src_ranges, dst_ranges;
    std::vector<DeviceReanchorJob> jobs;
    RopePlan plan;
    std::vector<int64_t> delta;
    if (meta != nullptr && status.ok()) {
      absl::StatusOr<RopePlan> p = MakeRopePlan(meta->fingerprint());
      if (!p.ok()) status = p.status();
      if (status.ok()) plan = std::move(p).value();
      delta.assign(meta->n_tokens(), 4096);
    }
    jobs.reserve(n);
    for (int i = 0; i < n && status.ok(); ++i) {
      down.push_back({h + i * bytes, d + i * bytes, bytes});
      up.push_back({d2 + i * bytes, h + i * bytes, bytes});
      fetch.push_back({d + i * bytes, h + i * bytes, bytes, true});
      const DeviceReanchorJob* job = nullptr;
      if (meta != nullptr) {
        jobs.push_back({&plan, meta, d2 + i * bytes, bytes, delta});
        job = &jobs.back();
      }
      land.push_back({h + i * bytes, d2 + i * bytes, bytes, true, job});
      for (uint64_t off = 0; off < bytes; off += kChecksumChunkBytes) {
        const uint64_t c = std::min<uint64_t>(kChecksumChunkBytes, bytes - off);
        src_ranges.push_back({d + i * bytes + off, c});
        dst_ranges.push_back({d2 + i * bytes + off, c});
      }
    }
    std::vector<uint64_t> sums(n), chunk_sums(src_ranges.size());
    Result save{name + " save", total}, load{name + " load", total};
    if (status.ok()) {
      save.memcpy_ms = MedianMs(runs_, [&] { return Memcpy(down, cudaMemcpyDeviceToHost); },
                                &status);
    }
    if (status.ok()) {
      save.pipelined_ms = MedianMs(
          runs_, [&] { return ops_->FetchBlocks(fetch, absl::MakeSpan(sums)); }, &status);
    }
    if (status.ok()) {
      save.sequential_ms = MedianMs(
          runs_,
          [&] {
            if (absl::Status s = ops_->DeviceToHost(down); !s.ok()) return s;
            return ops_->ChunkChecksums(src_ranges, absl::MakeSpan(chunk_sums));
          },
          &status);
    }
    if (status.ok()) {
      load.memcpy_ms =
          MedianMs(runs_, [&] { return Memcpy(up, cudaMemcpyHostToDevice); }, &status);
    }
    if (status.ok()) {
      load.pipelined_ms = MedianMs(
          runs_, [&] { return ops_->LandBlocks(land, absl::MakeSpan(sums)); }, &status);
    }
    if (status.ok()) {
      load.sequential_ms = MedianMs(
          runs_,
          [&] {
            if (absl::Status s = ops_->HostToDevice(up); !s.ok()) return s;
            if (absl::Status s = ops_->ChunkChecksums(dst_ranges, absl::MakeSpan(chunk_sums));
                !s.ok()) {
              return s;
            }
            return ops_->ReanchorCanonicalBlocks(jobs);
          },
          &status);
    }
    if (host != nullptr) cudaFreeHost(host);
    if (dst != nullptr) cudaFree(dst);
    if (dev != nullptr) cudaFree(dev);
    if (!status.ok()) return status;
    out->push_back(save);
    out->push_back(load);
    return absl::OkStatus();
  }

  // `pages` pages of `page` bytes scattered through a pool twice as large,
  // gathered into one host block and scattered back: one batch each way
  // (HostToDevice / DeviceToHost) against one cudaMemcpyAsync per page.
  absl::Status Paged(int pages, uint64_t page, std::vector<Result>* out) {
    const uint64_t total = page * pages;
    void* dev = nullptr;
    void* host = nullptr;
    absl::Status status = Cuda(cudaMalloc(&dev, 2 * total), "cudaMalloc");
    if (status.ok()) status = Cuda(cudaMallocHost(&host, total), "cudaMallocHost");
    auto* d = static_cast<uint8_t*>(dev);
    auto* h = static_cast<uint8_t*>(host);
    std::vector<CopyOp> gather, scatter;
    for (int i = 0; i < pages && status.ok(); ++i) {
      const uint64_t slot = static_cast<uint64_t>((i * 7919) % (2 * pages));  // scattered
      gather.push_back({h + i * page, d + slot * page, page});
      scatter.push_back({d + slot * page, h + i * page, page});
    }
    Result g{absl::StrCat("paged ", pages, "x", page >> 10, "KiB gather"), total};
    Result s{absl::StrCat("paged ", pages, "x", page >> 10, "KiB scatter"), total};
    if (status.ok()) {
      g.memcpy_ms = MedianMs(runs_, [&] { return Memcpy(gather, cudaMemcpyDeviceToHost); },
                             &status);
    }
    if (status.ok()) g.pipelined_ms = MedianMs(runs_, [&] { return ops_->DeviceToHost(gather); }, &status);
    if (status.ok()) {
      s.memcpy_ms = MedianMs(runs_, [&] { return Memcpy(scatter, cudaMemcpyHostToDevice); },
                             &status);
    }
    if (status.ok()) s.pipelined_ms = MedianMs(runs_, [&] { return ops_->HostToDevice(scatter); }, &status);
    // The floor: one contiguous copy of the same bytes.
    const std::vector<CopyOp> one_down = {{h, d, total}};
    const std::vector<CopyOp> one_up = {{d, h, total}};
    if (status.ok()) {
      g.sequential_ms = MedianMs(runs_, [&] { return Memcpy(one_down, cudaMemcpyDeviceToHost); },
                                 &status);
    }
    if (status.ok()) {
      s.sequential_ms = MedianMs(runs_, [&] { return Memcpy(one_up, cudaMemcpyHostToDevice); },
                                 &status);
    }
    if (host != nullptr) cudaFreeHost(host);
    if (dev != nullptr) cudaFree(dev);
    if (!status.ok()) return status;
    out->push_back(g);
    out->push_back(s);
    return absl::OkStatus();
  }

 private:
  const int runs_;
  std::unique_ptr<DeviceOps> ops_;
  cudaStream_t stream_ = nullptr;
};

v1::BlockMeta HeadlineMeta() {
  v1::BlockMeta meta;
  v1::LayoutFingerprint fp = testing::CanonicalFingerprint(v1::ROPE_NEOX, v1::DTYPE_BF16,
                                                           v1::DTYPE_BF16, 32, 8, 128);
  fp.mutable_rope()->set_freq_base(500000);
  *meta.mutable_fingerprint() = fp;
  meta.set_n_tokens(128);
  meta.set_layer_begin(0);
  meta.set_layer_end(32);
  meta.set_first_position(0);
  return meta;
}

double Gbps(uint64_t bytes, double ms) { return ms > 0 ? bytes / ms / 1e6 : 0; }

int Main(int argc, char** argv) {
  int runs = 7;
  std::string json;
  bool dry_run = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else if (a == "--dry-run") {
      dry_run = true;
    } else {
      std::fprintf(stderr, "usage: %s [--runs N] [--json FILE] [--dry-run]\n", argv[0]);
      return 2;
    }
  }
  const char* kCases[] = {"cuda16MiB save/load (1 x 16 MiB session block)",
                          "headline2048 save/load (16 x 16 MiB canonical bf16, re-anchored)",
                          "paged 2048x16KiB gather/scatter (one batch vs one copy per page)"};
  if (dry_run) {
    std::printf("gpu_pipeline_bench: dry run, %d runs per measurement; cases:\n", runs);
    for (const char* c : kCases) std::printf("  %s\n", c);
    return 0;
  }
  std::string why;
  if (!testing::HaveCudaDevice(&why)) {
    std::printf("gpu_pipeline_bench: skipped (%s)\n", why.c_str());
    return 0;
  }
  Bench bench(runs);
  std::vector<Result> results;
  absl::Status s = bench.Init();
  if (s.ok()) s = bench.SaveLoad("cuda16MiB", 1, 16ull << 20, nullptr, &results);
  const v1::BlockMeta meta = HeadlineMeta();
  const uint64_t block = 32ull * 2 * 128 * 8 * 128 * 2;  // 16 MiB
  if (s.ok()) s = bench.SaveLoad("headline2048", 16, block, &meta, &results);
  if (s.ok()) s = bench.Paged(2048, 16 << 10, &results);
  if (!s.ok()) {
    std::fprintf(stderr, "gpu_pipeline_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("%-30s %9s %9s %9s %9s %7s %7s\n", "case", "MiB", "memcpy", "evoke", "before",
              "ratio", "before");
  std::string out = "[\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    const double ratio = r.pipelined_ms > 0 ? r.memcpy_ms / r.pipelined_ms : 0;
    const double before = r.sequential_ms > 0 ? r.memcpy_ms / r.sequential_ms : 0;
    std::printf("pipeline: %-20s %9.1f %7.2fGB %7.2fGB %7.2fGB %6.2fx %6.2fx\n", r.name.c_str(),
                r.bytes / 1048576.0, Gbps(r.bytes, r.memcpy_ms), Gbps(r.bytes, r.pipelined_ms),
                Gbps(r.bytes, r.sequential_ms), ratio, before);
    out += absl::StrFormat(
        "  {\"case\": \"%s\", \"bytes\": %llu, \"memcpy_ms\": %.4f, \"evoke_ms\": %.4f, "
        "\"sequential_ms\": %.4f, \"ratio_cuda_memcpy\": %.4f, \"ratio_sequential\": %.4f}%s\n",
        r.name, static_cast<unsigned long long>(r.bytes), r.memcpy_ms, r.pipelined_ms,
        r.sequential_ms, ratio, before, i + 1 < results.size() ? "," : "");
  }
  out += "]\n";
  std::printf("(ratio: evoke's time vs cudaMemcpyAsync of the same bytes, pinned host; "
              "'before': the sequential path; for paged cases 'before' is one contiguous copy)\n");
  if (!json.empty()) std::ofstream(json) << out;
  return 0;
}

}  // namespace
}  // namespace evoke

int main(int argc, char** argv) { return evoke::Main(argc, argv); }
