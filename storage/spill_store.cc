#include "storage/spill_store.h"

#include <sys/statvfs.h>

#include <random>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/byte_size.h"
#include "common/failpoint.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "rocksdb/cache.h"
#include "rocksdb/convenience.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "rocksdb/listener.h"
#include "rocksdb/options.h"
#include "rocksdb/sst_file_reader.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"
#include "storage/fault_env.h"
#include "storage/segment_log.h"
#include "storage/spill_record.pb.h"

namespace evoke {
namespace {

constexpr char kMetaFamily[] = "meta";
constexpr char kPayloadFamily[] = "payload";
constexpr char kFormatKey[] = "evoke.format";
// Format 2: payloads in segment files (storage/segment_log.h), records in
// the meta column family point at them. Format 1 kept payloads in the
// "payload" column family (blob files); a format-1 dir is migrated at open.
constexpr char kFormatVersion[] = "2";
constexpr char kFormat1[] = "1";
// Present (value "1") while format-1 payloads remain in the payload column
// family: set when a format-1 dir is opened, removed when the last one has
// moved into a segment.
constexpr char kMigrateKey[] = "evoke.format1_payloads";
// 16 random bytes written once; every segment file names it.
constexpr char kInstanceKey[] = "evoke.instance";
// Compaction and migration move payloads in batches of about this many bytes.
constexpr uint64_t kMoveBatchBytes = 16ull << 20;

// StoreKey writes an id's key (BlockId::ToBytes) without allocating.
void StoreKey(const BlockId& id, char* out) {
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<char>(id.hi() >> (56 - 8 * i));
    out[8 + i] = static_cast<char>(id.lo() >> (56 - 8 * i));
  }
}

char* PutVarint(char* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<char>(v);
  return p;
}

PayloadLocation FromProto(const storage::PayloadLocation& p) {
  return PayloadLocation{p.segment(), p.offset(), p.length(), p.seq()};
}
void ToProto(const PayloadLocation& l, storage::PayloadLocation* p) {
  p->set_segment(l.segment);
  p->set_offset(l.offset);
  p->set_length(l.length);
  p->set_seq(l.seq);
}

// ToAbsl translates a RocksDB status, once, at the storage edge.
absl::Status ToAbsl(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = absl::StrCat("spill store ", what, ": ", s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsNoSpace() || s.subcode() == rocksdb::Status::kSpaceLimit) {
    return absl::ResourceExhaustedError(msg);
  }
  if (s.IsIOError() || s.IsBusy() || s.IsTryAgain() || s.IsIncomplete() ||
      s.IsShutdownInProgress() || s.IsTimedOut()) {
    return absl::UnavailableError(msg);
  }
  return absl::InternalError(msg);
}

#define EVOKE_ROCKS_CHECK(expr, what)            \
  do {                                           \
    const rocksdb::Status rocks_status_ = (expr); \
    if (!rocks_status_.ok()) return ToAbsl(rocks_status_, what); \
  } while (0)

// Free and total bytes of the filesystem holding `path` (0 when unknown).
struct FsSpace {
  uint64_t free = 0, total = 0;
};
FsSpace SpaceOf(const std::string& path) {
  struct statvfs st {};
  if (statvfs(path.c_str(), &st) != 0) return {};
  return {static_cast<uint64_t>(st.f_bavail) * st.f_frsize,
          static_cast<uint64_t>(st.f_blocks) * st.f_frsize};
}

// Bytes of WAL files in `path`: what a read-write open must rewrite (as
// L0 and blob files) before it deletes them.
uint64_t WalBytes(const std::string& path) {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(path, ec)) {
    if (f.path().extension() == ".log") total += f.file_size(ec);
  }
  return total;
}

// Headroom a read-write open needs on top of the WAL: a new MANIFEST,
// OPTIONS file and WAL.
constexpr uint64_t kOpenHeadroom = 4ull << 20;
// Writes that add no payload (deletes, breadcrumbs) are refused below this.
constexpr uint64_t kMetadataReserve = 1ull << 20;

bool IsLockError(const rocksdb::Status& s) {
  return s.IsIOError() && s.ToString().find("lock") != std::string::npos;
}
bool IsNoSpace(const rocksdb::Status& s) {
  return s.IsNoSpace() || s.subcode() == rocksdb::Status::kSpaceLimit ||
         s.ToString().find("No space left") != std::string::npos;
}
// Errors that a recovery step may get past: damaged or missing files.
bool IsDamage(const rocksdb::Status& s) {
  if (s.IsCorruption() || s.IsPathNotFound() || s.IsInvalidArgument()) return true;
  const std::string m = s.ToString();
  return m.find("No such file") != std::string::npos ||
         m.find("checksum mismatch") != std::string::npos ||
         m.find("CURRENT") != std::string::npos;
}

// What RocksDB's background threads tell the store. Shared with the
// listener, which RocksDB may keep after the store is gone.
struct ListenerState {
  std::atomic<bool> write_error{false};
  std::atomic<uint64_t> corrupt_compactions{0};
  absl::Mutex mu;
  std::string last_error ABSL_GUARDED_BY(mu);
};

class Listener final : public rocksdb::EventListener {
 public:
  explicit Listener(std::shared_ptr<ListenerState> state) : state_(std::move(state)) {}
  const char* Name() const override { return "EvokeSpillListener"; }

  // Runs on RocksDB's threads (flush, compaction, writes): no blocking.
  void OnBackgroundError(rocksdb::BackgroundErrorReason reason,
                         rocksdb::Status* error) override {
    if (error == nullptr || error->ok()) return;
    {
      absl::MutexLock lock(&state_->mu);
      state_->last_error = error->ToString();
    }
    if (reason == rocksdb::BackgroundErrorReason::kCompaction && error->IsCorruption()) {
      // With paranoid_checks a corrupt input file makes the whole database
      // read-only for good (kUnrecoverableError), and it happens again
      // after every restart: deletes, breadcrumbs and new spills would all
      // fail with DATA_LOSS. The records in that file are unreadable
      // anyway (reads verify and fail); keep writing.
      state_->corrupt_compactions.fetch_add(1);
      *error = rocksdb::Status::OK();
      return;
    }
    state_->write_error.store(true);
  }

 private:
  const std::shared_ptr<ListenerState> state_;
};

// How Open opens: each step of the recovery ladder relaxes one check.
enum class OpenMode { kNormal, kSkipCorruptWal, kBestEfforts, kReadOnly };

const char* ModeName(OpenMode m) {
  switch (m) {
    case OpenMode::kNormal: return "normal open";
    case OpenMode::kSkipCorruptWal: return "open skipping corrupt WAL records";
    case OpenMode::kBestEfforts: return "best-efforts recovery";
    case OpenMode::kReadOnly: return "read-only open";
  }
  return "open";
}

struct OpenedDb {
  std::unique_ptr<rocksdb::DB> db;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;  // default, meta, payload
  void Close() {
    if (db == nullptr) return;
    for (rocksdb::ColumnFamilyHandle* h : handles) db->DestroyColumnFamilyHandle(h);
    handles.clear();
    db->Close().PermitUncheckedError();
    db.reset();
  }
};

// The RocksDB configuration of a store: options for each open.
class DbConfig {
 public:
  DbConfig(const SpillStoreOptions& opts, std::shared_ptr<ListenerState> listener)
      : opts_(opts), listener_(std::move(listener)) {
    if (opts.faults != nullptr) {
      env_ = rocksdb::NewCompositeEnv(
          NewFaultFileSystem(rocksdb::FileSystem::Default(), opts.faults));
    }
    cache_ = rocksdb::NewLRUCache(opts.block_cache_bytes);
  }

  rocksdb::DBOptions DbOptions(OpenMode mode) const {
    rocksdb::DBOptions o;
    if (env_ != nullptr) o.env = env_.get();
    o.create_if_missing = true;
    o.create_missing_column_families = true;
    o.max_background_jobs = 2;
    o.bytes_per_sync = 1 << 20;
    o.max_total_wal_size = 512ull << 20;
    o.info_log_level = rocksdb::WARN_LEVEL;
    o.keep_log_file_num = 4;
    // paranoid_checks stays on: it is what stops writes after a failed WAL
    // write (without it the next write appends to a WAL writer that saw an
    // error, which RocksDB asserts against).
    o.paranoid_checks = true;
    // Our own thread resumes writes (SpillStore's comment), faster than
    // RocksDB's own retries.
    o.max_bgerror_resume_count = 0;
    o.listeners.push_back(std::make_shared<Listener>(listener_));
    if (mode == OpenMode::kSkipCorruptWal) {
      o.wal_recovery_mode = rocksdb::WALRecoveryMode::kSkipAnyCorruptedRecords;
    }
    if (mode == OpenMode::kBestEfforts) o.best_efforts_recovery = true;
    return o;
  }

  std::vector<rocksdb::ColumnFamilyDescriptor> Families() const {
    rocksdb::BlockBasedTableOptions table;
    table.block_cache = cache_;
    table.cache_index_and_filter_blocks = true;

    rocksdb::ColumnFamilyOptions meta_options;
    meta_options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
    meta_options.OptimizeForPointLookup(opts_.block_cache_bytes >> 20);

    rocksdb::ColumnFamilyOptions payload_options;
    payload_options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
    payload_options.enable_blob_files = true;
    payload_options.min_blob_size = opts_.min_blob_bytes;
    payload_options.blob_file_size = opts_.blob_file_bytes;
    payload_options.enable_blob_garbage_collection = true;
    payload_options.blob_garbage_collection_age_cutoff = 0.25;
    // KV tensors do not compress; do not spend CPU trying.
    payload_options.compression = rocksdb::kNoCompression;
    payload_options.blob_compression_type = rocksdb::kNoCompression;
    payload_options.write_buffer_size = 64ull << 20;

    return {
        {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()},
        {kMetaFamily, meta_options},
        {kPayloadFamily, payload_options},
    };
  }

  rocksdb::Status Open(OpenMode mode, OpenedDb* out) const {
    rocksdb::DB* raw = nullptr;
    rocksdb::Status s =
        mode == OpenMode::kReadOnly
            ? rocksdb::DB::OpenForReadOnly(DbOptions(mode), opts_.path, Families(),
                                           &out->handles, &raw)
            : rocksdb::DB::Open(DbOptions(mode), opts_.path, Families(), &out->handles, &raw);
    if (s.ok()) out->db.reset(raw);
    return s;
  }

  rocksdb::Env* env() const { return env_ != nullptr ? env_.get() : rocksdb::Env::Default(); }
  rocksdb::Options MetaReaderOptions() const {
    return rocksdb::Options(DbOptions(OpenMode::kNormal), Families()[1].options);
  }

 private:
  const SpillStoreOptions opts_;
  const std::shared_ptr<ListenerState> listener_;
  std::unique_ptr<rocksdb::Env> env_;
  std::shared_ptr<rocksdb::Cache> cache_;
};

class RocksSpillStore final : public SpillStore {
 public:
  RocksSpillStore(const SpillStoreOptions& opts, uint64_t reserve)
      : opts_(opts),
        reserve_(reserve),
        listener_(std::make_shared<ListenerState>()),
        config_(opts, listener_) {}

  ~RocksSpillStore() override { Close().IgnoreError(); }

  // Close stops the maintenance thread, seals the active segments (sealed
  // segments open from their footers, without a scan) and closes RocksDB.
  absl::Status Close() override {
    {
      absl::MutexLock lock(&state_mu_);
      stop_thread_ = true;
    }
    if (thread_.joinable()) thread_.join();
    absl::MutexLock w(&write_mu_);
    absl::WriterMutexLock d(&db_mu_);
    absl::Status status;
    if (log_ != nullptr && db_.db != nullptr && !read_only_unlocked()) {
      for (SegmentStream stream : {SegmentStream::kHot, SegmentStream::kCompaction}) {
        const absl::Status s = log_->Seal(stream);
        if (!s.ok()) {
          EVOKE_LOG_WARNING("spill store: sealing a segment at close failed: ", s.ToString());
          status.Update(s);
        }
      }
    }
    db_.Close();
    ReleaseOwnLock();
    return status;
  }

  // OpenFirst opens the database through the recovery ladder and starts
  // the maintenance thread.
  absl::Status OpenFirst() {
    {
      absl::MutexLock w(&write_mu_);
      absl::WriterMutexLock d(&db_mu_);
      EVOKE_RETURN_IF_ERROR(OpenLadder());
      EVOKE_RETURN_IF_ERROR(OpenSegments());
      CheckLocations();
    }
    if (format1_payloads_.load()) MigrateFormat1(/*at_open=*/true);
    thread_ = std::thread([this] { Maintain(); });
    return absl::OkStatus();
  }

  // Put appends the payloads to the active segment (one pwrite stream, one
  // fdatasync), then commits the records, which point at them, in one
  // WriteBatch: a record never names bytes that are not durable.
  absl::Status Put(absl::Span<const SpillWrite> writes, bool sync) override {
    uint64_t adds = 0;
    for (const SpillWrite& w : writes) {
      adds += w.record->ByteSizeLong() +
              (w.payload.empty() ? 0 : SegmentRecordBytes(w.payload.size()));
    }
    absl::MutexLock wl(&write_mu_);
    EVOKE_RETURN_IF_ERROR(CheckWritable(adds, "write"));
    absl::ReaderMutexLock d(&db_mu_);
    EVOKE_RETURN_IF_ERROR(CheckOpen());
    EVOKE_RETURN_IF_ERROR(CheckLog());
    // Earlier copies become garbage: look them up, except for ids the
    // engine knows are new to the tier (a flush of new blocks skips the
    // lookups entirely).
    std::vector<BlockId> ids;
    for (const SpillWrite& w : writes) {
      if (!w.fresh) ids.push_back(w.id);
    }
    const std::vector<std::optional<PayloadLocation>> old = Locations(ids);

    std::vector<SegmentAppend> appends;
    for (const SpillWrite& w : writes) {
      if (!w.payload.empty()) appends.push_back({w.id, w.payload, w.record->meta().checksum()});
    }
    std::vector<PayloadLocation> placed;
    if (!appends.empty()) {
      absl::StatusOr<std::vector<PayloadLocation>> r = log_->Append(appends);
      if (!r.ok()) return AppendFailed(r.status(), "write");
      placed = *std::move(r);
      // Payloads durable, records not yet: a crash here leaves garbage only.
      EVOKE_FAILPOINT("segment.synced");
    }

    // Records are inserted in key order: RocksDB's memtable skip list
    // inserts ascending keys from the last insert's position (several
    // times faster than random order for a large batch). A stable sort
    // keeps the last write of an id that repeats last, so it wins.
    std::vector<uint32_t> order(writes.size());
    std::vector<const PayloadLocation*> where(writes.size(), nullptr);
    for (size_t i = 0, next = 0; i < writes.size(); ++i) {
      order[i] = static_cast<uint32_t>(i);
      if (!writes[i].payload.empty()) where[i] = &placed[next++];
    }
    // Keys are the ids in big-endian bytes: (hi, lo) order is key order.
    const auto before = [](const BlockId& a, const BlockId& b) {
      return a.hi() != b.hi() ? a.hi() < b.hi() : a.lo() < b.lo();
    };
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      return before(writes[a].id, writes[b].id);
    });
    rocksdb::WriteBatch batch;
    std::string value;
    std::vector<PayloadLocation> live;
    for (size_t k = 0; k < order.size(); ++k) {
      const uint32_t i = order[k];
      const SpillWrite& w = writes[i];
      const bool superseded = k + 1 < order.size() && writes[order[k + 1]].id == w.id;
      if (where[i] != nullptr && !superseded) live.push_back(*where[i]);
      EncodeRecord(*w.record, where[i], &value);
      char key[16];
      StoreKey(w.id, key);
      const rocksdb::Slice key_slice(key, sizeof(key));
      EVOKE_ROCKS_CHECK(batch.Put(meta(), key_slice, value), "batch");
      if (format1_payloads_.load()) EVOKE_ROCKS_CHECK(batch.Delete(payload(), key_slice), "batch");
    }
    EVOKE_RETURN_IF_ERROR(CommitLocked(&batch, sync, "write"));
    for (const auto& l : old) {
      if (l.has_value()) log_->RemoveLive(*l);
    }
    for (const PayloadLocation& l : live) log_->AddLive(l);
    return absl::OkStatus();
  }

  absl::Status DropPayloads(absl::Span<const SpillWrite> breadcrumbs) override {
    absl::MutexLock wl(&write_mu_);
    EVOKE_RETURN_IF_ERROR(CheckWritable(0, "drop payloads"));
    absl::ReaderMutexLock d(&db_mu_);
    EVOKE_RETURN_IF_ERROR(CheckOpen());
    EVOKE_RETURN_IF_ERROR(CheckLog());
    std::vector<BlockId> ids;
    for (const SpillWrite& w : breadcrumbs) ids.push_back(w.id);
    const std::vector<std::optional<PayloadLocation>> old = Locations(ids);
    rocksdb::WriteBatch batch;
    std::string value;
    for (const SpillWrite& w : breadcrumbs) {
      const std::string key = w.id.ToBytes();
      storage::SpillRecord record = *w.record;
      record.set_payload_present(false);
      record.clear_location();
      value.clear();
      record.SerializeToString(&value);
      EVOKE_ROCKS_CHECK(batch.Put(meta(), key, value), "batch");
      if (format1_payloads_.load()) EVOKE_ROCKS_CHECK(batch.Delete(payload(), key), "batch");
    }
    EVOKE_RETURN_IF_ERROR(CommitLocked(&batch, false, "drop payloads"));
    for (const auto& l : old) {
      if (l.has_value()) log_->RemoveLive(*l);
    }
    return absl::OkStatus();
  }

  absl::Status Delete(absl::Span<const BlockId> ids) override {
    absl::MutexLock wl(&write_mu_);
    EVOKE_RETURN_IF_ERROR(CheckWritable(0, "delete"));
    absl::ReaderMutexLock d(&db_mu_);
    EVOKE_RETURN_IF_ERROR(CheckOpen());
    EVOKE_RETURN_IF_ERROR(CheckLog());
    const std::vector<std::optional<PayloadLocation>> old = Locations(ids);
    rocksdb::WriteBatch batch;
    for (const BlockId& id : ids) {
      const std::string key = id.ToBytes();
      EVOKE_ROCKS_CHECK(batch.Delete(meta(), key), "batch");
      if (format1_payloads_.load()) EVOKE_ROCKS_CHECK(batch.Delete(payload(), key), "batch");
    }
    EVOKE_RETURN_IF_ERROR(CommitLocked(&batch, false, "delete"));
    for (const auto& l : old) {
      if (l.has_value()) log_->RemoveLive(*l);
    }
    return absl::OkStatus();
  }

  // Read gets the record, then the payload from its segment (or, for a
  // record not migrated yet, from the format-1 payload column family). A
  // segment removed by compaction between the two (the record has moved)
  // reads the record again, once.
  absl::Status Read(const BlockId& id,
                    const std::function<absl::Status(
                        const storage::SpillRecord&, absl::string_view)>& consume)
      override {
    const std::string key = id.ToBytes();
    absl::Status last;
    for (int attempt = 0; attempt < 2; ++attempt) {
      absl::ReaderMutexLock d(&db_mu_);
      EVOKE_RETURN_IF_ERROR(CheckOpen());
      rocksdb::DB* db = db_.db.get();
      rocksdb::ReadOptions options;
      options.verify_checksums = true;
      rocksdb::PinnableSlice meta_value;
      rocksdb::Status s = [&] {
        PhaseTimer timer(Phase::kRocksDb);
        return db->Get(options, meta(), key, &meta_value);
      }();
      if (s.IsNotFound()) return NoPayload(id);
      if (!s.ok()) return ToAbsl(s, "read");
      storage::SpillRecord record;
      if (!record.ParseFromArray(meta_value.data(), static_cast<int>(meta_value.size()))) {
        return absl::DataLossError(
            absl::StrCat("spill store: record of ", id.ToHex(), " is unreadable"));
      }
      if (!record.payload_present()) return NoPayload(id);
      if (!record.has_location()) {
        // Not migrated yet (or migrated while we looked: read again).
        last = ReadFormat1(id, key, record, consume);
      } else if (log_ == nullptr) {
        return NoPayload(id);
      } else {
        last = log_->Read(id, FromProto(record.location()),
                          [&](absl::string_view payload) { return consume(record, payload); });
      }
      if (last.code() != absl::StatusCode::kNotFound) return last;
    }
    return last;
  }

  absl::Status ForEachRecord(
      const std::function<absl::Status(const BlockId&, storage::SpillRecord)>&
          visit,
      std::vector<std::string>* skipped) override {
    absl::ReaderMutexLock d(&db_mu_);
    EVOKE_RETURN_IF_ERROR(CheckOpen());
    rocksdb::ReadOptions options;
    options.fill_cache = false;
    options.verify_checksums = true;
    std::unique_ptr<rocksdb::Iterator> it(db_.db->NewIterator(options, meta()));
    std::string last_good;
    bool any = false;
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      last_good.assign(it->key().data(), it->key().size());
      any = true;
      EVOKE_RETURN_IF_ERROR(Visit(it->key(), it->value(), visit, skipped));
    }
    if (it->status().ok()) return absl::OkStatus();
    if (!it->status().IsCorruption()) return ToAbsl(it->status(), "scan");
    // A corrupt block: read around it.
    EVOKE_LOG_ERROR("spill store: the start-up scan met a corrupt block after ",
                    any ? "the first records" : "no record", ": ", it->status().ToString(),
                    "; reading around it");
    return ScanAroundCorruption(any ? &last_good : nullptr, visit, skipped);
  }

  uint64_t UsedBytes() override {
    absl::ReaderMutexLock d(&db_mu_);
    if (db_.db == nullptr) return 0;
    uint64_t total = 0;
    for (rocksdb::ColumnFamilyHandle* h : db_.handles) {
      uint64_t v = 0;
      if (db_.db->GetIntProperty(h, rocksdb::DB::Properties::kTotalSstFilesSize, &v)) {
        total += v;
      }
      if (db_.db->GetIntProperty(h, rocksdb::DB::Properties::kTotalBlobFileSize, &v)) {
        total += v;
      }
    }
    if (log_ != nullptr) total += log_->FileBytes();
    return total;
  }

  // Sync: the segments are synced by every append; only the WAL is left.
  absl::Status Sync() override {
    absl::MutexLock w(&write_mu_);
    EVOKE_RETURN_IF_ERROR(CheckWritable(0, "sync"));
    absl::ReaderMutexLock d(&db_mu_);
    EVOKE_RETURN_IF_ERROR(CheckOpen());
    const rocksdb::Status s = db_.db->SyncWAL();
    if (!s.ok()) Stop(s, "sync");
    return ToAbsl(s, "sync");
  }

  absl::Status Persist() override {
    absl::MutexLock w(&write_mu_);
    EVOKE_RETURN_IF_ERROR(CheckWritable(0, "sync"));
    absl::ReaderMutexLock d(&db_mu_);
    EVOKE_RETURN_IF_ERROR(CheckOpen());
    // Never sync a WAL that failed an append: CheckWritable refused above
    // if any write failed since the last resume.
    rocksdb::Status s = db_.db->SyncWAL();
    if (s.ok()) {
      rocksdb::FlushOptions options;
      options.wait = true;
      options.allow_write_stall = true;
      s = db_.db->Flush(options, {meta(), payload()});
    }
    if (!s.ok()) Stop(s, "sync");
    return ToAbsl(s, "flush");
  }

  SpillStoreHealth Health() const override {
    SpillStoreHealth h;
    h.compacted_records = compacted_records_.load();
    h.removed_segments = removed_segments_.load();
    std::shared_ptr<SegmentLog> log;
    {
      absl::ReaderMutexLock d(&db_mu_);
      log = log_;
    }
    if (log != nullptr) {
      for (const SegmentInfo& s : log->Segments()) {
        ++h.segments;
        h.segment_file_bytes += s.size;
        h.segment_live_bytes += s.live_bytes;
      }
      const SegmentLogStats st = log->Stats();
      h.segment_syncs = st.syncs;
      h.direct_io = st.direct_io;
    }
    absl::MutexLock lock(&state_mu_);
    h.writable = !stopped_;
    h.reason = stop_reason_;
    h.opened_read_only = read_only_;
    h.write_failures = write_failures_;
    h.refused_writes = refused_writes_;
    h.resumes = resumes_;
    h.last_outage = last_outage_;
    h.corrupt_files = corrupt_files_ + listener_->corrupt_compactions.load();
    h.unreadable_records = unreadable_records_;
    h.recovery = recovery_;
    return h;
  }

 private:
  rocksdb::ColumnFamilyHandle* meta() const ABSL_SHARED_LOCKS_REQUIRED(db_mu_) {
    return db_.handles[1];
  }
  rocksdb::ColumnFamilyHandle* payload() const ABSL_SHARED_LOCKS_REQUIRED(db_mu_) {
    return db_.handles[2];
  }

  // ------------------------------------------------------------ writes

  // EncodeRecord serializes `record` with payload_present and location set
  // from `where` (null: a breadcrumb) without copying it: protobuf parsing
  // lets a later occurrence of a scalar field replace an earlier one, so the
  // two fields are appended after the engine's record (which never carries a
  // location; one that does is copied and cleared first).
  static void EncodeRecord(const storage::SpillRecord& record, const PayloadLocation* where,
                           std::string* out) {
    out->clear();
    if (record.has_location()) {
      storage::SpillRecord copy = record;
      copy.clear_location();
      copy.SerializeToString(out);
    } else {
      record.SerializeToString(out);
    }
    out->push_back(static_cast<char>((2 << 3) | 0));  // payload_present, varint.
    out->push_back(where != nullptr ? 1 : 0);
    if (where == nullptr) return;
    char loc[4 * 11];
    char* p = loc;
    for (const auto& [field, v] : {std::pair<int, uint64_t>{1, where->segment},
                                   {2, where->offset}, {3, where->length}, {4, where->seq}}) {
      *p++ = static_cast<char>(field << 3);
      p = PutVarint(p, v);
    }
    out->push_back(static_cast<char>((4 << 3) | 2));  // location, length-delimited.
    out->push_back(static_cast<char>(p - loc));  // < 128 bytes: one varint byte.
    out->append(loc, static_cast<size_t>(p - loc));
  }

  // CommitLocked applies `batch` (records only: payloads are already in
  // their segments). The caller checked that the store is writable.
  absl::Status CommitLocked(rocksdb::WriteBatch* batch, bool sync, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) ABSL_SHARED_LOCKS_REQUIRED(db_mu_) {
    rocksdb::WriteOptions options;
    options.sync = sync || opts_.sync;
    PhaseTimer timer(Phase::kRocksDb);
    const rocksdb::Status s = db_.db->Write(options, batch);
    if (!s.ok()) Stop(s, what);
    return ToAbsl(s, what);
  }

  // AppendFailed counts a failed segment append. The log has poisoned the
  // segment (the next append starts a new one), so the store keeps
  // accepting writes: a full disk refuses each of them at fallocate.
  absl::Status AppendFailed(const absl::Status& s, absl::string_view what) {
    {
      absl::MutexLock lock(&state_mu_);
      ++write_failures_;
      if (s.code() == absl::StatusCode::kResourceExhausted) ++refused_writes_;
    }
    const int64_t now = absl::ToUnixSeconds(absl::Now());
    int64_t logged = last_append_log_s_.load();
    if (now - logged >= 10 && last_append_log_s_.compare_exchange_strong(logged, now)) {
      EVOKE_LOG_ERROR("spill store ", what, ": segment append failed: ", s.ToString());
    }
    return absl::Status(s.code(), absl::StrCat("spill store ", what, ": ", s.message()));
  }

  absl::Status CheckLog() const ABSL_SHARED_LOCKS_REQUIRED(db_mu_) {
    if (log_ != nullptr) return absl::OkStatus();
    return absl::UnavailableError(
        absl::StrCat("spill store: the segment files of ", opts_.path, " are not open"));
  }

  static absl::Status NoPayload(const BlockId& id) {
    return absl::NotFoundError(absl::StrCat("block ", id.ToHex(), " has no payload on disk"));
  }

  // Locations returns where each id's record points now (nullopt: no
  // record, no payload, or a format-1 payload).
  std::vector<std::optional<PayloadLocation>> Locations(absl::Span<const BlockId> ids)
      ABSL_SHARED_LOCKS_REQUIRED(db_mu_) {
    std::vector<std::optional<PayloadLocation>> out(ids.size());
    if (ids.empty()) return out;
    std::vector<std::string> keys;
    keys.reserve(ids.size());
    for (const BlockId& id : ids) keys.push_back(id.ToBytes());
    std::vector<rocksdb::Slice> slices(keys.begin(), keys.end());
    std::vector<rocksdb::PinnableSlice> values(ids.size());
    std::vector<rocksdb::Status> statuses(ids.size());
    PhaseTimer timer(Phase::kRocksDb);
    db_.db->MultiGet(rocksdb::ReadOptions(), meta(), ids.size(), slices.data(), values.data(),
                     statuses.data());
    storage::SpillRecord record;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!statuses[i].ok()) continue;
      if (!record.ParseFromArray(values[i].data(), static_cast<int>(values[i].size()))) continue;
      if (record.payload_present() && record.has_location()) {
        out[i] = FromProto(record.location());
      }
    }
    return out;
  }

  // ReadFormat1 reads a payload that has not moved into a segment yet.
  absl::Status ReadFormat1(
      const BlockId& id, const std::string& key, const storage::SpillRecord& record,
      const std::function<absl::Status(const storage::SpillRecord&, absl::string_view)>&
          consume) ABSL_SHARED_LOCKS_REQUIRED(db_mu_) {
    if (!format1_payloads_.load()) return NoPayload(id);
    rocksdb::ReadOptions options;
    options.verify_checksums = true;
    rocksdb::PinnableSlice value;
    const rocksdb::Status s = db_.db->Get(options, payload(), key, &value);
    if (s.IsNotFound()) return NoPayload(id);
    if (!s.ok()) return ToAbsl(s, "read");
    return consume(record, absl::string_view(value.data(), value.size()));
  }

  // CheckOpen: UNAVAILABLE while no database is open (a reopen failed).
  absl::Status CheckOpen() const ABSL_SHARED_LOCKS_REQUIRED(db_mu_) {
    if (db_.db != nullptr) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat("spill store: ", opts_.path,
                                               " is not open (a reopen failed; retrying)"));
  }

  // CheckWritable refuses a write while the store is stopped, or when
  // `adds` bytes would leave less than the reserve free.
  absl::Status CheckWritable(uint64_t adds, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) {
    if (listener_->write_error.load() && !stopped()) {
      std::string error;
      {
        absl::MutexLock lock(&listener_->mu);
        error = listener_->last_error;
      }
      Stop(rocksdb::Status::IOError(error), "background flush");
    }
    if (stopped()) {
      absl::MutexLock lock(&state_mu_);
      return no_space_ ? absl::ResourceExhaustedError(stop_reason_)
                       : absl::UnavailableError(stop_reason_);
    }
    const FsSpace space = SpaceOf(opts_.path);
    const uint64_t keep = adds > 0 ? reserve_ : kMetadataReserve;
    if (space.total > 0 && space.free < adds + keep) {
      absl::MutexLock lock(&state_mu_);
      ++refused_writes_;
      return absl::ResourceExhaustedError(absl::StrCat(
          "spill store ", what, ": the data dir ", opts_.path, " is full (",
          FormatByteSize(space.free), " free; this write needs ", FormatByteSize(adds),
          " and ", FormatByteSize(keep), " are kept free for RocksDB)"));
    }
    return absl::OkStatus();
  }

  bool stopped() const {
    absl::MutexLock lock(&state_mu_);
    return stopped_;
  }

  // Stop refuses writes from now on until the maintenance thread resumes
  // them.
  void Stop(const rocksdb::Status& s, absl::string_view what) {
    absl::MutexLock lock(&state_mu_);
    ++write_failures_;
    if (stopped_) return;
    stopped_ = true;
    no_space_ = IsNoSpace(s);
    stopped_at_ = absl::Now();
    stop_reason_ = absl::StrCat(
        "spill store is not accepting writes: ", what, " failed (", s.ToString(), "); ",
        no_space_ ? "the data dir is full; writes resume when space returns"
                  : "writes resume when the device recovers");
    EVOKE_LOG_ERROR(stop_reason_);
  }

  // ------------------------------------------------------------ open

  // OpenLadder opens db_: read-only when the disk is too full to recover
  // the WAL, else through the recovery ladder for damaged files.
  absl::Status OpenLadder() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_, db_mu_) {
    const bool exists = std::filesystem::exists(opts_.path + "/CURRENT");
    if (exists && !RoomToOpen()) {
      EVOKE_RETURN_IF_ERROR(OpenReadOnly("the data dir is full"));
      return absl::OkStatus();
    }
    std::string failures;
    for (OpenMode mode : {OpenMode::kNormal, OpenMode::kSkipCorruptWal, OpenMode::kBestEfforts}) {
      rocksdb::Status s = config_.Open(mode, &db_);
      if (!s.ok() && mode == OpenMode::kNormal &&
          s.ToString().find("CURRENT") != std::string::npos && RewriteCurrent()) {
        // CURRENT names the MANIFEST in use, nothing more: pointing it at
        // the newest MANIFEST loses nothing (best-efforts recovery would
        // skip the WAL).
        Note(absl::StrCat("CURRENT was damaged (", s.ToString(),
                          "); rewrote it to name the newest MANIFEST"));
        s = config_.Open(mode, &db_);
      }
      if (s.ok()) s = CheckFormat();
      if (s.ok()) {
        if (mode != OpenMode::kNormal) {
          Note(absl::StrCat(ModeName(mode), " succeeded after: ", failures));
        }
        VerifyTables();
        return absl::OkStatus();
      }
      db_.Close();
      if (IsLockError(s)) {
        return absl::UnavailableError(absl::StrCat(
            "data_dir: ", opts_.path,
            " is in use by another evoked (RocksDB lock held): ", s.ToString()));
      }
      if (s.IsIOError() && IsNoSpace(s)) {
        return OpenReadOnly(absl::StrCat("opening read-write failed: ", s.ToString()));
      }
      if (s.ToString().find("evoke format") != std::string::npos) {
        return absl::FailedPreconditionError(s.ToString());
      }
      if (!IsDamage(s)) return ToAbsl(s, absl::StrCat("open ", opts_.path));
      absl::StrAppend(&failures, failures.empty() ? "" : "; ", ModeName(mode), ": ",
                      s.ToString());
      EVOKE_LOG_ERROR("spill store: ", ModeName(mode), " of ", opts_.path,
                      " failed: ", s.ToString());
    }
    // Nothing opens: keep the files for a post-mortem and start empty.
    const std::string aside =
        absl::StrCat(opts_.path, "/quarantine-", absl::ToUnixSeconds(absl::Now()));
    std::error_code ec;
    std::filesystem::create_directories(aside, ec);
    int moved = 0;
    for (const auto& f : std::filesystem::directory_iterator(opts_.path, ec)) {
      const std::string name = f.path().filename().string();
      // The segment files go too: no record points into them any more.
      if (!f.is_regular_file() && name != "segments") continue;
      std::filesystem::rename(f.path(), aside + "/" + name, ec);
      moved += !ec;
    }
    Note(absl::StrCat("no recovery step opened the store (", failures, "); moved ", moved,
                      " files to ", aside, " and started empty: every block on disk is lost"));
    rocksdb::Status s = config_.Open(OpenMode::kNormal, &db_);
    if (s.ok()) s = CheckFormat();
    if (!s.ok()) {
      db_.Close();
      return ToAbsl(s, absl::StrCat("open ", opts_.path, " (empty, after quarantine)"));
    }
    return absl::OkStatus();
  }

  // RewriteCurrent points CURRENT at the newest MANIFEST file.
  bool RewriteCurrent() const {
    std::string newest;
    uint64_t newest_number = 0;
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator(opts_.path, ec)) {
      const std::string name = f.path().filename().string();
      if (name.rfind("MANIFEST-", 0) != 0) continue;
      const uint64_t number = std::strtoull(name.c_str() + 9, nullptr, 10);
      if (newest.empty() || number > newest_number) {
        newest = name;
        newest_number = number;
      }
    }
    if (newest.empty()) return false;
    const std::string tmp = opts_.path + "/CURRENT.evoke-tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << newest << "\n";
      out.flush();
      if (!out) return false;
    }
    std::filesystem::rename(tmp, opts_.path + "/CURRENT", ec);
    return !ec;
  }

  // RoomToOpen: whether a read-write open can rewrite the WAL.
  bool RoomToOpen() const {
    const FsSpace space = SpaceOf(opts_.path);
    return space.total == 0 || space.free >= WalBytes(opts_.path) + kOpenHeadroom;
  }

  absl::Status OpenReadOnly(const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_, db_mu_) {
    // A read-only instance takes no lock: take RocksDB's LOCK file ourselves
    // so that a second evoked still cannot open this dir.
    if (!TakeOwnLock()) {
      return absl::UnavailableError(absl::StrCat(
          "data_dir: ", opts_.path, " is in use by another evoked (LOCK held)"));
    }
    rocksdb::Status s = config_.Open(OpenMode::kReadOnly, &db_);
    if (!s.ok()) {
      ReleaseOwnLock();
      return ToAbsl(s, absl::StrCat("open ", opts_.path, " read-only (", why, ")"));
    }
    const FsSpace space = SpaceOf(opts_.path);
    {
      absl::MutexLock lock(&state_mu_);
      read_only_ = true;
      stopped_ = true;
      no_space_ = true;
      stopped_at_ = absl::Now();
      stop_reason_ = absl::StrCat("spill store is read-only: ", why, " (",
                                  FormatByteSize(space.free), " free, the WAL needs ",
                                  FormatByteSize(WalBytes(opts_.path)),
                                  " to recover); it reopens read-write when space returns");
      recovery_.push_back(stop_reason_);
      EVOKE_LOG_ERROR(stop_reason_);
    }
    const rocksdb::Status format = CheckFormat();
    if (!format.ok()) {
      db_.Close();
      ReleaseOwnLock();
      if (format.IsNotSupported()) return absl::FailedPreconditionError(format.ToString());
      return ToAbsl(format, absl::StrCat("open ", opts_.path, " read-only (", why, ")"));
    }
    return absl::OkStatus();
  }

  bool TakeOwnLock() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) {
    if (own_lock_ != nullptr) return true;
    rocksdb::Env* env = rocksdb::Env::Default();
    return env->LockFile(opts_.path + "/LOCK", &own_lock_).ok();
  }
  void ReleaseOwnLock() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) {
    if (own_lock_ == nullptr) return;
    rocksdb::Env::Default()->UnlockFile(own_lock_).PermitUncheckedError();
    own_lock_ = nullptr;
  }

  // CheckFormat reads (or, in a new dir, writes) the format and the
  // instance id. A format-1 dir is turned into a format-2 dir whose old
  // payloads are still in the payload column family (kMigrateKey): this
  // evoked reads them there until MigrateFormat1 has moved them, and an
  // older evoked refuses the dir instead of missing the new payloads.
  rocksdb::Status CheckFormat() ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_) {
    rocksdb::ColumnFamilyHandle* def = db_.handles[0];
    std::string format;
    rocksdb::Status s = db_.db->Get(rocksdb::ReadOptions(), def, kFormatKey, &format);
    const bool read_only = read_only_unlocked();
    if (s.IsNotFound()) {
      format = kFormatVersion;
      if (!read_only) {
        rocksdb::WriteOptions w;
        w.sync = true;
        s = db_.db->Put(w, def, kFormatKey, kFormatVersion);
      } else {
        s = rocksdb::Status::OK();
      }
    }
    if (!s.ok()) return s;
    if (format != kFormatVersion && format != kFormat1) {
      return rocksdb::Status::NotSupported(absl::StrCat(
          "data_dir: ", opts_.path, " holds spill format '", format,
          "', this evoked reads formats 1 (migrated at start) and ", kFormatVersion,
          " (evoke format)"));
    }
    std::string migrate;
    const rocksdb::Status m = db_.db->Get(rocksdb::ReadOptions(), def, kMigrateKey, &migrate);
    if (!m.ok() && !m.IsNotFound()) return m;
    format1_payloads_.store(format == kFormat1 || m.ok());

    std::string instance;
    s = db_.db->Get(rocksdb::ReadOptions(), def, kInstanceKey, &instance);
    if (s.IsNotFound() && !read_only) {
      std::random_device rd;
      instance.resize(16);
      for (char& c : instance) c = static_cast<char>(rd());
      rocksdb::WriteBatch batch;
      batch.Put(def, kInstanceKey, instance).PermitUncheckedError();
      if (format == kFormat1) {
        batch.Put(def, kMigrateKey, "1").PermitUncheckedError();
        batch.Put(def, kFormatKey, kFormatVersion).PermitUncheckedError();
      }
      rocksdb::WriteOptions w;
      w.sync = true;
      s = db_.db->Write(w, &batch);
    } else if (s.ok() && format == kFormat1 && !read_only) {
      rocksdb::WriteBatch batch;
      batch.Put(def, kMigrateKey, "1").PermitUncheckedError();
      batch.Put(def, kFormatKey, kFormatVersion).PermitUncheckedError();
      rocksdb::WriteOptions w;
      w.sync = true;
      s = db_.db->Write(w, &batch);
    } else if (s.IsNotFound()) {
      instance.clear();  // Read-only and never written: no segment exists yet.
      s = rocksdb::Status::OK();
    }
    if (!s.ok()) return s;
    if (!instance.empty() && instance.size() != 16) {
      return rocksdb::Status::Corruption(absl::StrCat(
          "data_dir: ", opts_.path, ": ", kInstanceKey, " is ", instance.size(),
          " bytes, not 16 (evoke format)"));
    }
    instance_ = instance;
    return s;
  }

  // ------------------------------------------------------------ segments

  // OpenSegments opens the segment log (once: it outlives reopens of the
  // database). Without an instance id yet (a read-only open of a dir that
  // never had one) it waits for the read-write reopen.
  absl::Status OpenSegments() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_, db_mu_) {
    if (log_ != nullptr || instance_.empty()) return absl::OkStatus();
    SegmentLogOptions o;
    o.dir = opts_.path + "/segments";
    o.segment_bytes = opts_.segment_bytes;
    std::copy(instance_.begin(), instance_.end(), reinterpret_cast<char*>(o.instance.data()));
    o.direct_io = opts_.direct_io;
    o.faults = opts_.faults;
    std::vector<std::string> notes;
    absl::StatusOr<std::unique_ptr<SegmentLog>> log = SegmentLog::Open(o, &notes);
    for (std::string& n : notes) Note(std::move(n));
    if (!log.ok()) {
      return absl::Status(log.status().code(),
                          absl::StrCat("spill store: opening the segment files failed: ",
                                       log.status().message()));
    }
    log_ = std::shared_ptr<SegmentLog>(std::move(*log));
    return absl::OkStatus();
  }

  // CheckLocations scans every record once at open: a location inside a
  // segment's valid range counts as live; one that is not (its segment is
  // gone or quarantined, or it lies past a torn tail) is rewritten as a
  // breadcrumb, never served. If the scan cannot read every record, no
  // segment is ever removed during this run (a record it missed may point
  // into one).
  void CheckLocations() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_, db_mu_) {
    if (log_ == nullptr) return;
    rocksdb::ReadOptions options;
    options.fill_cache = false;
    options.verify_checksums = true;
    std::unique_ptr<rocksdb::Iterator> it(db_.db->NewIterator(options, meta()));
    storage::SpillRecord record;
    std::vector<std::pair<std::string, storage::SpillRecord>> bad;
    uint64_t live = 0;
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      if (!record.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
        continue;
      }
      if (!record.payload_present()) continue;
      if (!record.has_location()) {
        if (!format1_payloads_.load()) bad.emplace_back(it->key().ToString(), record);
        continue;
      }
      const PayloadLocation l = FromProto(record.location());
      if (log_->Contains(l)) {
        log_->AddLive(l);
        ++live;
      } else {
        bad.emplace_back(it->key().ToString(), record);
      }
    }
    if (!it->status().ok()) {
      segments_removable_ = false;
      Note(absl::StrCat("the record scan of the segment check stopped early (",
                        it->status().ToString(),
                        "); no segment file is removed until the next start"));
    }
    if (bad.empty()) return;
    {
      absl::MutexLock lock(&state_mu_);
      unreadable_records_ += bad.size();
    }
    std::string what = absl::StrCat(bad.size(), " records point at payload bytes that are not in a "
                                    "valid segment (missing, quarantined or past a torn tail)");
    if (read_only_unlocked()) {
      Note(absl::StrCat(what, "; they are not served (read-only: left as they are)"));
      return;
    }
    rocksdb::WriteBatch batch;
    std::string value;
    for (auto& [key, r] : bad) {
      r.set_payload_present(false);
      r.clear_location();
      value.clear();
      r.SerializeToString(&value);
      batch.Put(meta(), key, value).PermitUncheckedError();
    }
    rocksdb::WriteOptions w;
    w.sync = true;
    const rocksdb::Status s = db_.db->Write(w, &batch);
    Note(absl::StrCat(what, "; ", s.ok() ? "rewritten as breadcrumbs (metadata kept)"
                                         : "rewriting them failed: " + s.ToString()));
  }

  // MoveItem: one payload that compaction or migration moves.
  struct MoveItem {
    BlockId id;
    std::string key;
    std::string payload;
    uint64_t checksum = 0;
    std::optional<PayloadLocation> from;  // Compaction: where it was.
    bool checksum_ok = true;
  };

  // MoveBatch appends the items whose records still point where they were
  // read from (compaction) or still have no location (migration), and
  // commits their new locations with sync. A record that moved, was
  // deleted or was rewritten meanwhile keeps its newer state (the copy
  // becomes garbage). A compaction item whose payload fails its checksum
  // is not copied: its record becomes a breadcrumb.
  absl::Status MoveBatch(std::vector<MoveItem>* items, absl::string_view what,
                         uint64_t* moved, uint64_t* quarantined) {
    uint64_t adds = 0;
    for (const MoveItem& m : *items) adds += SegmentRecordBytes(m.payload.size());
    absl::MutexLock wl(&write_mu_);
    EVOKE_RETURN_IF_ERROR(CheckWritable(adds, what));
    absl::ReaderMutexLock d(&db_mu_);
    EVOKE_RETURN_IF_ERROR(CheckOpen());
    EVOKE_RETURN_IF_ERROR(CheckLog());
    std::vector<std::string> values(items->size());
    std::vector<storage::SpillRecord> records(items->size());
    std::vector<bool> keep(items->size(), false);
    std::vector<bool> dropped(items->size(), false);  // Quarantined from `from`.
    std::vector<SegmentAppend> appends;
    rocksdb::WriteBatch batch;
    for (size_t i = 0; i < items->size(); ++i) {
      MoveItem& m = (*items)[i];
      const rocksdb::Status s = db_.db->Get(rocksdb::ReadOptions(), meta(), m.key, &values[i]);
      if (s.IsNotFound()) {
        if (!m.from.has_value()) batch.Delete(payload(), m.key).PermitUncheckedError();
        continue;
      }
      if (!s.ok()) return ToAbsl(s, absl::StrCat(what, " read"));
      storage::SpillRecord& r = records[i];
      if (!r.ParseFromString(values[i]) || !r.payload_present()) {
        if (!m.from.has_value()) batch.Delete(payload(), m.key).PermitUncheckedError();
        continue;
      }
      if (m.from.has_value()) {
        if (!r.has_location() || FromProto(r.location()) != *m.from) continue;
      } else if (r.has_location()) {
        batch.Delete(payload(), m.key).PermitUncheckedError();
        continue;
      }
      // A migrated payload's checksum is its record's (compaction's comes
      // from the segment and must agree with it).
      if (!m.from.has_value()) m.checksum = r.meta().checksum();
      if (!m.checksum_ok || r.meta().checksum() != m.checksum ||
          r.meta().payload_bytes() != m.payload.size()) {
        r.set_payload_present(false);
        r.clear_location();
        batch.Put(meta(), m.key, r.SerializeAsString()).PermitUncheckedError();
        if (!m.from.has_value()) batch.Delete(payload(), m.key).PermitUncheckedError();
        dropped[i] = m.from.has_value();
        ++*quarantined;
        continue;
      }
      keep[i] = true;
      appends.push_back({m.id, m.payload, m.checksum});
    }
    std::vector<PayloadLocation> placed;
    if (!appends.empty()) {
      // Moved data goes to its own stream: cold records stay apart from new
      // spills.
      absl::StatusOr<std::vector<PayloadLocation>> r =
          log_->Append(appends, SegmentStream::kCompaction);
      if (!r.ok()) return AppendFailed(r.status(), what);
      placed = *std::move(r);
    }
    size_t next = 0;
    for (size_t i = 0; i < items->size(); ++i) {
      if (!keep[i]) continue;
      storage::SpillRecord& r = records[i];
      ToProto(placed[next++], r.mutable_location());
      batch.Put(meta(), (*items)[i].key, r.SerializeAsString()).PermitUncheckedError();
      if (!(*items)[i].from.has_value()) {
        batch.Delete(payload(), (*items)[i].key).PermitUncheckedError();
      }
    }
    if (batch.Count() > 0) EVOKE_RETURN_IF_ERROR(CommitLocked(&batch, /*sync=*/true, what));
    // Moved records committed, old copies still in place.
    EVOKE_FAILPOINT("compaction.committed");
    next = 0;
    for (size_t i = 0; i < items->size(); ++i) {
      const MoveItem& m = (*items)[i];
      // Moved or quarantined: the record no longer points where it was.
      if (m.from.has_value() && (keep[i] || dropped[i])) log_->RemoveLive(*m.from);
      if (keep[i]) log_->AddLive(placed[next++]);
    }
    *moved += placed.size();
    items->clear();
    return absl::OkStatus();
  }

  // MigrateFormat1 moves the payloads still in the format-1 payload column
  // family into segments, in batches, each committed with sync (a crash
  // resumes where it stopped: moved records have a location). It needs free
  // space for all of them (their blob files are freed only at the end):
  // without it, it leaves them where they are, readable, and tries again
  // at the next start.
  void MigrateFormat1(bool at_open) {
    const absl::Time start = absl::Now();
    uint64_t bytes_left = 0;
    {
      absl::ReaderMutexLock d(&db_mu_);
      if (db_.db == nullptr || log_ == nullptr || read_only_unlocked()) return;
      uint64_t v = 0;
      if (db_.db->GetIntProperty(payload(), rocksdb::DB::Properties::kTotalBlobFileSize, &v)) {
        bytes_left += v;
      }
      if (db_.db->GetIntProperty(payload(), rocksdb::DB::Properties::kLiveSstFilesSize, &v)) {
        bytes_left += v;
      }
    }
    const FsSpace space = SpaceOf(opts_.path);
    if (space.total > 0 && space.free < bytes_left + reserve_) {
      if (at_open) {
        Note(absl::StrCat(
            "format-1 payloads (", FormatByteSize(bytes_left), ") stay in the payload column "
            "family, readable, because moving them into segment files needs ",
            FormatByteSize(bytes_left + reserve_), " free and ", FormatByteSize(space.free),
            " are; they move at a later start once there is room"));
      }
      return;
    }
    std::vector<MoveItem> items;
    uint64_t batch_bytes = 0, moved = 0, quarantined = 0, scanned = 0;
    absl::Status status;
    {
      std::unique_ptr<rocksdb::Iterator> it;
      {
        absl::ReaderMutexLock d(&db_mu_);
        rocksdb::ReadOptions options;
        options.fill_cache = false;
        options.verify_checksums = true;
        it.reset(db_.db->NewIterator(options, payload()));
      }
      for (it->SeekToFirst(); it->Valid() && status.ok(); it->Next()) {
        ++scanned;
        MoveItem m;
        m.key = it->key().ToString();
        auto id = BlockId::FromBytes(m.key);
        if (!id.ok()) continue;
        m.id = *id;
        m.payload = it->value().ToString();
        // The checksum comes from the record, which MoveBatch reads anyway.
        batch_bytes += m.payload.size();
        items.push_back(std::move(m));
        if (batch_bytes >= kMoveBatchBytes || items.size() >= 4096) {
          status = MoveBatch(&items, "migration", &moved, &quarantined);
          batch_bytes = 0;
        }
      }
      if (status.ok() && !it->status().ok()) status = ToAbsl(it->status(), "migration scan");
      // The iterator pins the database: release it before any reopen.
    }
    if (status.ok() && !items.empty()) {
      status = MoveBatch(&items, "migration", &moved, &quarantined);
    }
    if (!status.ok()) {
      Note(absl::StrCat("moving format-1 payloads into segment files stopped after ", moved,
                        " blocks: ", status.ToString(), "; the rest stay readable where they "
                        "are and move at a later start"));
      return;
    }
    absl::MutexLock wl(&write_mu_);
    absl::ReaderMutexLock d(&db_mu_);
    if (db_.db == nullptr) return;
    rocksdb::WriteOptions w;
    w.sync = true;
    rocksdb::Status s = db_.db->Delete(w, db_.handles[0], kMigrateKey);
    if (s.ok()) {
      format1_payloads_.store(false);
      rocksdb::CompactRangeOptions c;
      c.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
      s = db_.db->CompactRange(c, payload(), nullptr, nullptr);
    }
    Note(absl::StrCat("moved ", moved, " format-1 payloads into segment files in ",
                      absl::FormatDuration(absl::Now() - start), " (", scanned, " scanned, ",
                      quarantined, " whose record disagreed with the payload left as "
                      "breadcrumbs)", s.ok() ? "" : "; freeing the old blob files failed: " +
                      s.ToString()));
  }

  // CompactSegments runs on the maintenance thread: removes segments with
  // no live record, and moves the live records out of the segment where
  // most space is garbage (LFS cost-benefit: (1 - u) * age / (1 + u)), once
  // at least half of it is.
  void CompactSegments() {
    std::shared_ptr<SegmentLog> log;
    {
      absl::ReaderMutexLock d(&db_mu_);
      log = log_;
    }
    if (log == nullptr || !segments_removable_ || stopped()) return;
    const int64_t now_ms = absl::ToUnixMillis(absl::Now());
    std::optional<SegmentInfo> victim;
    double best = 0;
    std::vector<SegmentInfo> segments;
    {
      // Under the write lock: a Put counts the records it appended as live
      // only after committing them, and holds the lock from its append to
      // then; outside it, a segment it just filled would look like garbage.
      absl::MutexLock wl(&write_mu_);
      segments = log->Segments();
      for (const SegmentInfo& s : segments) {
        if (s.active || s.live_bytes != 0) continue;
        const absl::Status r = log->RemoveSegment(s.id);
        if (!r.ok()) {
          EVOKE_LOG_WARNING("spill store: removing segment ", s.id, " failed: ", r.ToString());
        } else {
          removed_segments_.fetch_add(1);
        }
      }
    }
    for (const SegmentInfo& s : segments) {
      if (s.active || s.live_bytes == 0 || uncompactable_.contains(s.id)) continue;
      const uint64_t used = s.valid_end > 4096 ? s.valid_end - 4096 : 0;
      if (used == 0 || s.live_bytes * 2 > used) continue;
      const double u = static_cast<double>(s.live_bytes) / static_cast<double>(used);
      const double age = static_cast<double>(std::max<int64_t>(1, now_ms - s.created_unix_ms));
      const double score = (1 - u) * age / (1 + u);
      if (!victim.has_value() || score > best) {
        victim = s;
        best = score;
      }
    }
    if (!victim.has_value()) return;
    std::vector<MoveItem> items;
    uint64_t batch_bytes = 0, moved = 0, quarantined = 0;
    absl::Status status = log->ForEachRecord(
        victim->id, [&](const SegmentRecord& r, bool checksum_ok) -> absl::Status {
          MoveItem m;
          m.id = r.id;
          m.key = r.id.ToBytes();
          m.payload.assign(r.payload.data(), r.payload.size());
          m.checksum = r.checksum;
          m.from = r.location;
          m.checksum_ok = checksum_ok;
          batch_bytes += m.payload.size();
          items.push_back(std::move(m));
          if (batch_bytes < kMoveBatchBytes) return absl::OkStatus();
          batch_bytes = 0;
          return MoveBatch(&items, "compaction", &moved, &quarantined);
        });
    if (status.ok() && !items.empty()) {
      status = MoveBatch(&items, "compaction", &moved, &quarantined);
    }
    compacted_records_.fetch_add(moved);
    if (quarantined > 0) {
      absl::MutexLock lock(&state_mu_);
      unreadable_records_ += quarantined;
    }
    if (!status.ok()) {
      if (status.code() == absl::StatusCode::kDataLoss) {
        // A record header inside it does not verify: the records after it
        // cannot be walked to. They stay readable by their locations; the
        // segment is left alone for this run instead of failing every pass.
        uncompactable_.insert(victim->id);
        Note(absl::StrCat("segment ", victim->id, " cannot be compacted (", status.message(),
                          "); its records stay where they are"));
        return;
      }
      const absl::Time now = absl::Now();
      if (now - last_compaction_log_ > absl::Seconds(10)) {
        last_compaction_log_ = now;
        EVOKE_LOG_WARNING("spill store: compacting segment ", victim->id, " stopped: ",
                          status.ToString());
      }
      return;
    }
    // The segment is now garbage only; the next pass removes it (once every
    // record that moved is committed, which MoveBatch did with sync).
  }

  // VerifyTables reads every SST file with its checksums once at start, so
  // that a corrupt one is counted and logged now, not when a compaction or
  // a load meets it. Blob files are not read (they hold the payloads, and
  // every payload read is verified by the engine).
  void VerifyTables() ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_) {
    std::vector<rocksdb::LiveFileMetaData> files;
    db_.db->GetLiveFilesMetaData(&files);
    const rocksdb::Options reader_options = config_.MetaReaderOptions();
    for (const rocksdb::LiveFileMetaData& f : files) {
      rocksdb::SstFileReader reader(reader_options);
      const std::string path = f.db_path + f.name;
      rocksdb::Status s = reader.Open(path);
      if (s.ok()) s = reader.VerifyChecksum();
      if (s.ok()) continue;
      absl::MutexLock lock(&state_mu_);
      ++corrupt_files_;
      const std::string note = absl::StrCat(
          "SST file ", path, " (column family ", f.column_family_name,
          ") is corrupt: ", s.ToString(), "; its records are unreadable and never served");
      recovery_.push_back(note);
      EVOKE_LOG_ERROR("spill store: ", note);
    }
  }

  void Note(std::string note) {
    EVOKE_LOG_ERROR("spill store: ", note);
    absl::MutexLock lock(&state_mu_);
    recovery_.push_back(std::move(note));
  }

  // ------------------------------------------------------------ scan

  absl::Status Visit(const rocksdb::Slice& key, const rocksdb::Slice& value,
                     const std::function<absl::Status(const BlockId&, storage::SpillRecord)>&
                         visit,
                     std::vector<std::string>* skipped) {
    auto id = BlockId::FromBytes(absl::string_view(key.data(), key.size()));
    storage::SpillRecord record;
    if (!id.ok() || !record.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
      if (skipped != nullptr) {
        skipped->push_back(absl::StrCat("unreadable record under key ", key.size(),
                                        " bytes long"));
      }
      return absl::OkStatus();
    }
    if (record.payload_present()) {
      // A payload that CheckLocations found missing (left as it is on a
      // read-only open), or a format-1 one after the migration finished,
      // is not on disk: the engine sees a breadcrumb.
      const bool readable =
          record.has_location()
              ? log_ != nullptr && log_->Contains(FromProto(record.location()))
              : format1_payloads_.load();
      if (!readable) record.set_payload_present(false);
    }
    return visit(*id, std::move(record));
  }

  // ScanAroundCorruption visits the records after `after` (all when null)
  // that can still be read: the keys of every meta SST file read forward
  // and backward up to its corrupt blocks, each looked up through the
  // database (so deletes and newer versions still win); keys whose lookup
  // fails are counted as unreadable.
  absl::Status ScanAroundCorruption(
      const std::string* after,
      const std::function<absl::Status(const BlockId&, storage::SpillRecord)>& visit,
      std::vector<std::string>* skipped) ABSL_SHARED_LOCKS_REQUIRED(db_mu_) {
    std::vector<std::string> keys;
    rocksdb::ReadOptions options;
    options.fill_cache = false;
    options.verify_checksums = true;
    auto collect = [&](rocksdb::Iterator* it) {
      for (it->SeekToFirst(); it->Valid(); it->Next()) keys.push_back(it->key().ToString());
      for (it->SeekToLast(); it->Valid(); it->Prev()) keys.push_back(it->key().ToString());
    };
    {
      std::unique_ptr<rocksdb::Iterator> it(db_.db->NewIterator(options, meta()));
      collect(it.get());  // Memtable and every file, up to the corrupt block each way.
    }
    std::vector<rocksdb::LiveFileMetaData> files;
    db_.db->GetLiveFilesMetaData(&files);
    const rocksdb::Options reader_options = config_.MetaReaderOptions();
    for (const rocksdb::LiveFileMetaData& f : files) {
      if (f.column_family_name != kMetaFamily) continue;
      rocksdb::SstFileReader reader(reader_options);
      if (!reader.Open(f.db_path + f.name).ok()) continue;
      std::unique_ptr<rocksdb::Iterator> it(reader.NewIterator(options));
      collect(it.get());
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    uint64_t unreadable = 0;
    for (const std::string& key : keys) {
      if (after != nullptr && key <= *after) continue;
      std::string value;
      rocksdb::Status s = db_.db->Get(options, meta(), key, &value);
      if (s.IsNotFound()) continue;
      if (!s.ok()) {
        ++unreadable;
        continue;
      }
      EVOKE_RETURN_IF_ERROR(Visit(key, value, visit, skipped));
    }
    absl::MutexLock lock(&state_mu_);
    unreadable_records_ += unreadable;
    EVOKE_LOG_ERROR("spill store: read around the corrupt block: ", keys.size(),
                    " keys found, ", unreadable,
                    " unreadable; records only in the corrupt block are lost");
    return absl::OkStatus();
  }

  // ------------------------------------------------------------ recovery

  // Maintain runs on its own thread: every retry_interval, resumes stopped
  // writes once space returns and turns automatic compaction off after a
  // compaction met a corrupt file (it would fail again and again).
  void Maintain() {
    uint64_t corrupt_seen = 0;
    for (;;) {
      {
        absl::MutexLock lock(&state_mu_);
        auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_) { return stop_thread_; };
        state_mu_.AwaitWithTimeout(absl::Condition(&stop), opts_.retry_interval);
        if (stop_thread_) return;
      }
      const uint64_t corrupt = listener_->corrupt_compactions.load();
      if (corrupt != corrupt_seen) {
        corrupt_seen = corrupt;
        absl::ReaderMutexLock d(&db_mu_);
        if (db_.db != nullptr && !read_only_unlocked()) {
          for (rocksdb::ColumnFamilyHandle* h : {meta(), payload()}) {
            db_.db->SetOptions(h, {{"disable_auto_compactions", "true"}}).PermitUncheckedError();
          }
        }
        std::string error;
        {
          absl::MutexLock lock(&listener_->mu);
          error = listener_->last_error;
        }
        EVOKE_LOG_ERROR("spill store: a compaction met a corrupt file (", error,
                        "); writes continue, automatic compaction is off until restart");
      }
      if (listener_->write_error.load() || stopped()) TryResume();
      CompactSegments();
    }
  }

  bool read_only_unlocked() const {
    absl::MutexLock lock(&state_mu_);
    return read_only_;
  }

  void TryResume() {
    absl::MutexLock w(&write_mu_);
    if (listener_->write_error.load() && !stopped()) {
      std::string error;
      {
        absl::MutexLock lock(&listener_->mu);
        error = listener_->last_error;
      }
      Stop(rocksdb::Status::IOError(error), "background flush");
    }
    const FsSpace space = SpaceOf(opts_.path);
    if (space.total > 0 && space.free < reserve_) return;  // Still full.
    bool read_only = false;
    {
      absl::MutexLock lock(&state_mu_);
      read_only = read_only_;
    }
    rocksdb::Status s;
    if (read_only) {
      if (!RoomToOpen()) return;
      absl::WriterMutexLock d(&db_mu_);
      db_.Close();
      ReleaseOwnLock();
      {
        // CheckFormat writes what a read-only open could not.
        absl::MutexLock lock(&state_mu_);
        read_only_ = false;
      }
      s = config_.Open(OpenMode::kNormal, &db_);
      if (s.ok()) s = CheckFormat();
      if (s.ok() && log_ == nullptr) {
        const absl::Status opened = OpenSegments();
        if (opened.ok()) {
          CheckLocations();
        } else {
          s = rocksdb::Status::IOError(std::string(opened.message()));
        }
      }
      if (!s.ok()) {
        {
          absl::MutexLock lock(&state_mu_);
          read_only_ = true;
        }
        db_.Close();
        EVOKE_LOG_ERROR("spill store: reopening read-write failed: ", s.ToString(),
                        "; staying read-only");
        TakeOwnLock();
        if (!config_.Open(OpenMode::kReadOnly, &db_).ok()) {
          // Neither opens: calls fail UNAVAILABLE until a later try works.
          db_.Close();
        }
        return;
      }
    } else {
      absl::ReaderMutexLock d(&db_mu_);
      if (db_.db == nullptr) return;
      s = db_.db->Resume();
      if (!s.ok()) {
        // Busy: RocksDB's own recovery (it polls free space after ENOSPC)
        // is under way; it or a later try finishes.
        const absl::Time now = absl::Now();
        if (!s.IsBusy() && now - last_resume_log_ > absl::Seconds(10)) {
          last_resume_log_ = now;
          EVOKE_LOG_WARNING("spill store: resume failed: ", s.ToString());
        }
        return;
      }
    }
    listener_->write_error.store(false);
    absl::MutexLock lock(&state_mu_);
    last_outage_ = absl::Now() - stopped_at_;
    stopped_ = false;
    read_only_ = false;
    ++resumes_;
    EVOKE_LOG_INFO("spill store: writes resumed after ", absl::FormatDuration(last_outage_),
                   read_only ? " (reopened read-write)" : "");
    stop_reason_.clear();
  }

  const SpillStoreOptions opts_;
  const uint64_t reserve_;
  const std::shared_ptr<ListenerState> listener_;
  const DbConfig config_;

  // Lock order: write_mu_, db_mu_, state_mu_. write_mu_ serializes writes,
  // syncs and reopening (so that no WAL is synced after a failed append);
  // db_mu_ is held shared by every use of db_ and exclusively to swap it.
  absl::Mutex write_mu_;
  mutable absl::Mutex db_mu_ ABSL_ACQUIRED_AFTER(write_mu_);
  OpenedDb db_ ABSL_GUARDED_BY(db_mu_);
  rocksdb::FileLock* own_lock_ ABSL_GUARDED_BY(write_mu_) = nullptr;
  absl::Time last_resume_log_ ABSL_GUARDED_BY(write_mu_) = absl::InfinitePast();
  // The payload segments. Set once (at open, or at the first read-write
  // reopen of a dir opened read-only before it had an instance id); read
  // under db_mu_. Its own calls are thread-safe; appends, seals and
  // removals run under write_mu_.
  std::shared_ptr<SegmentLog> log_ ABSL_GUARDED_BY(db_mu_);
  std::string instance_ ABSL_GUARDED_BY(db_mu_);
  // Format-1 payloads remain in the payload column family (kMigrateKey).
  std::atomic<bool> format1_payloads_{false};
  // False when the open-time scan could not read every record.
  std::atomic<bool> segments_removable_{true};
  std::atomic<uint64_t> removed_segments_{0};
  std::atomic<uint64_t> compacted_records_{0};
  std::atomic<int64_t> last_append_log_s_{0};
  // The maintenance thread's own: segments it cannot walk (a damaged record
  // header), and when it last logged a failed compaction.
  absl::flat_hash_set<uint64_t> uncompactable_;
  absl::Time last_compaction_log_ = absl::InfinitePast();

  mutable absl::Mutex state_mu_ ABSL_ACQUIRED_AFTER(db_mu_);
  bool stop_thread_ ABSL_GUARDED_BY(state_mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(state_mu_) = false;
  bool no_space_ ABSL_GUARDED_BY(state_mu_) = false;
  bool read_only_ ABSL_GUARDED_BY(state_mu_) = false;
  absl::Time stopped_at_ ABSL_GUARDED_BY(state_mu_);
  std::string stop_reason_ ABSL_GUARDED_BY(state_mu_);
  uint64_t write_failures_ ABSL_GUARDED_BY(state_mu_) = 0;
  uint64_t refused_writes_ ABSL_GUARDED_BY(state_mu_) = 0;
  uint64_t resumes_ ABSL_GUARDED_BY(state_mu_) = 0;
  absl::Duration last_outage_ ABSL_GUARDED_BY(state_mu_);
  uint64_t corrupt_files_ ABSL_GUARDED_BY(state_mu_) = 0;
  uint64_t unreadable_records_ ABSL_GUARDED_BY(state_mu_) = 0;
  std::vector<std::string> recovery_ ABSL_GUARDED_BY(state_mu_);
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SpillStore>> SpillStore::Open(
    const SpillStoreOptions& opts) {
  if (opts.path.empty()) {
    return absl::InvalidArgumentError("data_dir: is required");
  }
  std::error_code ec;
  std::filesystem::create_directories(opts.path, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "data_dir: cannot create ", opts.path, ": ", ec.message()));
  }
  // The data dir holds other processes' KV bytes (the WAL, blob files): only
  // its owner may enter it, whatever the umask or the mode it was made with.
  std::filesystem::permissions(opts.path, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::replace, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("data_dir: cannot restrict ", opts.path,
                                               " to its owner (mode 0700): ", ec.message()));
  }
  uint64_t reserve = opts.reserve_bytes;
  if (reserve == 0) reserve = std::min<uint64_t>(256ull << 20, SpaceOf(opts.path).total / 20);
  auto store = std::make_unique<RocksSpillStore>(opts, reserve);
  EVOKE_RETURN_IF_ERROR(store->OpenFirst());
  return std::unique_ptr<SpillStore>(std::move(store));
}

}  // namespace evoke
