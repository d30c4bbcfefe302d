#include "storage/tier2/spill_store.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/checksum.h"
#include "storage/tier2/fault_env.h"
#include "storage/spill_record.pb.h"
#include "testing/blocks.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;

storage::SpillRecord Record(uint64_t checksum, uint64_t bytes) {
  storage::SpillRecord r;
  r.mutable_meta()->set_checksum(checksum);
  r.mutable_meta()->set_payload_bytes(bytes);
  r.mutable_meta()->set_session_id("s");
  r.set_last_access_unix_ms(42);
  return r;
}

class SpillStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<SpillStore> Open() {
    SpillStoreOptions options;
    options.path = dir_.Join("db");
    auto store = SpillStore::Open(options);
    EXPECT_TRUE(store.ok()) << store.status();
    return std::move(store).value();
  }

  std::string ReadPayload(SpillStore* store, const BlockId& id,
                          absl::Status* status) {
    std::string out;
    *status = store->Read(id, [&](const storage::SpillRecord&,
                                  absl::string_view payload) {
      out.assign(payload.data(), payload.size());
      return absl::OkStatus();
    });
    return out;
  }

  evoke::testing::TempDir dir_;
};

TEST_F(SpillStoreTest, PutReadDropDelete) {
  auto store = Open();
  const std::string big(100000, 'x');
  const storage::SpillRecord r1 = Record(1, big.size());
  const storage::SpillRecord r2 = Record(2, 3);
  const SpillWrite writes[] = {{BlockId(0, 1), &r1, big},
                               {BlockId(0, 2), &r2, "abc"}};
  ASSERT_OK(store->Put(writes, /*sync=*/false));

  absl::Status s;
  EXPECT_EQ(ReadPayload(store.get(), BlockId(0, 1), &s), big);
  EXPECT_OK(s);
  EXPECT_EQ(ReadPayload(store.get(), BlockId(0, 2), &s), "abc");
  EXPECT_OK(s);
  ReadPayload(store.get(), BlockId(0, 3), &s);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound));

  const SpillWrite crumbs[] = {{BlockId(0, 1), &r1, {}}};
  ASSERT_OK(store->DropPayloads(crumbs));
  ReadPayload(store.get(), BlockId(0, 1), &s);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound));

  std::vector<std::pair<BlockId, bool>> seen;
  ASSERT_OK(store->ForEachRecord(
      [&](const BlockId& id, storage::SpillRecord r) {
        seen.emplace_back(id, r.payload_present());
        EXPECT_EQ(r.last_access_unix_ms(), 42);
        return absl::OkStatus();
      },
      nullptr));
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], std::make_pair(BlockId(0, 1), false));
  EXPECT_EQ(seen[1], std::make_pair(BlockId(0, 2), true));

  const BlockId gone[] = {BlockId(0, 2)};
  ASSERT_OK(store->Delete(gone));
  ReadPayload(store.get(), BlockId(0, 2), &s);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound));
}

// The scan decodes on a second thread, batches ahead of the visits: every
// record comes once, in id order, on the calling thread, also across a
// reopen (the scan of the start) and when the visitor moves what it keeps;
// a visit error stops the scan while the decoder waits for room, and is
// returned.
TEST_F(SpillStoreTest, ScanVisitsEveryRecordInIdOrderAndStopsAtAnError) {
  constexpr uint64_t kBlocks = 5000;  // Many batches of the decoder's.
  {
    auto store = Open();
    std::vector<storage::SpillRecord> records;
    std::vector<std::string> payloads;
    records.reserve(kBlocks);
    payloads.reserve(kBlocks);
    std::vector<SpillWrite> writes;
    for (uint64_t i = 0; i < kBlocks; ++i) {
      payloads.push_back(absl::StrCat("payload ", i));
      records.push_back(Record(i, payloads.back().size()));
      // Ids out of order: the store sorts them.
      writes.push_back({BlockId(0, (i * 7919) % kBlocks), &records.back(), payloads.back()});
    }
    ASSERT_OK(store->Put(writes, /*sync=*/true));
  }
  auto store = Open();
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<uint64_t> seen;
  std::vector<v1::BlockMeta> kept;
  ASSERT_OK(store->ForEachRecord(
      [&](const BlockId& id, storage::SpillRecord& r) {
        EXPECT_EQ(std::this_thread::get_id(), caller);
        EXPECT_TRUE(r.payload_present());
        seen.push_back(id.lo());
        kept.push_back(std::move(*r.mutable_meta()));
        return absl::OkStatus();
      },
      nullptr));
  ASSERT_EQ(seen.size(), kBlocks);
  for (uint64_t i = 0; i < kBlocks; ++i) {
    ASSERT_EQ(seen[i], i);
    // Record(checksum) was written under id (checksum * 7919) % kBlocks.
    EXPECT_EQ(kept[i].checksum() * 7919 % kBlocks, i);
  }

  uint64_t visits = 0;
  EXPECT_THAT(store->ForEachRecord(
                  [&](const BlockId&, storage::SpillRecord&) {
                    return ++visits == 10 ? absl::AbortedError("enough") : absl::OkStatus();
                  },
                  nullptr),
              StatusIs(absl::StatusCode::kAborted));
  EXPECT_EQ(visits, 10u);
  // The store still serves after a scan was cut short.
  absl::Status s;
  EXPECT_EQ(ReadPayload(store.get(), BlockId(0, 0), &s), "payload 0");
  EXPECT_OK(s);
}

TEST_F(SpillStoreTest, SurvivesReopen) {
  const storage::SpillRecord r = Record(7, 5);
  {
    auto store = Open();
    const SpillWrite writes[] = {{BlockId(9, 9), &r, "hello"}};
    ASSERT_OK(store->Put(writes, /*sync=*/true));
  }
  auto store = Open();
  absl::Status s;
  EXPECT_EQ(ReadPayload(store.get(), BlockId(9, 9), &s), "hello");
  EXPECT_OK(s);
  bool read_record = false;
  ASSERT_OK(store->Read(BlockId(9, 9), [&](const storage::SpillRecord& rec,
                                           absl::string_view) {
    read_record = true;
    EXPECT_EQ(rec.meta().checksum(), 7u);
    EXPECT_TRUE(rec.payload_present());
    return absl::OkStatus();
  }));
  EXPECT_TRUE(read_record);
}

TEST_F(SpillStoreTest, SecondOpenOfSameDirectoryIsRefused) {
  auto store = Open();
  SpillStoreOptions options;
  options.path = dir_.Join("db");
  EXPECT_THAT(SpillStore::Open(options),
              StatusIs(absl::StatusCode::kUnavailable,
                       ::testing::HasSubstr("in use by another evoked")));
}

TEST_F(SpillStoreTest, EmptyPathIsInvalid) {
  EXPECT_THAT(SpillStore::Open(SpillStoreOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace evoke

namespace evoke {
namespace {

TEST(SpillStoreModeTest, DataDirIsRestrictedToItsOwner) {
  evoke::testing::TempDir dir;
  const std::string path = dir.Join("open-db");
  std::filesystem::create_directories(path);
  std::filesystem::permissions(path, std::filesystem::perms::all);  // 0777.
  SpillStoreOptions options;
  options.path = path;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SpillStore> store, SpillStore::Open(options));
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::mask,
            std::filesystem::perms::owner_all);
}

}  // namespace
}  // namespace evoke

// ---------------------------------------------------------------- disk full
// Through storage/tier2/fault_env.h: RocksDB's file writes fail with ENOSPC after
// a byte budget, as on a full disk.

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;

class SpillStoreDiskFullTest : public ::testing::Test {
 protected:
  std::unique_ptr<SpillStore> Open() {
    SpillStoreOptions options;
    options.path = dir_.Join("db");
    options.faults = faults_;
    options.retry_interval = absl::Milliseconds(20);
    options.reserve_bytes = 1;  // The tmp dir's free space is not under test here.
    auto store = SpillStore::Open(options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(store).value() : nullptr;
  }
  // Every id reads back as `payload`.
  static void ExpectPayloads(SpillStore* store, std::initializer_list<BlockId> ids,
                             const std::string& payload) {
    for (const BlockId& id : ids) {
      ASSERT_OK(store->Read(id, [&](const storage::SpillRecord&, absl::string_view p) {
        EXPECT_EQ(p, payload);
        return absl::OkStatus();
      }));
    }
  }
  static storage::SpillRecord Rec(uint64_t checksum, uint64_t bytes) {
    storage::SpillRecord r;
    r.mutable_meta()->set_checksum(checksum);
    r.mutable_meta()->set_payload_bytes(bytes);
    return r;
  }
  std::shared_ptr<DiskFaults> faults_ = std::make_shared<DiskFaults>();
  evoke::testing::TempDir dir_;
};

// A payload append that meets a full disk fails its Put with nothing
// committed; the store keeps serving reads, and the next Put after space
// returns starts a new segment.
TEST_F(SpillStoreDiskFullTest, FailedSegmentAppendCommitsNothing) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const std::string payload(64 << 10, 'p');
  const storage::SpillRecord r = Rec(1, payload.size());
  const SpillWrite before[] = {{BlockId(1, 1), &r, payload}};
  ASSERT_OK(store->Put(before, /*sync=*/true));

  faults_->NoSpaceAfter(1000);
  const SpillWrite during[] = {{BlockId(1, 2), &r, payload}};
  EXPECT_THAT(store->Put(during, /*sync=*/true), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(store->Read(BlockId(1, 2), [](const storage::SpillRecord&, absl::string_view) {
    return absl::OkStatus();
  }), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_GE(store->Health().write_failures, 1u);
  faults_->Clear();
  ASSERT_OK(store->Put(during, /*sync=*/true));
  store.reset();
  store = Open();
  ASSERT_NE(store, nullptr);
  ExpectPayloads(store.get(), {BlockId(1, 1), BlockId(1, 2)}, payload);
}

// Before: the failed WAL append left RocksDB's WAL writer in error, and the
// next Persist (SyncWAL) hit its assertion `sync_without_flush_called_`:
// the process aborted. (Payload bytes go to segments first, so the WAL is
// made to fail on a metadata-only write.)
TEST_F(SpillStoreDiskFullTest, FailedWritesStopWritesUntilSpaceReturns) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const std::string payload(64 << 10, 'p');
  const storage::SpillRecord r = Rec(1, payload.size());
  const SpillWrite before[] = {{BlockId(1, 1), &r, payload}};
  ASSERT_OK(store->Put(before, /*sync=*/true));

  faults_->NoSpaceAfter(0);
  const SpillWrite crumb[] = {{BlockId(1, 3), &r, {}}};
  const absl::Status failed = store->Put(crumb, /*sync=*/false);
  EXPECT_THAT(failed, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_FALSE(store->Health().writable);
  // Every later write and sync is refused without touching the WAL.
  const SpillWrite during[] = {{BlockId(1, 2), &r, payload}};
  EXPECT_THAT(store->Put(during, /*sync=*/true), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(store->Persist(), StatusIs(absl::StatusCode::kResourceExhausted));
  const BlockId ids[] = {BlockId(1, 1)};
  EXPECT_FALSE(store->Delete(ids).ok());
  // Reads keep working.
  std::string got;
  ASSERT_OK(store->Read(BlockId(1, 1), [&](const storage::SpillRecord&, absl::string_view p) {
    got.assign(p.data(), p.size());
    return absl::OkStatus();
  }));
  EXPECT_EQ(got, payload);

  faults_->Clear();
  const absl::Time freed = absl::Now();
  absl::Status resumed;
  ASSERT_TRUE(evoke::testing::WaitUntil(
      [&] {
        resumed = store->Put(during, /*sync=*/true);
        return resumed.ok();
      },
      absl::Seconds(15), absl::Milliseconds(10)))
      << resumed;
  // Our Resume() is refused as Busy while RocksDB's own recovery runs, and
  // that one polls free space every 5 s (SstFileManager): up to ~5 s, so the
  // bound leaves room (a 5 s bound failed at 5.03 s on a busy machine).
  EXPECT_LT(absl::Now() - freed, absl::Seconds(10));
  ASSERT_OK(store->Persist());
  const SpillStoreHealth health = store->Health();
  EXPECT_TRUE(health.writable);
  EXPECT_GE(health.write_failures, 1u);
  EXPECT_EQ(health.resumes, 1u);

  // Both blocks survive a reopen.
  store.reset();
  store = Open();
  ASSERT_NE(store, nullptr);
  ExpectPayloads(store.get(), {BlockId(1, 1), BlockId(1, 2)}, payload);
}

// A flush that fails (the memtable cannot become an SST) stops writes the
// same way, and a sync after it is refused rather than aborting.
TEST_F(SpillStoreDiskFullTest, FailedFlushIsRefusedNotFatal) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const std::string payload(256 << 10, 'q');
  const storage::SpillRecord r = Rec(2, payload.size());
  for (uint64_t i = 0; i < 8; ++i) {
    const SpillWrite w[] = {{BlockId(2, i), &r, payload}};
    ASSERT_OK(store->Put(w, /*sync=*/false));
  }
  faults_->NoSpaceAfter(0);  // The memtable holds only records now.
  EXPECT_FALSE(store->Persist().ok());
  EXPECT_FALSE(store->Persist().ok());
  faults_->Clear();
  EXPECT_TRUE(evoke::testing::WaitUntil([&] { return store->Persist().ok(); },
                                        absl::Seconds(10), absl::Milliseconds(10)));
  for (uint64_t i = 0; i < 8; ++i) {
    ASSERT_OK(store->Read(BlockId(2, i), [&](const storage::SpillRecord&, absl::string_view p) {
      EXPECT_EQ(p, payload);
      return absl::OkStatus();
    }));
  }
}

// The free-space reserve refuses payload writes before RocksDB meets ENOSPC;
// deletes (which free space) still go through.
TEST_F(SpillStoreDiskFullTest, ReserveRefusesPayloadWritesButNotDeletes) {
  SpillStoreOptions options;
  options.path = dir_.Join("reserve-db");
  options.reserve_bytes = 1ull << 62;  // More than any disk has free.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SpillStore> store, SpillStore::Open(options));
  const storage::SpillRecord r = Rec(3, 3);
  const SpillWrite w[] = {{BlockId(3, 1), &r, "abc"}};
  EXPECT_THAT(store->Put(w, false), StatusIs(absl::StatusCode::kResourceExhausted,
                                             ::testing::HasSubstr("is full")));
  const BlockId ids[] = {BlockId(3, 1)};
  EXPECT_OK(store->Delete(ids));
  EXPECT_EQ(store->Health().refused_writes, 1u);
  EXPECT_TRUE(store->Health().writable);  // Refused, not stopped.
}

}  // namespace
}  // namespace evoke

// ------------------------------------------------------------ corrupt files
// One flipped bit in each kind of RocksDB file, then a reopen: the store
// opens every time, every block reads back exactly or fails (never other
// bytes), and a block that fails can be deleted.

namespace evoke {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> FilesOfKind(const std::string& dir, const std::string& kind) {
  std::vector<fs::path> out;
  for (const auto& f : fs::directory_iterator(dir)) {
    if (!f.is_regular_file() || f.file_size() == 0) continue;
    const std::string name = f.path().filename().string();
    const bool match =
        kind == "sst"        ? name.size() > 4 && name.substr(name.size() - 4) == ".sst"
        : kind == "blob"     ? name.size() > 5 && name.substr(name.size() - 5) == ".blob"
        : kind == "wal"      ? name.size() > 4 && name.substr(name.size() - 4) == ".log"
        : kind == "manifest" ? name.rfind("MANIFEST-", 0) == 0
        : kind == "current"  ? name == "CURRENT"
        : kind == "options"  ? name.rfind("OPTIONS-", 0) == 0
        : kind == "segment"  ? name.size() > 4 && name.substr(name.size() - 4) == ".evs"
                             : false;
    if (match) out.push_back(f.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void Flip(const fs::path& path, double fraction, int bit, uint64_t size = 0) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  if (size == 0) size = fs::file_size(path);
  const uint64_t offset =
      std::min<uint64_t>(size - 1, static_cast<uint64_t>(fraction * static_cast<double>(size)));
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ (1 << bit));
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

TEST(SpillStoreCorruptTest, BitFlipsInEveryFileKind) {
  const char* long_env = std::getenv("EVOKE_TRIAL_LONG");
  const bool long_form = long_env != nullptr && std::string(long_env) == "1";
  const std::vector<double> fractions = long_form
      ? std::vector<double>{0.01, 0.2, 0.4, 0.6, 0.8, 0.99}
      : std::vector<double>{0.5, 0.95};
  int trials = 0, opens_failed = 0, exact = 0, errors = 0, wrong = 0, deleted = 0;
  for (const std::string kind : {"sst", "segment", "manifest", "wal", "current", "options"}) {
    for (double fraction : fractions) {
      for (int bit : long_form ? std::vector<int>{0, 3, 7} : std::vector<int>{2}) {
        ++trials;
        evoke::testing::TempDir dir;
        SpillStoreOptions options;
        options.path = dir.Join("db");
        options.reserve_bytes = 1;
        std::map<BlockId, std::string> written;
        uint64_t segment_end = 0;  // Where the records end in the segment.
        {
          ASSERT_OK_AND_ASSIGN(std::unique_ptr<SpillStore> store, SpillStore::Open(options));
          storage::SpillRecord r;
          for (uint64_t i = 0; i < 40; ++i) {
            // Small payloads stay in the SST, large ones go to blob files.
            const std::string p = evoke::testing::Payload(i, i % 2 == 0 ? 1000 : 9000 + i);
            r.mutable_meta()->set_checksum(PayloadChecksum(p.data(), p.size()));
            r.mutable_meta()->set_payload_bytes(p.size());
            const SpillWrite w[] = {{BlockId(7, i), &r, p}};
            ASSERT_OK(store->Put(w, /*sync=*/true));
            written[BlockId(7, i)] = p;
            if (i == 29) {
              ASSERT_OK(store->Persist());  // The rest stays in the WAL.
            }
          }
          ASSERT_OK(store->ForEachRecord(
              [&](const BlockId&, storage::SpillRecord rec) {
                segment_end = std::max<uint64_t>(
                    segment_end, rec.location().offset() + 64 + rec.location().length());
                return absl::OkStatus();
              },
              nullptr));
        }
        const bool segment = kind == "segment";
        const std::vector<fs::path> files =
            FilesOfKind(segment ? options.path + "/segments" : options.path, kind);
        ASSERT_FALSE(files.empty()) << kind;
        // A segment is preallocated: flip inside what was written.
        Flip(files[trials % files.size()], fraction, bit, segment ? segment_end : 0);
        const std::string what = absl::StrCat(kind, " at ", fraction, " bit ", bit);
        const int errors_before = errors;

        absl::StatusOr<std::unique_ptr<SpillStore>> store = SpillStore::Open(options);
        if (!store.ok()) {
          ++opens_failed;
          ADD_FAILURE() << what << ": " << store.status();
          continue;
        }
        std::vector<BlockId> listed;
        ASSERT_OK((*store)->ForEachRecord(
            [&](const BlockId& id, storage::SpillRecord) {
              listed.push_back(id);
              return absl::OkStatus();
            },
            nullptr))
            << what;
        for (const auto& [id, payload] : written) {
          std::string got;
          // As the engine does: a copy that fails its checksum is DATA_LOSS.
          const absl::Status s =
              (*store)->Read(id, [&](const storage::SpillRecord& rec, absl::string_view p) {
                if (PayloadChecksum(p.data(), p.size()) != rec.meta().checksum()) {
                  return absl::DataLossError("checksum");
                }
                got.assign(p.data(), p.size());
                return absl::OkStatus();
              });
          if (!s.ok()) {
            ++errors;
            const BlockId ids[] = {id};
            EXPECT_OK((*store)->Delete(ids)) << what;
            deleted += (*store)->Delete(ids).ok();
            continue;
          }
          if (got == payload) {
            ++exact;
          } else {
            ++wrong;
            ADD_FAILURE() << what << ": wrong bytes for " << id.ToHex();
          }
        }
        // Salvage rebuilds what the metadata loses: only a flip in a
        // segment costs a block (the one whose record it hit).
        const int lost = errors - errors_before;
        EXPECT_LE(lost, segment ? 1 : 0) << what;
        std::cerr << "[ bit flips ] " << what << ": " << lost << " of " << written.size()
                  << " not loaded\n";
      }
    }
  }
  std::cerr << "[ bit flips ] trials " << trials << ", failed opens " << opens_failed
            << ", reads exact " << exact << ", errors " << errors << " (deleted " << deleted
            << "), wrong " << wrong << "\n";
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(opens_failed, 0);
}

}  // namespace
}  // namespace evoke

// ------------------------------------------------------------ segments
// Format 2: payloads in segment files, records in RocksDB.

namespace evoke {
namespace {

namespace fs = std::filesystem;
using ::evoke::testing::StatusIs;

class SpillSegmentTest : public ::testing::Test {
 protected:
  std::unique_ptr<SpillStore> Open(uint64_t segment_bytes = 256ull << 20) {
    SpillStoreOptions options;
    options.path = path_;
    options.reserve_bytes = 1;
    options.segment_bytes = segment_bytes;
    options.retry_interval = absl::Milliseconds(20);
    auto store = SpillStore::Open(options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(store).value() : nullptr;
  }
  // Puts one block per call, with its real checksum.
  void Put(SpillStore* store, uint64_t n, uint64_t bytes) {
    const std::string p = evoke::testing::Payload(n, bytes);
    storage::SpillRecord r;
    r.mutable_meta()->set_checksum(PayloadChecksum(p.data(), p.size()));
    r.mutable_meta()->set_payload_bytes(p.size());
    const SpillWrite w[] = {{BlockId(9, n), &r, p}};
    ASSERT_OK(store->Put(w, /*sync=*/true));
    payloads_[n] = p;
  }
  // Reads a block as the engine does (a checksum failure is DATA_LOSS).
  absl::Status Read(SpillStore* store, uint64_t n, std::string* out) {
    return store->Read(BlockId(9, n), [&](const storage::SpillRecord& rec, absl::string_view p) {
      if (PayloadChecksum(p.data(), p.size()) != rec.meta().checksum()) {
        return absl::DataLossError("checksum");
      }
      out->assign(p.data(), p.size());
      return absl::OkStatus();
    });
  }
  std::map<uint64_t, storage::SpillRecord> Records(SpillStore* store) {
    std::map<uint64_t, storage::SpillRecord> out;
    EXPECT_OK(store->ForEachRecord(
        [&](const BlockId& id, storage::SpillRecord r) {
          out[id.lo()] = std::move(r);
          return absl::OkStatus();
        },
        nullptr));
    return out;
  }
  std::vector<fs::path> Segments() const {
    std::vector<fs::path> out;
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(path_ + "/segments", ec)) {
      if (f.path().extension() == ".evs") out.push_back(f.path());
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  // Bytes of the RocksDB files (WAL, SST, blob), not the segments.
  uint64_t RocksBytes() const {
    uint64_t total = 0;
    for (const auto& f : fs::directory_iterator(path_)) {
      const std::string ext = f.path().extension().string();
      if (f.is_regular_file() && (ext == ".log" || ext == ".sst" || ext == ".blob")) {
        total += f.file_size();
      }
    }
    return total;
  }

  evoke::testing::TempDir dir_;
  const std::string path_ = dir_.Join("db");
  std::map<uint64_t, std::string> payloads_;
};

// The payload bytes are written once, into segments: RocksDB's files (WAL
// and SSTs) hold only the records. In format 1 every payload went through
// the WAL and again into a blob file.
TEST_F(SpillSegmentTest, PayloadBytesStayOutOfRocksDb) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  for (uint64_t n = 0; n < 24; ++n) Put(store.get(), n, (1 << 20) + n);
  ASSERT_OK(store->Persist());
  EXPECT_LT(RocksBytes(), 1u << 20) << "payload bytes reached the WAL or an SST";
  ASSERT_FALSE(Segments().empty());
  EXPECT_GE(store->UsedBytes(), 24u << 20);
  store.reset();
  store = Open();
  ASSERT_NE(store, nullptr);
  for (uint64_t n = 0; n < 24; ++n) {
    std::string got;
    ASSERT_OK(Read(store.get(), n, &got));
    EXPECT_EQ(got, payloads_[n]);
  }
}

// A record whose segment is gone is a breadcrumb after the next open:
// counted, noted, never served; its metadata stays.
TEST_F(SpillSegmentTest, RecordsIntoAMissingSegmentBecomeBreadcrumbs) {
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    for (uint64_t n = 0; n < 10; ++n) Put(store.get(), n, 5000 + n);
  }
  for (const fs::path& p : Segments()) fs::remove(p);
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const SpillStoreHealth h = store->Health();
  EXPECT_EQ(h.unreadable_records, 10u);
  ASSERT_FALSE(h.recovery.empty());
  EXPECT_NE(h.recovery.back().find("breadcrumbs"), std::string::npos) << h.recovery.back();
  const auto records = Records(store.get());
  ASSERT_EQ(records.size(), 10u);
  for (const auto& [n, r] : records) {
    EXPECT_FALSE(r.payload_present()) << n;
    std::string got;
    EXPECT_THAT(Read(store.get(), n, &got), StatusIs(absl::StatusCode::kNotFound));
  }
  // Rewritten once: the next open has nothing to report.
  store.reset();
  store = Open();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Health().unreadable_records, 0u);
}

// Damage in the middle of a segment (a record header overwritten, as a torn
// or lost write would leave it): the records before it read back exactly,
// the damaged one is never served, the store opens.
TEST_F(SpillSegmentTest, DamagedRecordHeaderIsNeverServed) {
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    for (uint64_t n = 0; n < 6; ++n) Put(store.get(), n, 20000 + 1000 * n);
  }
  storage::SpillRecord victim;
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    victim = Records(store.get()).at(3);
  }
  ASSERT_TRUE(victim.has_location());
  const std::vector<fs::path> segments = Segments();
  ASSERT_EQ(segments.size(), 1u);
  {
    std::fstream f(segments[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(victim.location().offset()));
    const std::string zeros(64, '\0');
    f.write(zeros.data(), zeros.size());
  }
  auto store = Open();
  ASSERT_NE(store, nullptr);
  int exact = 0;
  for (uint64_t n = 0; n < 6; ++n) {
    std::string got;
    const absl::Status s = Read(store.get(), n, &got);
    if (s.ok()) {
      EXPECT_EQ(got, payloads_[n]) << n;
      ++exact;
    } else {
      EXPECT_NE(n, 0u) << s;
    }
  }
  std::string got;
  EXPECT_FALSE(Read(store.get(), 3, &got).ok());
  EXPECT_GE(exact, 3);
}

// Deleting most blocks leaves garbage; compaction moves the live ones out
// and removes the old segments. Every live block reads back exactly,
// before and after a reopen.
TEST_F(SpillSegmentTest, CompactionReclaimsGarbageSegments) {
  auto store = Open(/*segment_bytes=*/4 << 20);
  ASSERT_NE(store, nullptr);
  for (uint64_t n = 0; n < 12; ++n) Put(store.get(), n, (1 << 20) - 7 * n);
  const size_t before = Segments().size();
  ASSERT_GE(before, 4u);
  std::vector<BlockId> gone;
  for (uint64_t n = 0; n < 12; ++n) {
    if (n % 4 != 0 && n != 11) {
      gone.push_back(BlockId(9, n));
      payloads_.erase(n);
    }
  }
  ASSERT_OK(store->Delete(gone));
  // Sealed segments each hold one live block of three: compacted, then
  // removed. What stays: the active segment of new spills and the one
  // compaction writes to.
  ASSERT_TRUE(evoke::testing::WaitUntil([&] { return Segments().size() <= 2; }, absl::Seconds(20),
                                        absl::Milliseconds(20)))
      << Segments().size() << " segments";
  for (int round = 0; round < 2; ++round) {
    for (const auto& [n, p] : payloads_) {
      std::string got;
      ASSERT_OK(Read(store.get(), n, &got)) << n;
      EXPECT_EQ(got, p) << n;
    }
    for (const BlockId& id : gone) {
      std::string got;
      EXPECT_THAT(Read(store.get(), id.lo(), &got), StatusIs(absl::StatusCode::kNotFound));
    }
    store.reset();
    store = Open(4 << 20);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->Health().unreadable_records, 0u);
  }
}

}  // namespace
}  // namespace evoke

namespace evoke {
namespace {

// A Put counts the records it appended as live only once they are
// committed. Compaction used to judge segments while a Put was between the
// two: a segment that the Put had half filled looked half garbage, and its
// live records were moved (a shutdown flush of 1M small blocks spent a
// quarter of its time on it). Nothing is garbage here: nothing may move.
TEST(SpillSegmentRaceTest, NothingIsCompactedWhileNothingIsGarbage) {
  evoke::testing::TempDir dir;
  SpillStoreOptions options;
  options.path = dir.Join("db");
  options.reserve_bytes = 1;
  options.segment_bytes = 4 << 20;
  options.retry_interval = absl::Microseconds(200);  // Compaction looks often.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SpillStore> store, SpillStore::Open(options));
  std::vector<std::string> payloads;
  for (uint64_t i = 0; i < 20; ++i) payloads.push_back(evoke::testing::Payload(i, 256 << 10));
  std::vector<storage::SpillRecord> records(payloads.size());
  for (size_t i = 0; i < payloads.size(); ++i) {
    records[i].mutable_meta()->set_checksum(PayloadChecksum(payloads[i].data(), payloads[i].size()));
    records[i].mutable_meta()->set_payload_bytes(payloads[i].size());
  }
  constexpr uint64_t kPuts = 24;
  for (uint64_t put = 0; put < kPuts; ++put) {
    // 5 MiB a Put into 4 MiB segments: each Put fills the rest of one
    // segment whose first quarter an earlier Put committed.
    std::vector<SpillWrite> writes;
    for (size_t i = 0; i < payloads.size(); ++i) {
      writes.push_back({BlockId(put + 1, i), &records[i], payloads[i], /*fresh=*/true});
    }
    ASSERT_OK(store->Put(writes, /*sync=*/false));
  }
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(store->Health().compacted_records, 0u);
  for (uint64_t put = 0; put < kPuts; ++put) {
    for (size_t i = 0; i < payloads.size(); ++i) {
      ASSERT_OK(store->Read(BlockId(put + 1, i),
                            [&](const storage::SpillRecord&, absl::string_view p) {
                              EXPECT_EQ(p, payloads[i]);
                              return absl::OkStatus();
                            }));
    }
  }
}

}  // namespace
}  // namespace evoke
