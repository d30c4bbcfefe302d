#include "storage/spill_store.h"

#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "storage/spill_record.pb.h"
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
