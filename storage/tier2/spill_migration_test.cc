// Migration of a format-1 data dir (payloads in RocksDB's "payload" column
// family, with blob files) to format 2 (payloads in segment files). The
// format-1 dir is written here with RocksDB directly, as evoked up to
// format 1 wrote it.
#include <filesystem>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checksum.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "storage/tier2/fault_env.h"
#include "storage/spill_record.pb.h"
#include "storage/tier2/spill_store.h"
#include "testing/blocks.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke {
namespace {

namespace fs = std::filesystem;
using ::evoke::testing::StatusIs;

// WriteFormat1 creates a format-1 store in `path` holding `payloads`
// (block i: BlockId(5, i)), and returns after closing it. Every third block
// is a breadcrumb (record, no payload).
void WriteFormat1(const std::string& path, const std::map<uint64_t, std::string>& payloads) {
  rocksdb::DBOptions db;
  db.create_if_missing = true;
  db.create_missing_column_families = true;
  rocksdb::ColumnFamilyOptions payload_options;
  payload_options.enable_blob_files = true;
  payload_options.min_blob_size = 4096;
  payload_options.compression = rocksdb::kNoCompression;
  std::vector<rocksdb::ColumnFamilyDescriptor> families = {
      {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()},
      {"meta", rocksdb::ColumnFamilyOptions()},
      {"payload", payload_options}};
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  ASSERT_TRUE(rocksdb::DB::Open(db, path, families, &handles, &raw).ok());
  std::unique_ptr<rocksdb::DB> d(raw);
  rocksdb::WriteOptions w;
  w.sync = true;
  ASSERT_TRUE(d->Put(w, handles[0], "evoke.format", "1").ok());
  for (const auto& [n, p] : payloads) {
    storage::SpillRecord r;
    r.mutable_meta()->set_checksum(PayloadChecksum(p.data(), p.size()));
    r.mutable_meta()->set_payload_bytes(p.size());
    r.set_payload_present(n % 3 != 2);
    const std::string key = BlockId(5, n).ToBytes();
    rocksdb::WriteBatch batch;
    ASSERT_TRUE(batch.Put(handles[1], key, r.SerializeAsString()).ok());
    if (r.payload_present()) {
      ASSERT_TRUE(batch.Put(handles[2], key, p).ok());
    }
    ASSERT_TRUE(d->Write(w, &batch).ok());
  }
  ASSERT_TRUE(d->Flush(rocksdb::FlushOptions(), handles).ok());
  for (auto* h : handles) ASSERT_TRUE(d->DestroyColumnFamilyHandle(h).ok());
  ASSERT_TRUE(d->Close().ok());
}

class SpillMigrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (uint64_t n = 0; n < 60; ++n) {
      payloads_[n] = evoke::testing::Payload(n, n % 2 == 0 ? 700 + n : 70000 + n);
    }
    WriteFormat1(path_, payloads_);
  }
  absl::StatusOr<std::unique_ptr<SpillStore>> Open(uint64_t reserve = 1) {
    SpillStoreOptions options;
    options.path = path_;
    options.reserve_bytes = reserve;
    options.faults = faults_;
    return SpillStore::Open(options);
  }
  // Every block reads back exactly (checksum verified as the engine does),
  // breadcrumbs are NOT_FOUND.
  void ExpectAllReadable(SpillStore* store) {
    for (const auto& [n, p] : payloads_) {
      std::string got;
      const absl::Status s =
          store->Read(BlockId(5, n), [&](const storage::SpillRecord& r, absl::string_view v) {
            if (PayloadChecksum(v.data(), v.size()) != r.meta().checksum()) {
              return absl::DataLossError("checksum");
            }
            got.assign(v.data(), v.size());
            return absl::OkStatus();
          });
      if (n % 3 == 2) {
        EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound)) << n;
      } else {
        ASSERT_OK(s) << n;
        EXPECT_EQ(got, p) << n;
      }
    }
  }
  // Records that still have no location (format 1).
  int Unmoved(SpillStore* store) {
    int unmoved = 0;
    EXPECT_OK(store->ForEachRecord(
        [&](const BlockId&, storage::SpillRecord r) {
          unmoved += r.payload_present() && !r.has_location();
          return absl::OkStatus();
        },
        nullptr));
    return unmoved;
  }
  static std::string Notes(const SpillStore& store) {
    return absl::StrJoin(store.Health().recovery, " | ");
  }

  evoke::testing::TempDir dir_;
  const std::string path_ = dir_.Join("db");
  std::shared_ptr<DiskFaults> faults_ = std::make_shared<DiskFaults>();
  std::map<uint64_t, std::string> payloads_;
};

TEST_F(SpillMigrationTest, Format1DirIsMigratedAtOpen) {
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<SpillStore> store, Open());
    EXPECT_NE(Notes(*store).find("moved 40 format-1 payloads"), std::string::npos)
        << Notes(*store);
    EXPECT_EQ(Unmoved(store.get()), 0);
    ExpectAllReadable(store.get());
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SpillStore> store, Open());
  EXPECT_EQ(Notes(*store).find("format-1"), std::string::npos) << Notes(*store);
  ExpectAllReadable(store.get());
  // New writes and deletes work on the migrated dir.
  const std::string p = evoke::testing::Payload(99, 5000);
  storage::SpillRecord r;
  r.mutable_meta()->set_checksum(PayloadChecksum(p.data(), p.size()));
  r.mutable_meta()->set_payload_bytes(p.size());
  const SpillWrite w[] = {{BlockId(5, 99), &r, p}};
  ASSERT_OK(store->Put(w, true));
  const BlockId ids[] = {BlockId(5, 0)};
  ASSERT_OK(store->Delete(ids));
  payloads_.erase(0);
  payloads_[99] = p;
  ExpectAllReadable(store.get());
}

// Without room for the payloads' copies the migration waits: the store
// opens, every block stays readable where it is, and a later open with room
// moves them.
TEST_F(SpillMigrationTest, WithoutRoomPayloadsStayReadableAndMoveLater) {
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<SpillStore> store, Open(/*reserve=*/1ull << 62));
    EXPECT_NE(Notes(*store).find("stay in the payload column family"), std::string::npos)
        << Notes(*store);
    EXPECT_EQ(Unmoved(store.get()), 40);
    ExpectAllReadable(store.get());
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SpillStore> store, Open());
  EXPECT_EQ(Unmoved(store.get()), 0);
  ExpectAllReadable(store.get());
}

// A migration cut short (here the disk fills up after a few batches; a
// crash leaves the same state: each batch is committed with sync) resumes
// at the next open; nothing is lost or served wrong in between.
TEST_F(SpillMigrationTest, InterruptedMigrationResumes) {
  faults_->NoSpaceAfter(300 << 10);
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<SpillStore> store, Open());
    EXPECT_NE(Notes(*store).find("stopped after"), std::string::npos) << Notes(*store);
    const int unmoved = Unmoved(store.get());
    EXPECT_GT(unmoved, 0);
    faults_->Clear();
    ExpectAllReadable(store.get());
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SpillStore> store, Open());
  EXPECT_EQ(Unmoved(store.get()), 0);
  ExpectAllReadable(store.get());
}

TEST_F(SpillMigrationTest, UnknownFormatIsRefusedWithTheReason) {
  {
    rocksdb::DBOptions db;
    std::vector<rocksdb::ColumnFamilyDescriptor> families = {
        {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()},
        {"meta", rocksdb::ColumnFamilyOptions()},
        {"payload", rocksdb::ColumnFamilyOptions()}};
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(db, path_, families, &handles, &raw).ok());
    ASSERT_TRUE(raw->Put(rocksdb::WriteOptions(), handles[0], "evoke.format", "7").ok());
    for (auto* h : handles) ASSERT_TRUE(raw->DestroyColumnFamilyHandle(h).ok());
    delete raw;
  }
  EXPECT_THAT(Open().status(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                        ::testing::HasSubstr("spill format '7'")));
}

}  // namespace
}  // namespace evoke
