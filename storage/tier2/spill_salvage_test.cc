// Salvage: a spill store whose metadata is lost or cut short rebuilds it from
// the identity records in its segment files; tombstones keep deleted blocks
// and dropped payloads from coming back; what cannot come back is counted.
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/checksum.h"
#include "gtest/gtest.h"
#include "storage/spill_record.pb.h"
#include "storage/tier2/spill_store.h"
#include "testing/blocks.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke {
namespace {

namespace fs = std::filesystem;

class SpillSalvageTest : public ::testing::Test {
 protected:
  std::unique_ptr<SpillStore> Open() {
    SpillStoreOptions options;
    options.path = path_;
    options.reserve_bytes = 1;
    options.segment_bytes = 4 << 20;  // Small: the blocks span several segments.
    options.retry_interval = absl::Milliseconds(20);
    absl::StatusOr<std::unique_ptr<SpillStore>> store = SpillStore::Open(options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(store).value() : nullptr;
  }
  storage::SpillRecord Record(uint64_t n, const std::string& payload) {
    storage::SpillRecord r;
    r.mutable_meta()->set_checksum(PayloadChecksum(payload.data(), payload.size()));
    r.mutable_meta()->set_payload_bytes(payload.size());
    r.mutable_meta()->set_session_id(absl::StrCat("session-", n % 3));
    r.mutable_meta()->set_n_tokens(static_cast<uint32_t>(n));
    r.set_last_access_unix_ms(1000 + static_cast<int64_t>(n));
    return r;
  }
  void Put(SpillStore* store, uint64_t n, uint64_t bytes, bool sync = false) {
    const std::string p = evoke::testing::Payload(n, bytes);
    const storage::SpillRecord r = Record(n, p);
    const SpillWrite w[] = {{BlockId(5, n), &r, p}};
    ASSERT_OK(store->Put(w, sync));
    payloads_[n] = p;
  }
  // The block's record and payload as the engine reads them (a checksum
  // failure is DATA_LOSS).
  absl::Status Read(SpillStore* store, uint64_t n, storage::SpillRecord* record,
                    std::string* out) {
    return store->Read(BlockId(5, n), [&](const storage::SpillRecord& rec, absl::string_view p) {
      if (PayloadChecksum(p.data(), p.size()) != rec.meta().checksum()) {
        return absl::DataLossError("checksum");
      }
      *record = rec;
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
  // Overwrites every MANIFEST with garbage: no recovery step opens the
  // metadata, and the store starts it anew.
  void DestroyManifests() {
    int n = 0;
    for (const auto& f : fs::directory_iterator(path_)) {
      if (f.path().filename().string().rfind("MANIFEST-", 0) != 0) continue;
      std::ofstream out(f.path(), std::ios::binary | std::ios::trunc);
      out << std::string(4096, '\x5a');
      ++n;
    }
    ASSERT_GT(n, 0);
  }
  // Flips one bit in the middle of block `n`'s payload in its segment.
  void DamagePayload(const storage::SpillRecord& record) {
    const std::string seg = absl::StrFormat("%s/segments/seg-%016x.evs", path_,
                                            record.location().segment());
    std::fstream f(seg, std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t at = record.location().offset() + 64 + record.location().length() / 2;
    f.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(static_cast<std::streamoff>(at));
    f.write(&c, 1);
    ASSERT_TRUE(f.good());
  }

  evoke::testing::TempDir dir_;
  const std::string path_ = dir_.Join("db");
  std::map<uint64_t, std::string> payloads_;
};

TEST_F(SpillSalvageTest, LostMetadataIsRebuiltFromTheSegments) {
  std::map<uint64_t, storage::SpillRecord> before;
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    for (uint64_t n = 0; n < 60; ++n) Put(store.get(), n, 40000 + n * 997);
    // Overwritten: the newest copy wins.
    Put(store.get(), 7, 50000);
    // Deleted and dropped: neither comes back.
    const BlockId gone[] = {BlockId(5, 10), BlockId(5, 11)};
    ASSERT_OK(store->Delete(gone));
    storage::SpillRecord crumb = Record(12, payloads_[12]);
    const SpillWrite drop[] = {{BlockId(5, 12), &crumb, {}}};
    ASSERT_OK(store->DropPayloads(drop));
    payloads_.erase(10);
    payloads_.erase(11);
    payloads_.erase(12);
    before = Records(store.get());
    ASSERT_OK(store->Close());
  }
  DestroyManifests();

  auto store = Open();
  ASSERT_NE(store, nullptr);
  const TierHealth h = store->Health();
  EXPECT_TRUE(h.quarantined);
  EXPECT_TRUE(h.salvage.ran);
  EXPECT_EQ(h.salvage.restored, payloads_.size());
  EXPECT_EQ(h.salvage.lost(), 0u);
  for (const auto& [n, payload] : payloads_) {
    storage::SpillRecord record;
    std::string got;
    ASSERT_OK(Read(store.get(), n, &record, &got)) << n;
    EXPECT_EQ(got, payload) << n;
    // The whole record comes back, not only the payload.
    EXPECT_EQ(record.meta().session_id(), before[n].meta().session_id()) << n;
    EXPECT_EQ(record.meta().n_tokens(), before[n].meta().n_tokens()) << n;
    EXPECT_EQ(record.last_access_unix_ms(), before[n].last_access_unix_ms()) << n;
  }
  const std::map<uint64_t, storage::SpillRecord> after = Records(store.get());
  EXPECT_EQ(after.count(10) + after.count(11), 0u) << "a deleted block came back";
  EXPECT_EQ(after.count(12), 0u) << "a dropped payload came back";
  EXPECT_EQ(after.size(), payloads_.size());

  // Salvaged records are records like any other: the next start is clean.
  ASSERT_OK(store->Close());
  store.reset();
  store = Open();
  ASSERT_NE(store, nullptr);
  EXPECT_FALSE(store->Health().salvage.ran);
  EXPECT_EQ(Records(store.get()).size(), payloads_.size());
}

TEST_F(SpillSalvageTest, DamagedPayloadsAreCountedAndNeverServed) {
  std::map<uint64_t, storage::SpillRecord> records;
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    for (uint64_t n = 0; n < 20; ++n) Put(store.get(), n, 30000);
    records = Records(store.get());
    ASSERT_OK(store->Close());
  }
  DamagePayload(records[3]);
  DamagePayload(records[15]);
  DestroyManifests();

  auto store = Open();
  ASSERT_NE(store, nullptr);
  const TierHealth h = store->Health();
  EXPECT_EQ(h.salvage.restored, 18u);
  EXPECT_EQ(h.salvage.damaged, 2u);
  EXPECT_EQ(h.salvage.lost(), 2u);
  for (uint64_t n = 0; n < 20; ++n) {
    storage::SpillRecord record;
    std::string got;
    const absl::Status s = Read(store.get(), n, &record, &got);
    if (n == 3 || n == 15) {
      EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << n << ": " << s;
    } else {
      ASSERT_OK(s) << n;
      EXPECT_EQ(got, payloads_[n]);
    }
  }
}

TEST_F(SpillSalvageTest, TombstonesOutliveTheSegmentsThatHeldThem) {
  // Blocks 0-2 deleted: their tombstones land in the newest segment. Every
  // block outside block 0's segment deleted later: that newest segment
  // holds garbage only and compaction removes it, while block 0's segment
  // stays (blocks 3.. in it live). The tombstones must move on.
  std::vector<BlockId> elsewhere;
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    for (uint64_t n = 0; n < 40; ++n) Put(store.get(), n, 200000);
    const std::map<uint64_t, storage::SpillRecord> records = Records(store.get());
    const uint64_t first = records.at(0).location().segment();
    for (const auto& [n, r] : records) {
      if (r.location().segment() != first) elsewhere.push_back(BlockId(5, n));
    }
    ASSERT_GE(elsewhere.size(), 5u) << "the blocks should span several segments";
    ASSERT_GE(records.at(3).location().segment(), first);
    const BlockId gone[] = {BlockId(5, 0), BlockId(5, 1), BlockId(5, 2)};
    ASSERT_OK(store->Delete(gone));
    ASSERT_OK(store->Close());  // Writes the tombstones and seals.
  }
  for (uint64_t n : {0, 1, 2}) payloads_.erase(n);
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    ASSERT_OK(store->Delete(elsewhere));
    for (const BlockId& id : elsewhere) payloads_.erase(id.lo());
    // Compaction runs every retry_interval: wait until it removed them.
    for (int i = 0; i < 200 && store->Health().removed_segments == 0; ++i) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_GT(store->Health().removed_segments, 0u);
    ASSERT_OK(store->Close());
  }
  DestroyManifests();
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const std::map<uint64_t, storage::SpillRecord> after = Records(store.get());
  for (uint64_t n : {0, 1, 2}) EXPECT_EQ(after.count(n), 0u) << "deleted block " << n;
  EXPECT_EQ(after.size(), payloads_.size());
  for (const auto& [n, payload] : payloads_) {
    storage::SpillRecord record;
    std::string got;
    ASSERT_OK(Read(store.get(), n, &record, &got)) << n;
    EXPECT_EQ(got, payload);
  }
}

TEST_F(SpillSalvageTest, ACorruptTableIsSalvagedOnce) {
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    for (uint64_t n = 0; n < 30; ++n) Put(store.get(), n, 20000);
    ASSERT_OK(store->Persist());  // The records into a table.
    ASSERT_OK(store->Close());
  }
  // One flipped bit in the middle of the (only) table file.
  int tables = 0;
  for (const auto& f : fs::directory_iterator(path_)) {
    if (f.path().extension() != ".sst") continue;
    std::fstream file(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(fs::file_size(f.path()) / 3);
    file.seekg(at);
    char c = 0;
    file.read(&c, 1);
    c = static_cast<char>(c ^ 4);
    file.seekp(at);
    file.write(&c, 1);
    ++tables;
  }
  ASSERT_EQ(tables, 1);
  for (int start = 0; start < 2; ++start) {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    const TierHealth h = store->Health();
    EXPECT_EQ(h.corrupt_files, 1u) << start;
    // The first start rewrites every record into a healthy table; the
    // second finds the same corrupt table and nothing to rebuild.
    EXPECT_EQ(h.salvage.ran, start == 0) << start;
    EXPECT_EQ(Records(store.get()).size(), 30u) << start;
    for (const auto& [n, payload] : payloads_) {
      storage::SpillRecord record;
      std::string got;
      ASSERT_OK(Read(store.get(), n, &record, &got)) << start << " " << n;
      EXPECT_EQ(got, payload);
    }
    ASSERT_OK(store->Close());
  }
}

TEST_F(SpillSalvageTest, SeqsKeepRisingWhenTheNewestSegmentsAreGone) {
  // Tombstones kill by seq: a seq used again after a restart could make an
  // old tombstone kill a new record. Every segment removed (all deleted),
  // then a restart: new records still get seqs above everything before.
  uint64_t highest = 0;
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    for (uint64_t n = 0; n < 30; ++n) Put(store.get(), n, 200000);
    for (const auto& [n, r] : Records(store.get())) {
      highest = std::max<uint64_t>(highest, r.location().seq());
    }
    std::vector<BlockId> all;
    for (uint64_t n = 0; n < 30; ++n) all.push_back(BlockId(5, n));
    ASSERT_OK(store->Delete(all));
    ASSERT_OK(store->Close());
  }
  // Compaction removes the dead segments; the tombstones it carries land in
  // a new active segment, removed (nothing left to protect) after the next
  // restart seals it.
  uint64_t segments = 1;
  for (int start = 0; start < 4 && segments > 0; ++start) {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    for (int i = 0; i < 25; ++i) absl::SleepFor(absl::Milliseconds(20));
    segments = store->Health().segments;
    ASSERT_OK(store->Close());
  }
  ASSERT_EQ(segments, 0u);
  auto store = Open();
  ASSERT_NE(store, nullptr);
  payloads_.clear();
  Put(store.get(), 99, 1000);
  const std::map<uint64_t, storage::SpillRecord> after = Records(store.get());
  ASSERT_EQ(after.count(99), 1u);
  EXPECT_GT(after.at(99).location().seq(), highest);
}

TEST_F(SpillSalvageTest, NoSalvageAfterACleanStart) {
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    for (uint64_t n = 0; n < 10; ++n) Put(store.get(), n, 10000);
    const BlockId gone[] = {BlockId(5, 9)};  // The newest payload, deleted.
    ASSERT_OK(store->Delete(gone));
    ASSERT_OK(store->Close());
  }
  for (int i = 0; i < 2; ++i) {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    const TierHealth h = store->Health();
    EXPECT_FALSE(h.salvage.ran) << i;
    EXPECT_FALSE(h.quarantined) << i;
    EXPECT_EQ(Records(store.get()).size(), 9u);
    ASSERT_OK(store->Close());
  }
}

}  // namespace
}  // namespace evoke
