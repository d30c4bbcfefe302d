// evoke-bench: end-to-end throughput and latency of evoked's data paths, with
// the baselines measured in the same run.
//
//   evoke-bench [--quick] [--json FILE] [--chart FILE.svg] [--evoked PATH]
//               [--redis-server PATH]
//
// It starts its own evoked (Unix socket in a temp dir) and its own
// redis-server (Unix socket, no persistence), then runs every case:
//   ops      save, load, save+load (a save then a load of each block)
//   paths    inline gRPC, shared memory (through the command ring when the
//            client has one; shm-rpc: the same with the ring off), CUDA IPC
//            (when a device exists)
//   sizes    64 KiB .. 16 MiB blocks; batches of small blocks
//   threads  1, 2, 8 clients
// Each case is compared with memcpy of the same bytes on as many threads
// (cache-cold destinations, like tier 1) and with Redis 7 pipelined SET/GET
// of the same blocks (and, for CUDA, with cudaMemcpyAsync between a device
// buffer and pinned memory in this process). The ratios are what to read:
// the machines are shared and noisy, absolute GB/s are not.
//
// Shared-memory cases measure the steady state: each case's region is
// written through once (a save and a load of every slice, untimed) before
// the timed pass, as an engine that registers its region once would have
// it; --cold-regions measures the first pass instead.
//
// Then the goal cases of issue #12 (each against a baseline measured in the
// same run; the "goal_cases" array of the JSON):
//   ops4k    4 KiB blocks per second, many in flight (ring: SubmitSave /
//            SubmitLoad / Wait, 64 in flight; rpc: 64 blocks per request)
//            vs Redis pipelined SET / GET, 64 in flight
//   lat4k    p50 / p99 of one 4 KiB load (and save) waited for at once,
//            ring vs gRPC vs a 4 KiB memcpy
//   gather   the 16-token pages of 32 layers (K and V, 8 KV heads, head_dim
//            128, f16) scattered through one region, gathered into one
//            block and scattered back, vs memcpy of the same pages
//
// --chart draws the JSON (throughput against block size per path, with the
// baselines) as an SVG with scripts/bench-chart.py, so that the chart's
// numbers are the JSON's; the JSON also records the command and the date for
// the chart's title.
#include <CLI/CLI.hpp>
#include <hiredis/hiredis.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/chart.h"
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
  bool ring = false;                 // shm: the client's blocks went through its ring.
  double Gbps() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
  double Percentile(double p) const {
    if (latencies_us.empty()) return 0;
    std::vector<double> v = latencies_us;
    const size_t k = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
    std::nth_element(v.begin(), v.begin() + k, v.end());
    return v[k];
  }
};

// PerfSwitch: with EVOKE_BENCH_PERF_CTL=CTL_FIFO,ACK_FIFO (the fifos of a
// `perf record -D -1 --control=fifo:CTL_FIFO,ACK_FIFO`, as
// scripts/bench-profile.sh starts it), the timed passes switch the recording
// on and off, so that a profile of the daemon holds the timed work only (not
// the untimed warm-up and setup of each case). Otherwise it does nothing.
class PerfSwitch {
 public:
  static PerfSwitch& Get() {
    static PerfSwitch s;
    return s;
  }
  void Set(bool on) {
    if (ctl_ < 0) return;
    const std::string cmd = on ? "enable\n" : "disable\n";
    if (write(ctl_, cmd.data(), cmd.size()) != static_cast<ssize_t>(cmd.size())) return;
    char ack[8];
    if (ack_ >= 0) (void)!read(ack_, ack, sizeof(ack));  // "ack\n" once perf switched.
  }

 private:
  PerfSwitch() {
    const char* env = std::getenv("EVOKE_BENCH_PERF_CTL");
    if (env == nullptr) return;
    const std::vector<std::string> fifos = absl::StrSplit(env, ',');
    ctl_ = open(fifos[0].c_str(), O_WRONLY | O_CLOEXEC);
    if (fifos.size() > 1) ack_ = open(fifos[1].c_str(), O_RDONLY | O_CLOEXEC);
  }
  int ctl_ = -1, ack_ = -1;
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
  std::barrier sync_go(threads + 1);  // The threads and this one, once perf is on.
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      sync_go.arrive_and_wait();
      starts[t] = Clock::now();
      body(t, &per[t]);
      ends[t] = Clock::now();
    });
  }
  PerfSwitch::Get().Set(true);
  sync_go.arrive_and_wait();
  for (auto& th : pool) th.join();
  PerfSwitch::Get().Set(false);
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
// kShmRpc: shared memory with ClientOptions::use_ring off (the RPC per
// request); kShm uses the ring whenever the client gets one.
enum class Path { kInline, kShm, kCuda, kShmRpc };

const char* OpName(Op op) {
  return op == Op::kSave ? "save" : op == Op::kLoad ? "load" : "save+load";
}
const char* PathName(Path p) {
  switch (p) {
    case Path::kInline:
      return "inline";
    case Path::kShm:
      return "shm";
    case Path::kCuda:
      return "cuda";
    case Path::kShmRpc:
      return "shm-rpc";
  }
  return "?";
}
bool IsShm(Path p) { return p == Path::kShm || p == Path::kShmRpc; }

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
  Sample stream_base;  // Inline cases: the same bytes over a bare Unix socket.
  bool have_redis = false;
  bool have_cuda_base = false;
  bool have_stream_base = false;
};

class Bench {
 public:
  Bench(std::string socket, uint64_t case_bytes, ClientOptions client_options,
        bool warm_regions)
      : socket_(std::move(socket)),
        case_bytes_(case_bytes),
        client_options_(std::move(client_options)),
        warm_regions_(warm_regions) {}

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
      if (c.path == Path::kShmRpc) o.use_ring = false;
      EVOKE_ASSIGN_OR_RETURN(s.client, Client::Connect(o));
      EVOKE_RETURN_IF_ERROR(s.client->OpenLease("evoke-bench"));
      for (int i = 0; i < n; ++i) {
        s.metas.push_back(SessionBlockMeta(fp, absl::StrCat(session, "-", t), i, 1, 0, 1, 0));
        s.ids.push_back(BlockIdOf(s.metas.back()));
      }
      if (IsShm(c.path)) {
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
      slice.set_region_id(IsShm(c.path) ? s.region->id() : s.cuda_region);
      slice.set_offset(i * size);
      slice.set_length(size);
      return BlockToSave(s.metas[i], slice);
    };
    auto dest = [&](ThreadState& s, int i) {
      v1::RegionSlice slice;
      slice.set_region_id(IsShm(c.path) ? s.region->id() : s.cuda_region);
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
    // Steady state: an engine registers its region once and reuses it, so
    // the daemon's first touch of each page of its mapping (a fault per page;
    // it does not populate client memfds) is not the data path. One untimed
    // save and load of every slice, as blocks of another session, faults
    // them in and warms the ring.
    if (IsShm(c.path) && warm_regions_) {
      for (int t = 0; t < c.threads; ++t) {
        ThreadState& s = state[t];
        const std::string warm = absl::StrCat(session, "-warm-", t);
        for (int i = 0; i < n; i += c.batch) {
          std::vector<BlockToSave> batch;
          std::vector<BlockId> ids;
          std::vector<v1::RegionSlice> dests;
          for (int k = i; k < i + c.batch; ++k) {
            batch.push_back(block(s, k));
            batch.back().meta = SessionBlockMeta(fp, warm, k, 1, 0, 1, 0);
            ids.push_back(BlockIdOf(batch.back().meta));
            dests.push_back(dest(s, k));
          }
          EVOKE_RETURN_IF_ERROR(s.client->Save(batch).status());
          EVOKE_RETURN_IF_ERROR(s.client->LoadInto(ids, fp, dests).status());
        }
        EVOKE_RETURN_IF_ERROR(s.client->DropSession("bench", warm).status());
      }
    }
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
    sample.ring = IsShm(c.path) && state[0].client->has_ring();
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
  bool warm_regions_;
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

// A raw stream of the same bytes, the inline path's baseline: each thread
// writes every operation's bytes into a Unix stream socket, a peer thread
// reads them into a buffer and answers one byte, and the writer waits for
// it (save+load: both ways). No framing, no checksum, no copy into tier 1:
// the floor of moving the bytes through the kernel's socket.
absl::StatusOr<Sample> RunUnixStream(const Case& c, int blocks_per_thread) {
  const uint64_t op_bytes = c.block_bytes * c.batch;
  std::vector<std::array<int, 2>> fds(c.threads);
  for (auto& f : fds) {
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, f.data()) != 0) {
      return absl::InternalError(absl::StrCat("socketpair: ", std::strerror(errno)));
    }
  }
  // Moves exactly n bytes with `io` (read or write), retrying on EINTR.
  auto all = [](auto io, int fd, auto* p, uint64_t n) {
    while (n > 0) {
      const ssize_t done = io(fd, p, n);
      if (done < 0 && errno == EINTR) continue;
      if (done <= 0) return false;
      p += done;
      n -= static_cast<uint64_t>(done);
    }
    return true;
  };
  auto write_all = [&](int fd, const uint8_t* p, uint64_t n) { return all(::write, fd, p, n); };
  auto read_all = [&](int fd, uint8_t* p, uint64_t n) { return all(::read, fd, p, n); };
  const int ways = c.op == Op::kSaveLoad ? 2 : 1;
  const int ops = (blocks_per_thread + c.batch - 1) / c.batch;
  std::atomic<bool> failed{false};
  // One peer per thread: reads each operation's bytes, answers a byte (and
  // for save+load sends them back).
  std::vector<std::thread> peers;
  for (int t = 0; t < c.threads; ++t) {
    peers.emplace_back([&, t] {
      std::vector<uint8_t> buf(op_bytes);
      uint8_t ack = 1;
      for (int i = 0; i < ops && !failed; ++i) {
        bool ok = read_all(fds[t][1], buf.data(), op_bytes);
        if (ok && ways == 2) ok = write_all(fds[t][1], buf.data(), op_bytes);
        if (ok && ways == 1) ok = write_all(fds[t][1], &ack, 1);
        if (!ok) failed = true;
      }
    });
  }
  std::vector<std::vector<uint8_t>> src(c.threads);
  for (int t = 0; t < c.threads; ++t) {
    src[t].resize(op_bytes);
    testing::FillPayload(t, src[t].data(), op_bytes);
  }
  Sample sample;
  sample.seconds = RunThreads(
      c.threads,
      [&](int t, std::vector<double>* lat) {
        std::vector<uint8_t> back(ways == 2 ? op_bytes : 1);
        for (int i = 0; i < ops && !failed; ++i) {
          const auto a = Clock::now();
          if (!write_all(fds[t][0], src[t].data(), op_bytes) ||
              !read_all(fds[t][0], back.data(), back.size())) {
            failed = true;
          }
          lat->push_back(Micros(a, Clock::now()));
        }
      },
      &sample.latencies_us);
  for (auto& f : fds) shutdown(f[0], SHUT_RDWR);
  for (std::thread& p : peers) p.join();
  for (auto& f : fds) {
    close(f[0]);
    close(f[1]);
  }
  if (failed) return absl::InternalError("the unix-stream baseline failed");
  sample.bytes = static_cast<uint64_t>(ops) * op_bytes * c.threads;
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
  // `command`: 's' SET, 'g' GET, 'd' DEL.
  auto pipeline = [&](redisContext* r, int t, int first, int count, char command) -> bool {
    for (int i = first; i < first + count; ++i) {
      const std::string k = key(t, i);
      if (command == 's') {
        redisAppendCommand(r, "SET %b %b", k.data(), k.size(), payload[t].data(), size);
      } else if (command == 'g') {
        redisAppendCommand(r, "GET %b", k.data(), k.size());
      } else {
        redisAppendCommand(r, "DEL %b", k.data(), k.size());
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
  // Steady state, as on evoke's side: one untimed SET of every key (a
  // load's blocks stored first), then for a save a DEL of each, so that the
  // timed SETs reuse memory Redis already faulted in instead of growing its
  // heap (not FLUSHALL: Redis 7 hands the memory back to the system then).
  for (int t = 0; t < c.threads; ++t) {
    for (int i = 0; i < blocks_per_thread; i += depth) {
      const int count = std::min(depth, blocks_per_thread - i);
      pipeline(conns[t], t, i, count, 's');
      if (c.op != Op::kLoad) pipeline(conns[t], t, i, count, 'd');
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
          if (c.op != Op::kLoad) ok = pipeline(conns[t], t, i, count, 's');
          if (ok && c.op != Op::kSave) ok = pipeline(conns[t], t, i, count, 'g');
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

// Selected: --only is empty, or `name` contains one of its comma-separated
// parts.
bool Selected(absl::string_view name, absl::string_view only) {
  if (only.empty()) return true;
  for (absl::string_view part : absl::StrSplit(only, ',', absl::SkipEmpty())) {
    if (absl::StrContains(name, part)) return true;
  }
  return false;
}

// ------------------------------------------------------------ goal cases
// The cases of issue #12's goals table that do not fit the op x path x size
// matrix above. Each reports a figure and a baseline measured in the same
// run; `ratio` is always figure / baseline (for latencies lower is better).

struct GoalResult {
  std::string name;           // e.g. "ops4k save ring"
  std::string unit;           // "ops/s", "us" (a p50) or "GB/s"
  double value = 0;
  std::string baseline;       // What it is compared with, e.g. "redis SET x64"
  double baseline_value = 0;  // In `unit`.
  double p50_us = 0, p99_us = 0;
  bool ring = false;          // The evoke side went through the command ring.
  double ratio() const { return value / std::max(1e-12, baseline_value); }
};

class GoalCases {
 public:
  GoalCases(std::string socket, ClientOptions options, std::string redis_socket,
            bool have_redis, bool quick, std::string only)
      : socket_(std::move(socket)),
        options_(std::move(options)),
        redis_socket_(std::move(redis_socket)),
        have_redis_(have_redis),
        quick_(quick),
        only_(std::move(only)) {}

  void RunAll() {
    // A fresh redis-server is several times slower on its first passes
    // (its heap and buffers grow): one untimed SET/GET pass first, so that
    // the first group is not compared with a cold Redis.
    if (have_redis_ && (Want("ops4k ring") || Want("ops4k rpc"))) {
      RunRedis(redis_socket_, {Op::kLoad, Path::kShm, 4096, 1, 64}, quick_ ? 4096 : 16384)
          .IgnoreError();
    }
    Group("ops4k ring", [&] { return Ops4k(true); });
    Group("ops4k rpc", [&] { return Ops4k(false); });
    Group("lat4k", [&] { return Latency4k(); });
    Group("gather ring", [&] { return Gather(true); });
    Group("gather rpc", [&] { return Gather(false); });
  }

  const std::vector<GoalResult>& results() const { return results_; }
  int failures() const { return failures_; }

 private:
  bool Want(absl::string_view name) const {
    return Selected(name, only_);
  }

  // Group runs one group of cases unless --only leaves it out; a failure is
  // loud (stderr, a FAILED row, the exit status), never a missing row.
  void Group(const std::string& name, const std::function<absl::Status()>& body) {
    // lat4k runs its ring and RPC sides together (interleaved), either alone.
    const bool wanted =
        name == "lat4k" ? Want("lat4k ring") || Want("lat4k rpc") : Want(name);
    if (!wanted) return;
    const absl::Status s = body();
    if (!s.ok()) Fail(name, s);
  }

  void Fail(const std::string& name, const absl::Status& s) {
    ++failures_;
    std::printf("%-22s FAILED: %s\n", name.c_str(), s.ToString().c_str());
    std::fprintf(stderr, "goal case %s failed: %s\n", name.c_str(), s.ToString().c_str());
    std::fflush(stdout);
  }

  void Report(GoalResult r) {
    std::printf("%-22s | %12.2f %-5s | %-26s %12.2f | %8.3f | %8.1f %8.1f | %s\n",
                r.name.c_str(), r.value, r.unit.c_str(), r.baseline.c_str(), r.baseline_value,
                r.ratio(), r.p50_us, r.p99_us, r.ring ? "ring" : "rpc");
    std::fflush(stdout);
    results_.push_back(std::move(r));
  }

  // A connected client with a lease and one shared region of `bytes`; with
  // `ring`, the client must have got its ring (FAILED_PRECONDITION
  // otherwise: a ring case never quietly measures the RPC path).
  absl::Status Connect(bool ring, uint64_t bytes, std::unique_ptr<Client>* client,
                       std::unique_ptr<SharedRegion>* region) {
    ClientOptions o = options_;
    o.target = socket_;
    o.use_ring = ring;
    o.max_batch_bytes = std::max<uint64_t>(o.max_batch_bytes, 64ull << 20);
    EVOKE_ASSIGN_OR_RETURN(*client, Client::Connect(o));
    EVOKE_RETURN_IF_ERROR((*client)->OpenLease("evoke-bench-goals"));
    EVOKE_ASSIGN_OR_RETURN(*region, (*client)->CreateSharedRegion(bytes));
    if (ring && !(*client)->has_ring()) {
      return absl::FailedPreconditionError(
          "the client has no command ring after CreateSharedRegion (the daemon refused "
          "AttachRing, or is older than the ring)");
    }
    // Every page touched here; the daemon's side is faulted in by each
    // case's untimed first pass.
    std::memset((*region)->data(), 0, bytes);
    return absl::OkStatus();
  }

  std::string NewSession() { return absl::StrCat("goal", session_counter_++); }
  // Timed passes per case (each side's median is reported).
  int reps() const { return quick_ ? 3 : 5; }
  static double Median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
  }

  // Pipelined: `n` operations, at most `depth` in flight, through the ring.
  // `submit(i)` queues operation i; each completion must be OK and, for a
  // load, carry `expect_bytes`.
  static absl::StatusOr<double> Pipelined(Client& client, int n, int depth,
                                          uint64_t expect_bytes,
                                          const std::function<absl::StatusOr<uint64_t>(int)>& submit) {
    std::deque<uint64_t> in_flight;
    auto reap = [&]() -> absl::Status {
      EVOKE_ASSIGN_OR_RETURN(RingCompletion done, client.Wait(in_flight.front()));
      in_flight.pop_front();
      EVOKE_RETURN_IF_ERROR(done.status);
      if (done.deduplicated) return absl::InternalError("a ring save was deduplicated");
      if (expect_bytes != 0 && done.payload_bytes != expect_bytes) {
        return absl::InternalError(absl::StrCat("a ring load returned ", done.payload_bytes,
                                                " bytes, expected ", expect_bytes));
      }
      return absl::OkStatus();
    };
    const auto a = Clock::now();
    for (int i = 0; i < n; ++i) {
      if (static_cast<int>(in_flight.size()) >= depth) EVOKE_RETURN_IF_ERROR(reap());
      EVOKE_ASSIGN_OR_RETURN(const uint64_t ticket, submit(i));
      in_flight.push_back(ticket);
    }
    while (!in_flight.empty()) EVOKE_RETURN_IF_ERROR(reap());
    return std::chrono::duration<double>(Clock::now() - a).count();
  }

  // ops4k: 4 KiB blocks per second, save then load, many in flight, against
  // Redis pipelined SET / GET of the same blocks (64 in flight, one
  // connection, measured right after).
  absl::Status Ops4k(bool ring) {
    constexpr uint64_t kSize = 4096;
    constexpr int kDepth = 64;
    const int n = quick_ ? 4096 : 16384;
    const v1::LayoutFingerprint fp = testing::OpaqueFingerprint("bench", "bench");
    std::unique_ptr<Client> client;
    std::unique_ptr<SharedRegion> region;
    EVOKE_RETURN_IF_ERROR(Connect(ring, 2 * n * kSize, &client, &region));
    for (int i = 0; i < n; ++i) testing::FillPayload(i, region->data() + i * kSize, kSize);
    auto src = [&](int i) { return region->Slice(i * kSize, kSize); };
    auto dst = [&](int i) { return region->Slice((n + i) * kSize, kSize); };
    // One pass: save all n blocks of `session`, then load them all; returns
    // {save seconds, load seconds}.
    auto pass = [&](const std::string& session) -> absl::StatusOr<std::pair<double, double>> {
      std::vector<v1::BlockMeta> metas;
      std::vector<BlockId> ids;
      for (int i = 0; i < n; ++i) {
        metas.push_back(SessionBlockMeta(fp, session, i, 1, 0, 1, 0));
        ids.push_back(BlockIdOf(metas.back()));
      }
      if (ring) {
        EVOKE_ASSIGN_OR_RETURN(const double save_s,
                               Pipelined(*client, n, kDepth, 0, [&](int i) {
                                 return client->SubmitSave(BlockToSave(metas[i], src(i)));
                               }));
        EVOKE_ASSIGN_OR_RETURN(const double load_s,
                               Pipelined(*client, n, kDepth, kSize, [&](int i) {
                                 const v1::RegionSlice d = dst(i);
                                 return client->SubmitLoad(ids[i], fp, {&d, 1});
                               }));
        return std::make_pair(save_s, load_s);
      }
      // The RPC path's best for many small blocks: 64 per request.
      const auto a = Clock::now();
      for (int i = 0; i < n; i += kDepth) {
        std::vector<BlockToSave> batch;
        for (int k = i; k < i + kDepth; ++k) batch.emplace_back(metas[k], src(k));
        EVOKE_RETURN_IF_ERROR(client->Save(batch).status());
      }
      const auto b = Clock::now();
      for (int i = 0; i < n; i += kDepth) {
        std::vector<v1::RegionSlice> dests;
        for (int k = i; k < i + kDepth; ++k) dests.push_back(dst(k));
        EVOKE_RETURN_IF_ERROR(
            client->LoadInto({ids.data() + i, static_cast<size_t>(kDepth)}, fp, dests).status());
      }
      const auto c = Clock::now();
      return std::make_pair(std::chrono::duration<double>(b - a).count(),
                            std::chrono::duration<double>(c - b).count());
    };
    const std::string warm = NewSession();
    EVOKE_RETURN_IF_ERROR(pass(warm).status());  // Faults, ring start-up.
    EVOKE_RETURN_IF_ERROR(client->DropSession("bench", warm).status());
    // Passes of evoke and Redis alternate; each side's median is reported.
    std::vector<double> save_s, load_s, set_s, get_s;
    for (int rep = 0; rep < reps(); ++rep) {
      const std::string session = NewSession();
      PerfSwitch::Get().Set(true);
      const absl::StatusOr<std::pair<double, double>> timed = pass(session);
      PerfSwitch::Get().Set(false);
      EVOKE_ASSIGN_OR_RETURN(const auto seconds, timed);
      EVOKE_RETURN_IF_ERROR(client->DropSession("bench", session).status());
      save_s.push_back(seconds.first);
      load_s.push_back(seconds.second);
      if (have_redis_) {
        EVOKE_ASSIGN_OR_RETURN(
            const Sample set, RunRedis(redis_socket_, {Op::kSave, Path::kShm, kSize, 1, kDepth}, n));
        EVOKE_ASSIGN_OR_RETURN(
            const Sample get, RunRedis(redis_socket_, {Op::kLoad, Path::kShm, kSize, 1, kDepth}, n));
        set_s.push_back(set.seconds);
        get_s.push_back(get.seconds);
      }
    }
    const char* variant = ring ? "ring" : "rpc64";
    for (const bool is_load : {false, true}) {
      GoalResult r;
      r.name = absl::StrCat("ops4k ", is_load ? "load " : "save ", variant);
      r.unit = "ops/s";
      r.value = n / Median(is_load ? load_s : save_s);
      r.baseline = !have_redis_ ? "(no redis)" : is_load ? "redis GET x64" : "redis SET x64";
      r.baseline_value = have_redis_ ? n / Median(is_load ? get_s : set_s) : 0;
      r.ring = ring;
      Report(std::move(r));
    }
    return absl::OkStatus();
  }

  // lat4k: one 4 KiB block saved / loaded and waited for at once, p50 and
  // p99 over many, the ring and the RPC interleaved op by op (so that both
  // see the same noise), beside a 4 KiB memcpy timed the same way.
  absl::Status Latency4k() {
    constexpr uint64_t kSize = 4096;
    const int n = quick_ ? 1000 : 5000;
    const v1::LayoutFingerprint fp = testing::OpaqueFingerprint("bench", "bench");
    const bool want_ring = Want("lat4k ring");
    const bool want_rpc = Want("lat4k rpc");
    struct Side {
      bool ring = false;
      std::unique_ptr<Client> client;
      std::unique_ptr<SharedRegion> region;
      std::string session;
      std::vector<v1::BlockMeta> metas;
      std::vector<BlockId> ids;
      std::vector<double> save_us, load_us;
    };
    std::vector<Side> sides;
    for (const bool ring : {true, false}) {
      if (ring ? !want_ring : !want_rpc) continue;
      sides.emplace_back();
      sides.back().ring = ring;
    }
    for (auto it = sides.begin(); it != sides.end();) {
      Side& side = *it;
      const absl::Status connected =
          Connect(side.ring, 2 * n * kSize, &side.client, &side.region);
      // A daemon without the ring fails the ring side (loudly) and still
      // gives the RPC side's figures.
      if (!connected.ok()) {
        if (!side.ring || sides.size() == 1) return connected;
        Fail("lat4k ring", connected);
        it = sides.erase(it);
        continue;
      }
      for (int i = 0; i < n; ++i) {
        testing::FillPayload(i, side.region->data() + i * kSize, kSize);
      }
      ++it;
    }
    auto save = [&](Side& side, int i) -> absl::Status {
      BlockToSave b(side.metas[i], side.region->Slice(i * kSize, kSize));
      if (!side.ring) return side.client->Save({&b, 1}).status();
      EVOKE_ASSIGN_OR_RETURN(const uint64_t ticket, side.client->SubmitSave(b));
      EVOKE_ASSIGN_OR_RETURN(const RingCompletion done, side.client->Wait(ticket));
      return done.status;
    };
    auto load = [&](Side& side, int i) -> absl::Status {
      const v1::RegionSlice d = side.region->Slice((n + i) * kSize, kSize);
      if (!side.ring) return side.client->LoadInto({&side.ids[i], 1}, fp, {&d, 1}).status();
      EVOKE_ASSIGN_OR_RETURN(const uint64_t ticket, side.client->SubmitLoad(side.ids[i], fp, {&d, 1}));
      EVOKE_ASSIGN_OR_RETURN(const RingCompletion done, side.client->Wait(ticket));
      EVOKE_RETURN_IF_ERROR(done.status);
      if (done.payload_bytes != kSize) return absl::InternalError("a ring load's size is wrong");
      return absl::OkStatus();
    };
    // Two passes: the first (untimed) faults the daemon's side of the
    // regions in and starts the rings; the second is measured.
    for (int pass = 0; pass < 2; ++pass) {
      PerfSwitch::Get().Set(pass == 1);
      for (Side& side : sides) {
        side.session = NewSession();
        side.metas.clear();
        side.ids.clear();
        for (int i = 0; i < n; ++i) {
          side.metas.push_back(SessionBlockMeta(fp, side.session, i, 1, 0, 1, 0));
          side.ids.push_back(BlockIdOf(side.metas.back()));
        }
      }
      for (int i = 0; i < n; ++i) {
        for (Side& side : sides) {
          const auto a = Clock::now();
          EVOKE_RETURN_IF_ERROR(save(side, i));
          if (pass == 1) side.save_us.push_back(Micros(a, Clock::now()));
        }
      }
      for (int i = 0; i < n; ++i) {
        for (Side& side : sides) {
          const auto a = Clock::now();
          EVOKE_RETURN_IF_ERROR(load(side, i));
          if (pass == 1) side.load_us.push_back(Micros(a, Clock::now()));
        }
      }
      PerfSwitch::Get().Set(false);
      for (Side& side : sides) {
        EVOKE_RETURN_IF_ERROR(side.client->DropSession("bench", side.session).status());
      }
    }
    // memcpy of 4 KiB from a cache-cold source (rotating over 64 MiB) into
    // a destination likewise, timed one by one.
    const uint64_t span = 64ull << 20;
    std::vector<uint8_t> from(span, 1), to(span, 2);
    Sample copy;
    for (int i = 0; i < n; ++i) {
      const uint64_t off = (static_cast<uint64_t>(i) * 7919 * kSize) % (span - kSize);
      const auto a = Clock::now();
      std::memcpy(to.data() + off, from.data() + off, kSize);
      copy.latencies_us.push_back(Micros(a, Clock::now()));
    }
    const double copy_p50 = copy.Percentile(0.5);
    auto stats = [](std::vector<double> v) {
      Sample s;
      s.latencies_us = std::move(v);
      return std::make_pair(s.Percentile(0.5), s.Percentile(0.99));
    };
    const Side* rpc = nullptr;
    for (const Side& side : sides) {
      if (!side.ring) rpc = &side;
    }
    for (const Side& side : sides) {
      for (const bool is_load : {true, false}) {
        const auto [p50, p99] = stats(is_load ? side.load_us : side.save_us);
        GoalResult r;
        r.name = absl::StrCat("lat4k ", is_load ? "load " : "save ", side.ring ? "ring" : "rpc");
        r.unit = "us";
        r.value = r.p50_us = p50;
        r.p99_us = p99;
        r.ring = side.ring;
        if (side.ring && rpc != nullptr) {
          r.baseline = "rpc p50 (same run)";
          r.baseline_value = stats(is_load ? rpc->load_us : rpc->save_us).first;
        } else {
          r.baseline = "memcpy 4K p50";
          r.baseline_value = copy_p50;
        }
        Report(std::move(r));
      }
    }
    return absl::OkStatus();
  }

  // gather: a paged cache's block. vLLM-style pages of 16 tokens x 8 KV
  // heads x head_dim 128 x f16 (32 KiB) for K and V of 32 layers: 64 pages,
  // 2 MiB per block, the pages of all blocks shuffled through one region.
  // Each block is saved gathered from its 64 pages and loaded scattered
  // into 64 other pages (shuffled again), 8 blocks per call; the bytes are
  // checked afterwards. Baseline: memcpy of the same pages into one buffer
  // per block and back out into the destination pages.
  absl::Status Gather(bool ring) {
    constexpr uint64_t kPage = 16 * 8 * 128 * 2;
    constexpr int kPieces = 32 * 2;
    constexpr int kPerCall = 8;
    const int blocks = quick_ ? 8 : 32;
    const uint64_t pages = static_cast<uint64_t>(blocks) * kPieces;
    const uint64_t block_bytes = kPage * kPieces;
    const v1::LayoutFingerprint fp = testing::OpaqueFingerprint("bench", "bench");
    std::unique_ptr<Client> client;
    std::unique_ptr<SharedRegion> region;
    EVOKE_RETURN_IF_ERROR(Connect(ring, 2 * pages * kPage, &client, &region));
    std::vector<uint64_t> src_page(pages), dst_page(pages);
    for (uint64_t p = 0; p < pages; ++p) src_page[p] = dst_page[p] = p;
    std::mt19937_64 rng(12);
    std::shuffle(src_page.begin(), src_page.end(), rng);
    std::shuffle(dst_page.begin(), dst_page.end(), rng);
    for (uint64_t p = 0; p < pages; ++p) {
      testing::FillPayload(p, region->data() + p * kPage, kPage);
    }
    // Piece j of block b: source page src_page[b * 64 + j] (first half),
    // destination page dst_page[b * 64 + j] (second half).
    auto src = [&](int b, int j) {
      return region->Slice(src_page[b * kPieces + j] * kPage, kPage);
    };
    auto dst = [&](int b, int j) {
      return region->Slice((pages + dst_page[b * kPieces + j]) * kPage, kPage);
    };
    auto pass = [&](const std::string& session) -> absl::StatusOr<std::pair<double, double>> {
      std::vector<v1::BlockMeta> metas;
      std::vector<BlockId> ids;
      for (int b = 0; b < blocks; ++b) {
        metas.push_back(SessionBlockMeta(fp, session, b, 1, 0, 1, 0));
        ids.push_back(BlockIdOf(metas.back()));
      }
      const auto t0 = Clock::now();
      for (int b = 0; b < blocks; b += kPerCall) {
        std::vector<BlockToSave> batch(kPerCall);
        for (int k = 0; k < kPerCall; ++k) {
          batch[k].meta = metas[b + k];
          for (int j = 0; j < kPieces; ++j) batch[k].gather.push_back(src(b + k, j));
        }
        EVOKE_ASSIGN_OR_RETURN(const std::vector<v1::SaveResult> saved, client->Save(batch));
        for (const v1::SaveResult& r : saved) {
          // A deduplicated save copied nothing: it would flatter the figure.
          if (r.deduplicated()) return absl::InternalError("a gathered save was deduplicated");
        }
      }
      const auto t1 = Clock::now();
      for (int b = 0; b < blocks; b += kPerCall) {
        std::vector<std::vector<v1::RegionSlice>> scatter(kPerCall);
        for (int k = 0; k < kPerCall; ++k) {
          for (int j = 0; j < kPieces; ++j) scatter[k].push_back(dst(b + k, j));
        }
        EVOKE_RETURN_IF_ERROR(
            client->LoadScatter({ids.data() + b, static_cast<size_t>(kPerCall)}, fp, scatter)
                .status());
      }
      const auto t2 = Clock::now();
      // Every destination page must now hold its source page's bytes.
      for (int b = 0; b < blocks; ++b) {
        for (int j = 0; j < kPieces; ++j) {
          const v1::RegionSlice s = src(b, j), d = dst(b, j);
          if (std::memcmp(region->data() + s.offset(), region->data() + d.offset(), kPage) != 0) {
            return absl::DataLossError(absl::StrCat("gather/scatter: block ", b, " piece ", j,
                                                    " came back different"));
          }
        }
      }
      std::memset(region->data() + pages * kPage, 0, pages * kPage);
      return std::make_pair(std::chrono::duration<double>(t1 - t0).count(),
                            std::chrono::duration<double>(t2 - t1).count());
    };
    const std::string warm = NewSession();
    EVOKE_RETURN_IF_ERROR(pass(warm).status());
    EVOKE_RETURN_IF_ERROR(client->DropSession("bench", warm).status());
    // The memcpy baseline: the same page layout in private memory, every
    // page touched first; passes alternate with evoke's, medians reported.
    std::vector<uint8_t> pool(2 * pages * kPage, 1), staging(blocks * block_bytes, 2);
    std::vector<double> save_s, load_s, gather_s, scatter_s, both_s, copy_both_s;
    for (int rep = 0; rep < reps(); ++rep) {
      const std::string session = NewSession();
      EVOKE_ASSIGN_OR_RETURN(const auto seconds, pass(session));
      EVOKE_RETURN_IF_ERROR(client->DropSession("bench", session).status());
      save_s.push_back(seconds.first);
      load_s.push_back(seconds.second);
      both_s.push_back(seconds.first + seconds.second);
      const auto m0 = Clock::now();
      for (int b = 0; b < blocks; ++b) {
        for (int j = 0; j < kPieces; ++j) {
          std::memcpy(staging.data() + b * block_bytes + j * kPage,
                      pool.data() + src_page[b * kPieces + j] * kPage, kPage);
        }
      }
      const auto m1 = Clock::now();
      for (int b = 0; b < blocks; ++b) {
        for (int j = 0; j < kPieces; ++j) {
          std::memcpy(pool.data() + (pages + dst_page[b * kPieces + j]) * kPage,
                      staging.data() + b * block_bytes + j * kPage, kPage);
        }
      }
      const auto m2 = Clock::now();
      gather_s.push_back(std::chrono::duration<double>(m1 - m0).count());
      scatter_s.push_back(std::chrono::duration<double>(m2 - m1).count());
      copy_both_s.push_back(std::chrono::duration<double>(m2 - m0).count());
    }
    const double total = static_cast<double>(blocks) * block_bytes;
    const char* variant = ring ? "ring" : "rpc";
    auto report = [&](const char* what, double bytes, const std::vector<double>& evoke_s,
                      const char* base, const std::vector<double>& base_s) {
      GoalResult r;
      r.name = absl::StrCat(what, " ", variant);
      r.unit = "GB/s";
      r.value = bytes / Median(evoke_s) / 1e9;
      r.baseline = base;
      r.baseline_value = bytes / Median(base_s) / 1e9;
      r.ring = ring;
      Report(std::move(r));
    };
    report("gather save", total, save_s, "memcpy gather", gather_s);
    report("scatter load", total, load_s, "memcpy scatter", scatter_s);
    report("gather+scatter", 2 * total, both_s, "memcpy gather+scatter", copy_both_s);
    return absl::OkStatus();
  }

  std::string socket_;
  ClientOptions options_;
  std::string redis_socket_;
  bool have_redis_;
  bool quick_;
  std::string only_;
  int session_counter_ = 0;
  int failures_ = 0;
  std::vector<GoalResult> results_;
};

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
  std::string chart_path, chart_script = EVOKE_BENCH_CHART_SCRIPT;
  app.add_option("--chart", chart_path,
                 "Also draw the results as an SVG chart to FILE (throughput against block "
                 "size per path, with the memcpy and Redis baselines), from the JSON");
  app.add_option("--chart-script", chart_script, "The chart program --chart runs")
      ->capture_default_str();
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
  app.add_option("--only", only,
                 "Run only cases whose name contains this (or one of these, comma-separated), "
                 "e.g. 'save shm 64K' or 'shm 1M 1 1,ops4k'");
  int headline_tokens = 0;
  app.add_option("--headline", headline_tokens,
                 "Only the issue-4 headline: the KV of this many tokens of a Llama-3.1-8B "
                 "shape saved through CUDA IPC and loaded back re-anchored (GPU machines)");
  bool cold_regions = false;
  app.add_flag("--cold-regions", cold_regions,
               "Shared-memory cases: time each region's first pass (the daemon's first-touch "
               "page faults included) instead of the steady state");
  bool goals_only = false;
  int64_t ring_spin_max_us = -1;
  app.add_option("--ring-spin-max-us", ring_spin_max_us,
                 "The clients' ClientOptions::ring_spin_max in microseconds (default: the "
                 "library's); 20 (= ring_spin) polls a fixed 20 us, as clients before issue #26");
  app.add_flag("--goals-only", goals_only,
               "Only the goal cases of issue #12 (ops4k, lat4k, gather), not the matrix");
  CLI11_PARSE(app, argc, argv);
  const std::string command_line = CommandLine(argc, argv);
  const std::string started_at = UtcNow();
  if (!chart_path.empty()) {
    if (absl::Status s = CheckChartFlags(chart_path, chart_script); !s.ok()) {
      std::fprintf(stderr, "evoke-bench: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }

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
  // --chart without --json: the JSON goes to the temp dir.
  if (!chart_path.empty() && json_path.empty()) json_path = dir + "/results.json";
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
  if (ring_spin_max_us >= 0) client_options.ring_spin_max = absl::Microseconds(ring_spin_max_us);
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
  // The shared-memory path with the ring off (the RPC per request), beside
  // the ring: every size (quick: 1 MiB), one thread.
  for (uint64_t s : quick ? std::vector<uint64_t>{1 << 20} : sizes) {
    for (Op op : {Op::kSave, Op::kLoad, Op::kSaveLoad}) {
      cases.push_back({op, Path::kShmRpc, s, 1, 1});
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
  paths.push_back(Path::kShmRpc);
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
  Bench bench(socket, case_bytes, client_options, /*warm_regions=*/!cold_regions);
  std::vector<Result> results;
  int failures = 0;
  if (goals_only) cases.clear();
  std::printf("evoke-bench: %zu cases, %s per case, evoked %s, redis %s, cuda %s\n",
              cases.size(), FormatByteSize(case_bytes).c_str(), evoked.c_str(),
              have_redis ? redis.c_str() : "(not found: no Redis baseline)",
              have_cuda ? "yes" : "no device");
  std::printf("%-9s %-7s %5s %3s %5s | %8s %9s %9s | %8s %8s | %8s %8s\n", "op", "path",
              "size", "thr", "batch", "GB/s", "p50 us", "p99 us", "memcpy", "x memcpy",
              "redis", "x redis");
  for (const Case& c : cases) {
    if (!Selected(absl::StrCat(OpName(c.op), " ", PathName(c.path), " ", Size(c.block_bytes),
                               " ", c.threads, " ", c.batch),
                  only)) {
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
    if (c.path == Path::kInline) {
      absl::StatusOr<Sample> st = RunUnixStream(c, per_thread);
      if (st.ok()) {
        r.stream_base = *st;
        r.have_stream_base = true;
      }
    }
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
    std::printf("%-9s %-7s %5s %3d %5d | %8.2f %9.0f %9.0f | %8.2f %8.2f | %s%s%s%s\n",
                OpName(c.op), PathName(c.path), Size(c.block_bytes).c_str(), c.threads,
                c.batch, r.evoke.Gbps(), r.evoke.Percentile(0.5), r.evoke.Percentile(0.99),
                r.memcpy_base.Gbps(), ratio_memcpy, redis_cell.c_str(),
                r.have_cuda_base ? " (cudaMemcpy)" : "", r.evoke.ring ? " ring" : "",
                r.have_stream_base
                    ? absl::StrFormat(" | stream %.2f GB/s, x%.3f", r.stream_base.Gbps(),
                                      r.evoke.Gbps() / std::max(1e-9, r.stream_base.Gbps()))
                          .c_str()
                    : "");
    std::fflush(stdout);
    results.push_back(std::move(r));
  }

  // The goal cases of issue #12.
  std::printf("\n%-22s | %18s | %-26s %12s | %8s | %8s %8s | %s\n", "goal case", "evoke",
              "baseline (same run)", "", "ratio", "p50 us", "p99 us", "path");
  GoalCases goals(socket, client_options, redis_socket, have_redis, quick, only);
  goals.RunAll();
  failures += goals.failures();

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
    out << "{\n  \"quick\": " << (quick ? "true" : "false")
        << ",\n  \"command\": " << JsonQuote(command_line)
        << ",\n  \"date\": " << JsonQuote(started_at) << ",\n  \"cases\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      out << absl::StrFormat(
          "    {\"op\": \"%s\", \"path\": \"%s\", \"block_bytes\": %llu, \"threads\": %d, "
          "\"batch\": %d, \"gbps\": %.4f, \"p50_us\": %.1f, \"p99_us\": %.1f, "
          "\"memcpy_gbps\": %.4f, \"ratio_memcpy\": %.4f, \"redis_gbps\": %s, "
          "\"ratio_redis\": %s, \"cuda_memcpy_gbps\": %s, \"ratio_cuda_memcpy\": %s, "
          "\"stream_gbps\": %s, \"ratio_stream\": %s, \"ring\": %s}%s\n",
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
          r.have_stream_base ? absl::StrFormat("%.4f", r.stream_base.Gbps()) : "null",
          r.have_stream_base
              ? absl::StrFormat("%.4f", r.evoke.Gbps() / std::max(1e-9, r.stream_base.Gbps()))
              : "null",
          r.evoke.ring ? "true" : "false", i + 1 < results.size() ? "," : "");
    }
    out << "  ],\n  \"warm_regions\": " << (cold_regions ? "false" : "true")
        << ",\n  \"goal_cases\": [\n";
    const std::vector<GoalResult>& g = goals.results();
    for (size_t i = 0; i < g.size(); ++i) {
      out << absl::StrFormat(
          "    {\"name\": \"%s\", \"unit\": \"%s\", \"value\": %.4f, \"baseline\": \"%s\", "
          "\"baseline_value\": %.4f, \"ratio\": %.4f, \"p50_us\": %.2f, \"p99_us\": %.2f, "
          "\"ring\": %s}%s\n",
          g[i].name, g[i].unit, g[i].value, g[i].baseline, g[i].baseline_value, g[i].ratio(),
          g[i].p50_us, g[i].p99_us, g[i].ring ? "true" : "false", i + 1 < g.size() ? "," : "");
    }
    out << "  ]" << registration_json << "\n}\n";
    out.close();
    if (!out) {
      std::fprintf(stderr, "evoke-bench: cannot write %s\n", json_path.c_str());
      ++failures;
    } else if (!chart_path.empty()) {
      std::fflush(stdout);  // The table before the script's line.
      const absl::Status drawn = DrawChart(chart_script, json_path, chart_path);
      if (!drawn.ok()) {
        std::fprintf(stderr, "evoke-bench: --chart: %s\n", drawn.ToString().c_str());
        ++failures;
      }
    }
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
