// evoke-remote-bench: tier 3 (Ceph RADOS) against the cluster it sits on, for
// issue #14's measurements. One case per subcommand; each prints `RESULT
// case=... key=value ...` lines that scripts/bench-issue14.sh pairs with
// `rados bench` baselines run on the same cluster in the same round (the
// script starts the cluster and prints the tables; this program runs no
// baseline itself). Every case starts its own evoked daemons ("hosts": own
// directory, socket and tiers) with testing::DaemonProcess.
//
//   throughput: host A saves --total-bytes of prefix blocks of exactly
//            --block-bytes (Llama-3.1-8B canonical layout: 128 KiB per token,
//            so 1 MiB = 8 tokens, 4 MiB = 32 tokens) and times from the first
//            Save until Stat shows its write-behind drained (objects_written
//            reached the block count, nothing queued or in flight): MB/s.
//            With --osd-pids (the cluster's OSD pids), the OSDs are stopped
//            (SIGSTOP) while host A saves and continued (SIGCONT) once every
//            Save is acknowledged, so the whole set is queued when the
//            write-behind gets going: queued_MBps is then the write-behind's
//            own rate, from the first objects written to the drain (local
//            Saves, slower than RADOS on a loaded machine, are out of it).
//            Then host B (fresh, empty tiers) Loads them --load-blocks per
//            Load, as an engine would, each served from TIER_REMOTE: MB/s;
//            then the same Loads again, served from B's tier 1 (reload_MBps:
//            the local half of the path alone).
//   reuse:   a 2,048-token Llama-3.1-8B prefix (256 MiB) on host B, either
//            fetched from RADOS (--source remote: host A wrote it; B has
//            nothing) or from B's own tier 2 (--source tier2: B saved it,
//            was restarted, so tier 1 is empty and every block is on disk;
//            --drop-caches: cold page cache). Times the fleet-wide Lookup,
//            the first Load (the first --load-blocks blocks) and the whole
//            prefix, from the start of the Lookup.
//   saves:   local Save latency (one 1 MiB prefix block per Save, --blocks
//            of them) on evoked with (--remote) or without a remote tier;
//            with it, every Save also feeds the write-behind, which is kept
//            busy for the whole run. p50/p99/p99.9/max.
#include <CLI/CLI.hpp>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/size_flag.h"
#include "common/byte_size.h"
#include "common/status_macros.h"
#include "evoke/client.h"
#include "storage/remote/rados_store.h"
#include "storage/remote/remote_tier.h"
#include "testing/blocks.h"
#include "testing/daemon_process.h"

namespace evoke {
namespace {

// Llama-3.1-8B's KV: 32 layers, 8 KV heads, head dim 128, f16 K and V.
constexpr uint64_t kTokenBytes = 32ull * 8 * 128 * 2 * 2;  // 128 KiB

double Mbps(uint64_t bytes, absl::Duration d) {
  return static_cast<double>(bytes) / 1e6 / absl::ToDoubleSeconds(d);
}
double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

struct Cluster {
  std::vector<int> osd_pids;  // Stopped while host A saves (throughput).
  std::string conf;
  std::string pool = "evoke";
  int inflight = 16;
  uint64_t queue_bytes = 0;  // 0: evoked's default.
  std::string write_budget;  // --remote-write-bytes-per-s ("": none).
};

std::vector<std::string> RemoteFlags(const Cluster& c) {
  std::vector<std::string> f = {"--remote-conf", c.conf, "--remote-pool", c.pool,
                                "--remote-inflight", absl::StrCat(c.inflight)};
  if (c.queue_bytes > 0) {
    f.push_back("--remote-queue-bytes");
    f.push_back(absl::StrCat(c.queue_bytes));
  }
  if (!c.write_budget.empty()) {
    f.push_back("--remote-write-bytes-per-s");
    f.push_back(c.write_budget);
  }
  if (!c.osd_pids.empty()) {  // Operations wait out the stopped OSDs.
    f.push_back("--remote-op-timeout-ms");
    f.push_back("60000");
  }
  return f;
}

// A host: evoked in `dir` with a tier 1 of `pinned` bytes, a 16 GiB tier 2
// and, when `remote` is set, the remote tier.
absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> StartHost(const std::string& dir,
                                                                  uint64_t pinned,
                                                                  const Cluster* remote) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::vector<std::string> flags = {"--pinned-bytes", absl::StrCat(pinned), "--lock-memory",
                                    "false", "--spill-bytes", "16GiB", "--log-level",
                                    "warning"};
  if (remote != nullptr) {
    const std::vector<std::string> r = RemoteFlags(*remote);
    flags.insert(flags.end(), r.begin(), r.end());
  }
  absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> d =
      testing::DaemonProcess::Start(dir, flags, absl::Seconds(120));
  if (!d.ok() || remote == nullptr) return d;
  std::unique_ptr<Client> client = (*d)->Connect();
  absl::StatusOr<v1::StatResponse> s = client->Stat();
  if (!s.ok()) return s.status();
  if (!s->remote().connected()) {
    return absl::UnavailableError(
        absl::StrCat("remote tier not connected: ", s->remote().ShortDebugString()));
  }
  return d;
}

// A prefix chain of `n` blocks of `block_tokens` Llama-3.1-8B tokens in
// namespace `ns`, with payloads (exactly block_tokens * 128 KiB each).
struct Chain {
  v1::LayoutFingerprint fp;
  std::vector<v1::BlockMeta> metas;
  std::vector<BlockId> ids;
  std::vector<std::string> payloads;  // Empty when built without payloads.
  uint64_t block_bytes = 0;
  uint64_t bytes() const { return block_bytes * metas.size(); }
};

Chain MakeChain(const std::string& ns, uint64_t n, uint32_t block_tokens, bool payloads) {
  Chain c;
  c.fp = testing::CanonicalFingerprint(ns, "meta-llama/Llama-3.1-8B", 32, 8, 128);
  std::vector<int32_t> tokens(n * block_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 1000 + static_cast<int32_t>(i % 120000);
  c.metas = testing::PrefixChainMetas(c.fp, tokens, block_tokens);
  c.block_bytes = block_tokens * kTokenBytes;
  const uint64_t seed = std::hash<std::string>()(ns);
  for (size_t i = 0; i < c.metas.size(); ++i) {
    c.ids.push_back(testing::IdOf(c.metas[i]));
    if (payloads) c.payloads.push_back(testing::CanonicalPayload(c.metas[i], seed + i));
  }
  return c;
}

absl::Status SaveAll(Client& client, const Chain& c) {
  std::vector<BlockToSave> batch;
  batch.reserve(c.metas.size());
  for (size_t i = 0; i < c.metas.size(); ++i) batch.emplace_back(c.metas[i], c.payloads[i]);
  return client.Save(batch).status();
}

// Waits until the write-behind has nothing queued or in flight and has
// written (or found written) `n` objects; polls Stat every 5 ms. The last
// RemoteStat seen goes to `last`; `max_queue` is the deepest queue seen.
absl::Status WaitDrained(Client& client, uint64_t n, absl::Duration timeout,
                         v1::RemoteStat* last, uint64_t* max_queue = nullptr) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    absl::StatusOr<v1::StatResponse> s = client.Stat();
    if (!s.ok()) return s.status();
    *last = s->remote();
    if (max_queue != nullptr) *max_queue = std::max<uint64_t>(*max_queue, last->queue_blocks());
    if (last->queue_blocks() == 0 && last->inflight() == 0 &&
        last->objects_written() + last->dedups() >= n) {
      return absl::OkStatus();
    }
    if (last->dropped_blocks() > 0) {
      return absl::InternalError(
          absl::StrCat("write-behind dropped blocks: ", last->ShortDebugString()));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("write-behind did not drain: ", last->ShortDebugString()));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

int Fail(absl::string_view what, const absl::Status& s) {
  absl::FPrintF(stderr, "%s: %s\n", what, s.ToString());
  return 1;
}

// Loads `c` --load-blocks at a time; *first is the time of the first Load,
// *all of all of them. Checks every payload and the tier it came from after
// the clock stopped.
struct LoadRun {
  absl::Duration first, all;
  uint64_t wrong = 0, other_tier = 0;
};

// With `region` (at least c.bytes(), pages already touched) the blocks land
// there through shared memory (LoadInto, the engines' path: the daemon
// copies each payload once); without it they come inline in gRPC messages.
absl::StatusOr<LoadRun> LoadChain(Client& client, const Chain& c, size_t per_load,
                                  v1::Tier want_tier, absl::Time t0,
                                  SharedRegion* region = nullptr) {
  LoadRun run;
  std::vector<LoadedBlock> got;
  got.reserve(c.ids.size());
  for (size_t begin = 0; begin < c.ids.size(); begin += per_load) {
    const size_t end = std::min(c.ids.size(), begin + per_load);
    const absl::Span<const BlockId> ids = absl::MakeConstSpan(c.ids).subspan(begin, end - begin);
    absl::StatusOr<std::vector<LoadedBlock>> loaded;
    if (region != nullptr) {
      std::vector<v1::RegionSlice> dests;
      for (size_t i = begin; i < end; ++i) {
        dests.push_back(region->Slice(i * c.block_bytes, c.block_bytes));
      }
      loaded = client.LoadInto(ids, c.fp, dests);
    } else {
      loaded = client.Load(ids, c.fp);
    }
    if (!loaded.ok()) return loaded.status();
    if (begin == 0) run.first = absl::Now() - t0;
    for (LoadedBlock& b : *loaded) got.push_back(std::move(b));
  }
  run.all = absl::Now() - t0;
  if (got.size() != c.ids.size()) {
    return absl::InternalError(absl::StrCat(got.size(), " blocks loaded of ", c.ids.size()));
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].served_from != want_tier) ++run.other_tier;
    if (c.payloads.empty()) continue;
    const absl::string_view bytes =
        region != nullptr
            ? absl::string_view(reinterpret_cast<const char*>(region->data()) + i * c.block_bytes,
                                c.block_bytes)
            : absl::string_view(got[i].payload);
    if (bytes != c.payloads[i]) ++run.wrong;
  }
  return run;
}

// ShmRegion opens a lease and a region for LoadChain, its pages touched.
absl::StatusOr<std::unique_ptr<SharedRegion>> ShmRegion(Client& client, uint64_t bytes) {
  EVOKE_RETURN_IF_ERROR(client.OpenLease("evoke-remote-bench"));
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = client.CreateSharedRegion(bytes);
  if (region.ok()) std::memset((*region)->data(), 0, bytes);
  return region;
}

// RawFetch reads the chain straight through RemoteTier::Fetch (librados,
// `inflight` reads in flight, --load-blocks per call), without evoked: the
// tier-3 half of a fetch alone.
absl::StatusOr<absl::Duration> RawFetch(const Cluster& cluster, const std::string& ns,
                                        const Chain& c, size_t per_call) {
  RadosOptions ro;
  ro.conf_path = cluster.conf;
  ro.pool = cluster.pool;
  ro.inflight = cluster.inflight;
  RemoteTier tier(NewRadosObjectStore(ro), RemoteTierOptions());
  EVOKE_RETURN_IF_ERROR(tier.Start());
  std::vector<storage::SpillRecord> records;
  std::vector<std::string> payloads;
  const absl::Time t0 = absl::Now();
  for (size_t begin = 0; begin < c.ids.size(); begin += per_call) {
    const size_t end = std::min(c.ids.size(), begin + per_call);
    for (const absl::Status& s : tier.Fetch(
             ns, absl::MakeConstSpan(c.ids).subspan(begin, end - begin), UINT64_MAX, &records,
             &payloads)) {
      EVOKE_RETURN_IF_ERROR(s);
    }
  }
  return absl::Now() - t0;
}

// ------------------------------------------------------------ throughput

int RunThroughput(const std::string& dir, const Cluster& cluster, const std::string& ns,
                  uint64_t block_bytes, uint64_t total_bytes, size_t per_load, bool fetch,
                  bool shm) {
  const uint32_t block_tokens = static_cast<uint32_t>(block_bytes / kTokenBytes);
  const uint64_t n = std::max<uint64_t>(1, total_bytes / block_bytes);
  const Chain c = MakeChain(ns, n, block_tokens, /*payloads=*/true);
  const uint64_t pinned = c.bytes() + (256ull << 20);
  Cluster a_cluster = cluster;
  // The whole set fits the queue: nothing is dropped, all of it is timed.
  a_cluster.queue_bytes = std::max<uint64_t>(256ull << 20, c.bytes() + (64ull << 20));
  const bool queued = !cluster.osd_pids.empty();
  absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> a =
      StartHost(dir + "/a", pinned, &a_cluster);
  if (!a.ok()) return Fail("start host A", a.status());
  {
    std::unique_ptr<Client> client = (*a)->Connect();
    // Stopped OSDs: the write-behind's first operations wait (a 60 s op
    // deadline, see StartHost) and complete once the OSDs continue.
    for (int pid : cluster.osd_pids) kill(pid, SIGSTOP);
    const absl::Time t0 = absl::Now();
    absl::Status saved = SaveAll(*client, c);
    const absl::Duration save_time = absl::Now() - t0;
    for (int pid : cluster.osd_pids) kill(pid, SIGCONT);
    if (!saved.ok()) return Fail("save", saved);
    const absl::Time t_thaw = absl::Now();
    // The write-behind's own rate: from the first poll that sees objects
    // written (t1, w1) to the drain, over the n - w1 blocks in between.
    absl::Time t1;
    uint64_t w1 = 0;
    if (queued) {
      if (!testing::WaitUntil(
              [&] {
                absl::StatusOr<v1::StatResponse> s = client->Stat();
                if (!s.ok() || s->remote().objects_written() == 0) return false;
                t1 = absl::Now();
                w1 = s->remote().objects_written();
                return true;
              },
              absl::Seconds(120), absl::Milliseconds(2))) {
        return Fail("write-behind", absl::DeadlineExceededError("nothing written 120 s after "
                                                               "the OSDs continued"));
      }
    }
    v1::RemoteStat r;
    uint64_t max_queue = 0;
    if (absl::Status s = WaitDrained(*client, n, absl::Seconds(600), &r, &max_queue); !s.ok()) {
      return Fail("drain", s);
    }
    const absl::Time t_end = absl::Now();
    const absl::Duration drain_time = t_end - t0;
    std::string q = " queued=0";
    if (queued) {
      q = absl::StrFormat(
          " queued=1 thaw_to_first_s=%.3f first_written=%d queued_s=%.3f queued_MBps=%.1f",
          absl::ToDoubleSeconds(t1 - t_thaw), w1, absl::ToDoubleSeconds(t_end - t1),
          w1 < n ? Mbps((n - w1) * c.block_bytes, t_end - t1) : 0.0);
    }
    absl::PrintF(
        "RESULT case=write block_bytes=%d blocks=%d bytes=%d inflight=%d save_s=%.3f "
        "drain_s=%.3f MBps=%.1f objects_written=%d dedups=%d dropped=%d max_queue_blocks=%d "
        "errors=%d%s\n",
        block_bytes, n, c.bytes(), cluster.inflight, absl::ToDoubleSeconds(save_time),
        absl::ToDoubleSeconds(drain_time), Mbps(c.bytes(), drain_time), r.objects_written(),
        r.dedups(), r.dropped_blocks(), max_queue, r.errors(), q);
    std::fflush(stdout);
  }
  (*a)->KillHard();  // Its blocks are in RADOS; no need to flush tier 1.
  a->reset();
  if (!fetch) return 0;

  absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> b =
      StartHost(dir + "/b", pinned, &cluster);
  if (!b.ok()) return Fail("start host B", b.status());
  std::unique_ptr<Client> client = (*b)->Connect();
  std::unique_ptr<SharedRegion> region;
  if (shm) {
    absl::StatusOr<std::unique_ptr<SharedRegion>> r = ShmRegion(*client, c.bytes());
    if (!r.ok()) return Fail("shared region on host B", r.status());
    region = std::move(r).value();
  }
  const absl::Time t0 = absl::Now();
  absl::StatusOr<LoadRun> run =
      LoadChain(*client, c, per_load, v1::TIER_REMOTE, t0, region.get());
  if (!run.ok()) return Fail("load on host B", run.status());
  absl::StatusOr<v1::StatResponse> st = client->Stat();
  // The same Loads again, now served from B's tier 1 (the fetch promoted
  // every block): what the local half of the path (evoked -> client over
  // gRPC) costs alone. fetch - reload ~ RADOS reads + promotion.
  absl::StatusOr<LoadRun> again =
      LoadChain(*client, c, per_load, v1::TIER_PINNED_HOST, absl::Now(), region.get());
  if (!again.ok()) return Fail("reload on host B", again.status());
  absl::StatusOr<absl::Duration> raw = RawFetch(cluster, ns, c, per_load);
  if (!raw.ok()) return Fail("raw fetch", raw.status());
  absl::PrintF(
      "RESULT case=fetch path=%s block_bytes=%d blocks=%d bytes=%d inflight=%d load_blocks=%d "
      "load_s=%.3f MBps=%.1f first_load_ms=%.1f fetches=%d wrong=%d not_remote=%d "
      "reload_s=%.3f reload_MBps=%.1f reload_not_tier1=%d raw_fetch_s=%.3f raw_fetch_MBps=%.1f\n",
      shm ? "shm" : "inline", block_bytes, n, c.bytes(), cluster.inflight, per_load,
      absl::ToDoubleSeconds(run->all),
      Mbps(c.bytes(), run->all), Ms(run->first), st.ok() ? st->remote().fetches() : 0,
      run->wrong, run->other_tier, absl::ToDoubleSeconds(again->all),
      Mbps(c.bytes(), again->all), again->other_tier, absl::ToDoubleSeconds(*raw),
      Mbps(c.bytes(), *raw));
  std::fflush(stdout);
  return (run->wrong == 0 && run->other_tier == 0 && again->wrong == 0) ? 0 : 1;
}

// ------------------------------------------------------------ reuse

absl::Status DropPageCache() {
  sync();
  FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w");
  if (f == nullptr) return absl::PermissionDeniedError("cannot open drop_caches (root?)");
  std::fputs("3\n", f);
  if (std::fclose(f) != 0) return absl::PermissionDeniedError("cannot write drop_caches");
  return absl::OkStatus();
}

// The timed part: fleet-wide Lookup of the whole chain, then its Loads.
int TimeReuse(Client& client, const Chain& c, size_t per_load, const std::string& source,
              const std::string& ns, uint32_t block_tokens, v1::Tier tier, bool shm) {
  std::unique_ptr<SharedRegion> region;
  if (shm) {
    absl::StatusOr<std::unique_ptr<SharedRegion>> r = ShmRegion(client, c.bytes());
    if (!r.ok()) return Fail("shared region", r.status());
    region = std::move(r).value();
  }
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::vector<v1::Tier>> found = client.Lookup(c.ids, ns);
  const absl::Duration lookup_time = absl::Now() - t0;
  if (!found.ok()) return Fail("lookup", found.status());
  absl::StatusOr<LoadRun> run = LoadChain(client, c, per_load, tier, t0, region.get());
  if (!run.ok()) return Fail("load", run.status());
  uint64_t found_in_tier = 0;
  for (v1::Tier t : *found) found_in_tier += t == tier ? 1 : 0;
  absl::PrintF(
      "RESULT case=reuse path=%s source=%s tokens=%d block_tokens=%d blocks=%d bytes=%d load_blocks=%d "
      "lookup_ms=%.2f first_ms=%.1f all_ms=%.1f MBps=%.1f lookup_found=%d found_in_tier=%d "
      "wrong=%d other_tier=%d\n",
      shm ? "shm" : "inline", source, c.ids.size() * block_tokens, block_tokens, c.ids.size(), c.bytes(), per_load,
      Ms(lookup_time), Ms(run->first), Ms(run->all), Mbps(c.bytes(), run->all), found->size(),
      found_in_tier, run->wrong, run->other_tier);
  std::fflush(stdout);
  return (run->wrong == 0 && run->other_tier == 0 && found->size() == c.ids.size()) ? 0 : 1;
}

int RunReuse(const std::string& dir, const Cluster& cluster, const std::string& ns,
             const std::string& source, uint64_t tokens, uint32_t block_tokens, size_t per_load,
             bool drop_caches, bool shm) {
  const Chain c = MakeChain(ns, tokens / block_tokens, block_tokens, /*payloads=*/true);
  const uint64_t pinned = c.bytes() + (256ull << 20);
  if (source == "remote") {
    {
      Cluster a_cluster = cluster;
      a_cluster.queue_bytes = std::max<uint64_t>(256ull << 20, c.bytes() + (64ull << 20));
      absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> a =
          StartHost(dir + "/a", pinned, &a_cluster);
      if (!a.ok()) return Fail("start host A", a.status());
      std::unique_ptr<Client> client = (*a)->Connect();
      if (absl::Status s = SaveAll(*client, c); !s.ok()) return Fail("save on A", s);
      v1::RemoteStat r;
      if (absl::Status s = WaitDrained(*client, c.ids.size(), absl::Seconds(600), &r); !s.ok()) {
        return Fail("drain on A", s);
      }
      (*a)->KillHard();
    }
    absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> b =
        StartHost(dir + "/b", pinned, &cluster);
    if (!b.ok()) return Fail("start host B", b.status());
    if (drop_caches) DropPageCache().IgnoreError();  // Same conditions as tier2 cold.
    std::unique_ptr<Client> client = (*b)->Connect();
    return TimeReuse(*client, c, per_load, "remote", ns, block_tokens, v1::TIER_REMOTE, shm);
  }
  // tier2: B saves the prefix, is stopped (SIGTERM flushes tier 1 to tier
  // 2) and restarted: tier 1 is empty, the prefix is on B's disk only.
  const std::string bdir = dir + "/b";
  {
    absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> b = StartHost(bdir, pinned, nullptr);
    if (!b.ok()) return Fail("start host B", b.status());
    std::unique_ptr<Client> client = (*b)->Connect();
    if (absl::Status s = SaveAll(*client, c); !s.ok()) return Fail("save on B", s);
    client.reset();
    absl::StatusOr<int> code = (*b)->Terminate();
    if (!code.ok() || *code != 0) {
      return Fail("stop host B", code.ok() ? absl::InternalError(absl::StrCat("exit ", *code))
                                           : code.status());
    }
  }
  absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> b = StartHost(bdir, pinned, nullptr);
  if (!b.ok()) return Fail("restart host B", b.status());
  if (drop_caches) {
    if (absl::Status s = DropPageCache(); !s.ok()) return Fail("drop caches", s);
  }
  std::unique_ptr<Client> client = (*b)->Connect();
  return TimeReuse(*client, c, per_load, drop_caches ? "tier2_cold" : "tier2_warm", ns,
                   block_tokens, v1::TIER_SPILL, shm);
}

// ------------------------------------------------------------ saves

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

int RunSaves(const std::string& dir, const Cluster* cluster, const std::string& ns,
             uint64_t block_bytes, uint64_t n, uint64_t warmup) {
  const uint32_t block_tokens = static_cast<uint32_t>(block_bytes / kTokenBytes);
  const Chain c = MakeChain(ns, n + warmup, block_tokens, /*payloads=*/false);
  absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> d =
      StartHost(dir + "/host", c.bytes() + (512ull << 20), cluster);
  if (!d.ok()) return Fail("start host", d.status());
  std::unique_ptr<Client> client = (*d)->Connect();
  const uint64_t seed = std::hash<std::string>()(ns);
  std::vector<double> ms;
  ms.reserve(n);
  std::string payload;
  absl::Duration busy;
  v1::RemoteStat at_start;
  for (uint64_t i = 0; i < n + warmup; ++i) {
    payload = testing::Payload(seed + i, c.block_bytes);
    if (i == warmup) {
      absl::StatusOr<v1::StatResponse> s = client->Stat();
      if (s.ok()) at_start = s->remote();
    }
    const BlockToSave one[] = {BlockToSave(c.metas[i], payload)};
    const absl::Time t0 = absl::Now();
    absl::StatusOr<std::vector<v1::SaveResult>> saved = client->Save(one);
    const absl::Duration d = absl::Now() - t0;
    if (!saved.ok()) return Fail(absl::StrCat("save ", i), saved.status());
    if (i >= warmup) {
      ms.push_back(Ms(d));
      busy += d;
    }
  }
  absl::StatusOr<v1::StatResponse> s = client->Stat();
  const v1::RemoteStat r = s.ok() ? s->remote() : v1::RemoteStat();
  double sum = 0;
  for (double x : ms) sum += x;
  // Objects the write-behind wrote while the timed Saves ran: it was busy
  // when this is near its drain throughput times the run's length.
  const uint64_t written = r.objects_written() - at_start.objects_written();
  absl::PrintF(
      "RESULT case=saves remote=%d block_bytes=%d saves=%d p50_ms=%.3f p90_ms=%.3f "
      "p99_ms=%.3f p999_ms=%.3f max_ms=%.3f mean_ms=%.3f saves_per_s=%.0f "
      "remote_written=%d remote_written_MBps=%.1f queue_blocks_at_end=%d dropped=%d\n",
      cluster != nullptr ? 1 : 0, c.block_bytes, n, Percentile(ms, 0.5), Percentile(ms, 0.9),
      Percentile(ms, 0.99), Percentile(ms, 0.999), Percentile(ms, 1.0), sum / ms.size(),
      n / absl::ToDoubleSeconds(busy), written,
      Mbps(written * c.block_bytes, busy), r.queue_blocks(), r.dropped_blocks());
  std::fflush(stdout);
  (*d)->KillHard();
  return 0;
}


}  // namespace
}  // namespace evoke

int main(int argc, char** argv) {
  using evoke::SizeOrDie;
  CLI::App app{"evoke-remote-bench: tier 3 on Ceph RADOS: write-behind and fetch throughput, "
               "cross-host prefix reuse, Save latency under write-behind (issue #14); "
               "scripts/bench-issue14.sh runs it beside rados bench"};
  app.require_subcommand(1);
  std::string dir, ns, evoked;
  evoke::Cluster cluster;
  auto common = [&](CLI::App* c, bool conf_required) {
    c->add_option("--dir", dir, "Scratch directory for the hosts (removed first)")->required();
    c->add_option("--ns", ns, "evoke namespace (= RADOS namespace); unique per run")
        ->required();
    auto* conf = c->add_option("--conf", cluster.conf, "ceph.conf of the cluster");
    if (conf_required) conf->required();
    c->add_option("--pool", cluster.pool, "RADOS pool")->capture_default_str();
    c->add_option("--inflight", cluster.inflight, "evoked --remote-inflight")
        ->capture_default_str();
    c->add_option("--evoked", evoked, "evoked binary (default: the build tree's)");
    c->add_option("--write-budget", cluster.write_budget,
                  "evoked --remote-write-bytes-per-s (default: none)");
  };
  std::string block = "1MiB", total = "256MiB";
  size_t per_load = 16;
  bool no_fetch = false;
  bool shm = false;
  CLI::App* tp = app.add_subcommand("throughput", "Write-behind on host A, fetch on host B");
  common(tp, true);
  tp->add_option("--block-bytes", block, "Payload per block (a multiple of 128 KiB)")
      ->capture_default_str();
  tp->add_option("--total-bytes", total, "Payload bytes in all")->capture_default_str();
  tp->add_option("--load-blocks", per_load, "Blocks per Load on host B")->capture_default_str();
  tp->add_flag("--no-fetch", no_fetch, "Write-behind only");
  tp->add_flag("--shm", shm, "Host B loads into shared memory (LoadInto), not inline");
  tp->add_option("--osd-pids", cluster.osd_pids,
                 "Stop these OSDs (SIGSTOP) while host A saves, continue them after: the "
                 "write-behind then starts with every block queued (queued_MBps)");

  CLI::App* reuse = app.add_subcommand("reuse", "A Llama-3.1-8B prefix on host B: RADOS or tier 2");
  common(reuse, false);
  std::string source = "remote";
  uint64_t tokens = 2048;
  uint32_t block_tokens = 16;
  bool drop = false;
  reuse->add_option("--source", source, "remote or tier2")
      ->check(CLI::IsMember({"remote", "tier2"}))
      ->capture_default_str();
  reuse->add_option("--tokens", tokens, "Prefix tokens")->capture_default_str();
  reuse->add_option("--block-tokens", block_tokens, "Tokens per block")->capture_default_str();
  reuse->add_option("--load-blocks", per_load, "Blocks per Load")->capture_default_str();
  reuse->add_flag("--drop-caches", drop, "Drop the page cache before the timed part (root)");
  reuse->add_flag("--shm", shm, "Load into shared memory (LoadInto), not inline");

  CLI::App* saves = app.add_subcommand("saves", "Save latency with and without write-behind");
  common(saves, false);
  bool remote = false;
  uint64_t n = 2000, warmup = 100;
  saves->add_option("--block-bytes", block, "Payload per block")->capture_default_str();
  saves->add_option("--saves", n, "Timed Saves (one block each)")->capture_default_str();
  saves->add_option("--warmup", warmup, "Untimed Saves first")->capture_default_str();
  saves->add_flag("--remote", remote, "With the remote tier (--conf)");

  CLI11_PARSE(app, argc, argv);
  if (!evoked.empty()) setenv("EVOKE_EVOKED", evoked.c_str(), 1);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);
  const uint64_t block_bytes = SizeOrDie(block, "--block-bytes");
  if (block_bytes % evoke::kTokenBytes != 0) {
    std::fprintf(stderr, "--block-bytes: not a multiple of 128 KiB (one token)\n");
    return 2;
  }
  int rc = 0;
  if (tp->parsed()) {
    rc = evoke::RunThroughput(dir, cluster, ns, block_bytes, SizeOrDie(total, "--total-bytes"),
                              std::max<size_t>(1, per_load), !no_fetch, shm);
  } else if (reuse->parsed()) {
    if (source == "remote" && cluster.conf.empty()) {
      std::fprintf(stderr, "--source remote needs --conf\n");
      return 2;
    }
    rc = evoke::RunReuse(dir, cluster, ns, source, tokens, std::max<uint32_t>(1, block_tokens),
                         std::max<size_t>(1, per_load), drop, shm);
  } else {
    if (remote && cluster.conf.empty()) {
      std::fprintf(stderr, "--remote needs --conf\n");
      return 2;
    }
    rc = evoke::RunSaves(dir, remote ? &cluster : nullptr, ns, block_bytes,
                         std::max<uint64_t>(1, n), warmup);
  }
  std::filesystem::remove_all(dir, ec);
  return rc;
}
