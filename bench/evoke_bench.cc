// evoke-bench: end-to-end throughput and latency of evoked's data paths, with
// the baselines measured in the same run.
//
//   evoke-bench [--quick] [--json FILE] [--evoked PATH] [--redis-server PATH]
//
// It starts its own evoked (Unix socket in a temp dir) and its own
// redis-server (Unix socket, no persistence), then runs every case:
//   ops      save, load, save+load (a save then a load of each block)
//   paths    inline gRPC, shared memory, CUDA IPC (when a device exists)
//   sizes    64 KiB .. 16 MiB blocks; batches of small blocks
//   threads  1, 2, 8 clients
// Each case is compared with memcpy of the same bytes on as many threads
// (cache-cold destinations, like tier 1) and with Redis 7 pipelined SET/GET
// of the same blocks (and, for CUDA, with cudaMemcpyAsync between a device
// buffer and pinned memory in this process). The ratios are what to read:
// the machines are shared and noisy, absolute GB/s are not.
#include <CLI/CLI.hpp>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "bench/cuda_bench.h"
#include "common/block_validation.h"
#include "common/byte_size.h"
#include "common/status_macros.h"
#include "common/subprocess.h"
#include "evoke/client.h"
#include "testing/blocks.h"

namespace evoke::bench {
namespace {

using Clock = std::chrono::steady_clock;

// ------------------------------------------------------------ processes

// Start runs `argv` with stdout and stderr both in `log`.
absl::StatusOr<Subprocess> Start(const std::vector<std::string>& argv, const std::string& log) {
  SpawnOptions options{.argv = argv};
  options.stdout_path = options.stderr_path = log;
  return Subprocess::Spawn(options);
}

// Stop ends a child politely: SIGTERM, then SIGKILL if it is still there
// after 30 s.
void Stop(Subprocess& child) {
  if (child.running()) child.Stop(absl::Seconds(30)).IgnoreError();
}

std::string FindBinary(const std::string& flag_value, const std::vector<std::string>& guesses) {
  if (!flag_value.empty()) return flag_value;
  for (const std::string& g : guesses) {
    if (access(g.c_str(), X_OK) == 0) return g;
  }
  return "";
}

// ------------------------------------------------------------ measurement

struct Sample {
  uint64_t bytes = 0;
  double seconds = 0;                // Wall time of the whole case.
  std::vector<double> latencies_us;  // Per operation (per request).
  double Gbps() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
  double Percentile(double p) const {
    if (latencies_us.empty()) return 0;
    std::vector<double> v = latencies_us;
    const size_t k = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
    std::nth_element(v.begin(), v.begin() + k, v.end());
    return v[k];
  }
};

// RunThreads runs `body(thread, &latencies)` on `threads` threads released
// together and returns the wall time from the first start to the last end,
// as the threads themselves measured it (the main thread may be descheduled
// on a small machine, so it does not hold the clock).
double RunThreads(int threads,
                  const std::function<void(int, std::vector<double>*)>& body,
                  std::vector<double>* latencies) {
  std::vector<std::vector<double>> per(threads);
  std::vector<Clock::time_point> starts(threads), ends(threads);
  std::barrier sync(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      sync.arrive_and_wait();
      starts[t] = Clock::now();
      body(t, &per[t]);
      ends[t] = Clock::now();
    });
  }
  for (auto& th : pool) th.join();
  for (auto& p : per) latencies->insert(latencies->end(), p.begin(), p.end());
  return std::chrono::duration<double>(*std::max_element(ends.begin(), ends.end()) -
                                       *std::min_element(starts.begin(), starts.end()))
      .count();
}

double Micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// ------------------------------------------------------------ cases

enum class Op { kSave, kLoad, kSaveLoad };
enum class Path { kInline, kShm, kCuda };

const char* OpName(Op op) {
  return op == Op::kSave ? "save" : op == Op::kLoad ? "load" : "save+load";
}
const char* PathName(Path p) {
  return p == Path::kInline ? "inline" : p == Path::kShm ? "shm" : "cuda";
}

struct Case {
  Op op;
  Path path;
  uint64_t block_bytes;
  int threads;
  int batch;  // Blocks per request.
};

struct Result {
  Case c;
  Sample evoke;
  Sample memcpy_base;
  Sample redis;
  Sample cuda_base;
  bool have_redis = false;
  bool have_cuda_base = false;
};

class Bench {
 public:
  Bench(std::string socket, uint64_t case_bytes, ClientOptions client_options)
      : socket_(std::move(socket)),
        case_bytes_(case_bytes),
        client_options_(std::move(client_options)) {}

  // Blocks per thread for a case: the case's bytes spread over threads.
  int BlocksPerThread(const Case& c) const {
    const uint64_t per = case_bytes_ / c.threads / c.block_bytes;
    const uint64_t n = std::max<uint64_t>(per, static_cast<uint64_t>(c.batch) * 2);
    return static_cast<int>((n + c.batch - 1) / c.batch * c.batch);
  }

  absl::StatusOr<Sample> RunEvoke(const Case& c) {
    const int n = BlocksPerThread(c);
    const uint64_t size = c.block_bytes;
    // Opaque blocks, so that any size is valid.
    const v1::LayoutFingerprint fp = testing::OpaqueFingerprint("bench", "bench");
    struct ThreadState {
      std::unique_ptr<Client> client;
      std::unique_ptr<SharedRegion> region;  // shm: payloads then destinations.
      std::vector<std::string> payloads;     // inline.
      std::unique_ptr<CudaPool> cuda;
      uint64_t cuda_region = 0;
      std::vector<v1::BlockMeta> metas;
      std::vector<BlockId> ids;
    };
    std::vector<ThreadState> state(c.threads);
    const std::string session = absl::StrCat("case", case_counter_++);
    for (int t = 0; t < c.threads; ++t) {
      ThreadState& s = state[t];
      ClientOptions o = client_options_;
      o.target = socket_;
      // Each request's payloads travel together for batched cases.
      o.max_batch_bytes = std::max<uint64_t>(o.max_batch_bytes, size * c.batch);
      EVOKE_ASSIGN_OR_RETURN(s.client, Client::Connect(o));
      EVOKE_RETURN_IF_ERROR(s.client->OpenLease("evoke-bench"));
      for (int i = 0; i < n; ++i) {
        s.metas.push_back(SessionBlockMeta(fp, absl::StrCat(session, "-", t), i, 1, 0, 1, 0));
        s.ids.push_back(BlockIdOf(s.metas.back()));
      }
      if (c.path == Path::kShm) {
        EVOKE_ASSIGN_OR_RETURN(s.region, s.client->CreateSharedRegion(2 * n * size));
        for (int i = 0; i < n; ++i) {
          testing::FillPayload(i + 1000 * t, s.region->data() + i * size, size);
        }
        // Touch the destination half too, so page faults are not measured.
        std::memset(s.region->data() + n * size, 0, n * size);
      } else if (c.path == Path::kInline) {
        for (int i = 0; i < n; ++i) {
          s.payloads.emplace_back(size, '\0');
          testing::FillPayload(i + 1000 * t, s.payloads.back().data(), size);
        }
      } else {
        EVOKE_ASSIGN_OR_RETURN(s.cuda, CudaPool::Create(2 * n * size, /*seed=*/t));
        EVOKE_ASSIGN_OR_RETURN(s.cuda_region,
                           s.client->RegisterCudaRegion(s.cuda->ipc_handle(), s.cuda->device(),
                                                        s.cuda->size()));
      }
    }
    auto block = [&](ThreadState& s, int i) -> BlockToSave {
      if (c.path == Path::kInline) return BlockToSave(s.metas[i], s.payloads[i]);
      v1::RegionSlice slice;
      slice.set_region_id(c.path == Path::kShm ? s.region->id() : s.cuda_region);
      slice.set_offset(i * size);
      slice.set_length(size);
      return BlockToSave(s.metas[i], slice);
    };
    auto dest = [&](ThreadState& s, int i) {
      v1::RegionSlice slice;
      slice.set_region_id(c.path == Path::kShm ? s.region->id() : s.cuda_region);
      slice.set_offset((n + i) * size);
      slice.set_length(size);
      return slice;
    };
    auto save = [&](ThreadState& s, int first) -> absl::Status {
      std::vector<BlockToSave> batch;
      for (int i = first; i < first + c.batch; ++i) batch.push_back(block(s, i));
      return s.client->Save(batch).status();
    };
    auto load = [&](ThreadState& s, int first) -> absl::Status {
      std::vector<BlockId> ids(s.ids.begin() + first, s.ids.begin() + first + c.batch);
      if (c.path == Path::kInline) return s.client->Load(ids, fp).status();
      std::vector<v1::RegionSlice> dests;
      for (int i = first; i < first + c.batch; ++i) dests.push_back(dest(s, i));
      return s.client->LoadInto(ids, fp, dests).status();
    };
    if (c.op == Op::kLoad) {  // Load needs the blocks stored first (untimed).
      for (ThreadState& s : state) {
        for (int i = 0; i < n; i += c.batch) EVOKE_RETURN_IF_ERROR(save(s, i));
      }
    }
    std::atomic<int> errors{0};
    absl::Status first_error;
    absl::Mutex error_mu;
    Sample sample;
    sample.seconds = RunThreads(
        c.threads,
        [&](int t, std::vector<double>* lat) {
          ThreadState& s = state[t];
          for (int i = 0; i < n; i += c.batch) {
            const auto a = Clock::now();
            absl::Status st;
            if (c.op == Op::kSave) {
              st = save(s, i);
            } else if (c.op == Op::kLoad) {
              st = load(s, i);
            } else {
              st = save(s, i);
              if (st.ok()) st = load(s, i);
            }
            lat->push_back(Micros(a, Clock::now()));
            if (!st.ok()) {
              ++errors;
              absl::MutexLock lock(&error_mu);
              if (first_error.ok()) first_error = st;
            }
          }
        },
        &sample.latencies_us);
    sample.bytes = static_cast<uint64_t>(n) * size * c.threads;
    for (ThreadState& s : state) {
      s.client->DropSession("bench", s.metas[0].session_id()).IgnoreError();
    }
    if (errors > 0) return first_error;
    return sample;
  }

 private:
  std::string socket_;
  uint64_t case_bytes_;
  ClientOptions client_options_;
  int case_counter_ = 0;
};

// memcpy of the same bytes: every thread copies its blocks from a source
// into fresh (cache-cold) destinations, as the daemon copies into tier 1.
Sample RunMemcpy(const Case& c, int blocks_per_thread) {
  const uint64_t size = c.block_bytes;
  std::vector<std::vector<uint8_t>> src(c.threads), dst(c.threads);
  for (int t = 0; t < c.threads; ++t) {
    src[t].resize(blocks_per_thread * size);
    dst[t].resize(blocks_per_thread * size);
    testing::FillPayload(t, src[t].data(), src[t].size());
    std::memset(dst[t].data(), 1, dst[t].size());
  }
  const int copies = c.op == Op::kSaveLoad ? 2 : 1;
  Sample sample;
  sample.seconds = RunThreads(
      c.threads,
      [&](int t, std::vector<double>* lat) {
        for (int i = 0; i < blocks_per_thread; i += c.batch) {
          const auto a = Clock::now();
          for (int k = 0; k < copies; ++k) {
            std::memcpy(dst[t].data() + i * size, src[t].data() + i * size, size * c.batch);
          }
          lat->push_back(Micros(a, Clock::now()));
        }
      },
      &sample.latencies_us);
  sample.bytes = static_cast<uint64_t>(blocks_per_thread) * size * c.threads;
  return sample;
}

// Redis 7: pipelined SET (save), GET (load) or SET+GET of the same blocks,
// one connection per thread, `depth` commands in flight.
absl::StatusOr<Sample> RunRedis(const std::string& socket, const Case& c,
                                int blocks_per_thread) {
  const uint64_t size = c.block_bytes;
  const int depth = std::max(8, c.batch);
  std::vector<redisContext*> conns(c.threads);
  std::vector<std::string> payload(c.threads);
  for (int t = 0; t < c.threads; ++t) {
    conns[t] = redisConnectUnix(socket.c_str());
    if (conns[t] == nullptr || conns[t]->err) {
      return absl::UnavailableError("cannot connect to redis-server");
    }
    payload[t].resize(size);
    testing::FillPayload(t, payload[t].data(), size);
  }
  auto key = [](int t, int i) { return absl::StrCat("b:", t, ":", i); };
  auto pipeline = [&](redisContext* r, int t, int first, int count, bool set) -> bool {
    for (int i = first; i < first + count; ++i) {
      const std::string k = key(t, i);
      if (set) {
        redisAppendCommand(r, "SET %b %b", k.data(), k.size(), payload[t].data(), size);
      } else {
        redisAppendCommand(r, "GET %b", k.data(), k.size());
      }
    }
    for (int i = 0; i < count; ++i) {
      void* reply = nullptr;
      if (redisGetReply(r, &reply) != REDIS_OK || reply == nullptr) return false;
      const bool ok = static_cast<redisReply*>(reply)->type != REDIS_REPLY_ERROR;
      freeReplyObject(reply);
      if (!ok) return false;
    }
    return true;
  };
  if (c.op == Op::kLoad) {
    for (int t = 0; t < c.threads; ++t) {
      for (int i = 0; i < blocks_per_thread; i += depth) {
        pipeline(conns[t], t, i, std::min(depth, blocks_per_thread - i), true);
      }
    }
  }
  std::atomic<bool> failed{false};
  Sample sample;
  sample.seconds = RunThreads(
      c.threads,
      [&](int t, std::vector<double>* lat) {
        for (int i = 0; i < blocks_per_thread; i += depth) {
          const int count = std::min(depth, blocks_per_thread - i);
          const auto a = Clock::now();
          bool ok = true;
          if (c.op != Op::kLoad) ok = pipeline(conns[t], t, i, count, true);
          if (ok && c.op != Op::kSave) ok = pipeline(conns[t], t, i, count, false);
          // Per-block latency: the pipeline's time shared by its blocks.
          const double us = Micros(a, Clock::now());
          for (int k = 0; k < count; k += c.batch) lat->push_back(us * c.batch / count);
          if (!ok) failed = true;
        }
      },
      &sample.latencies_us);
  sample.bytes = static_cast<uint64_t>(blocks_per_thread) * size * c.threads;
  for (redisContext* r : conns) {
    redisReply* reply = static_cast<redisReply*>(redisCommand(r, "FLUSHALL"));
    if (reply != nullptr) freeReplyObject(reply);
    redisFree(r);
  }
  if (failed) return absl::InternalError("a Redis command failed");
  return sample;
}

// The headline measurement of issue #4: the KV of `tokens` tokens of a
// Llama-3.1-8B-shaped model (32 layers, 8 KV heads, head_dim 128, bf16),
// held on the GPU in canonical blocks of 128 tokens, saved through CUDA IPC
// into evoked and loaded back into another GPU buffer re-anchored at new
// positions (K rotated on the GPU, V byte-identical). Median of `runs` after a
// warm-up; compare with gpu/prefill_baseline.py's re-prefill of the same
// tokens.
absl::Status Headline(const std::string& socket, int tokens, int runs, std::string* json) {
  constexpr int kBlockTokens = 128;
  const v1::LayoutFingerprint fp = testing::WithRope(
      testing::CanonicalFingerprint("headline", "llama-3.1-8b-shape", 32, 8, 128,
                                    v1::DTYPE_BF16),
      v1::ROPE_NEOX, 500000);
  const int n_blocks = tokens / kBlockTokens;
  EVOKE_ASSIGN_OR_RETURN(const uint64_t block_bytes,
                         CanonicalPayloadBytes(fp, kBlockTokens, 32));
  const uint64_t total = block_bytes * n_blocks;
  ClientOptions o;
  o.target = socket;
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(o));
  EVOKE_RETURN_IF_ERROR(client->OpenLease("headline"));
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<CudaPool> pool, CudaPool::Create(2 * total, 7));
  EVOKE_ASSIGN_OR_RETURN(uint64_t region,
                         client->RegisterCudaRegion(pool->ipc_handle(), pool->device(), 2 * total));
  std::vector<double> save_ms, load_ms;
  for (int run = 0; run <= runs; ++run) {
    const std::string session = absl::StrCat("run", run);
    std::vector<BlockToSave> blocks;
    std::vector<BlockId> ids;
    std::vector<v1::Reanchor> reanchor(n_blocks);
    std::vector<v1::RegionSlice> dests(n_blocks);
    for (int b = 0; b < n_blocks; ++b) {
      v1::RegionSlice src;
      src.set_region_id(region);
      src.set_offset(b * block_bytes);
      src.set_length(block_bytes);
      blocks.emplace_back(SessionBlockMeta(fp, session, b, kBlockTokens, 0, 32, b * kBlockTokens),
                          src);
      ids.push_back(BlockIdOf(blocks.back().meta));
      reanchor[b].set_first_position(4096 + b * kBlockTokens);  // A new place in the context.
      dests[b].set_region_id(region);
      dests[b].set_offset(total + b * block_bytes);
      dests[b].set_length(block_bytes);
    }
    const auto t0 = Clock::now();
    EVOKE_RETURN_IF_ERROR(client->Save(blocks).status());
    const auto t1 = Clock::now();
    EVOKE_RETURN_IF_ERROR(client->LoadWith(ids, fp, reanchor, dests).status());
    const auto t2 = Clock::now();
    EVOKE_RETURN_IF_ERROR(client->DropSession("headline", session).status());
    if (run == 0) continue;  // Warm-up.
    save_ms.push_back(Micros(t0, t1) / 1000);
    load_ms.push_back(Micros(t1, t2) / 1000);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double s = median(save_ms), l = median(load_ms);
  // The copy floor of the same bytes in this run: plain cudaMemcpyAsync of
  // the blocks between device memory and pinned host memory, one batch.
  EVOKE_ASSIGN_OR_RETURN(const double d2h_gbps,
                         CudaMemcpyBaseline(block_bytes, n_blocks, n_blocks, 0));
  EVOKE_ASSIGN_OR_RETURN(const double h2d_gbps,
                         CudaMemcpyBaseline(block_bytes, n_blocks, n_blocks, 1));
  const double d2h_ms = total / d2h_gbps / 1e6, h2d_ms = total / h2d_gbps / 1e6;
  std::printf("headline: %d tokens, %s of KV in %d blocks: save %.2f ms, load re-anchored "
              "%.2f ms, save+load %.2f ms (%.1f / %.1f GB/s)\n",
              tokens, FormatByteSize(total).c_str(), n_blocks, s, l, s + l, total / s / 1e6,
              total / l / 1e6);
  std::printf("headline: copy floor (cudaMemcpy, pinned host, same run): device to host "
              "%.2f ms, host to device %.2f ms; evoke is %.2fx / %.2fx of it\n",
              d2h_ms, h2d_ms, s / d2h_ms, l / h2d_ms);
  *json = absl::StrFormat(
      "{\"tokens\": %d, \"kv_bytes\": %llu, \"blocks\": %d, \"save_ms\": %.3f, "
      "\"load_ms\": %.3f, \"save_load_ms\": %.3f, \"memcpy_d2h_ms\": %.3f, "
      "\"memcpy_h2d_ms\": %.3f}",
      tokens, static_cast<unsigned long long>(total), n_blocks, s, l, s + l, d2h_ms, h2d_ms);
  return absl::OkStatus();
}

std::string Size(uint64_t b) {
  if (b >= (1u << 20)) return absl::StrCat(b >> 20, "M");
  return absl::StrCat(b >> 10, "K");
}

int Run(int argc, char** argv) {
  CLI::App app{"evoke-bench: throughput and latency of evoked's data paths, "
               "with memcpy, Redis and cudaMemcpy baselines from the same run"};
  bool quick = false;
  std::string json_path, evoked_flag, redis_flag, register_probe, target, only;
  uint64_t case_mib = 0;
  app.add_flag("--quick", quick, "A reduced set of cases, under a minute (CI runs it)");
  app.add_option("--json", json_path, "Also write the results as JSON to FILE");
  app.add_option("--evoked", evoked_flag, "Path of evoked (default: next to this binary)");
  app.add_option("--redis-server", redis_flag, "Path of redis-server (default: PATH)");
  std::vector<std::string> evoked_args;
  app.add_option("--evoked-arg", evoked_args,
                 "An extra flag for the evoked this tool starts, e.g. --evoked-arg=--copy-threads=8 "
                 "(repeatable)");
  std::string evoked_log_flag;
  app.add_option("--evoked-log", evoked_log_flag,
                 "Keep the started evoked's log in FILE (default: a temp dir, removed)");
  app.add_option("--case-mib", case_mib, "Bytes moved per case, in MiB (default 256, quick 64)");
  app.add_option("--register-probe", register_probe,
                 "Also start an evoked with this much tier 1 (e.g. 8GiB) and time its "
                 "background CUDA registration (GPU machines)");
  app.add_option("--target", target,
                 "Measure an evoked that is already running on this socket instead of "
                 "starting one (e.g. to profile it)");
  app.add_option("--only", only, "Run only cases whose name contains this, e.g. 'save shm 64K'");
  int headline_tokens = 0;
  app.add_option("--headline", headline_tokens,
                 "Only the issue-4 headline: the KV of this many tokens of a Llama-3.1-8B "
                 "shape saved through CUDA IPC and loaded back re-anchored (GPU machines)");
  CLI11_PARSE(app, argc, argv);

  const std::filesystem::path self = std::filesystem::canonical("/proc/self/exe");
  const std::string evoked = FindBinary(
      evoked_flag, {(self.parent_path().parent_path() / "daemon" / "evoked").string(),
                    (self.parent_path() / "evoked").string()});
  if (evoked.empty()) {
    std::fprintf(stderr, "evoke-bench: cannot find evoked (use --evoked)\n");
    return 1;
  }
  const std::string redis = FindBinary(redis_flag, {"/usr/bin/redis-server",
                                                    "/usr/local/bin/redis-server"});
  char tmpl[] = "/tmp/evoke-bench-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string socket = target.empty() ? dir + "/evoked.sock" : target;
  const uint64_t case_bytes = (case_mib != 0 ? case_mib : quick ? 64 : 256) << 20;
  const uint64_t pinned = std::max<uint64_t>(1ull << 30, 3 * case_bytes);

  const std::string evoked_log = evoked_log_flag.empty() ? dir + "/evoked.log" : evoked_log_flag;
  Subprocess evoked_process, redis_process;
  if (target.empty()) {
    std::vector<std::string> args = {
        evoked, "--socket", socket, "--data-dir", dir + "/data", "--pinned-bytes",
        absl::StrCat(pinned), "--spill-bytes", "8GiB", "--max-block-bytes", "64MiB",
        "--log-level", "warning"};
    args.insert(args.end(), evoked_args.begin(), evoked_args.end());
    absl::StatusOr<Subprocess> started = Start(args, evoked_log);
    if (!started.ok()) {
      std::fprintf(stderr, "evoke-bench: %s\n", started.status().ToString().c_str());
      return 1;
    }
    evoked_process = std::move(started).value();
  }
  const std::string redis_socket = dir + "/redis.sock";
  if (!redis.empty()) {
    absl::StatusOr<Subprocess> started =
        Start({redis, "--port", "0", "--unixsocket", redis_socket, "--save", "",
               "--appendonly", "no", "--daemonize", "no", "--maxmemory", "0",
               "--io-threads", "1"},
              dir + "/redis.log");
    // Without Redis the run goes on, without its baseline.
    if (started.ok()) redis_process = std::move(started).value();
  }
  ClientOptions client_options;
  client_options.target = socket;
  client_options.connect_timeout = absl::Seconds(30);
  client_options.max_message_bytes = 80ull << 20;
  absl::StatusOr<std::unique_ptr<Client>> probe = Client::Connect(client_options);
  if (!probe.ok()) {
    std::fprintf(stderr, "evoke-bench: evoked did not start: %s\n",
                 probe.status().ToString().c_str());
    Stop(evoked_process);
    Stop(redis_process);
    return 1;
  }
  const bool have_redis =
      redis_process.running() &&
      testing::WaitUntil([&] { return access(redis_socket.c_str(), F_OK) == 0; },
                         absl::Seconds(5));
  const absl::StatusOr<v1::StatResponse> stat = (*probe)->Stat();
  const bool have_cuda = CudaBenchAvailable() && stat.ok() && stat->cuda_available();

  // The cases.
  std::vector<Case> cases;
  const std::vector<uint64_t> sizes =
      quick ? std::vector<uint64_t>{64 << 10, 1 << 20, 16 << 20}
            : std::vector<uint64_t>{64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20};
  std::vector<Path> paths = {Path::kInline, Path::kShm};
  if (have_cuda) paths.push_back(Path::kCuda);
  for (Path p : paths) {
    for (uint64_t s : sizes) {
      for (Op op : {Op::kSave, Op::kLoad, Op::kSaveLoad}) cases.push_back({op, p, s, 1, 1});
    }
  }
  const std::vector<int> thread_counts = quick ? std::vector<int>{2} : std::vector<int>{2, 8};
  for (int threads : thread_counts) {
    for (Path p : paths) {
      for (uint64_t s : quick ? std::vector<uint64_t>{1 << 20}
                              : std::vector<uint64_t>{256 << 10, 1 << 20, 4 << 20}) {
        for (Op op : {Op::kSave, Op::kLoad}) cases.push_back({op, p, s, threads, 1});
      }
    }
  }
  // Batched small blocks: 64 KiB x 64 per request (and 16 KiB x 64).
  for (Path p : paths) {
    for (Op op : {Op::kSave, Op::kLoad, Op::kSaveLoad}) {
      cases.push_back({op, p, 64 << 10, 1, 64});
      if (!quick) cases.push_back({op, p, 16 << 10, 1, 64});
    }
  }

  if (headline_tokens > 0) {
    std::string json;
    absl::Status s = have_cuda ? Headline(socket, headline_tokens, 7, &json)
                               : absl::UnavailableError("the headline needs a CUDA device");
    if (!json_path.empty() && s.ok()) std::ofstream(json_path) << json << "\n";
    probe->reset();
    Stop(evoked_process);
    Stop(redis_process);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    if (!s.ok()) std::fprintf(stderr, "evoke-bench: %s\n", s.ToString().c_str());
    return s.ok() ? 0 : 1;
  }
  Bench bench(socket, case_bytes, client_options);
  std::vector<Result> results;
  int failures = 0;
  std::printf("evoke-bench: %zu cases, %s per case, evoked %s, redis %s, cuda %s\n",
              cases.size(), FormatByteSize(case_bytes).c_str(), evoked.c_str(),
              have_redis ? redis.c_str() : "(not found: no Redis baseline)",
              have_cuda ? "yes" : "no device");
  std::printf("%-9s %-6s %5s %3s %5s | %8s %9s %9s | %8s %8s | %8s %8s\n", "op", "path",
              "size", "thr", "batch", "GB/s", "p50 us", "p99 us", "memcpy", "x memcpy",
              "redis", "x redis");
  for (const Case& c : cases) {
    if (!only.empty() &&
        absl::StrCat(OpName(c.op), " ", PathName(c.path), " ", Size(c.block_bytes), " ",
                     c.threads, " ", c.batch)
                .find(only) == std::string::npos) {
      continue;
    }
    Result r;
    r.c = c;
    absl::StatusOr<Sample> s = bench.RunEvoke(c);
    if (!s.ok()) {
      std::fprintf(stderr, "case %s %s %s failed: %s\n", OpName(c.op), PathName(c.path),
                   Size(c.block_bytes).c_str(), s.status().ToString().c_str());
      ++failures;
      continue;
    }
    r.evoke = *s;
    const int per_thread = bench.BlocksPerThread(c);
    r.memcpy_base = RunMemcpy(c, per_thread);
    if (have_redis && c.path != Path::kCuda) {
      absl::StatusOr<Sample> rs = RunRedis(redis_socket, c, per_thread);
      if (rs.ok()) {
        r.redis = *rs;
        r.have_redis = true;
      }
    }
    if (c.path == Path::kCuda) {
      absl::StatusOr<double> base =
          CudaMemcpyBaseline(c.block_bytes, per_thread, c.batch,
                             c.op == Op::kSave ? 0 : c.op == Op::kLoad ? 1 : 2);
      if (base.ok()) {
        r.cuda_base.bytes = r.evoke.bytes;
        r.cuda_base.seconds = r.evoke.bytes / (*base * 1e9);
        r.have_cuda_base = true;
      }
    }
    const double ratio_memcpy = r.evoke.Gbps() / std::max(1e-9, r.memcpy_base.Gbps());
    const std::string redis_cell =
        r.have_redis ? absl::StrFormat("%8.2f %8.2f", r.redis.Gbps(),
                                       r.evoke.Gbps() / std::max(1e-9, r.redis.Gbps()))
        : r.have_cuda_base
            ? absl::StrFormat("%8.2f %8.2f", r.cuda_base.Gbps(),
                              r.evoke.Gbps() / std::max(1e-9, r.cuda_base.Gbps()))
            : std::string("       -        -");
    std::printf("%-9s %-6s %5s %3d %5d | %8.2f %9.0f %9.0f | %8.2f %8.2f | %s%s\n",
                OpName(c.op), PathName(c.path), Size(c.block_bytes).c_str(), c.threads,
                c.batch, r.evoke.Gbps(), r.evoke.Percentile(0.5), r.evoke.Percentile(0.99),
                r.memcpy_base.Gbps(), ratio_memcpy, redis_cell.c_str(),
                r.have_cuda_base ? " (cudaMemcpy)" : "");
    std::fflush(stdout);
    results.push_back(std::move(r));
  }

  // Optional: time tier 1's background CUDA registration at a given size.
  std::string registration_json;
  if (!register_probe.empty() && have_cuda) {
    const std::string probe_dir = dir + "/probe";
    std::filesystem::create_directories(probe_dir);
    const absl::Time start = absl::Now();
    absl::StatusOr<Subprocess> probe_process =
        Start({evoked, "--socket", probe_dir + "/e.sock", "--data-dir", probe_dir + "/data",
               "--pinned-bytes", register_probe, "--log-level", "warning"},
              probe_dir + "/evoked.log");
    ClientOptions po = client_options;
    po.target = probe_dir + "/e.sock";
    po.connect_timeout = absl::Seconds(120);
    absl::StatusOr<std::unique_ptr<Client>> pc =
        probe_process.ok() ? Client::Connect(po)
                           : absl::StatusOr<std::unique_ptr<Client>>(probe_process.status());
    const double serving_s = absl::ToDoubleSeconds(absl::Now() - start);
    uint64_t ms = 0, registered = 0;
    if (pc.ok()) {
      testing::WaitUntil(
          [&] {
            absl::StatusOr<v1::StatResponse> ps = (*pc)->Stat();
            if (!ps.ok() || ps->pinned_cuda_registration_ms() == 0) return false;
            ms = ps->pinned_cuda_registration_ms();
            registered = ps->pinned_cuda_registered_bytes();
            return true;
          },
          absl::Seconds(120));
    }
    std::printf("cuda registration of a %s tier 1: serving after %.2f s, registered %s in "
                "the background in %llu ms\n",
                register_probe.c_str(), serving_s, FormatByteSize(registered).c_str(),
                static_cast<unsigned long long>(ms));
    registration_json = absl::StrFormat(
        ",\n  \"cuda_registration\": {\"tier1\": \"%s\", \"serving_s\": %.3f, "
        "\"registered_bytes\": %llu, \"registration_ms\": %llu}",
        register_probe, serving_s, static_cast<unsigned long long>(registered),
        static_cast<unsigned long long>(ms));
    if (probe_process.ok()) Stop(*probe_process);
  }

  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "{\n  \"quick\": " << (quick ? "true" : "false") << ",\n  \"cases\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      out << absl::StrFormat(
          "    {\"op\": \"%s\", \"path\": \"%s\", \"block_bytes\": %llu, \"threads\": %d, "
          "\"batch\": %d, \"gbps\": %.4f, \"p50_us\": %.1f, \"p99_us\": %.1f, "
          "\"memcpy_gbps\": %.4f, \"ratio_memcpy\": %.4f, \"redis_gbps\": %s, "
          "\"ratio_redis\": %s, \"cuda_memcpy_gbps\": %s, \"ratio_cuda_memcpy\": %s}%s\n",
          OpName(r.c.op), PathName(r.c.path),
          static_cast<unsigned long long>(r.c.block_bytes), r.c.threads, r.c.batch,
          r.evoke.Gbps(), r.evoke.Percentile(0.5), r.evoke.Percentile(0.99),
          r.memcpy_base.Gbps(), r.evoke.Gbps() / std::max(1e-9, r.memcpy_base.Gbps()),
          r.have_redis ? absl::StrFormat("%.4f", r.redis.Gbps()) : "null",
          r.have_redis
              ? absl::StrFormat("%.4f", r.evoke.Gbps() / std::max(1e-9, r.redis.Gbps()))
              : "null",
          r.have_cuda_base ? absl::StrFormat("%.4f", r.cuda_base.Gbps()) : "null",
          r.have_cuda_base
              ? absl::StrFormat("%.4f", r.evoke.Gbps() / std::max(1e-9, r.cuda_base.Gbps()))
              : "null",
          i + 1 < results.size() ? "," : "");
    }
    out << "  ]" << registration_json << "\n}\n";
  }
  probe->reset();
  Stop(evoked_process);
  Stop(redis_process);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (failures > 0) {
    std::fprintf(stderr, "evoke-bench: %d cases failed\n", failures);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace evoke::bench

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  return evoke::bench::Run(argc, argv);
}
