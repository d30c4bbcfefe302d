// Segment compaction (live payloads of mostly-dead segments moved to the
// compaction stream) and the periodic check of RocksDB's tables.
#include "storage/tier2/spill_store_impl.h"

#include "absl/strings/str_join.h"

namespace evoke {
namespace spill_internal {

void RocksSpillStore::CompactSegments() {
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
      if (s.may_hold_tombstones && !CarryTombstones(*log, s.id, segments)) continue;
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

std::string RocksSpillStore::VerifyTables() {
  std::vector<std::string> corrupt;
  std::vector<rocksdb::LiveFileMetaData> files;
  db_.db->GetLiveFilesMetaData(&files);
  const rocksdb::Options reader_options = config_.MetaReaderOptions();
  for (const rocksdb::LiveFileMetaData& f : files) {
    rocksdb::SstFileReader reader(reader_options);
    const std::string path = f.db_path + f.name;
    rocksdb::Status s = reader.Open(path);
    if (s.ok()) s = reader.VerifyChecksum();
    if (s.ok()) continue;
    corrupt.push_back(f.name);
    absl::MutexLock lock(&state_mu_);
    ++corrupt_files_;
    const std::string note = absl::StrCat(
        "SST file ", path, " (column family ", f.column_family_name,
        ") is corrupt: ", s.ToString(), "; its records are unreadable and never served");
    recovery_.push_back(note);
    EVOKE_LOG_ERROR("spill store: ", note);
  }
  std::sort(corrupt.begin(), corrupt.end());
  return absl::StrJoin(corrupt, ",");
}

}  // namespace spill_internal
}  // namespace evoke
