// evokectl against a real evoked: every command, text and --json output,
// exit codes (tools/evokectl/exit_codes.h) and one-line errors, block
// streams between two daemons, progress bars, top's plain snapshots.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
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
  // Where /metrics is served, as the daemon reports it (test daemons share
  // the default address: one serves it, the others run without).
  absl::StatusOr<v1::StatResponse> stat = client_->Stat();
  ASSERT_OK(stat.status());
  EXPECT_THAT(r.out, HasSubstr(stat->metrics_address().empty()
                                   ? std::string("metrics off\n")
                                   : absl::StrCat("metrics http://", stat->metrics_address(),
                                                  "/metrics\n")));
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
  EXPECT_EQ(r.exit_code, 2);  // A usage error.
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
  // Exit statuses: 2 usage, 3 not found, 4 unavailable (the table in
  // tools/evokectl/exit_codes.h; before it, every error but usage was 1).
  CommandResult r = Ctl({"show", "nothex"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("evokectl: INVALID_ARGUMENT: block id 'nothex'"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1);
  r = Ctl({"show", std::string(32, 'a')});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
  r = Ctl({"no-such-command"});
  EXPECT_EQ(r.exit_code, 2);
  r = RunEvokectl(dir_.Join("nobody.sock"), {"stat", "--timeout", "1"});
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_THAT(r.err, HasSubstr("cannot reach evoked"));
  // Without --timeout too: a path with no socket fails at once, not after
  // the 10 s connect wait (the message says why).
  r = RunEvokectl(dir_.Join("nobody.sock"), {"stat"});
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_THAT(r.err, HasSubstr("no such socket"));
  r = Ctl({"ls", "--limit", "-1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--limit"));
}

// A Unix socket bound at PATH; listening (never accepting) when `listen` is
// set, else closed again, which leaves a stale socket file behind.
int BindUnixSocket(const std::string& path, bool listen) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  EXPECT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0) << path;
  if (listen) {
    EXPECT_EQ(::listen(fd, 8), 0);
    return fd;
  }
  ::close(fd);
  return -1;
}

TEST_F(EvokectlTest, UnreachableSocketsFailFastNamingPathAndReason) {
  // Each of these took the whole 10 s connect wait and said only "cannot
  // reach evoked"; now each fails within evokectl's 2 s connect limit (the
  // bound below leaves room for a loaded machine), in one line.
  const std::string dir = dir_.Join("a-directory");
  std::filesystem::create_directory(dir);
  const std::string file = dir_.Join("a-file");
  std::ofstream(file) << "not a socket\n";
  const std::string stale = dir_.Join("stale.sock");
  BindUnixSocket(stale, /*listen=*/false);
  const std::string silent = dir_.Join("silent.sock");
  const int silent_fd = BindUnixSocket(silent, /*listen=*/true);
  const std::pair<std::string, std::string> cases[] = {
      {dir, "it is a directory, not a socket"},
      {file, "it is a regular file, not a socket"},
      {stale, "nothing listens on it (a stale socket file"},
      {silent, "a process accepts connections there but did not answer within 2s"},
  };
  for (const auto& [path, reason] : cases) {
    const auto start = std::chrono::steady_clock::now();
    CommandResult r = RunEvokectl(path, {"stat"});
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(r.exit_code, 4) << path << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("cannot reach evoked at unix:" + path + ": " + reason));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_LT(seconds, 6.0) << path;
  }
  ::close(silent_fd);
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
  EXPECT_EQ(r.exit_code, 3);
  r = Ctl({"rm", id});
  EXPECT_EQ(r.exit_code, 3);
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
  EXPECT_EQ(r.exit_code, 5);
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
  EXPECT_EQ(r.exit_code, 3);
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

TEST_F(EvokectlTest, LookupAndKeep) {
  // The first two of "sess", then an absent id: a run of two.
  CommandResult r = Ctl({"lookup", blocks_[0].id().ToHex(), blocks_[1].id().ToHex(),
                         SessionBlock("absent", 0, 64).id().ToHex(), blocks_[2].id().ToHex()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("2 of 4 leading blocks held"));
  EXPECT_THAT(r.out, HasSubstr(blocks_[1].id().ToHex()));
  r = Ctl({"lookup", "--json", blocks_[0].id().ToHex()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"n_present\":1"));
  r = Ctl({"keep", "test", "sess", "30"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("kept for 30 s (6 blocks now)"));
  absl::StatusOr<v1::StatResponse> stat = client_->Stat();
  ASSERT_OK(stat.status());
  EXPECT_EQ(stat->kept_sessions(), 1u);
  r = Ctl({"keep", "--json", "test", "sess", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"n_blocks\":6"));
  // Past the daemon's limit: refused, naming the field (exit 1).
  r = Ctl({"keep", "test", "sess", "999999"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("seconds"));
}

TEST_F(EvokectlTest, Ttl) {
  CommandResult r = Ctl({"ttl", "high", "30", blocks_[0].id().ToHex(), blocks_[1].id().ToHex()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("2 block(s) high for 30 s"));
  absl::StatusOr<v1::StatResponse> stat = client_->Stat();
  ASSERT_OK(stat.status());
  EXPECT_EQ(stat->high_blocks(), 2u);
  r = Ctl({"ttl", "--json", "normal", "0", blocks_[0].id().ToHex()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"class\":\"normal\""));
  r = Ctl({"ttl", "higher", "30", blocks_[0].id().ToHex()});
  EXPECT_EQ(r.exit_code, 2);
  r = Ctl({"ttl", "low", "0", SessionBlock("absent", 0, 64).id().ToHex()});
  EXPECT_EQ(r.exit_code, 3) << r.err;  // NOT_FOUND.
  EXPECT_THAT(r.err, HasSubstr("ids[0]"));
}

TEST_F(EvokectlTest, PinAndUnpinSetTheHighClass) {
  auto high = [&] {
    absl::StatusOr<v1::StatResponse> stat = client_->Stat();
    EXPECT_OK(stat.status());
    return stat.ok() ? stat->high_blocks() : 0;
  };
  CommandResult r = Ctl({"pin", blocks_[0].id().ToHex()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("1 block(s) high"));
  EXPECT_EQ(high(), 1u);
  r = Ctl({"pin", "--ttl", "30", blocks_[1].id().ToHex()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("for 30 s"));
  EXPECT_EQ(high(), 2u);
  r = Ctl({"unpin", "--json", blocks_[0].id().ToHex(), blocks_[1].id().ToHex()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"class\":\"normal\""));
  EXPECT_EQ(high(), 0u);
  r = Ctl({"pin", SessionBlock("absent", 0, 64).id().ToHex()});
  EXPECT_EQ(r.exit_code, 3) << r.err;
}

TEST_F(EvokectlTest, RecoverRanksASessionsBlocks) {
  // Session "rec": 4 blocks whose MEAN_KEYS summaries point along 4 axes,
  // block 3's close to block 0's.
  std::vector<TestBlock> rec;
  for (int i = 0; i < 4; ++i) {
    TestBlock b = SessionBlock("rec", i, 64);
    const v1::LayoutFingerprint& fp = b.meta.fingerprint();
    v1::Summary* sum = b.meta.add_summaries();
    sum->set_kind(v1::SUMMARY_MEAN_KEYS);
    sum->set_layer(b.meta.layer_begin());
    sum->set_heads(fp.n_kv_heads());
    sum->set_dim(fp.head_dim());
    for (uint32_t j = 0; j < fp.n_kv_heads() * fp.head_dim(); ++j) {
      sum->add_values(i == 3 ? (j % 4 == 0 ? 0.9f : 0.1f) : (j % 4 == static_cast<uint32_t>(i)));
    }
    rec.push_back(std::move(b));
  }
  ASSERT_OK(SaveBlocks(*client_, rec));
  auto ids_in_order = [](const std::string& out) {
    std::vector<std::string> ids;
    for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
      const std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (words.size() > 1) ids.push_back(words[1]);
    }
    return ids;
  };
  // Like block 0: block 3 first, the others after, never block 0 itself
  // nor another session's.
  CommandResult r = Ctl({"recover", "test", "rec", "--like", rec[0].id().ToHex()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> ids = ids_in_order(r.out);
  ASSERT_EQ(ids.size(), 3u) << r.out;
  EXPECT_EQ(ids[0], rec[3].id().ToHex()) << r.out;
  EXPECT_THAT(r.out, Not(HasSubstr(rec[0].id().ToHex())));
  EXPECT_THAT(r.out, Not(HasSubstr(blocks_[0].id().ToHex())));
  r = Ctl({"recover", "--json", "test", "rec", "--like", rec[0].id().ToHex(), "-k", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"blocks\""));
  EXPECT_THAT(r.out, HasSubstr(rec[3].id().ToHex()));

  // The same query from a file (block 2's axis): block 2 first.
  const v1::Summary& sum = rec[2].meta.summaries(0);
  const std::string file = dir_.Join("query.txt");
  {
    std::ofstream out(file);
    for (float v : sum.values()) out << v << "\n";
  }
  r = Ctl({"recover", "test", "rec", "--query-file", file, "--heads",
           std::to_string(sum.heads()), "--layer", std::to_string(sum.layer())});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ids = ids_in_order(r.out);
  ASSERT_EQ(ids.size(), 4u) << r.out;
  EXPECT_EQ(ids[0], rec[2].id().ToHex()) << r.out;

  // Refusals name the option.
  r = Ctl({"recover", "test", "rec"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--like or --query-file"));
  {
    std::ofstream out(file);
    out << "1.0 oops\n";
  }
  r = Ctl({"recover", "test", "rec", "--query-file", file, "--heads", "1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--query-file: oops"));
  r = Ctl({"recover", "test", "rec", "--like", rec[0].id().ToHex(), "--kind", "repr"});
  EXPECT_EQ(r.exit_code, 3) << r.err;  // No such summary.
  r = Ctl({"recover", "test", "rec", "--like", rec[0].id().ToHex(), "--kind", "best"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--kind"));
}

TEST_F(EvokectlTest, Quota) {
  CommandResult r = Ctl({"quota", "test"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("namespace test: "));
  EXPECT_THAT(r.out, HasSubstr("no quota"));
  EXPECT_THAT(r.out, HasSubstr("retention classes up to: no cap"));
  r = Ctl({"quota", "--json", "test"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"name\":\"test\""));
  r = Ctl({"quota", "nobody"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("holds no blocks"));
}

TEST_F(EvokectlTest, PrefetchAndWatch) {
  ASSERT_EQ(Ctl({"flush", "--evict"}).exit_code, 0);
  CommandResult r = Ctl({"prefetch", blocks_[0].id().ToHex(), blocks_[1].id().ToHex(),
                         SessionBlock("absent", 0, 64).id().ToHex()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("2 promoted"));
  EXPECT_THAT(r.out, HasSubstr("1 missing"));
  r = Ctl({"prefetch", "--json", blocks_[0].id().ToHex()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"in_tier1\":1"));

  // A token from now; then a block's save and removal, which `watch`
  // prints from that token on.
  absl::StatusOr<std::unique_ptr<BlockWatch>> w = client_->WatchBlocks(v1::WatchBlocksRequest());
  ASSERT_OK(w.status());
  v1::BlockEvents first;
  ASSERT_TRUE((*w)->Next(&first));
  const TestBlock b = SessionBlock("watched", 0, 64);
  ASSERT_OK(SaveBlocks(*client_, {b}));
  ASSERT_OK(client_->Delete({b.id()}));
  const std::string token = absl::BytesToHexString(first.resume_token());
  r = Ctl({"watch", "--resume", token, "--count", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stored " + b.id().ToHex()));
  EXPECT_THAT(r.out, HasSubstr("removed " + b.id().ToHex()));
  EXPECT_THAT(r.err, HasSubstr("resume: "));
  r = Ctl({"watch", "--json", "--kind", "removed", "--resume", token, "--count", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("BLOCK_EVENT_REMOVED"));
  EXPECT_THAT(r.out, Not(HasSubstr("BLOCK_EVENT_STORED")));
  r = Ctl({"watch", "--resume", "xyz"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--resume"));
}

// The metadata lost while the daemon was down (every MANIFEST garbled) and
// one payload damaged: the restart rebuilds the records from the segment
// files, serves every intact block, and `verify` says what was lost.
TEST_F(EvokectlTest, VerifyReportsWhatTheLastStartCouldNotBringBack) {
  ASSERT_EQ(Ctl({"flush", "--evict"}).exit_code, 0);
  client_.reset();
  ASSERT_OK(daemon_->Terminate());
  int manifests = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir_.Join("data"))) {
    if (f.path().filename().string().rfind("MANIFEST-", 0) != 0) continue;
    std::ofstream(f.path(), std::ios::binary | std::ios::trunc) << std::string(4096, 'Z');
    ++manifests;
  }
  ASSERT_GT(manifests, 0);
  // The first payload of the first segment file damaged.
  bool damaged_one = false;
  const bool damaged = DamagePayloads(dir_.Join("data/segments"), [&](int) {
                         return !std::exchange(damaged_one, true);
                       }) == 1;
  ASSERT_TRUE(damaged);
  Restart();
  int served = 0;
  for (const TestBlock& b : blocks_) {
    absl::StatusOr<std::vector<LoadedBlock>> got = client_->Load({b.id()}, SmallFingerprint());
    if (got.ok()) {
      ASSERT_EQ((*got)[0].payload, b.payload);
      ++served;
    } else {
      EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
    }
  }
  EXPECT_EQ(served, static_cast<int>(blocks_.size()) - 1);
  CommandResult r = Ctl({"stat"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("recovery: metadata started anew"));
  EXPECT_THAT(r.out, HasSubstr("restored=7"));
  EXPECT_THAT(r.out, HasSubstr("lost_damaged=1"));
  r = Ctl({"verify"});
  EXPECT_EQ(r.exit_code, 5) << r.out << r.err;  // DATA_LOSS (exit_codes.h).
  EXPECT_THAT(r.out, HasSubstr("checked 7 blocks"));
  EXPECT_THAT(r.err, HasSubstr("quarantined and rebuilt (7 records salvaged)"));
  EXPECT_THAT(r.err, HasSubstr("1 blocks with damaged payloads"));
}

TEST_F(EvokectlTest, HelpListsTheExitStatuses) {
  CommandResult r = Ctl({"--help"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Exit status:"));
  EXPECT_THAT(r.out, HasSubstr("5  data loss"));
  EXPECT_THAT(r.out, HasSubstr("top"));
}

// A namespace (and a session of it) from this daemon into a second one
// through one block stream: byte-identical loads, re-import deduplicates,
// a damaged or truncated stream stores nothing and exits 5.
TEST_F(EvokectlTest, StreamExportImportBetweenDaemons) {
  // A block of another namespace, which the export must leave out.
  const TestBlock elsewhere = SessionBlock("sess", 0, 64, SmallFingerprint("elsewhere"));
  ASSERT_OK(SaveBlocks(*client_, {elsewhere}));
  const std::string file = dir_.Join("test.evks");
  CommandResult r = Ctl({"export", "--namespace", "test", "-o", file});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("exported 8 blocks"));
  EXPECT_EQ(r.err, "");  // Not a terminal: no progress bar.
  r = Ctl({"export", "--namespace", "test", "--session", "other", "-o", dir_.Join("other.evks"),
           "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"blocks\":2"));

  TempDir other_dir;
  absl::StatusOr<std::unique_ptr<DaemonProcess>> b = DaemonProcess::Start(other_dir.path());
  ASSERT_OK(b);
  std::unique_ptr<Client> b_client = (*b)->Connect();
  ASSERT_NE(b_client, nullptr);
  auto ctl_b = [&](const std::vector<std::string>& args) {
    return RunEvokectl((*b)->socket(), args);
  };
  auto b_blocks = [&] {
    v1::ListRequest all;
    all.set_page_size(1000);
    absl::StatusOr<v1::ListResponse> l = b_client->List(all);
    EXPECT_OK(l);
    return l.ok() ? static_cast<size_t>(l->blocks_size()) : 0u;
  };

  // Damaged copies first: refused with DATA_LOSS naming the record, and
  // nothing of them stored (a file is checked through before storing).
  const std::string bytes = ReadFile(file);
  ASSERT_GT(bytes.size(), 8u * 64 * 2048);
  const std::string truncated = dir_.Join("truncated.evks");
  std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() * 2 / 3);
  r = ctl_b({"import", truncated});
  EXPECT_EQ(r.exit_code, 5) << r.err;
  EXPECT_THAT(r.err, HasSubstr("DATA_LOSS"));
  EXPECT_THAT(r.err, HasSubstr("truncated"));
  EXPECT_THAT(r.err, HasSubstr("record "));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1);
  std::string flipped_bytes = bytes;
  flipped_bytes[bytes.size() / 2] ^= 0x01;
  const std::string flipped = dir_.Join("flipped.evks");
  std::ofstream(flipped, std::ios::binary) << flipped_bytes;
  r = ctl_b({"import", flipped});
  EXPECT_EQ(r.exit_code, 5) << r.err;
  EXPECT_THAT(r.err, HasSubstr("DATA_LOSS"));
  EXPECT_THAT(r.err, HasSubstr("record "));
  EXPECT_EQ(b_blocks(), 0u) << "nothing of a damaged file is stored";

  // The intact stream: every block, byte-identical.
  r = ctl_b({"import", file});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("imported 8 blocks"));
  EXPECT_THAT(r.out, HasSubstr("8 new, 0 already stored"));
  std::vector<BlockId> ids;
  for (const TestBlock& t : blocks_) ids.push_back(t.id());
  absl::StatusOr<std::vector<LoadedBlock>> got = b_client->Load(ids, SmallFingerprint());
  ASSERT_OK(got);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    EXPECT_EQ((*got)[i].payload, blocks_[i].payload) << i;
    EXPECT_EQ((*got)[i].meta.session_id(), blocks_[i].meta.session_id());
    EXPECT_EQ((*got)[i].meta.sequence(), blocks_[i].meta.sequence());
  }
  EXPECT_THAT(b_client->Describe(elsewhere.id()), StatusIs(absl::StatusCode::kNotFound));
  // Again: idempotent.
  r = ctl_b({"import", file, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"blocks\":8"));
  EXPECT_THAT(r.out, HasSubstr("\"deduplicated\":8"));
  EXPECT_EQ(b_blocks(), 8u);

  // Through a pipe: export to stdout, import from stdin.
  ASSERT_OK(b_client->Delete(ids));
  r = RunCommand({"/bin/sh", "-c",
                  "'" + EvokectlPath() + "' --socket '" + daemon_->socket() +
                      "' export --namespace test -o - | '" + EvokectlPath() + "' --socket '" +
                      (*b)->socket() + "' import -"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("imported 8 blocks"));
  EXPECT_THAT(r.err, HasSubstr("exported 8 blocks (1 MiB) to stdout"));
  EXPECT_EQ(b_blocks(), 8u);
  // A truncated pipe: the intact records are stored, the error says so.
  ASSERT_OK(b_client->Delete(ids));
  r = RunCommand({"/bin/sh", "-c",
                  "head -c " + std::to_string(bytes.size() * 2 / 3) + " '" + file + "' | '" +
                      EvokectlPath() + "' --socket '" + (*b)->socket() + "' import -"});
  EXPECT_EQ(r.exit_code, 5) << r.err;
  EXPECT_THAT(r.err, HasSubstr("standard input: block stream is truncated"));
  EXPECT_THAT(r.err, HasSubstr("intact blocks before it were stored"));

  // Usage errors need no daemon and do nothing.
  EXPECT_EQ(Ctl({"export", "--namespace", "test"}).exit_code, 2);
  EXPECT_EQ(Ctl({"export"}).exit_code, 2);
  EXPECT_EQ(Ctl({"export", blocks_[0].id().ToHex(), "--namespace", "test", "-o", file}).exit_code,
            2);
  EXPECT_EQ(Ctl({"export", "--session", "sess", blocks_[0].id().ToHex(), file}).exit_code, 2);
}

TEST_F(EvokectlTest, ProgressBarsOnlyWhenAskedOrOnATerminal) {
  const std::string file = dir_.Join("p.evks");
  CommandResult r = Ctl({"--progress", "always", "export", "--namespace", "test", "-o", file});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("export ["));
  EXPECT_THAT(r.err, HasSubstr("100% 8/8 blocks"));
  r = Ctl({"--progress", "always", "import", file});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("import ["));
  EXPECT_THAT(r.err, HasSubstr("8/8 blocks"));
  r = Ctl({"--progress", "always", "verify"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("verify ["));
  EXPECT_THAT(r.out, HasSubstr("checked 8 blocks, 8 copies: 8 ok, 0 corrupt"));
  r = Ctl({"--progress", "always", "flush"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The bar ends on the count the answer gives (all 8, unless the spiller
  // wrote some in the background first).
  const size_t wrote = r.out.find("wrote ");
  ASSERT_NE(wrote, std::string::npos) << r.out;
  const std::string n = r.out.substr(wrote + 6, r.out.find(' ', wrote + 6) - wrote - 6);
  EXPECT_THAT(r.err, HasSubstr("flush " + n + " blocks written"));
  // Captured output (not a terminal) and --progress never: no bar.
  r = Ctl({"verify"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  r = Ctl({"--progress", "never", "verify"});
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(Ctl({"--progress", "sometimes", "verify"}).exit_code, 2);
}

TEST_F(EvokectlTest, TopPrintsPlainSnapshotsWhenNotOnATerminal) {
  CommandResult r = Ctl({"top", "--iterations", "2", "--interval", "0.2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("\x1b")));
  size_t frames = 0;
  for (size_t at = r.out.find("\n1 pinned host"); at != std::string::npos;
       at = r.out.find("\n1 pinned host", at + 1)) {
    ++frames;
  }
  EXPECT_EQ(frames, 2u) << r.out;
  EXPECT_THAT(r.out, HasSubstr("totals: saves 8 "));
  EXPECT_THAT(r.out, HasSubstr("avg since start"));  // The first frame.
  EXPECT_THAT(r.out, HasSubstr("last 0."));          // The second, over the interval.
  r = RunEvokectl(dir_.Join("nobody.sock"), {"top", "--iterations", "1"});
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_THAT(r.out, HasSubstr("disconnected, retrying"));
}

}  // namespace
}  // namespace evoke::testing
