// The maintenance thread: resuming writes once space returns or the device
// recovers (reopening read-write a store opened read-only).
#include "storage/tier2/spill_store_impl.h"

namespace evoke {
namespace spill_internal {

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
