// The RocksDB spill store (tier 2) inside: its helpers and RocksSpillStore,
// whose members are defined by concern in spill_store.cc (data operations),
// spill_store_open.cc (the open and recovery ladder), spill_store_migration.cc
// (format-1 payloads into segments), spill_store_compaction.cc and
// spill_store_maintenance.cc (the maintenance thread: resuming writes,
// scans around damage). Private to storage/: include storage/tier2/spill_store.h.
#ifndef EVOKE_STORAGE_TIER2_SPILL_STORE_IMPL_H_
#define EVOKE_STORAGE_TIER2_SPILL_STORE_IMPL_H_

#include "storage/tier2/spill_store.h"


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
#include "storage/tier2/fault_env.h"
#include "storage/tier2/segment_log.h"
#include "storage/spill_record.pb.h"

namespace evoke {
namespace spill_internal {


constexpr char kMetaFamily[] = "meta";
constexpr char kPayloadFamily[] = "payload";
constexpr char kFormatKey[] = "evoke.format";
// Format 2: payloads in segment files (storage/tier2/segment_log.h), records in
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
// Every payload record up to this seq (decimal) is accounted for in the
// metadata (written at close and after a salvage): a payload record above
// it and above every record's location was appended but its record was
// lost (a crash, a WAL cut short), and starts a salvage of the newest
// segments.
constexpr char kWatermarkKey[] = "evoke.seq_watermark";
// The corrupt tables (VerifyTables' list) a finished salvage rewrote the
// records of: the next start with the same list needs no salvage.
constexpr char kSalvagedTablesKey[] = "evoke.salvaged_tables";
// Compaction and migration move payloads in batches of about this many bytes.
constexpr uint64_t kMoveBatchBytes = 16ull << 20;

// StoreKey writes an id's key (BlockId::ToBytes) without allocating.
inline void StoreKey(const BlockId& id, char* out) {
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<char>(id.hi() >> (56 - 8 * i));
    out[8 + i] = static_cast<char>(id.lo() >> (56 - 8 * i));
  }
}

inline char* PutVarint(char* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<char>(v);
  return p;
}

inline PayloadLocation FromProto(const storage::PayloadLocation& p) {
  return PayloadLocation{p.segment(), p.offset(), p.length(), p.seq()};
}
inline void ToProto(const PayloadLocation& l, storage::PayloadLocation* p) {
  p->set_segment(l.segment);
  p->set_offset(l.offset);
  p->set_length(l.length);
  p->set_seq(l.seq);
}

// ToAbsl translates a RocksDB status, once, at the storage edge.
inline absl::Status ToAbsl(const rocksdb::Status& s, absl::string_view what) {
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
inline FsSpace SpaceOf(const std::string& path) {
  struct statvfs st {};
  if (statvfs(path.c_str(), &st) != 0) return {};
  return {static_cast<uint64_t>(st.f_bavail) * st.f_frsize,
          static_cast<uint64_t>(st.f_blocks) * st.f_frsize};
}

// Bytes of WAL files in `path`: what a read-write open must rewrite (as
// L0 and blob files) before it deletes them.
inline uint64_t WalBytes(const std::string& path) {
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

inline bool IsLockError(const rocksdb::Status& s) {
  return s.IsIOError() && s.ToString().find("lock") != std::string::npos;
}
inline bool IsNoSpace(const rocksdb::Status& s) {
  return s.IsNoSpace() || s.subcode() == rocksdb::Status::kSpaceLimit ||
         s.ToString().find("No space left") != std::string::npos;
}
// Errors that a recovery step may get past: damaged or missing files.
inline bool IsDamage(const rocksdb::Status& s) {
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

inline const char* ModeName(OpenMode m) {
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

// The store's write state: one value, changed under state_mu_.
enum class WriteState : uint8_t {
  kWritable,
  // A write failed: for lack of space (refused RESOURCE_EXHAUSTED until
  // space returns), or otherwise (UNAVAILABLE until the device recovers).
  // The maintenance thread resumes writes (TryResume).
  kStoppedNoSpace,
  kStoppedFailed,
  // Opened read-only: the disk was too full to recover the WAL. Reopened
  // read-write when space returns.
  kReadOnly,
  // TryResume is reopening a read-only store read-write: still refusing
  // writes (for lack of space), while CheckFormat may write.
  kReopening,
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
  absl::Status Close() override;

  // OpenFirst opens the database through the recovery ladder and starts
  // the maintenance thread.
  absl::Status OpenFirst();

  // Put appends the payloads to the active segment (one pwrite stream, one
  // fdatasync), then commits the records, which point at them, in one
  // WriteBatch: a record never names bytes that are not durable.
  absl::Status Put(absl::Span<const SpillWrite> writes, bool sync) override;

  absl::Status DropPayloads(absl::Span<const SpillWrite> breadcrumbs) override;

  absl::Status Delete(absl::Span<const BlockId> ids) override;

  // Read gets the record, then the payload from its segment (or, for a
  // record not migrated yet, from the format-1 payload column family). A
  // segment removed by compaction between the two (the record has moved)
  // reads the record again, once.
  absl::Status Read(const BlockId& id,
                    const std::function<absl::Status(
                        const storage::SpillRecord&, absl::string_view)>& consume)
      override;

  absl::Status ForEachRecord(const RecordVisitor& visit,
                             std::vector<std::string>* skipped) override;

  uint64_t UsedBytes() override;

  // Sync: the segments are synced by every append; the tombstones, the hot
  // segment they went to without fdatasync, and the WAL are left.
  absl::Status Sync() override;
  // Persist: Sync, then the memtables flushed.
  absl::Status Persist() override;

  SpillStoreHealth Health() const override;

 private:
  // MakeDurable is Sync, and with `flush` Persist.
  absl::Status MakeDurable(bool flush);
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
                           std::string* out);
  // The two halves of EncodeRecord: the record without a location (also
  // the identity written into the segments), then payload_present and the
  // location.
  static void SerializeBase(const storage::SpillRecord& record, std::string* out);
  static void AppendPresence(const PayloadLocation* where, std::string* out);

  // WriteTombstones writes a delete's or a drop's tombstones once its
  // records are committed (one aligned write, no fdatasync: a process
  // crash keeps them, as it keeps RocksDB's unsynced WAL). Where that write
  // fails (a full disk: deletes must still work), they wait in memory for
  // the next append, Sync, Persist, Close or maintenance pass. One lost
  // only matters if salvage runs later: then that block (or its dropped
  // payload) comes back.
  void WriteTombstones(absl::Span<const SegmentTombstone> tombstones)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) ABSL_SHARED_LOCKS_REQUIRED(db_mu_);
  // Retire: the payloads at `old` (one per id, nullopt: none) are no longer
  // live; their tombstones, of `kind`, are written.
  void Retire(absl::Span<const BlockId> ids,
              absl::Span<const std::optional<PayloadLocation>> old, SegmentTombstone::Kind kind)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) ABSL_SHARED_LOCKS_REQUIRED(db_mu_);
  absl::Status FlushTombstones(bool sync) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_)
      ABSL_SHARED_LOCKS_REQUIRED(db_mu_);
  // The maintenance thread's flush (takes the locks; skipped while stopped).
  void FlushTombstonesIdle();

  // CommitLocked applies `batch` (records only: payloads are already in
  // their segments). The caller checked that the store is writable.
  absl::Status CommitLocked(rocksdb::WriteBatch* batch, bool sync, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) ABSL_SHARED_LOCKS_REQUIRED(db_mu_);

  // AppendFailed counts a failed segment append. The log has poisoned the
  // segment (the next append starts a new one), so the store keeps
  // accepting writes: a full disk refuses each of them at fallocate.
  absl::Status AppendFailed(const absl::Status& s, absl::string_view what);

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
      ABSL_SHARED_LOCKS_REQUIRED(db_mu_);

  // ReadFormat1 reads a payload that has not moved into a segment yet.
  absl::Status ReadFormat1(
      const BlockId& id, const std::string& key, const storage::SpillRecord& record,
      const std::function<absl::Status(const storage::SpillRecord&, absl::string_view)>&
          consume) ABSL_SHARED_LOCKS_REQUIRED(db_mu_);

  // CheckOpen: UNAVAILABLE while no database is open (a reopen failed).
  absl::Status CheckOpen() const ABSL_SHARED_LOCKS_REQUIRED(db_mu_) {
    if (db_.db != nullptr) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat("spill store: ", opts_.path,
                                               " is not open (a reopen failed; retrying)"));
  }

  // CheckWritable refuses a write while the store is stopped, or when
  // `adds` bytes would leave less than the reserve free.
  absl::Status CheckWritable(uint64_t adds, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);

  bool stopped() const {
    absl::MutexLock lock(&state_mu_);
    return write_state_ != WriteState::kWritable;
  }

  // Stop refuses writes from now on until the maintenance thread resumes
  // them.
  void Stop(const rocksdb::Status& s, absl::string_view what);

  // ------------------------------------------------------------ open

  // OpenLadder opens db_: read-only when the disk is too full to recover
  // the WAL, else through the recovery ladder for damaged files.
  absl::Status OpenLadder() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_, db_mu_);

  // RewriteCurrent points CURRENT at the newest MANIFEST file.
  bool RewriteCurrent() const;

  // RoomToOpen: whether a read-write open can rewrite the WAL.
  bool RoomToOpen() const {
    const FsSpace space = SpaceOf(opts_.path);
    return space.total == 0 || space.free >= WalBytes(opts_.path) + kOpenHeadroom;
  }

  absl::Status OpenReadOnly(const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_, db_mu_);

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
  rocksdb::Status CheckFormat() ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);

  // ------------------------------------------------------------ segments

  // OpenSegments opens the segment log (once: it outlives reopens of the
  // database). Without an instance id yet (a read-only open of a dir that
  // never had one) it waits for the read-write reopen.
  absl::Status OpenSegments() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_, db_mu_);

  // CheckLocations scans every record once at open: a location inside a
  // segment's valid range counts as live; one that is not (its segment is
  // gone or quarantined, or it lies past a torn tail) is rewritten as a
  // breadcrumb, never served. If the scan cannot read every record, no
  // segment is ever removed during this run (a record it missed may point
  // into one).
  void CheckLocations() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_, db_mu_);

  // Salvage rebuilds records from the segments after the open found the
  // metadata damaged (a recovery step beyond a normal open, a corrupt
  // table, a scan that stopped early): every payload record whose identity
  // record and payload verify, that no tombstone removed and that is newer
  // than what the metadata says of its block, gets its record back;
  // tombstones then remove what the metadata kept of deleted blocks. What
  // cannot come back is counted by kind (Health().salvage).
  // spill_store_salvage.cc.
  // Only segments holding records above `above` are read (0: all).
  void Salvage(uint64_t above) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_, db_mu_);
  // The watermark: read, and written (with sync) as the log's last payload
  // seq.
  uint64_t ReadWatermark() ABSL_SHARED_LOCKS_REQUIRED(db_mu_);
  rocksdb::Status WriteWatermark() ABSL_SHARED_LOCKS_REQUIRED(db_mu_);
  // TailSalvageFrom: the seq above which the segments hold payloads the
  // metadata does not account for (nullopt: none).
  std::optional<uint64_t> TailSalvageFrom() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_, db_mu_);
  // CarryTombstones re-appends the tombstones of a segment about to be
  // removed whose target segment still exists. False when that failed (the
  // segment must stay).
  bool CarryTombstones(SegmentLog& log, uint64_t segment,
                       const std::vector<SegmentInfo>& present)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);

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
                         uint64_t* moved, uint64_t* quarantined);

  // MigrateFormat1 moves the payloads still in the format-1 payload column
  // family into segments, in batches, each committed with sync (a crash
  // resumes where it stopped: moved records have a location). It needs free
  // space for all of them (their blob files are freed only at the end):
  // without it, it leaves them where they are, readable, and tries again
  // at the next start.
  void MigrateFormat1(bool at_open);

  // CompactSegments runs on the maintenance thread: removes segments with
  // no live record, and moves the live records out of the segment where
  // most space is garbage (LFS cost-benefit: (1 - u) * age / (1 + u)), once
  // at least half of it is.
  void CompactSegments();

  // VerifyTables reads every SST file with its checksums once at start, so
  // that a corrupt one is counted and logged now, not when a compaction or
  // a load meets it. Blob files are not read (they hold the payloads, and
  // every payload read is verified by the engine).
  // Returns the names of the corrupt ones, sorted, joined by commas.
  std::string VerifyTables() ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);

  void Note(std::string note) {
    EVOKE_LOG_ERROR("spill store: ", note);
    absl::MutexLock lock(&state_mu_);
    recovery_.push_back(std::move(note));
  }

  // ------------------------------------------------------------ scan

  // Decode parses one record of the metadata scan; its payload reads as
  // absent when its location is not in a valid segment. False when the key
  // or the value does not parse. Thread-safe: ForEachRecord decodes on a
  // second thread.
  bool Decode(const rocksdb::Slice& key, const rocksdb::Slice& value, BlockId* id,
              storage::SpillRecord* record);
  // Visit decodes one record and visits it, or counts it in `skipped`.
  absl::Status Visit(const rocksdb::Slice& key, const rocksdb::Slice& value,
                     const RecordVisitor& visit, std::vector<std::string>* skipped);

  // ScanAroundCorruption visits the records after `after` (all when null)
  // that can still be read: the keys of every meta SST file read forward
  // and backward up to its corrupt blocks, each looked up through the
  // database (so deletes and newer versions still win); keys whose lookup
  // fails are counted as unreadable.
  absl::Status ScanAroundCorruption(const std::string* after, const RecordVisitor& visit,
                                    std::vector<std::string>* skipped)
      ABSL_SHARED_LOCKS_REQUIRED(db_mu_);

  // ------------------------------------------------------------ recovery

  // Maintain runs on its own thread: every retry_interval, resumes stopped
  // writes once space returns and turns automatic compaction off after a
  // compaction met a corrupt file (it would fail again and again).
  void Maintain();

  bool read_only_unlocked() const {
    absl::MutexLock lock(&state_mu_);
    return write_state_ == WriteState::kReadOnly;
  }

  void TryResume();

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
  std::vector<SegmentTombstone> pending_tombstones_ ABSL_GUARDED_BY(write_mu_);
  // Set by the open when the metadata may have lost records.
  bool salvage_needed_ ABSL_GUARDED_BY(write_mu_) = false;
  // Why: the open ladder went past a normal open (or quarantined), or only
  // corrupt tables (their names) found by VerifyTables.
  bool ladder_damage_ ABSL_GUARDED_BY(write_mu_) = false;
  std::string corrupt_tables_ ABSL_GUARDED_BY(write_mu_);
  // The largest location seq of any record (CheckLocations).
  uint64_t max_record_seq_ ABSL_GUARDED_BY(write_mu_) = 0;
  // The maintenance thread's own: segments it cannot walk (a damaged record
  // header), and when it last logged a failed compaction.
  absl::flat_hash_set<uint64_t> uncompactable_;
  absl::Time last_compaction_log_ = absl::InfinitePast();

  mutable absl::Mutex state_mu_ ABSL_ACQUIRED_AFTER(db_mu_);
  bool stop_thread_ ABSL_GUARDED_BY(state_mu_) = false;
  // Whether writes are taken, and why not. Besides it, writes are refused
  // while db_ is closed (a reopen failed: CheckOpen) and the RocksDB
  // listener's write_error (set on its threads) stops them at the next check.
  WriteState write_state_ ABSL_GUARDED_BY(state_mu_) = WriteState::kWritable;
  absl::Time stopped_at_ ABSL_GUARDED_BY(state_mu_);
  std::string stop_reason_ ABSL_GUARDED_BY(state_mu_);
  uint64_t write_failures_ ABSL_GUARDED_BY(state_mu_) = 0;
  uint64_t refused_writes_ ABSL_GUARDED_BY(state_mu_) = 0;
  uint64_t resumes_ ABSL_GUARDED_BY(state_mu_) = 0;
  absl::Duration last_outage_ ABSL_GUARDED_BY(state_mu_);
  uint64_t corrupt_files_ ABSL_GUARDED_BY(state_mu_) = 0;
  uint64_t unreadable_records_ ABSL_GUARDED_BY(state_mu_) = 0;
  bool store_quarantined_ ABSL_GUARDED_BY(state_mu_) = false;
  SalvageCounts salvage_ ABSL_GUARDED_BY(state_mu_);
  std::vector<std::string> recovery_ ABSL_GUARDED_BY(state_mu_);
  std::thread thread_;
};

}  // namespace spill_internal
}  // namespace evoke

#endif  // EVOKE_STORAGE_TIER2_SPILL_STORE_IMPL_H_
