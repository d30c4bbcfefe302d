// evokectl against a real evoked: every command, text and --json output,
// exit codes and one-line errors.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "tests/e2e_fixture.h"

namespace evoke::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class EvokectlTest : public E2eTest {
 protected:
  void SetUp() override {
    StartDaemon();
    for (int i = 0; i < 6; ++i) blocks_.push_back(SessionBlock("sess", i, 64));
    for (int i = 0; i < 2; ++i) blocks_.push_back(SessionBlock("other", i, 64));
    ASSERT_OK(SaveBlocks(*client_, blocks_));
  }
  CommandResult Ctl(const std::vector<std::string>& args) {
    return RunEvokectl(daemon_->socket(), args);
  }
  std::vector<TestBlock> blocks_;
};

TEST_F(EvokectlTest, Stat) {
  CommandResult r = Ctl({"stat"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("1 pinned host"));
  EXPECT_THAT(r.out, HasSubstr("saves=8"));
  r = Ctl({"stat", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"saves\":\"8\""));
  EXPECT_THAT(r.out, HasSubstr("\"capacity_bytes\":\"33554432\""));
}

TEST_F(EvokectlTest, LsShowAndFilters) {
  CommandResult r = Ctl({"ls"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("8 blocks"));
  EXPECT_THAT(r.out, HasSubstr(blocks_[0].id().ToHex()));
  r = Ctl({"ls", "--namespace", "test", "--session", "other"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("2 blocks"));
  r = Ctl({"ls", "--json", "--limit", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Ids in JSON are hex, ready to paste into other commands.
  size_t count = 0;
  for (size_t at = r.out.find("\"id\":\""); at != std::string::npos;
       at = r.out.find("\"id\":\"", at + 1)) {
    EXPECT_EQ(r.out.substr(at + 6 + 32, 1), "\"");
    ++count;
  }
  EXPECT_EQ(count, 3u);
  r = Ctl({"ls", "--tier", "nowhere"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--tier"));

  r = Ctl({"show", blocks_[2].id().ToHex()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("session:       sess #2"));
  EXPECT_THAT(r.out, HasSubstr("tier:          pinned"));
  EXPECT_THAT(r.out, HasSubstr("model=test/tiny-llama@r1"));
  r = Ctl({"show", "--json", blocks_[2].id().ToHex()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"id\":\"" + blocks_[2].id().ToHex() + "\""));
  EXPECT_THAT(r.out, HasSubstr("\"tier\":\"TIER_PINNED_HOST\""));
}

TEST_F(EvokectlTest, ErrorsAreOneLineAndNonZero) {
  CommandResult r = Ctl({"show", "nothex"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("evokectl: INVALID_ARGUMENT: block id 'nothex'"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1);
  r = Ctl({"show", std::string(32, 'a')});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
  r = Ctl({"no-such-command"});
  EXPECT_EQ(r.exit_code, 2);
  r = RunEvokectl(dir_.Join("nobody.sock"), {"stat", "--timeout", "1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot reach evoked"));
  // Without --timeout too: a path with no socket fails at once, not after
  // the 10 s connect wait (the message says why).
  r = RunEvokectl(dir_.Join("nobody.sock"), {"stat"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("no such socket"));
  r = Ctl({"ls", "--limit", "-1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--limit"));
}

TEST_F(EvokectlTest, SocketFromEnvironment) {
  CommandResult r = RunCommand({EvokectlPath(), "health"},
                               {"EVOKE_SOCKET=" + daemon_->socket()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("SERVING"));
}

TEST_F(EvokectlTest, ExportRmImportRoundTrip) {
  const std::string id = blocks_[1].id().ToHex();
  const std::string file = dir_.Join("block.evk");
  CommandResult r = Ctl({"export", id, file});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(std::filesystem::exists(file));
  r = Ctl({"rm", id});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("deleted 1 block"));
  r = Ctl({"show", id});
  EXPECT_EQ(r.exit_code, 1);
  r = Ctl({"rm", id});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
  r = Ctl({"import", file});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("imported " + id));
  absl::StatusOr<std::vector<LoadedBlock>> got =
      client_->Load({blocks_[1].id()}, SmallFingerprint());
  ASSERT_OK(got);
  EXPECT_EQ((*got)[0].payload, blocks_[1].payload);
  // A damaged file is refused.
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(file) / 2));
    f.put('\x01');
  }
  r = Ctl({"import", file});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("DATA_LOSS"));
}

// Issue #11: `evokectl import /dev/zero` read the whole device into memory
// and aborted; now the header is checked first and it fails at once.
TEST_F(EvokectlTest, ImportOfAnythingButABlockFileFailsAtOnce) {
  const auto start = std::chrono::steady_clock::now();
  CommandResult r = Ctl({"import", "/dev/zero"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT: /dev/zero: not an evoke block file"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  r = Ctl({"import", dir_.Join("missing.evk")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
}

TEST_F(EvokectlTest, FlushVerifyDropSession) {
  CommandResult r = Ctl({"flush", "--evict"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("wrote 8 blocks"));
  EXPECT_THAT(r.out, HasSubstr("released 8 from tier 1"));
  r = Ctl({"ls", "--tier", "spill"});
  EXPECT_THAT(r.out, HasSubstr("8 blocks"));
  r = Ctl({"verify"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("checked 8 blocks, 8 copies: 8 ok, 0 corrupt"));
  r = Ctl({"verify", "--json", blocks_[0].id().ToHex()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"copies_ok\":\"1\""));
  r = Ctl({"drop-session", "test", "sess"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("deleted 6 block(s)"));
  r = Ctl({"ls"});
  EXPECT_THAT(r.out, HasSubstr("2 blocks"));
  EXPECT_THAT(r.out, Not(HasSubstr(blocks_[0].id().ToHex())));
}

}  // namespace
}  // namespace evoke::testing
