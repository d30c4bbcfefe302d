#include "storage/spill_store.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/byte_size.h"
#include "common/log.h"
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
#include "storage/spill_record.pb.h"

namespace evoke {
namespace {

constexpr char kMetaFamily[] = "meta";
constexpr char kPayloadFamily[] = "payload";
constexpr char kFormatKey[] = "evoke.format";
constexpr char kFormatVersion[] = "1";

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

rocksdb::Slice ToSlice(absl::string_view v) {
  return rocksdb::Slice(v.data(), v.size());
}

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

  ~RocksSpillStore() override {
    {
      absl::MutexLock lock(&state_mu_);
      stop_thread_ = true;
    }
    if (thread_.joinable()) thread_.join();
    absl::MutexLock w(&write_mu_);
    absl::WriterMutexLock d(&db_mu_);
    db_.Close();
    ReleaseOwnLock();
  }

  // OpenFirst opens the database through the recovery ladder and starts
  // the maintenance thread.
  absl::Status OpenFirst() {
    absl::MutexLock w(&write_mu_);
    absl::WriterMutexLock d(&db_mu_);
    EVOKE_RETURN_IF_ERROR(OpenLadder());
    thread_ = std::thread([this] { Maintain(); });
    return absl::OkStatus();
  }

  absl::Status Put(absl::Span<const SpillWrite> writes, bool sync) override {
    rocksdb::WriteBatch batch;
    std::string value;
    uint64_t adds = 0;
    {
    absl::ReaderMutexLock d(&db_mu_);
    EVOKE_RETURN_IF_ERROR(CheckOpen());
    for (const SpillWrite& w : writes) {
      const std::string key = w.id.ToBytes();
      storage::SpillRecord record = *w.record;
      record.set_payload_present(!w.payload.empty());
      value.clear();
      record.SerializeToString(&value);
      adds += value.size() + w.payload.size();
      EVOKE_ROCKS_CHECK(batch.Put(meta(), key, value), "batch");
      if (!w.payload.empty()) {
        EVOKE_ROCKS_CHECK(batch.Put(payload(), key, ToSlice(w.payload)), "batch");
      } else {
        EVOKE_ROCKS_CHECK(batch.Delete(payload(), key), "batch");
      }
    }
    }
    return Write(&batch, sync, "write", adds);
  }

  absl::Status DropPayloads(absl::Span<const SpillWrite> breadcrumbs) override {
    rocksdb::WriteBatch batch;
    std::string value;
    {
    absl::ReaderMutexLock d(&db_mu_);
    EVOKE_RETURN_IF_ERROR(CheckOpen());
    for (const SpillWrite& w : breadcrumbs) {
      const std::string key = w.id.ToBytes();
      storage::SpillRecord record = *w.record;
      record.set_payload_present(false);
      value.clear();
      record.SerializeToString(&value);
      EVOKE_ROCKS_CHECK(batch.Put(meta(), key, value), "batch");
      EVOKE_ROCKS_CHECK(batch.Delete(payload(), key), "batch");
    }
    }
    return Write(&batch, false, "drop payloads", 0);
  }

  absl::Status Delete(absl::Span<const BlockId> ids) override {
    rocksdb::WriteBatch batch;
    {
    absl::ReaderMutexLock d(&db_mu_);
    EVOKE_RETURN_IF_ERROR(CheckOpen());
    for (const BlockId& id : ids) {
      const std::string key = id.ToBytes();
      EVOKE_ROCKS_CHECK(batch.Delete(meta(), key), "batch");
      EVOKE_ROCKS_CHECK(batch.Delete(payload(), key), "batch");
    }
    }
    return Write(&batch, false, "delete", 0);
  }

  absl::Status Read(const BlockId& id,
                    const std::function<absl::Status(
                        const storage::SpillRecord&, absl::string_view)>& consume)
      override {
    const std::string key = id.ToBytes();
    rocksdb::PinnableSlice meta_value;
    rocksdb::PinnableSlice payload_value;
    {
      absl::ReaderMutexLock d(&db_mu_);
      EVOKE_RETURN_IF_ERROR(CheckOpen());
      rocksdb::DB* db = db_.db.get();
      const rocksdb::Snapshot* snapshot = db->GetSnapshot();
      rocksdb::ReadOptions options;
      options.snapshot = snapshot;
      options.verify_checksums = true;
      rocksdb::Status s = db->Get(options, meta(), key, &meta_value);
      if (s.ok()) s = db->Get(options, payload(), key, &payload_value);
      db->ReleaseSnapshot(snapshot);
      if (s.IsNotFound()) {
        return absl::NotFoundError(
            absl::StrCat("block ", id.ToHex(), " has no payload on disk"));
      }
      if (!s.ok()) return ToAbsl(s, "read");
    }
    // The pinned values stay valid after the database is swapped (they hold
    // their own references).
    storage::SpillRecord record;
    if (!record.ParseFromArray(meta_value.data(),
                               static_cast<int>(meta_value.size()))) {
      return absl::DataLossError(
          absl::StrCat("spill store: record of ", id.ToHex(), " is unreadable"));
    }
    return consume(record, absl::string_view(payload_value.data(),
                                             payload_value.size()));
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
    return total;
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

  // Write applies `batch`, which adds `adds` bytes. A batch names column
  // families by id, so it stays valid when the database is reopened
  // meanwhile (same families, same ids).
  absl::Status Write(rocksdb::WriteBatch* batch, bool sync, absl::string_view what,
                     uint64_t adds) ABSL_LOCKS_EXCLUDED(write_mu_, db_mu_) {
    absl::MutexLock w(&write_mu_);
    EVOKE_RETURN_IF_ERROR(CheckWritable(adds, what));
    absl::ReaderMutexLock d(&db_mu_);
    EVOKE_RETURN_IF_ERROR(CheckOpen());
    rocksdb::WriteOptions options;
    options.sync = sync || opts_.sync;
    const rocksdb::Status s = db_.db->Write(options, batch);
    if (!s.ok()) Stop(s, what);
    return ToAbsl(s, what);
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
      if (!f.is_regular_file()) continue;
      std::filesystem::rename(f.path(), aside + "/" + f.path().filename().string(), ec);
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
    absl::MutexLock lock(&state_mu_);
    read_only_ = true;
    stopped_ = true;
    no_space_ = true;
    stopped_at_ = absl::Now();
    stop_reason_ = absl::StrCat(
        "spill store is read-only: ", why, " (", FormatByteSize(space.free), " free, the WAL needs ",
        FormatByteSize(WalBytes(opts_.path)), " to recover); it reopens read-write when space returns");
    recovery_.push_back(stop_reason_);
    EVOKE_LOG_ERROR(stop_reason_);
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

  rocksdb::Status CheckFormat() ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_) {
    std::string format;
    rocksdb::Status s = db_.db->Get(rocksdb::ReadOptions(), db_.handles[0], kFormatKey, &format);
    if (s.IsNotFound()) {
      rocksdb::WriteOptions w;
      w.sync = true;
      s = db_.db->Put(w, db_.handles[0], kFormatKey, kFormatVersion);
      format = kFormatVersion;
    }
    if (!s.ok()) return s;
    if (format != kFormatVersion) {
      return rocksdb::Status::NotSupported(absl::StrCat(
          "data_dir: ", opts_.path, " holds spill format '", format,
          "', this evoked reads format ", kFormatVersion, " (evoke format)"));
    }
    return s;
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
      s = config_.Open(OpenMode::kNormal, &db_);
      if (s.ok()) s = CheckFormat();
      if (!s.ok()) {
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
