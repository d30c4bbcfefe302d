// Format-1 payloads (kept in the payload column family) moved into segment
// files, and MoveBatch, which migration and compaction share.
#include "storage/tier2/spill_store_impl.h"

namespace evoke {
namespace spill_internal {

absl::Status RocksSpillStore::ReadFormat1(
    const BlockId& id, const std::string& key, const storage::SpillRecord& record,
    const std::function<absl::Status(const storage::SpillRecord&, absl::string_view)>&
        consume) {
  if (!format1_payloads_.load()) return NoPayload(id);
  rocksdb::ReadOptions options;
  options.verify_checksums = true;
  rocksdb::PinnableSlice value;
  const rocksdb::Status s = db_.db->Get(options, payload(), key, &value);
  if (s.IsNotFound()) return NoPayload(id);
  if (!s.ok()) return ToAbsl(s, "read");
  return consume(record, absl::string_view(value.data(), value.size()));
}

absl::Status RocksSpillStore::MoveBatch(std::vector<MoveItem>* items, absl::string_view what,
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
  std::vector<std::string> identities(items->size());
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
    SerializeBase(r, &identities[i]);
    appends.push_back({m.id, m.payload, m.checksum, identities[i]});
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

void RocksSpillStore::MigrateFormat1(bool at_open) {
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

}  // namespace spill_internal
}  // namespace evoke
