// The record scans of a start: the segment check (every record's payload
// location, without parsing its metadata), the scan that hands every record
// to the engine's index (decoded on a second thread while the engine indexes
// the previous batch), and the scan that steps around a corrupt block.
#include <deque>
#include <system_error>
#include <thread>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "storage/tier2/spill_store_impl.h"

namespace evoke {
namespace spill_internal {
namespace {

using google::protobuf::internal::WireFormatLite;

// PeekLocation reads payload_present and location from a serialized
// SpillRecord, skipping its metadata. False when the bytes do not parse as
// protobuf fields (the full parse would fail too).
bool PeekLocation(const rocksdb::Slice& bytes, bool* present,
                  std::optional<storage::PayloadLocation>* location) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  *present = false;
  location->reset();
  for (;;) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) return static_cast<size_t>(in.CurrentPosition()) == bytes.size();
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    const auto wire = WireFormatLite::GetTagWireType(tag);
    if (field == storage::SpillRecord::kPayloadPresentFieldNumber &&
        wire == WireFormatLite::WIRETYPE_VARINT) {
      uint64_t v = 0;
      if (!in.ReadVarint64(&v)) return false;
      *present = v != 0;
    } else if (field == storage::SpillRecord::kLocationFieldNumber &&
               wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      // Occurrences of a message field merge, as in a full parse.
      if (!location->has_value()) location->emplace();
      int length = 0;
      if (!in.ReadVarintSizeAsInt(&length)) return false;
      const auto limit = in.PushLimit(length);
      if (!(*location)->MergePartialFromCodedStream(&in) || in.BytesUntilLimit() != 0) {
        return false;
      }
      in.PopLimit(limit);
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return false;
    }
  }
}

// One record of the index scan, decoded.
struct ScanItem {
  BlockId id;
  storage::SpillRecord record;
  bool readable = false;  // False: the key or the value did not parse.
  size_t key_bytes = 0;
};

// Up to kBatch records; a batch goes back to the decoder once visited, so
// that its messages are parsed into again (their allocations reused, and
// freed by the thread that made them).
struct ScanBatch {
  std::vector<ScanItem> items;
  size_t n = 0;  // Items filled.
};

// ScanQueue hands batches of decoded records from the decoding thread to
// the visiting one, a few batches ahead at most, and visited batches back.
class ScanQueue {
 public:
  static constexpr size_t kBatch = 256;
  static constexpr size_t kAhead = 8;

  // TakeEmpty returns a visited batch to fill again, or a new one.
  ScanBatch TakeEmpty() {
    ScanBatch b;
    {
      absl::MutexLock lock(&mu_);
      if (!empty_.empty()) {
        b = std::move(empty_.back());
        empty_.pop_back();
      }
    }
    if (b.items.empty()) b.items.resize(kBatch);
    b.n = 0;
    return b;
  }
  // Push waits for room; false once the consumer cancelled.
  bool Push(ScanBatch batch) {
    absl::MutexLock lock(&mu_);
    auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return cancelled_ || full_.size() < kAhead;
    };
    mu_.Await(absl::Condition(&room));
    if (cancelled_) return false;
    full_.push_back(std::move(batch));
    return true;
  }
  void Finish() {
    absl::MutexLock lock(&mu_);
    finished_ = true;
  }
  // Pop waits for a batch; false once the producer finished and every
  // batch was taken.
  bool Pop(ScanBatch* batch) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return finished_ || !full_.empty();
    };
    mu_.Await(absl::Condition(&ready));
    if (full_.empty()) return false;
    *batch = std::move(full_.front());
    full_.pop_front();
    return true;
  }
  void GiveBack(ScanBatch batch) {
    absl::MutexLock lock(&mu_);
    empty_.push_back(std::move(batch));
  }
  void Cancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }

 private:
  absl::Mutex mu_;
  std::deque<ScanBatch> full_ ABSL_GUARDED_BY(mu_);
  std::vector<ScanBatch> empty_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

std::string UnreadableRecord(size_t key_bytes) {
  return absl::StrCat("unreadable record under key ", key_bytes, " bytes long");
}

}  // namespace

void RocksSpillStore::CheckLocations() {
  if (log_ == nullptr) return;
  rocksdb::ReadOptions options;
  options.fill_cache = false;
  options.verify_checksums = true;
  std::unique_ptr<rocksdb::Iterator> it(db_.db->NewIterator(options, meta()));
  std::vector<std::string> bad;  // Keys.
  bool present = false;
  std::optional<storage::PayloadLocation> location;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (!PeekLocation(it->value(), &present, &location) || !present) continue;
    if (!location.has_value()) {
      if (!format1_payloads_.load()) bad.push_back(it->key().ToString());
      continue;
    }
    const PayloadLocation l = FromProto(*location);
    max_record_seq_ = std::max(max_record_seq_, l.seq);
    if (log_->Contains(l)) {
      log_->AddLive(l);
    } else {
      bad.push_back(it->key().ToString());
    }
  }
  if (!it->status().ok()) {
    segments_removable_ = false;
    salvage_needed_ = true;
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
  storage::SpillRecord r;
  for (const std::string& key : bad) {
    // Read again and parsed whole: few records, and rare.
    value.clear();
    if (!db_.db->Get(options, meta(), key, &value).ok() ||
        !r.ParseFromString(value)) {
      continue;  // The index scan counts it.
    }
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

bool RocksSpillStore::Decode(const rocksdb::Slice& key, const rocksdb::Slice& value,
                             BlockId* id, storage::SpillRecord* record) {
  auto parsed = BlockId::FromBytes(absl::string_view(key.data(), key.size()));
  if (!parsed.ok() || !record->ParseFromArray(value.data(), static_cast<int>(value.size()))) {
    return false;
  }
  *id = *parsed;
  if (record->payload_present()) {
    // A payload that CheckLocations found missing (left as it is on a
    // read-only open), or a format-1 one after the migration finished,
    // is not on disk: the engine sees a breadcrumb.
    const bool readable =
        record->has_location()
            ? log_ != nullptr && log_->Contains(FromProto(record->location()))
            : format1_payloads_.load();
    if (!readable) record->set_payload_present(false);
  }
  return true;
}

absl::Status RocksSpillStore::Visit(const rocksdb::Slice& key, const rocksdb::Slice& value,
                                    const RecordVisitor& visit,
                                    std::vector<std::string>* skipped) {
  BlockId id;
  storage::SpillRecord record;
  if (!Decode(key, value, &id, &record)) {
    if (skipped != nullptr) skipped->push_back(UnreadableRecord(key.size()));
    return absl::OkStatus();
  }
  return visit(id, record);
}

absl::Status RocksSpillStore::ForEachRecord(const RecordVisitor& visit,
                                            std::vector<std::string>* skipped) {
  absl::ReaderMutexLock d(&db_mu_);
  EVOKE_RETURN_IF_ERROR(CheckOpen());
  rocksdb::ReadOptions options;
  options.fill_cache = false;
  options.verify_checksums = true;
  std::unique_ptr<rocksdb::Iterator> it(db_.db->NewIterator(options, meta()));
  std::string last_good;  // The key of the last record read.
  bool any = false;

  // A second thread reads and decodes the records while this one visits
  // them (at start, this is most of what stands between a restart and
  // serving); this thread holds db_mu_ until it has joined.
  ScanQueue queue;
  auto produce = [&] {
    ScanBatch batch = queue.TakeEmpty();
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      ScanItem& item = batch.items[batch.n++];
      item.readable = Decode(it->key(), it->value(), &item.id, &item.record);
      item.key_bytes = it->key().size();
      last_good.assign(it->key().data(), it->key().size());
      any = true;
      if (batch.n == ScanQueue::kBatch) {
        if (!queue.Push(std::move(batch))) break;
        batch = queue.TakeEmpty();
      }
    }
    if (batch.n > 0) queue.Push(std::move(batch));
    queue.Finish();
  };
  absl::Status visited;
  std::thread decoder;
  try {
    decoder = std::thread(produce);
  } catch (const std::system_error&) {
    // No thread to be had: decode and visit each record in turn.
    for (it->SeekToFirst(); it->Valid() && visited.ok(); it->Next()) {
      last_good.assign(it->key().data(), it->key().size());
      any = true;
      visited = Visit(it->key(), it->value(), visit, skipped);
    }
    queue.Finish();
  }
  ScanBatch batch;
  while (visited.ok() && queue.Pop(&batch)) {
    for (size_t i = 0; i < batch.n && visited.ok(); ++i) {
      ScanItem& item = batch.items[i];
      if (item.readable) {
        visited = visit(item.id, item.record);
      } else if (skipped != nullptr) {
        skipped->push_back(UnreadableRecord(item.key_bytes));
      }
    }
    queue.GiveBack(std::move(batch));
  }
  if (!visited.ok()) queue.Cancel();
  if (decoder.joinable()) decoder.join();
  EVOKE_RETURN_IF_ERROR(visited);
  if (it->status().ok()) return absl::OkStatus();
  if (!it->status().IsCorruption()) return ToAbsl(it->status(), "scan");
  // A corrupt block: read around it.
  EVOKE_LOG_ERROR("spill store: the start-up scan met a corrupt block after ",
                  any ? "the first records" : "no record", ": ", it->status().ToString(),
                  "; reading around it");
  return ScanAroundCorruption(any ? &last_good : nullptr, visit, skipped);
}

absl::Status RocksSpillStore::ScanAroundCorruption(const std::string* after,
                                                   const RecordVisitor& visit,
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

}  // namespace spill_internal
}  // namespace evoke
