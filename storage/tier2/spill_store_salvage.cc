// Salvage: rebuilding the spill store's records from its payload segments
// after the open found the metadata damaged, and the tombstones that keep
// deleted blocks from coming back (queued, flushed, carried by compaction).
#include "storage/tier2/spill_store_impl.h"

namespace evoke {
namespace spill_internal {
namespace {

// The newest tombstone of a block: every record of it up to `seq` is gone.
struct Kill {
  uint64_t seq = 0;
  SegmentTombstone::Kind kind = SegmentTombstone::kDeleted;
};

// What the segments hold of one block that the metadata lacks.
struct Found {
  std::optional<PayloadLocation> good;  // The newest valid copy (rebuilt or kept).
  bool rebuilt = false;                 // Its record was rebuilt here.
  bool damaged = false;                 // A copy failed its checksum.
  bool unidentified = false;            // A copy had no (usable) identity.
};

}  // namespace

uint64_t RocksSpillStore::ReadWatermark() {
  std::string value;
  uint64_t mark = 0;
  if (db_.db->Get(rocksdb::ReadOptions(), db_.handles[0], kWatermarkKey, &value).ok() &&
      absl::SimpleAtoi(value, &mark)) {
    return mark;
  }
  return 0;
}

rocksdb::Status RocksSpillStore::WriteWatermark() {
  uint64_t mark = 0;
  for (const SegmentInfo& s : log_->Segments()) mark = std::max(mark, s.last_payload_seq);
  if (mark == 0) return rocksdb::Status::OK();
  rocksdb::WriteOptions w;
  w.sync = true;
  return db_.db->Put(w, db_.handles[0], kWatermarkKey, absl::StrCat(mark));
}

std::optional<uint64_t> RocksSpillStore::TailSalvageFrom() {
  const uint64_t mark = std::max(max_record_seq_, ReadWatermark());
  uint64_t newest = 0;
  for (const SegmentInfo& s : log_->Segments()) newest = std::max(newest, s.last_payload_seq);
  if (newest <= mark) return std::nullopt;
  Note(absl::StrCat("the segments hold payload records up to seq ", newest,
                    ", the metadata accounts for those up to ", mark,
                    " (a crash between a payload append and its commit, or a cut WAL): "
                    "salvaging the segments with newer records"));
  return mark;
}

void RocksSpillStore::Salvage(uint64_t above) {
  const absl::Time start = absl::Now();
  SalvageCounts counts;
  counts.ran = true;
  std::vector<SegmentInfo> segments = log_->Segments();
  // Records above `above` are only in segments whose newest record is.
  std::erase_if(segments, [&](const SegmentInfo& s) { return above > 0 && s.max_seq <= above; });

  // 1. Tombstones: record headers only.
  absl::flat_hash_map<BlockId, Kill> kills;
  for (const SegmentInfo& seg : segments) {
    const absl::Status s = log_->ForEachRecord(
        seg.id,
        [&](const SegmentRecord& r, bool) {
          if (!r.tombstone) return absl::OkStatus();
          Kill& k = kills[r.id];
          if (r.kills.seq >= k.seq) k = Kill{r.kills.seq, r.kind};
          return absl::OkStatus();
        },
        /*payloads=*/false);
    if (!s.ok()) {
      ++counts.unreadable_segments;
      Note(absl::StrCat("salvage: segment ", seg.id, " cannot be walked (", s.ToString(),
                        "); what it holds past the damage is not rebuilt"));
    }
  }
  auto killed = [&](const BlockId& id, uint64_t seq) {
    auto it = kills.find(id);
    return it != kills.end() && seq <= it->second.seq;
  };

  // What the metadata says of a block: where its payload is (nullopt: no
  // record, or one without a payload); the record in `record`, its bytes in
  // `value`.
  auto located = [&](const std::string& key, std::string* value,
                     storage::SpillRecord* record) -> std::optional<PayloadLocation> {
    if (!db_.db->Get(rocksdb::ReadOptions(), meta(), key, value).ok() ||
        !record->ParseFromString(*value) || !record->payload_present() ||
        !record->has_location()) {
      return std::nullopt;
    }
    return FromProto(record->location());
  };
  // Its location if that lies in a valid segment.
  auto current = [&](const std::string& key,
                     std::string* value) -> std::optional<PayloadLocation> {
    storage::SpillRecord record;
    std::optional<PayloadLocation> l = located(key, value, &record);
    if (l.has_value() && !log_->Contains(*l)) return std::nullopt;
    return l;
  };

  // 2. Payloads: the newest good copy of each block the metadata lacks
  // (or knows only in an older version) gets its record back.
  absl::flat_hash_map<BlockId, Found> found;
  rocksdb::WriteBatch batch;
  rocksdb::Status written;
  auto commit = [&] {
    if (batch.Count() == 0 || !written.ok()) return;
    written = db_.db->Write(rocksdb::WriteOptions(), &batch);
    batch.Clear();
  };
  std::string value;
  for (const SegmentInfo& seg : segments) {
    const absl::Status s = log_->ForEachRecord(seg.id, [&](const SegmentRecord& r, bool ok) {
      if (r.tombstone || killed(r.id, r.location.seq)) return absl::OkStatus();
      // A tail salvage reads only the segments holding records above
      // `above`, and with them only the tombstones of those records:
      // what lies at or below it the metadata accounts for.
      if (r.location.seq <= above) return absl::OkStatus();
      const std::string key = r.id.ToBytes();
      auto f = found.find(r.id);
      if (f == found.end()) {
        // First copy seen: is the metadata's own at least as new?
        const std::optional<PayloadLocation> have = current(key, &value);
        if (have.has_value() && have->seq >= r.location.seq) {
          // After damage, the records that survived are written again
          // too: into a healthy table (the flush below), where the start-up
          // scan finds them without reading around the corrupt one.
          if (above == 0) batch.Put(meta(), key, value).PermitUncheckedError();
          return absl::OkStatus();
        }
        f = found.emplace(r.id, Found{}).first;
        if (have.has_value()) f->second.good = have;  // Older, valid: a fallback.
      }
      Found& block = f->second;
      if (block.good.has_value() && block.good->seq >= r.location.seq) return absl::OkStatus();
      if (!ok) {
        block.damaged = true;
        return absl::OkStatus();
      }
      storage::SpillRecord record;
      if (r.identity.empty() || !record.ParseFromArray(r.identity.data(), static_cast<int>(r.identity.size())) ||
          record.meta().checksum() != r.checksum ||
          record.meta().payload_bytes() != r.payload.size()) {
        block.unidentified = true;
        return absl::OkStatus();
      }
      EncodeRecord(record, &r.location, &value);
      batch.Put(meta(), key, value).PermitUncheckedError();
      if (block.good.has_value()) log_->RemoveLive(*block.good);
      log_->AddLive(r.location);
      block.good = r.location;
      block.rebuilt = true;
      if (batch.Count() >= 1024) commit();
      return absl::OkStatus();
    });
    if (!s.ok() && s.code() != absl::StatusCode::kNotFound) {
      ++counts.unreadable_segments;
      Note(absl::StrCat("salvage: segment ", seg.id, " cannot be read to its end (",
                        s.ToString(), "); what it holds past the damage is not rebuilt"));
    }
  }
  for (const auto& [id, block] : found) {
    if (block.rebuilt) {
      ++counts.restored;
    } else if (block.good.has_value()) {
      continue;  // The metadata's own copy stays.
    } else if (block.damaged) {
      ++counts.damaged;
    } else if (block.unidentified) {
      ++counts.unidentified;
    }
  }

  // 3. Tombstones against what the metadata kept: a delete or a drop it
  // lost with its damage.
  for (const auto& [id, kill] : kills) {
    auto f = found.find(id);
    if (f != found.end() && f->second.rebuilt) continue;  // Newer than the kill.
    const std::string key = id.ToBytes();
    storage::SpillRecord record;
    const std::optional<PayloadLocation> at = located(key, &value, &record);
    if (!at.has_value() || at->seq > kill.seq) continue;
    const PayloadLocation l = *at;
    if (log_->Contains(l)) log_->RemoveLive(l);
    if (kill.kind == SegmentTombstone::kDeleted) {
      batch.Delete(meta(), key).PermitUncheckedError();
    } else {
      record.set_payload_present(false);
      record.clear_location();
      batch.Put(meta(), key, record.SerializeAsString()).PermitUncheckedError();
    }
    ++counts.removed;
  }
  commit();
  if (written.ok() && (above == 0 || counts.restored > 0 || counts.removed > 0)) {
    // Into a table of their own: a start-up scan that has to read around a
    // corrupt table walks the table files, not the memtable.
    rocksdb::FlushOptions flush;
    flush.wait = true;
    flush.allow_write_stall = true;
    written = db_.db->Flush(flush, meta());
  }
  if (written.ok() && above == 0 && !corrupt_tables_.empty()) {
    written = db_.db->Put(rocksdb::WriteOptions(), db_.handles[0], kSalvagedTablesKey,
                          corrupt_tables_);
  }
  if (written.ok()) written = db_.db->SyncWAL();
  if (written.ok()) written = WriteWatermark();
  std::string note = absl::StrCat(
      "salvage from ", segments.size(), " segment files: ", counts.restored, " records rebuilt, ",
      counts.removed, " removed by tombstones, ", counts.damaged,
      " blocks lost (payload damaged), ", counts.unidentified,
      " lost (no identity record: written before evoked kept one), ",
      counts.unreadable_segments, " segments not walkable to their end; took ",
      absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))));
  if (!written.ok()) {
    absl::StrAppend(&note, "; writing the rebuilt records failed: ", written.ToString(),
                    " (they are rebuilt again at the next start)");
  }
  Note(std::move(note));
  absl::MutexLock lock(&state_mu_);
  salvage_ = counts;
}

bool RocksSpillStore::CarryTombstones(SegmentLog& log, uint64_t segment,
                                      const std::vector<SegmentInfo>& present) {
  absl::flat_hash_set<uint64_t> exists;
  for (const SegmentInfo& s : present) exists.insert(s.id);
  std::vector<SegmentTombstone> carry;
  const absl::Status s = log.ForEachRecord(
      segment,
      [&](const SegmentRecord& r, bool) {
        if (r.tombstone && r.kills.segment != segment && exists.contains(r.kills.segment)) {
          carry.push_back({r.id, r.kills, r.kind});
        }
        return absl::OkStatus();
      },
      /*payloads=*/false);
  if (!s.ok()) {
    EVOKE_LOG_WARNING("spill store: reading the tombstones of segment ", segment,
                      " failed (", s.ToString(), "); it is kept");
    return false;
  }
  if (carry.empty()) return true;
  if (!CheckWritable(0, "tombstones").ok()) return false;
  absl::StatusOr<std::vector<PayloadLocation>> r =
      log.Append({}, SegmentStream::kCompaction, carry);
  if (!r.ok()) {
    AppendFailed(r.status(), "tombstones").IgnoreError();
    return false;
  }
  return true;
}

void RocksSpillStore::FlushTombstonesIdle() {
  absl::MutexLock w(&write_mu_);
  if (pending_tombstones_.empty() || !CheckWritable(0, "tombstones").ok()) return;
  absl::ReaderMutexLock d(&db_mu_);
  if (!CheckOpen().ok()) return;
  FlushTombstones(/*sync=*/true).IgnoreError();
}

}  // namespace spill_internal
}  // namespace evoke
