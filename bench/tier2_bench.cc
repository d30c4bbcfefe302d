// evoke-tier2-bench: tier 2 (SpillStore, through the Tier interface) against
// the disk it sits on, for issue #13's goals. One case per subcommand; each
// prints `RESULT case=... key=value ...` lines that scripts/bench-issue13.sh
// pairs with `dd` baselines run on the same filesystem in the same minute
// (the script prints the table; this program runs no baseline itself).
//
//   spill:   SpillStore::Put of --total-bytes in --block-bytes blocks, in
//            batches of --batch-bytes, either each batch with sync=true or
//            all with sync=false and one Persist at the end. Reports MB/s
//            of the Puts (and of Puts + Persist), and /proc/self/io deltas
//            per payload byte after the Puts, after Persist, after the
//            background work settled and after the store was closed.
//   load:    reopens the store written by `spill` (optionally after
//            dropping the page cache: root only) and reads every block in
//            write order, once cold and once warm, verifying each payload's
//            xxh3 checksum as the engine does with its own copy.
//   engine-load: the engine's cold Load (TierManager over the SpillStore):
//            saves --total-bytes of blocks, evicts them to tier 2, then
//            loads them back --batch blocks per Load into a host buffer,
//            with one disk read at a time and with --reads-in-flight,
//            alternating for --rounds.
//   sigterm: the real evoked with a tier 1 big enough for --blocks small
//            blocks; saves them (not durable: they stay dirty in tier 1),
//            sends SIGTERM and times until the process exits (Shutdown
//            flushes tier 1 to tier 2), restarts it and loads a sample back
//            from disk.
//
// The store is opened with SpillStoreOptions{path} only, so this program
// builds against any SpillStore with that interface (before and after the
// payloads moved out of RocksDB).
#include <CLI/CLI.hpp>
#include <signal.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/size_flag.h"
#include "common/byte_size.h"
#include "common/checksum.h"
#include "evoke/client.h"
#include "storage/spill_record.pb.h"
#include "storage/pinned_arena.h"
#include "storage/tier2/spill_store.h"
#include "storage/tier_manager.h"
#include "common/status_macros.h"
#include "testing/blocks.h"
#include "testing/daemon_process.h"

namespace evoke {
namespace {

// IoCounters: /proc/self/io, the whole process (RocksDB's background
// threads included, finished ones too).
struct IoCounters {
  uint64_t rchar = 0;
  uint64_t wchar = 0;
  uint64_t read_bytes = 0;
  uint64_t write_bytes = 0;
  uint64_t cancelled_write_bytes = 0;
};

IoCounters ReadIo() {
  IoCounters io;
  std::ifstream in("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "rchar:") io.rchar = value;
    if (key == "wchar:") io.wchar = value;
    if (key == "read_bytes:") io.read_bytes = value;
    if (key == "write_bytes:") io.write_bytes = value;
    if (key == "cancelled_write_bytes:") io.cancelled_write_bytes = value;
  }
  return io;
}

// Per payload byte between two samples.
std::string IoDelta(absl::string_view tag, const IoCounters& a, const IoCounters& b,
                    uint64_t payload) {
  const double p = static_cast<double>(payload);
  return absl::StrFormat(
      " %s_write_bytes=%d %s_wb_per_byte=%.3f %s_wchar_per_byte=%.3f "
      "%s_cancelled=%d %s_read_bytes=%d",
      tag, b.write_bytes - a.write_bytes, tag, (b.write_bytes - a.write_bytes) / p, tag,
      (b.wchar - a.wchar) / p, tag, b.cancelled_write_bytes - a.cancelled_write_bytes, tag,
      b.read_bytes - a.read_bytes);
}

double Mbps(uint64_t bytes, absl::Duration d) {
  return static_cast<double>(bytes) / 1e6 / absl::ToDoubleSeconds(d);
}

// The filesystem type of `path`, so that the output says it was not tmpfs.
std::string FsType(const std::string& path) {
  struct statfs s;
  if (statfs(path.c_str(), &s) != 0) return "unknown";
  switch (static_cast<unsigned long>(s.f_type)) {
    case 0xEF53: return "ext4";
    case 0x01021994: return "tmpfs";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x794c7630: return "overlay";
    default: return absl::StrFormat("0x%x", static_cast<unsigned long>(s.f_type));
  }
}

absl::Status DropPageCache() {
  sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  f << "3\n";
  f.flush();
  if (!f) return absl::PermissionDeniedError("cannot write /proc/sys/vm/drop_caches (root?)");
  return absl::OkStatus();
}

uint64_t DirBytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (e.is_regular_file(ec)) total += e.file_size(ec);
  }
  return total;
}

// The blocks of the spill and load cases: a realistic record (Llama-8B
// shaped canonical layout, session metadata, payload_bytes and checksum
// set), payloads sliced from a pool of random bytes (a block's bytes are not
// compressible; repeats across pool laps do not matter to a store that
// neither compresses nor deduplicates).
class BlockSet {
 public:
  BlockSet(uint64_t block_bytes, uint64_t count, uint64_t pool_bytes)
      : block_bytes_(block_bytes) {
    const uint64_t slots = std::clamp<uint64_t>(pool_bytes / block_bytes, 1, count);
    pool_.resize(slots * block_bytes);
    testing::FillPayload(block_bytes, pool_.data(), pool_.size());
    std::vector<uint64_t> sums(slots);
    for (uint64_t s = 0; s < slots; ++s) {
      sums[s] = PayloadChecksum(pool_.data() + s * block_bytes, block_bytes);
    }
    const v1::LayoutFingerprint fp =
        testing::CanonicalFingerprint("bench", "llama-3.1-8b-shape", 32, 8, 128);
    const std::string session = absl::StrCat("tier2-bench-", block_bytes);
    records_.resize(count);
    ids_.resize(count);
    const int64_t now_ms = absl::ToUnixMillis(absl::Now());
    for (uint64_t i = 0; i < count; ++i) {
      v1::BlockMeta meta = testing::SessionMeta(fp, session, i, 16, 0, 32,
                                                static_cast<int32_t>(i * 16));
      meta.set_payload_bytes(block_bytes);
      meta.set_checksum(sums[i % slots]);
      ids_[i] = testing::IdOf(meta);
      *records_[i].mutable_meta() = std::move(meta);
      records_[i].set_last_access_unix_ms(now_ms);
    }
  }

  uint64_t count() const { return records_.size(); }
  const BlockId& id(uint64_t i) const { return ids_[i]; }
  const storage::SpillRecord& record(uint64_t i) const { return records_[i]; }
  absl::string_view payload(uint64_t i) const {
    const uint64_t slots = pool_.size() / block_bytes_;
    return absl::string_view(pool_.data() + (i % slots) * block_bytes_, block_bytes_);
  }

 private:
  uint64_t block_bytes_;
  std::string pool_;
  std::vector<storage::SpillRecord> records_;
  std::vector<BlockId> ids_;
};

struct Sizes {
  uint64_t block_bytes = 4ull << 20;
  uint64_t total_bytes = 1ull << 30;
  uint64_t batch_bytes = 16ull << 20;
  uint64_t pool_bytes = 256ull << 20;
  uint64_t count() const { return std::max<uint64_t>(1, total_bytes / block_bytes); }
};

absl::StatusOr<std::unique_ptr<SpillStore>> OpenStore(const std::string& dir) {
  SpillStoreOptions options;
  options.path = dir;
  return SpillStore::Open(options);
}

// Waits until write_bytes stops moving for `quiet` (RocksDB's background
// flushes and compactions), at most `limit`. Returns how long it waited.
absl::Duration Settle(absl::Duration quiet, absl::Duration limit) {
  const absl::Time start = absl::Now();
  uint64_t last = ReadIo().write_bytes;
  absl::Time since = absl::Now();
  while (absl::Now() - start < limit) {
    absl::SleepFor(absl::Milliseconds(100));
    const uint64_t now = ReadIo().write_bytes;
    if (now != last) {
      last = now;
      since = absl::Now();
    } else if (absl::Now() - since >= quiet) {
      break;
    }
  }
  return absl::Now() - start;
}

int RunSpill(const std::string& dir, const Sizes& sz, bool sync, bool keep) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);
  const BlockSet blocks(sz.block_bytes, sz.count(), sz.pool_bytes);
  const uint64_t per_batch = std::max<uint64_t>(1, sz.batch_bytes / sz.block_bytes);
  const uint64_t payload = blocks.count() * sz.block_bytes;

  const absl::Time t_open = absl::Now();
  absl::StatusOr<std::unique_ptr<SpillStore>> store = OpenStore(dir);
  if (!store.ok()) {
    absl::FPrintF(stderr, "open %s: %s\n", dir.c_str(), store.status().ToString().c_str());
    return 1;
  }
  const absl::Duration open_time = absl::Now() - t_open;

  const IoCounters io0 = ReadIo();
  const absl::Time t0 = absl::Now();
  std::vector<TierWrite> writes;
  for (uint64_t begin = 0; begin < blocks.count(); begin += per_batch) {
    writes.clear();
    const uint64_t end = std::min(blocks.count(), begin + per_batch);
    for (uint64_t i = begin; i < end; ++i) {
      writes.push_back(TierWrite{blocks.id(i), &blocks.record(i), blocks.payload(i)});
    }
    const absl::Status s = (*store)->Put(writes, sync);
    if (!s.ok()) {
      absl::FPrintF(stderr, "put: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  const absl::Duration put_time = absl::Now() - t0;
  const IoCounters io_put = ReadIo();
  const absl::Status persisted = (*store)->Persist();
  if (!persisted.ok()) {
    absl::FPrintF(stderr, "persist: %s\n", persisted.ToString().c_str());
    return 1;
  }
  const absl::Duration persist_time = absl::Now() - t0 - put_time;
  const IoCounters io_persist = ReadIo();
  const absl::Duration settle_time = Settle(absl::Seconds(1), absl::Seconds(30));
  const IoCounters io_settle = ReadIo();
  const absl::Time t_close = absl::Now();
  store->reset();
  const absl::Duration close_time = absl::Now() - t_close;
  const IoCounters io_close = ReadIo();

  absl::PrintF(
      "RESULT case=spill mode=%s fs=%s block_bytes=%d blocks=%d batch_blocks=%d "
      "payload_bytes=%d open_s=%.3f put_s=%.3f persist_s=%.3f settle_s=%.3f close_s=%.3f "
      "put_MBps=%.1f put_persist_MBps=%.1f dir_bytes=%d%s%s%s%s\n",
      sync ? "sync" : "nosync_persist", FsType(dir), sz.block_bytes, blocks.count(), per_batch,
      payload, absl::ToDoubleSeconds(open_time), absl::ToDoubleSeconds(put_time),
      absl::ToDoubleSeconds(persist_time), absl::ToDoubleSeconds(settle_time),
      absl::ToDoubleSeconds(close_time), Mbps(payload, put_time),
      Mbps(payload, put_time + persist_time), DirBytes(dir),
      IoDelta("put", io0, io_put, payload), IoDelta("persist", io0, io_persist, payload),
      IoDelta("settled", io0, io_settle, payload), IoDelta("closed", io0, io_close, payload));
  std::fflush(stdout);
  if (!keep) std::filesystem::remove_all(dir, ec);
  return 0;
}

// One pass over every block: read, check length and checksum.
absl::Status ReadAll(SpillStore& store, const BlockSet& blocks, uint64_t block_bytes,
                     bool verify, uint64_t* bytes) {
  *bytes = 0;
  for (uint64_t i = 0; i < blocks.count(); ++i) {
    const uint64_t want = blocks.record(i).meta().checksum();
    absl::Status s = store.Read(
        blocks.id(i),
        [&](const storage::SpillRecord& record, absl::string_view payload) -> absl::Status {
          if (payload.size() != block_bytes || record.meta().payload_bytes() != block_bytes) {
            return absl::DataLossError(absl::StrCat("block ", i, ": ", payload.size(), " bytes"));
          }
          if (verify && PayloadChecksum(payload.data(), payload.size()) != want) {
            return absl::DataLossError(absl::StrCat("block ", i, ": checksum mismatch"));
          }
          *bytes += payload.size();
          return absl::OkStatus();
        });
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

int RunLoad(const std::string& dir, const Sizes& sz, bool drop_caches, bool verify,
            int warm_passes) {
  // Only the ids and checksums are needed; a 1-block pool is enough when not
  // verifying, but the checksums come from the same pool as the spill's.
  const BlockSet blocks(sz.block_bytes, sz.count(), sz.pool_bytes);
  if (drop_caches) {
    const absl::Status s = DropPageCache();
    if (!s.ok()) {
      absl::FPrintF(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  const IoCounters io0 = ReadIo();
  const absl::Time t_open = absl::Now();
  absl::StatusOr<std::unique_ptr<SpillStore>> store = OpenStore(dir);
  if (!store.ok()) {
    absl::FPrintF(stderr, "open %s: %s\n", dir.c_str(), store.status().ToString().c_str());
    return 1;
  }
  const absl::Duration open_time = absl::Now() - t_open;
  // RocksDB's open may replay a WAL the flush left behind: device reads.
  const uint64_t open_read_bytes = ReadIo().read_bytes - io0.read_bytes;
  for (int pass = 0; pass <= warm_passes; ++pass) {
    const IoCounters a = ReadIo();
    const absl::Time t0 = absl::Now();
    uint64_t bytes = 0;
    const absl::Status s = ReadAll(**store, blocks, sz.block_bytes, verify, &bytes);
    const absl::Duration d = absl::Now() - t0;
    const IoCounters b = ReadIo();
    if (!s.ok()) {
      absl::FPrintF(stderr, "read: %s\n", s.ToString().c_str());
      return 1;
    }
    const bool cold = pass == 0 && drop_caches;
    absl::PrintF(
        "RESULT case=load mode=%s fs=%s block_bytes=%d blocks=%d verify=%d open_s=%.3f "
        "read_s=%.3f read_MBps=%.1f device_read_bytes=%d rchar=%d open_device_read_bytes=%d\n",
        cold ? "cold" : "warm", FsType(dir), sz.block_bytes, blocks.count(), verify ? 1 : 0,
        absl::ToDoubleSeconds(open_time), absl::ToDoubleSeconds(d), Mbps(bytes, d),
        b.read_bytes - a.read_bytes, b.rchar - a.rchar, open_read_bytes);
    std::fflush(stdout);
  }
  return 0;
}

// ---------------------------------------------------------------- engine-load

// A LoadSink into one reused buffer (block i of a batch at i * block_bytes).
class BufferSink final : public LoadSink {
 public:
  explicit BufferSink(uint8_t* base, uint64_t block_bytes) : base_(base), block_(block_bytes) {}
  absl::Status Prepare(absl::Span<const v1::BlockMeta> metas) override {
    for (const v1::BlockMeta& m : metas) {
      if (m.payload_bytes() != block_) return absl::InternalError("unexpected block size");
    }
    return absl::OkStatus();
  }
  uint8_t* HostDestination(size_t i) override { return base_ + i * block_; }

 private:
  uint8_t* base_;
  uint64_t block_;
};

absl::StatusOr<std::unique_ptr<TierManager>> OpenEngine(const std::string& dir,
                                                        uint64_t tier1_bytes, int in_flight) {
  PinnedArenaOptions arena_options;
  arena_options.capacity_bytes = tier1_bytes;
  arena_options.lock_memory = false;
  arena_options.prefault = false;
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<PinnedArena> arena, PinnedArena::Create(arena_options));
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<SpillStore> store, OpenStore(dir));
  TierManagerOptions options;
  options.disk_reads_in_flight = in_flight;
  return TierManager::Open(options, std::move(arena), std::move(store));
}

// The engine's cold Load: blocks saved through a TierManager and evicted to
// tier 2, then loaded back in batches of `batch` blocks per Load into a
// host buffer (the path of a Load into a client's shared memory), with one
// read at a time and with `in_flight` reads at once, alternating.
int RunEngineLoad(const std::string& dir, const Sizes& sz, uint64_t batch, int in_flight,
                  int rounds) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  const uint64_t n = sz.count();
  const v1::LayoutFingerprint fp = testing::OpaqueFingerprint("bench", "engine-load");
  std::vector<BlockId> ids;
  {
    // Tier 1 holds a few batches; Saves past it spill, Flush evicts the rest.
    absl::StatusOr<std::unique_ptr<TierManager>> tm =
        OpenEngine(dir, std::max<uint64_t>(64ull << 20, 4 * sz.block_bytes), 1);
    if (!tm.ok()) {
      absl::FPrintF(stderr, "open: %s\n", tm.status().ToString().c_str());
      return 1;
    }
    std::string payload(sz.block_bytes, '\0');
    for (uint64_t i = 0; i < n; ++i) {
      testing::FillPayload(i, payload.data(), payload.size());
      v1::BlockMeta meta = testing::SessionMeta(fp, "engine-load", i, 16, 0, 1, 0);
      meta.set_payload_bytes(sz.block_bytes);
      meta.set_checksum(PayloadChecksum(payload.data(), payload.size()));
      ids.push_back(testing::IdOf(meta));
      const SaveItem item{&meta, payload.size(), false};
      HostSaveSource source({payload});
      const auto saved = (*tm)->Save({&item, 1}, source, false, absl::InfiniteFuture(), 1);
      if (!saved.ok()) {
        absl::FPrintF(stderr, "save %d: %s\n", i, saved.status().ToString().c_str());
        return 1;
      }
    }
    if (const auto f = (*tm)->Flush(/*evict=*/true); !f.ok()) {
      absl::FPrintF(stderr, "flush: %s\n", f.status().ToString().c_str());
      return 1;
    }
  }
  std::vector<uint8_t> buffer(batch * sz.block_bytes);
  BufferSink sink(buffer.data(), sz.block_bytes);
  for (int round = 0; round < rounds; ++round) {
    for (const int reads : {1, in_flight}) {
      // A tier 1 too small to promote into: every pass reads from disk.
      absl::StatusOr<std::unique_ptr<TierManager>> tm =
          OpenEngine(dir, std::max<uint64_t>(4096, sz.block_bytes), reads);
      if (!tm.ok()) {
        absl::FPrintF(stderr, "reopen: %s\n", tm.status().ToString().c_str());
        return 1;
      }
      std::vector<v1::BlockMeta> metas;
      std::vector<LoadedInfo> infos;
      uint64_t from_disk = 0;
      const absl::Time t0 = absl::Now();
      for (uint64_t b = 0; b < n; b += batch) {
        const size_t k = static_cast<size_t>(std::min(batch, n - b));
        const absl::Status s = (*tm)->Load(absl::MakeConstSpan(ids).subspan(b, k), fp, sink,
                                           &metas, &infos);
        if (!s.ok()) {
          absl::FPrintF(stderr, "load at %d: %s\n", b, s.ToString().c_str());
          return 1;
        }
        for (const LoadedInfo& info : infos) {
          from_disk += info.served_from == BlockLocation::kDisk ? 1 : 0;
        }
      }
      const absl::Duration d = absl::Now() - t0;
      absl::PrintF(
          "RESULT case=engine_load round=%d block_bytes=%d blocks=%d batch=%d "
          "reads_in_flight=%d from_disk=%d read_s=%.3f read_MBps=%.1f\n",
          round, sz.block_bytes, n, batch, reads, from_disk, absl::ToDoubleSeconds(d),
          Mbps(n * sz.block_bytes, d));
      std::fflush(stdout);
    }
  }
  return 0;
}

// ---------------------------------------------------------------- sigterm

v1::BlockMeta SmallMeta(const v1::LayoutFingerprint& fp, uint64_t i) {
  return testing::SessionMeta(fp, "sigterm", i, 1, 0, 1, 0);
}

int RunSigterm(const std::string& dir, uint64_t n, uint64_t payload_bytes,
               uint64_t save_batch, uint64_t sample, const std::string& evoked) {
  if (!evoked.empty()) setenv("EVOKE_EVOKED", evoked.c_str(), 1);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);
  // Tier 1 allocates 4 KiB granules: every small block takes one. Keep the
  // whole set under the high watermark (0.95) so that nothing spills before
  // SIGTERM: all n blocks are dirty in tier 1 when it comes.
  const uint64_t granule = 4096;
  const uint64_t per_block = std::max(granule, (payload_bytes + granule - 1) / granule * granule);
  const uint64_t pinned = (n * per_block) / 10 * 12 + (64ull << 20);
  const std::vector<std::string> flags = {
      "--pinned-bytes", absl::StrCat(pinned),     "--lock-memory", "false",
      "--spill-bytes",  "64GiB",                  "--metadata-bytes", "8GiB",
      "--log-level",    "info"};
  std::string cmdline = "evoked --socket DIR/evoked.sock --data-dir DIR/data --pinned-bytes 32MiB "
                        "--worker-threads 4";
  for (const std::string& f : flags) absl::StrAppend(&cmdline, " ", f);
  absl::PrintF("evoked: %s (DIR=%s)\n", cmdline.c_str(), dir.c_str());

  // The daemon's own I/O and CPU, from its rusage once it is reaped (it
  // writes nothing to disk before SIGTERM but its RocksDB open: all of
  // ru_oublock is, to a few KiB, the flush).
  struct rusage before_start;
  getrusage(RUSAGE_CHILDREN, &before_start);
  absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> d =
      testing::DaemonProcess::Start(dir, flags, absl::Seconds(60));
  if (!d.ok()) {
    absl::FPrintF(stderr, "start: %s\n", d.status().ToString().c_str());
    return 1;
  }
  const v1::LayoutFingerprint fp = testing::OpaqueFingerprint("bench", "bench");
  {
    std::unique_ptr<Client> client = (*d)->Connect();
    const absl::Time t0 = absl::Now();
    std::vector<std::string> payloads;
    std::vector<BlockToSave> batch;
    for (uint64_t begin = 0; begin < n; begin += save_batch) {
      const uint64_t end = std::min(n, begin + save_batch);
      payloads.clear();
      batch.clear();
      payloads.reserve(end - begin);
      batch.reserve(end - begin);
      for (uint64_t i = begin; i < end; ++i) {
        payloads.push_back(testing::Payload(i, payload_bytes));
        batch.emplace_back(SmallMeta(fp, i), payloads.back());
      }
      absl::StatusOr<std::vector<v1::SaveResult>> saved = client->Save(batch);
      if (!saved.ok()) {
        absl::FPrintF(stderr, "save at %d: %s\n", begin, saved.status().ToString().c_str());
        return 1;
      }
    }
    const absl::Duration save_time = absl::Now() - t0;
    absl::PrintF("RESULT case=sigterm_setup blocks=%d payload_bytes=%d save_s=%.2f saves_per_s=%.0f "
                "pinned_bytes=%d\n",
                n, payload_bytes, absl::ToDoubleSeconds(save_time),
                n / absl::ToDoubleSeconds(save_time), pinned);
    absl::StatusOr<v1::StatResponse> stat = client->Stat();
    if (stat.ok()) {
      absl::PrintF("stat before SIGTERM: %s\n", stat->ShortDebugString().substr(0, 600).c_str());
    }
  }
  std::fflush(stdout);
  const absl::Time t_term = absl::Now();
  (*d)->Signal(SIGTERM);
  absl::StatusOr<int> code = (*d)->Wait(absl::Seconds(600));
  const absl::Duration exit_time = absl::Now() - t_term;
  struct rusage after_exit;
  getrusage(RUSAGE_CHILDREN, &after_exit);
  const uint64_t daemon_written = (after_exit.ru_oublock - before_start.ru_oublock) * 512ull;
  const auto cpu_s = [](const struct rusage& r) {
    return r.ru_utime.tv_sec + r.ru_stime.tv_sec +
           (r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
  };
  const double daemon_cpu_s = cpu_s(after_exit) - cpu_s(before_start);
  if (!code.ok() || *code != 0) {
    absl::FPrintF(stderr, "evoked exit: %s\n%s\n",
                 code.ok() ? absl::StrCat(*code).c_str() : code.status().ToString().c_str(),
                 (*d)->Log().c_str());
    return 1;
  }
  // The daemon's own figure: "shut down: flushed N tier-1 blocks to disk in X".
  std::string flushed_line;
  {
    std::istringstream log((*d)->Log());
    for (std::string line; std::getline(log, line);) {
      if (line.find("shut down: flushed") != std::string::npos) flushed_line = line;
    }
  }
  d->reset();
  const uint64_t data_bytes = DirBytes(dir + "/data");

  // Restart: every block must be in tier 2 now.
  const absl::Time t_start = absl::Now();
  absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> d2 =
      testing::DaemonProcess::Start(dir, flags, absl::Seconds(300));
  if (!d2.ok()) {
    absl::FPrintF(stderr, "restart: %s\n", d2.status().ToString().c_str());
    return 1;
  }
  const absl::Duration restart_time = absl::Now() - t_start;
  uint64_t checked = 0, from_disk = 0, bad = 0;
  {
    std::unique_ptr<Client> client = (*d2)->Connect();
    std::vector<BlockId> ids;
    std::vector<uint64_t> which;
    const uint64_t step = std::max<uint64_t>(1, n / std::max<uint64_t>(1, sample));
    for (uint64_t i = 0; i < n; i += step) {
      ids.push_back(testing::IdOf(SmallMeta(fp, i)));
      which.push_back(i);
    }
    if (which.back() != n - 1) {  // The last block saved, too.
      ids.push_back(testing::IdOf(SmallMeta(fp, n - 1)));
      which.push_back(n - 1);
    }
    absl::StatusOr<std::vector<LoadedBlock>> loaded = client->Load(ids, fp);
    if (!loaded.ok()) {
      absl::FPrintF(stderr, "load after restart: %s\n", loaded.status().ToString().c_str());
      return 1;
    }
    for (size_t k = 0; k < loaded->size(); ++k) {
      ++checked;
      if ((*loaded)[k].served_from == v1::TIER_SPILL) ++from_disk;
      if ((*loaded)[k].payload != testing::Payload(which[k], payload_bytes)) ++bad;
    }
  }
  absl::StatusOr<int> code2 = (*d2)->Terminate();
  absl::PrintF(
      "RESULT case=sigterm blocks=%d payload_bytes=%d sigterm_to_exit_s=%.3f data_dir_bytes=%d "
      "restart_to_serving_s=%.3f sample=%d sample_from_disk=%d sample_wrong=%d "
      "second_exit=%d daemon_write_bytes=%d daemon_wb_per_payload_byte=%.2f "
      "daemon_cpu_s=%.2f\n",
      n, payload_bytes, absl::ToDoubleSeconds(exit_time), data_bytes,
      absl::ToDoubleSeconds(restart_time), checked, from_disk, bad, code2.ok() ? *code2 : -1, daemon_written,
      static_cast<double>(daemon_written) / static_cast<double>(n * payload_bytes), daemon_cpu_s);
  absl::PrintF("daemon: %s\n", flushed_line.c_str());
  std::fflush(stdout);
  return (bad == 0 && from_disk == checked) ? 0 : 1;
}


}  // namespace
}  // namespace evoke

int main(int argc, char** argv) {
  using evoke::SizeOrDie;
  CLI::App app{"evoke-tier2-bench: tier-2 spill, load and SIGTERM flush (issue #13); "
               "scripts/bench-issue13.sh runs it beside dd"};
  app.require_subcommand(1);
  std::string dir;
  std::string block = "4MiB", total = "1GiB", batch = "16MiB", pool = "256MiB";
  bool keep = false;
  auto add_sizes = [&](CLI::App* c) {
    c->add_option("--dir", dir, "Store directory (created; removed first)")->required();
    c->add_option("--block-bytes", block, "Payload bytes per block")->capture_default_str();
    c->add_option("--total-bytes", total, "Payload bytes in all")->capture_default_str();
    c->add_option("--pool-bytes", pool, "Distinct random payload bytes (blocks cycle over them)")
        ->capture_default_str();
  };
  CLI::App* spill = app.add_subcommand("spill", "Put blocks into a fresh store");
  add_sizes(spill);
  spill->add_option("--batch-bytes", batch, "Payload bytes per Put")->capture_default_str();
  bool sync = false;
  spill->add_flag("--sync", sync, "Put with sync=true (else sync=false and Persist at the end)");
  spill->add_flag("--keep", keep, "Keep the store (for `load`)");

  CLI::App* load = app.add_subcommand("load", "Read every block of a store `spill --keep` wrote");
  add_sizes(load);
  bool drop = false, no_verify = false;
  int warm = 1;
  load->add_flag("--drop-caches", drop, "sync; echo 3 > /proc/sys/vm/drop_caches before open");
  load->add_flag("--no-verify", no_verify, "Do not hash the payloads read");
  load->add_option("--warm-passes", warm, "Passes after the first")->capture_default_str();

  CLI::App* engine = app.add_subcommand(
      "engine-load", "Save blocks through a TierManager, evict them, load them back in batches");
  add_sizes(engine);
  uint64_t load_batch = 16;
  int in_flight = 4, rounds = 3;
  engine->add_option("--batch", load_batch, "Blocks per Load")->capture_default_str();
  engine->add_option("--reads-in-flight", in_flight, "disk_reads_in_flight of the second setting")
      ->capture_default_str();
  engine->add_option("--rounds", rounds, "Alternating rounds")->capture_default_str();

  CLI::App* term = app.add_subcommand("sigterm", "evoked: save small blocks, SIGTERM, time exit");
  std::string evoked;
  uint64_t blocks = 1000000, payload = 256, save_batch = 8192, sample = 2000;
  term->add_option("--dir", dir, "Test directory (removed first)")->required();
  term->add_option("--blocks", blocks, "Blocks saved before SIGTERM")->capture_default_str();
  term->add_option("--payload-bytes", payload, "Payload of each block")->capture_default_str();
  term->add_option("--save-batch", save_batch, "Blocks per Save call")->capture_default_str();
  term->add_option("--sample", sample, "Blocks loaded back after restart")->capture_default_str();
  term->add_option("--evoked", evoked, "evoked binary (default: the build tree's)");

  CLI11_PARSE(app, argc, argv);
  evoke::Sizes sz;
  sz.block_bytes = SizeOrDie(block, "--block-bytes");
  sz.total_bytes = SizeOrDie(total, "--total-bytes");
  sz.batch_bytes = SizeOrDie(batch, "--batch-bytes");
  sz.pool_bytes = SizeOrDie(pool, "--pool-bytes");
  if (spill->parsed()) return evoke::RunSpill(dir, sz, sync, keep);
  if (load->parsed()) return evoke::RunLoad(dir, sz, drop, !no_verify, warm);
  if (engine->parsed()) {
    return evoke::RunEngineLoad(dir, sz, std::max<uint64_t>(1, load_batch), in_flight, rounds);
  }
  return evoke::RunSigterm(dir, blocks, payload, std::max<uint64_t>(1, save_batch), sample,
                           evoked);
}
