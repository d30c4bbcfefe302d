#include "storage/spill_store.h"

#include <filesystem>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/table.h"
#include "rocksdb/utilities/options_util.h"
#include "rocksdb/write_batch.h"
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

class RocksSpillStore final : public SpillStore {
 public:
  RocksSpillStore(std::unique_ptr<rocksdb::DB> db,
                  std::vector<rocksdb::ColumnFamilyHandle*> handles, bool sync)
      : db_(std::move(db)), handles_(std::move(handles)), sync_(sync) {}

  ~RocksSpillStore() override {
    for (rocksdb::ColumnFamilyHandle* h : handles_) {
      db_->DestroyColumnFamilyHandle(h);
    }
    db_->Close();
  }

  absl::Status Put(absl::Span<const SpillWrite> writes, bool sync) override {
    rocksdb::WriteBatch batch;
    std::string value;
    for (const SpillWrite& w : writes) {
      const std::string key = w.id.ToBytes();
      storage::SpillRecord record = *w.record;
      record.set_payload_present(!w.payload.empty());
      value.clear();
      record.SerializeToString(&value);
      EVOKE_ROCKS_CHECK(batch.Put(meta(), key, value), "batch");
      if (!w.payload.empty()) {
        EVOKE_ROCKS_CHECK(batch.Put(payload(), key, ToSlice(w.payload)), "batch");
      } else {
        EVOKE_ROCKS_CHECK(batch.Delete(payload(), key), "batch");
      }
    }
    return Write(&batch, sync, "write");
  }

  absl::Status DropPayloads(absl::Span<const SpillWrite> breadcrumbs) override {
    rocksdb::WriteBatch batch;
    std::string value;
    for (const SpillWrite& w : breadcrumbs) {
      const std::string key = w.id.ToBytes();
      storage::SpillRecord record = *w.record;
      record.set_payload_present(false);
      value.clear();
      record.SerializeToString(&value);
      EVOKE_ROCKS_CHECK(batch.Put(meta(), key, value), "batch");
      EVOKE_ROCKS_CHECK(batch.Delete(payload(), key), "batch");
    }
    return Write(&batch, false, "drop payloads");
  }

  absl::Status Delete(absl::Span<const BlockId> ids) override {
    rocksdb::WriteBatch batch;
    for (const BlockId& id : ids) {
      const std::string key = id.ToBytes();
      EVOKE_ROCKS_CHECK(batch.Delete(meta(), key), "batch");
      EVOKE_ROCKS_CHECK(batch.Delete(payload(), key), "batch");
    }
    return Write(&batch, false, "delete");
  }

  absl::Status Read(const BlockId& id,
                    const std::function<absl::Status(
                        const storage::SpillRecord&, absl::string_view)>& consume)
      override {
    const std::string key = id.ToBytes();
    const rocksdb::Snapshot* snapshot = db_->GetSnapshot();
    rocksdb::ReadOptions options;
    options.snapshot = snapshot;
    options.verify_checksums = true;
    rocksdb::PinnableSlice meta_value;
    rocksdb::PinnableSlice payload_value;
    rocksdb::Status s = db_->Get(options, meta(), key, &meta_value);
    if (s.ok()) s = db_->Get(options, payload(), key, &payload_value);
    db_->ReleaseSnapshot(snapshot);
    if (s.IsNotFound()) {
      return absl::NotFoundError(
          absl::StrCat("block ", id.ToHex(), " has no payload on disk"));
    }
    if (!s.ok()) return ToAbsl(s, "read");
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
    rocksdb::ReadOptions options;
    options.fill_cache = false;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(options, meta()));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      auto id = BlockId::FromBytes(
          absl::string_view(it->key().data(), it->key().size()));
      storage::SpillRecord record;
      if (!id.ok() || !record.ParseFromArray(it->value().data(),
                                             static_cast<int>(it->value().size()))) {
        if (skipped != nullptr) {
          skipped->push_back(absl::StrCat(
              "unreadable record under key ",
              absl::string_view(it->key().data(), it->key().size()).size(),
              " bytes long"));
        }
        continue;
      }
      absl::Status s = visit(*id, std::move(record));
      if (!s.ok()) return s;
    }
    return ToAbsl(it->status(), "scan");
  }

  uint64_t UsedBytes() override {
    uint64_t total = 0;
    for (rocksdb::ColumnFamilyHandle* h : handles_) {
      uint64_t v = 0;
      if (db_->GetIntProperty(h, rocksdb::DB::Properties::kTotalSstFilesSize, &v)) {
        total += v;
      }
      if (db_->GetIntProperty(h, rocksdb::DB::Properties::kTotalBlobFileSize, &v)) {
        total += v;
      }
    }
    return total;
  }

  absl::Status Persist() override {
    EVOKE_ROCKS_CHECK(db_->SyncWAL(), "sync");
    rocksdb::FlushOptions options;
    options.wait = true;
    options.allow_write_stall = true;
    return ToAbsl(db_->Flush(options, {meta(), payload()}), "flush");
  }

 private:
  rocksdb::ColumnFamilyHandle* meta() const { return handles_[1]; }
  rocksdb::ColumnFamilyHandle* payload() const { return handles_[2]; }

  absl::Status Write(rocksdb::WriteBatch* batch, bool sync,
                     absl::string_view what) {
    rocksdb::WriteOptions options;
    options.sync = sync || sync_;
    return ToAbsl(db_->Write(options, batch), what);
  }

  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;  // default, meta, payload
  const bool sync_;
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

  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  db_options.max_background_jobs = 2;
  db_options.bytes_per_sync = 1 << 20;
  db_options.max_total_wal_size = 512ull << 20;
  db_options.info_log_level = rocksdb::WARN_LEVEL;
  db_options.keep_log_file_num = 4;

  std::shared_ptr<rocksdb::Cache> cache =
      rocksdb::NewLRUCache(opts.block_cache_bytes);
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = cache;
  table.cache_index_and_filter_blocks = true;

  rocksdb::ColumnFamilyOptions meta_options;
  meta_options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  meta_options.OptimizeForPointLookup(opts.block_cache_bytes >> 20);

  rocksdb::ColumnFamilyOptions payload_options;
  payload_options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  payload_options.enable_blob_files = true;
  payload_options.min_blob_size = opts.min_blob_bytes;
  payload_options.blob_file_size = opts.blob_file_bytes;
  payload_options.enable_blob_garbage_collection = true;
  payload_options.blob_garbage_collection_age_cutoff = 0.25;
  // KV tensors do not compress; do not spend CPU trying.
  payload_options.compression = rocksdb::kNoCompression;
  payload_options.blob_compression_type = rocksdb::kNoCompression;
  payload_options.write_buffer_size = 64ull << 20;

  std::vector<rocksdb::ColumnFamilyDescriptor> families = {
      {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()},
      {kMetaFamily, meta_options},
      {kPayloadFamily, payload_options},
  };
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s =
      rocksdb::DB::Open(db_options, opts.path, families, &handles, &raw);
  if (!s.ok()) {
    if (s.IsIOError() && s.ToString().find("lock") != std::string::npos) {
      return absl::UnavailableError(absl::StrCat(
          "data_dir: ", opts.path,
          " is in use by another evoked (RocksDB lock held): ", s.ToString()));
    }
    return ToAbsl(s, absl::StrCat("open ", opts.path));
  }
  std::unique_ptr<rocksdb::DB> db(raw);

  std::string format;
  s = db->Get(rocksdb::ReadOptions(), handles[0], kFormatKey, &format);
  if (s.IsNotFound()) {
    rocksdb::WriteOptions w;
    w.sync = true;
    s = db->Put(w, handles[0], kFormatKey, kFormatVersion);
    format = kFormatVersion;
  }
  if (!s.ok() || format != kFormatVersion) {
    absl::Status err =
        s.ok() ? absl::FailedPreconditionError(absl::StrCat(
                     "data_dir: ", opts.path, " holds spill format '", format,
                     "', this evoked reads format ", kFormatVersion))
               : ToAbsl(s, "format check");
    for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
    db->Close();
    return err;
  }
  return std::unique_ptr<SpillStore>(
      new RocksSpillStore(std::move(db), std::move(handles), opts.sync));
}

}  // namespace evoke
