// The maintenance thread: resuming writes once space returns or the device
// recovers (reopening read-write a store opened read-only), and the record
// scans that step around damage.
#include "storage/tier2/spill_store_impl.h"

namespace evoke {
namespace spill_internal {

absl::Status RocksSpillStore::Visit(const rocksdb::Slice& key, const rocksdb::Slice& value,
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

absl::Status RocksSpillStore::ScanAroundCorruption(
    const std::string* after,
    const std::function<absl::Status(const BlockId&, storage::SpillRecord)>& visit,
    std::vector<std::string>* skipped) {
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

void RocksSpillStore::Maintain() {
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
    FlushTombstonesIdle();
    CompactSegments();
  }
}

void RocksSpillStore::TryResume() {
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
    read_only = write_state_ == WriteState::kReadOnly;
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
      write_state_ = WriteState::kReopening;
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
        write_state_ = WriteState::kReadOnly;
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
  write_state_ = WriteState::kWritable;
  ++resumes_;
  EVOKE_LOG_INFO("spill store: writes resumed after ", absl::FormatDuration(last_outage_),
                 read_only ? " (reopened read-write)" : "");
  stop_reason_.clear();
}

}  // namespace spill_internal
}  // namespace evoke
