// The spill store's data operations (Put, DropPayloads, Delete, Read,
// Sync, Persist, Health) and SpillStore::Open. The other concerns are in
// spill_store_{open,scan,migration,compaction,maintenance,salvage}.cc;
// the class is in spill_store_impl.h.
#include "storage/tier2/spill_store_impl.h"

namespace evoke {
namespace spill_internal {

absl::Status RocksSpillStore::Put(absl::Span<const SpillWrite> writes, bool sync) {
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

  // Each record serialized once: the identity written before its payload
  // (salvage rebuilds the record from it), then, with its location, the
  // record committed to RocksDB.
  std::vector<std::string> bases(writes.size());
  std::vector<SegmentAppend> appends;
  for (size_t i = 0; i < writes.size(); ++i) {
    const SpillWrite& w = writes[i];
    SerializeBase(*w.record, &bases[i]);
    if (!w.payload.empty()) {
      appends.push_back({w.id, w.payload, w.record->meta().checksum(), bases[i]});
    }
  }
  std::vector<PayloadLocation> placed;
  if (!appends.empty()) {
    // Tombstones whose own write failed earlier go with this one.
    absl::StatusOr<std::vector<PayloadLocation>> r =
        log_->Append(appends, SegmentStream::kHot, pending_tombstones_);
    if (!r.ok()) return AppendFailed(r.status(), "write");
    pending_tombstones_.clear();
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
    value = std::move(bases[i]);
    AppendPresence(where[i], &value);
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
  // A breadcrumb written over a payload: that payload must not come back.
  std::vector<SegmentTombstone> dropped;
  for (size_t i = 0, k = 0; i < writes.size(); ++i) {
    if (writes[i].fresh) continue;
    if (writes[i].payload.empty() && old[k].has_value()) {
      dropped.push_back({writes[i].id, *old[k], SegmentTombstone::kDropped});
    }
    ++k;
  }
  WriteTombstones(dropped);
  return absl::OkStatus();
}

absl::Status RocksSpillStore::DropPayloads(absl::Span<const SpillWrite> breadcrumbs) {
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
  Retire(ids, old, SegmentTombstone::kDropped);
  return absl::OkStatus();
}

absl::Status RocksSpillStore::Delete(absl::Span<const BlockId> ids) {
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
  Retire(ids, old, SegmentTombstone::kDeleted);
  return absl::OkStatus();
}

absl::Status RocksSpillStore::Read(const BlockId& id,
                  const std::function<absl::Status(
                      const storage::SpillRecord&, absl::string_view)>& consume) {
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

uint64_t RocksSpillStore::UsedBytes() {
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

absl::Status RocksSpillStore::Sync() { return MakeDurable(/*flush=*/false); }

absl::Status RocksSpillStore::Persist() { return MakeDurable(/*flush=*/true); }

absl::Status RocksSpillStore::MakeDurable(bool flush) {
  absl::MutexLock w(&write_mu_);
  EVOKE_RETURN_IF_ERROR(CheckWritable(0, "sync"));
  absl::ReaderMutexLock d(&db_mu_);
  EVOKE_RETURN_IF_ERROR(CheckOpen());
  EVOKE_RETURN_IF_ERROR(FlushTombstones(/*sync=*/true));
  // Tombstones written without fdatasync (WriteTombstones) become durable
  // with the delete they stand for.
  if (log_ != nullptr) {
    if (absl::Status t = log_->SyncActive(SegmentStream::kHot); !t.ok()) {
      return AppendFailed(t, "sync");
    }
  }
  // Never sync a WAL that failed an append: CheckWritable refused above
  // if any write failed since the last resume.
  rocksdb::Status s = db_.db->SyncWAL();
  if (s.ok() && flush) {
    rocksdb::FlushOptions options;
    options.wait = true;
    options.allow_write_stall = true;
    s = db_.db->Flush(options, {meta(), payload()});
  }
  if (!s.ok()) Stop(s, "sync");
  return ToAbsl(s, flush ? "flush" : "sync");
}

SpillStoreHealth RocksSpillStore::Health() const {
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
    h.quarantined_segments = st.quarantined_segments;
    h.segment_bytes_written = st.bytes_written;
    h.segment_payload_bytes = st.payload_bytes;
    h.direct_io = st.direct_io;
  }
  absl::MutexLock lock(&state_mu_);
  h.writable = write_state_ == WriteState::kWritable;
  h.reason = stop_reason_;
  h.opened_read_only = write_state_ == WriteState::kReadOnly;
  h.write_failures = write_failures_;
  h.refused_writes = refused_writes_;
  h.resumes = resumes_;
  h.last_outage = last_outage_;
  h.corrupt_files = corrupt_files_ + listener_->corrupt_compactions.load();
  h.unreadable_records = unreadable_records_;
  h.quarantined = store_quarantined_;
  h.salvage = salvage_;
  h.recovery = recovery_;
  return h;
}

void RocksSpillStore::SerializeBase(const storage::SpillRecord& record, std::string* out) {
  out->clear();
  if (record.has_location()) {
    storage::SpillRecord copy = record;
    copy.clear_location();
    copy.SerializeToString(out);
  } else {
    record.SerializeToString(out);
  }
}

void RocksSpillStore::AppendPresence(const PayloadLocation* where, std::string* out) {
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

void RocksSpillStore::EncodeRecord(const storage::SpillRecord& record, const PayloadLocation* where,
                                   std::string* out) {
  SerializeBase(record, out);
  AppendPresence(where, out);
}

void RocksSpillStore::Retire(absl::Span<const BlockId> ids,
                             absl::Span<const std::optional<PayloadLocation>> old,
                             SegmentTombstone::Kind kind) {
  std::vector<SegmentTombstone> tombstones;
  for (size_t i = 0; i < old.size(); ++i) {
    if (!old[i].has_value()) continue;
    log_->RemoveLive(*old[i]);
    tombstones.push_back({ids[i], *old[i], kind});
  }
  WriteTombstones(tombstones);
}

void RocksSpillStore::WriteTombstones(absl::Span<const SegmentTombstone> tombstones) {
  if (tombstones.empty()) return;
  pending_tombstones_.insert(pending_tombstones_.end(), tombstones.begin(), tombstones.end());
  const absl::Status s = FlushTombstones(/*sync=*/false);
  if (!s.ok()) {
    EVOKE_LOG_WARNING("spill store: writing ", pending_tombstones_.size(),
                      " tombstones failed (kept in memory, written with the next append): ",
                      s.ToString());
  }
}

absl::Status RocksSpillStore::FlushTombstones(bool sync) {
  if (pending_tombstones_.empty() || log_ == nullptr) return absl::OkStatus();
  absl::StatusOr<std::vector<PayloadLocation>> r =
      log_->Append({}, SegmentStream::kHot, pending_tombstones_, sync);
  if (!r.ok()) return AppendFailed(r.status(), "tombstones");
  pending_tombstones_.clear();
  return absl::OkStatus();
}

absl::Status RocksSpillStore::CommitLocked(rocksdb::WriteBatch* batch, bool sync,
                                          absl::string_view what) {
  rocksdb::WriteOptions options;
  options.sync = sync || opts_.sync;
  PhaseTimer timer(Phase::kRocksDb);
  const rocksdb::Status s = db_.db->Write(options, batch);
  if (!s.ok()) Stop(s, what);
  return ToAbsl(s, what);
}

absl::Status RocksSpillStore::AppendFailed(const absl::Status& s, absl::string_view what) {
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

std::vector<std::optional<PayloadLocation>> RocksSpillStore::Locations(
    absl::Span<const BlockId> ids) {
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

absl::Status RocksSpillStore::CheckWritable(uint64_t adds, absl::string_view what) {
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
    if (write_state_ == WriteState::kStoppedFailed) return absl::UnavailableError(stop_reason_);
    return absl::ResourceExhaustedError(stop_reason_);
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

void RocksSpillStore::Stop(const rocksdb::Status& s, absl::string_view what) {
  absl::MutexLock lock(&state_mu_);
  ++write_failures_;
  if (write_state_ != WriteState::kWritable) return;
  const bool no_space = IsNoSpace(s);
  write_state_ = no_space ? WriteState::kStoppedNoSpace : WriteState::kStoppedFailed;
  stopped_at_ = absl::Now();
  stop_reason_ = absl::StrCat(
      "spill store is not accepting writes: ", what, " failed (", s.ToString(), "); ",
      no_space ? "the data dir is full; writes resume when space returns"
               : "writes resume when the device recovers");
  EVOKE_LOG_ERROR(stop_reason_);
}

}  // namespace spill_internal

using spill_internal::RocksSpillStore;
using spill_internal::SpaceOf;

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
