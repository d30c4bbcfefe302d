// Opening the spill store: the recovery ladder for damaged RocksDB files,
// the read-only open of a full disk, the format check, the segment files
// and the records' locations in them; and Close.
#include "storage/tier2/spill_store_impl.h"

namespace evoke {
namespace spill_internal {

absl::Status RocksSpillStore::Close() {
  {
    absl::MutexLock lock(&state_mu_);
    stop_thread_ = true;
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock w(&write_mu_);
  absl::WriterMutexLock d(&db_mu_);
  absl::Status status;
  if (log_ != nullptr && db_.db != nullptr && !read_only_unlocked()) {
    if (absl::Status t = FlushTombstones(/*sync=*/true); !t.ok()) {
      EVOKE_LOG_WARNING("spill store: writing tombstones at close failed: ", t.ToString());
      status.Update(t);
    } else if (const rocksdb::Status m = WriteWatermark(); !m.ok()) {
      EVOKE_LOG_WARNING("spill store: writing the seq watermark at close failed: ",
                        m.ToString());
    }
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

absl::Status RocksSpillStore::OpenFirst() {
  {
    absl::MutexLock w(&write_mu_);
    absl::WriterMutexLock d(&db_mu_);
    EVOKE_RETURN_IF_ERROR(OpenLadder());
    EVOKE_RETURN_IF_ERROR(OpenSegments());
    CheckLocations();
    if (log_ != nullptr && !read_only_unlocked() && !format1_payloads_.load()) {
      // Seqs keep rising past every one the metadata names, even where the
      // segments that held the highest are gone.
      log_->AdvanceSeq(std::max(max_record_seq_, ReadWatermark()) + 1);
      std::string salvaged;
      if (salvage_needed_ && !ladder_damage_ && !corrupt_tables_.empty() &&
          db_.db->Get(rocksdb::ReadOptions(), db_.handles[0], kSalvagedTablesKey, &salvaged)
              .ok() &&
          salvaged == corrupt_tables_) {
        // Only tables already salvaged at an earlier start: their records
        // were written again into healthy ones then.
        Note(absl::StrCat("corrupt tables ", corrupt_tables_,
                          " were salvaged at an earlier start: nothing to rebuild"));
        salvage_needed_ = false;
      }
      if (salvage_needed_) {
        Salvage(0);
      } else if (const std::optional<uint64_t> from = TailSalvageFrom()) {
        Salvage(*from);
      }
    }
  }
  if (format1_payloads_.load()) MigrateFormat1(/*at_open=*/true);
  thread_ = std::thread([this] { Maintain(); });
  return absl::OkStatus();
}

absl::Status RocksSpillStore::OpenLadder() {
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
        salvage_needed_ = ladder_damage_ = true;
      }
      corrupt_tables_ = VerifyTables();
      if (!corrupt_tables_.empty()) salvage_needed_ = true;
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
  // Nothing opens: keep the metadata files for a post-mortem and start
  // empty. The segment files stay: salvage rebuilds the records from them.
  const std::string aside =
      absl::StrCat(opts_.path, "/quarantine-", absl::ToUnixSeconds(absl::Now()));
  std::error_code ec;
  std::filesystem::create_directories(aside, ec);
  int moved = 0;
  for (const auto& f : std::filesystem::directory_iterator(opts_.path, ec)) {
    if (!f.is_regular_file()) continue;
    const std::string name = f.path().filename().string();
    std::filesystem::rename(f.path(), aside + "/" + name, ec);
    moved += !ec;
  }
  Note(absl::StrCat("no recovery step opened the store (", failures, "); moved ", moved,
                    " metadata files to ", aside,
                    " and started an empty one: salvage rebuilds it from the segment files"));
  {
    absl::MutexLock lock(&state_mu_);
    store_quarantined_ = true;
  }
  salvage_needed_ = ladder_damage_ = true;
  rocksdb::Status s = config_.Open(OpenMode::kNormal, &db_);
  if (s.ok()) s = CheckFormat();
  if (!s.ok()) {
    db_.Close();
    return ToAbsl(s, absl::StrCat("open ", opts_.path, " (empty, after quarantine)"));
  }
  return absl::OkStatus();
}

bool RocksSpillStore::RewriteCurrent() const {
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

absl::Status RocksSpillStore::OpenReadOnly(const std::string& why) {
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
    write_state_ = WriteState::kReadOnly;
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

rocksdb::Status RocksSpillStore::CheckFormat() {
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
    // Metadata that lost its instance id (started empty, or rolled back to
    // before it was written) takes the segment files' back, so that they
    // stay this store's and salvage can read them.
    if (const auto kept = ReadSegmentInstance(opts_.path + "/segments")) {
      instance.assign(reinterpret_cast<const char*>(kept->data()), kept->size());
      Note("the metadata had no instance id: took the one its segment files name");
    } else {
      std::random_device rd;
      instance.resize(16);
      for (char& c : instance) c = static_cast<char>(rd());
    }
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

absl::Status RocksSpillStore::OpenSegments() {
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

}  // namespace spill_internal
}  // namespace evoke
