#include "storage/tier2/segment_log.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/tier2/fault_env.h"
#include "storage/tier2/segment_io.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint64_t kSeg = 4 << 20;  // Small segments: roll-over is cheap to reach.

std::string Bytes(uint64_t seed, size_t n) {
  std::string s(n, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    memcpy(s.data() + i, &x, std::min<size_t>(8, n - i));
  }
  return s;
}

BlockId Id(uint64_t i) { return BlockId(0xB10C000000000000ull | i, i * 7919 + 1); }

std::array<uint8_t, 16> Instance(uint8_t v) {
  std::array<uint8_t, 16> a{};
  a.fill(v);
  return a;
}

std::string SegPath(const std::string& dir, uint64_t id) {
  return absl::StrFormat("%s/seg-%016x.evs", dir, id);
}

// A stored block: what Append was given and where it landed.
struct Stored {
  BlockId id;
  std::string bytes;
  PayloadLocation loc;
};

absl::StatusOr<std::string> ReadBack(SegmentLog& log, const BlockId& id,
                                     const PayloadLocation& loc) {
  std::string out;
  absl::Status s = log.Read(id, loc, [&](absl::string_view p) {
    out.assign(p.data(), p.size());
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return out;
}

// Appends one batch of `sizes`; ids from *next.
absl::StatusOr<std::vector<Stored>> AppendBatch(SegmentLog& log, const std::vector<size_t>& sizes,
                                                uint64_t* next,
                                                SegmentStream stream = SegmentStream::kHot) {
  std::vector<Stored> batch;
  for (size_t n : sizes) {
    const uint64_t i = (*next)++;
    batch.push_back(Stored{Id(i), Bytes(i, n), {}});
  }
  std::vector<SegmentAppend> in;
  for (const Stored& s : batch) {
    in.push_back(SegmentAppend{s.id, s.bytes, PayloadChecksum(s.bytes.data(), s.bytes.size()), {}});
  }
  absl::StatusOr<std::vector<PayloadLocation>> locs = log.Append(in, stream);
  if (!locs.ok()) return locs.status();
  if (locs->size() != batch.size()) return absl::InternalError("wrong location count");
  for (size_t i = 0; i < batch.size(); ++i) batch[i].loc = (*locs)[i];
  return batch;
}

void ExpectAllReadable(SegmentLog& log, const std::vector<Stored>& all) {
  for (const Stored& s : all) {
    absl::StatusOr<std::string> got = ReadBack(log, s.id, s.loc);
    ASSERT_TRUE(got.ok()) << got.status() << " at segment " << s.loc.segment << " offset "
                          << s.loc.offset;
    ASSERT_EQ(got->size(), s.bytes.size());
    ASSERT_TRUE(*got == s.bytes) << "bytes differ at segment " << s.loc.segment << " offset "
                                 << s.loc.offset;
    EXPECT_TRUE(log.Contains(s.loc));
  }
}

// ------------------------------------------------------------ backends

enum class Backend { kFault, kTempDir, kBuffered, kTmpfs, kBuildDir };

std::string BackendName(Backend b) {
  switch (b) {
    case Backend::kFault: return "FaultDevice";
    case Backend::kTempDir: return "TempDir";
    case Backend::kBuffered: return "Buffered";
    case Backend::kTmpfs: return "Tmpfs";
    case Backend::kBuildDir: return "BuildDir";
  }
  return "?";
}

bool IsTmpfs(const std::string& path) {
  struct statfs st;
  return statfs(path.c_str(), &st) == 0 && st.f_type == 0x01021994;  // TMPFS_MAGIC
}

// A directory for one test, removed at the end (real backends).
class TestDir {
 public:
  explicit TestDir(const std::string& parent) {
    std::string t = parent + "/seglog-XXXXXX";
    if (mkdtemp(t.data()) != nullptr) path_ = t;
  }
  ~TestDir() {
    if (!path_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(path_, ec);
    }
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string ExeDir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
}

class SegmentLogBackendTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    switch (GetParam()) {
      case Backend::kFault:
        fault_ = std::make_shared<FaultSegmentIo>(42);
        root_ = "/dev/fault";
        break;
      case Backend::kTempDir:
      case Backend::kBuffered:
        root_ = temp_.path();
        break;
      case Backend::kTmpfs:
        if (!IsTmpfs("/dev/shm")) GTEST_SKIP() << "/dev/shm is not a tmpfs here";
        dir_ = std::make_unique<TestDir>("/dev/shm");
        root_ = dir_->path();
        break;
      case Backend::kBuildDir:
        // A directory next to the test binary: a disk filesystem in CI,
        // where /tmp may be a tmpfs.
        dir_ = std::make_unique<TestDir>(ExeDir());
        root_ = dir_->path();
        break;
    }
    ASSERT_FALSE(root_.empty());
  }

  SegmentLogOptions Options() const {
    SegmentLogOptions o;
    o.dir = root_ + "/segments";
    o.quarantine_dir = root_ + "/quarantine";
    o.segment_bytes = kSeg;
    o.instance = Instance(7);
    o.io = fault_;
    o.direct_io = GetParam() != Backend::kBuffered;
    return o;
  }

  std::unique_ptr<SegmentLog> OpenLog(std::vector<std::string>* notes = nullptr) {
    absl::StatusOr<std::unique_ptr<SegmentLog>> log = SegmentLog::Open(Options(), notes);
    EXPECT_TRUE(log.ok()) << log.status();
    return log.ok() ? std::move(*log) : nullptr;
  }

  evoke::testing::TempDir temp_;
  std::unique_ptr<TestDir> dir_;
  std::shared_ptr<FaultSegmentIo> fault_;
  std::string root_;
};

TEST_P(SegmentLogBackendTest, RoundTripManySizesAndReopen) {
  std::unique_ptr<SegmentLog> log = OpenLog();
  ASSERT_NE(log, nullptr);
  const SegmentLogStats st0 = log->Stats();
  std::cout << "[ backend ] " << BackendName(GetParam()) << " at " << root_ << ": "
            << (st0.direct_io ? "O_DIRECT" : "buffered + fdatasync") << ", alignment "
            << st0.io_align << "\n";
  // tmpfs refused O_DIRECT (EINVAL) before Linux 6.6; where it does, the
  // buffered fallback ran. Newer kernels take O_DIRECT on tmpfs.
  if (GetParam() == Backend::kBuffered) {
    EXPECT_FALSE(st0.direct_io);
  }
  uint64_t next = 1;
  std::vector<Stored> all;
  const std::vector<std::vector<size_t>> batches = {
      {1},
      {63, 64, 65},
      {4095, 4096, 4097, 127},
      {65536 + 7, 1, (1 << 20) + 3},
      {(4 << 20) - 1},
      {(4 << 20) + 1, 100},
      {8 << 20},
      {3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37},
  };
  for (const auto& sizes : batches) {
    ASSERT_OK_AND_ASSIGN(std::vector<Stored> b, AppendBatch(*log, sizes, &next));
    all.insert(all.end(), b.begin(), b.end());
  }
  ExpectAllReadable(*log, all);
  for (const Stored& s : all) EXPECT_EQ(s.loc.offset % 64, 0u);
  // Sequence numbers rise in append order.
  for (size_t i = 1; i < all.size(); ++i) EXPECT_GT(all[i].loc.seq, all[i - 1].loc.seq);

  // ForEachRecord sees every record once, with a good checksum.
  std::map<BlockId, int> seen;
  for (const SegmentInfo& info : log->Segments()) {
    ASSERT_OK(log->ForEachRecord(info.id, [&](const SegmentRecord& r, bool ok) {
      EXPECT_TRUE(ok);
      ++seen[r.id];
      return absl::OkStatus();
    }));
  }
  EXPECT_EQ(seen.size(), all.size());
  for (const auto& [id, n] : seen) EXPECT_EQ(n, 1);

  const SegmentLogStats st = log->Stats();
  EXPECT_GE(st.segments, 4u);  // Oversized records got segments of their own.
  EXPECT_GE(st.batches, batches.size());
  std::cout << "[ stats   ] " << st.segments << " segments, " << st.bytes_written
            << " bytes written for " << st.payload_bytes << " payload bytes, " << st.syncs
            << " syncs\n";

  // Close without sealing (as a crash between batches would), reopen: all
  // readable, the old segments take no appends, seq keeps rising.
  uint64_t max_id = 0, max_seq = 0;
  for (const SegmentInfo& i : log->Segments()) max_id = std::max(max_id, i.id);
  for (const Stored& s : all) max_seq = std::max(max_seq, s.loc.seq);
  log.reset();
  std::vector<std::string> notes;
  log = OpenLog(&notes);
  ASSERT_NE(log, nullptr);
  EXPECT_THAT(notes, ::testing::IsEmpty()) << absl::StrJoin(notes, "\n");
  ExpectAllReadable(*log, all);
  for (const SegmentInfo& i : log->Segments()) EXPECT_FALSE(i.active);
  ASSERT_OK_AND_ASSIGN(std::vector<Stored> more, AppendBatch(*log, {1000, 2000}, &next));
  EXPECT_GT(more[0].loc.segment, max_id);
  EXPECT_GT(more[0].loc.seq, max_seq);
  all.insert(all.end(), more.begin(), more.end());
  ASSERT_OK(log->Seal(SegmentStream::kHot));
  log.reset();
  log = OpenLog(&notes);
  ASSERT_NE(log, nullptr);
  ExpectAllReadable(*log, all);
}

TEST_P(SegmentLogBackendTest, RollsOverAndSeals) {
  std::unique_ptr<SegmentLog> log = OpenLog();
  ASSERT_NE(log, nullptr);
  uint64_t next = 1;
  std::vector<Stored> all;
  for (int b = 0; b < 20; ++b) {
    ASSERT_OK_AND_ASSIGN(std::vector<Stored> s,
                         AppendBatch(*log, {256 << 10, 300 << 10, 77}, &next));
    all.insert(all.end(), s.begin(), s.end());
  }
  const std::vector<SegmentInfo> segs = log->Segments();
  ASSERT_GE(segs.size(), 3u);
  int active = 0;
  for (const SegmentInfo& i : segs) {
    EXPECT_EQ(i.size, kSeg);
    EXPECT_LE(i.valid_end, i.size);
    active += i.active;
    EXPECT_FALSE(i.poisoned);
  }
  EXPECT_EQ(active, 1);
  EXPECT_EQ(log->FileBytes(), segs.size() * kSeg);
  ExpectAllReadable(*log, all);
  // Live accounting is the caller's: add all, remove one.
  for (const Stored& s : all) log->AddLive(s.loc);
  log->RemoveLive(all[0].loc);
  uint64_t live = 0;
  for (const SegmentInfo& i : log->Segments()) live += i.live_bytes;
  uint64_t expect = 0;
  for (size_t i = 1; i < all.size(); ++i) expect += SegmentRecordBytes(all[i].bytes.size());
  EXPECT_EQ(live, expect);
  // The compaction stream is a stream of its own.
  ASSERT_OK_AND_ASSIGN(std::vector<Stored> c,
                       AppendBatch(*log, {5000}, &next, SegmentStream::kCompaction));
  EXPECT_NE(c[0].loc.segment, all.back().loc.segment);
  bool found = false;
  for (const SegmentInfo& i : log->Segments()) {
    if (i.id == c[0].loc.segment) {
      found = true;
      EXPECT_EQ(i.stream, SegmentStream::kCompaction);
      EXPECT_TRUE(i.active);
    }
  }
  EXPECT_TRUE(found);
  // An active segment cannot be removed; a sealed one can.
  EXPECT_THAT(log->RemoveSegment(c[0].loc.segment),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_OK(log->Seal(SegmentStream::kCompaction));
  ASSERT_OK(log->RemoveSegment(c[0].loc.segment));
  EXPECT_THAT(ReadBack(*log, c[0].id, c[0].loc), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE(log->Contains(c[0].loc));
  // Sealed segments open from their footers: two blocks each, no scan.
  ASSERT_OK(log->Seal(SegmentStream::kHot));
  const size_t n = log->Segments().size();
  log.reset();
  log = OpenLog();
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(log->Segments().size(), n);
  EXPECT_LE(log->Stats().read_bytes, n * 2 * 4096);
  ExpectAllReadable(*log, all);
}

TEST_P(SegmentLogBackendTest, WrongLocationIsDataLossOrNotFound) {
  std::unique_ptr<SegmentLog> log = OpenLog();
  ASSERT_NE(log, nullptr);
  uint64_t next = 1;
  ASSERT_OK_AND_ASSIGN(std::vector<Stored> b, AppendBatch(*log, {1000, 5000, 70000}, &next));
  const Stored& a = b[0];
  const Stored& c = b[1];
  auto read = [&](const BlockId& id, PayloadLocation l) { return ReadBack(*log, id, l).status(); };
  const auto kLoss = absl::StatusCode::kDataLoss;
  const auto kNotFound = absl::StatusCode::kNotFound;
  // Another block's id at this location: never its bytes.
  EXPECT_THAT(read(c.id, a.loc), StatusIs(kLoss, HasSubstr("is not block")));
  PayloadLocation l = a.loc;
  l.seq += 1;
  EXPECT_THAT(read(a.id, l), StatusIs(kLoss, HasSubstr("seq")));
  l = a.loc;
  l.length -= 1;
  EXPECT_THAT(read(a.id, l), StatusIs(kLoss, HasSubstr("length")));
  l = a.loc;
  l.offset += 8;
  EXPECT_THAT(read(a.id, l), StatusIs(kLoss));
  l = a.loc;
  l.offset += 128;  // Inside the payload, on a 64-byte boundary.
  EXPECT_THAT(read(a.id, l), StatusIs(kLoss));
  l = b[2].loc;
  l.offset += SegmentRecordBytes(b[2].bytes.size());  // The skip record.
  l.length = 1;
  EXPECT_THAT(read(a.id, l), StatusIs(kLoss, HasSubstr("type 2")));
  uint64_t valid_end = 0;
  for (const SegmentInfo& i : log->Segments()) valid_end = i.valid_end;
  l.offset = valid_end;  // Past the valid end.
  EXPECT_THAT(read(a.id, l), StatusIs(kNotFound));
  EXPECT_FALSE(log->Contains(l));
  l = a.loc;
  l.length = 1 << 30;
  EXPECT_THAT(read(a.id, l), StatusIs(kNotFound));
  l = a.loc;
  l.offset = 0;
  EXPECT_THAT(read(a.id, l), StatusIs(kNotFound));
  l = a.loc;
  l.segment += 100;
  EXPECT_THAT(read(a.id, l), StatusIs(kNotFound));
  EXPECT_FALSE(log->Contains(l));
  l = a.loc;
  l.length = 0;
  EXPECT_THAT(read(a.id, l), StatusIs(kLoss));
  EXPECT_GE(log->Stats().header_mismatches, 6u);
  // The right location still reads.
  ASSERT_OK_AND_ASSIGN(std::string got, ReadBack(*log, a.id, a.loc));
  EXPECT_EQ(got, a.bytes);
  // An empty payload is refused.
  std::vector<SegmentAppend> empty = {SegmentAppend{Id(999), "", 0, {}}};
  EXPECT_THAT(log->Append(empty), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_P(SegmentLogBackendTest, ReadRacingRemoveSegment) {
  std::unique_ptr<SegmentLog> log = OpenLog();
  ASSERT_NE(log, nullptr);
  uint64_t next = 1;
  ASSERT_OK_AND_ASSIGN(std::vector<Stored> b, AppendBatch(*log, {300 << 10, 5000, 1 << 20}, &next));
  ASSERT_OK(log->Seal(SegmentStream::kHot));
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, gone{0}, bad{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t) {
    // Each reader keeps reading until the segment is removed, then reads
    // every block at least 7 more times (so reads after the removal are
    // certain, whatever the scheduling: on a busy machine the readers used
    // to run out of iterations before the removal).
    readers.emplace_back([&, t] {
      for (int i = 0, after = 0; after < 21; ++i) {
        if (stop.load()) ++after;
        const Stored& s = b[(i + t) % b.size()];
        absl::StatusOr<std::string> got = ReadBack(*log, s.id, s.loc);
        if (got.ok()) {
          (*got == s.bytes ? ok : bad).fetch_add(1);
        } else if (got.status().code() == absl::StatusCode::kNotFound) {
          gone.fetch_add(1);
        } else {
          bad.fetch_add(1);
        }
      }
    });
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ok.load() < 10 && bad.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  const absl::Status removed_first = log->RemoveSegment(b[0].loc.segment);
  stop = true;
  for (std::thread& t : readers) t.join();
  ASSERT_OK(removed_first);
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(gone.load(), 0);
  // A read that holds the segment while it is removed completes: remove it
  // from inside the consume callback of a read of a second segment.
  ASSERT_OK_AND_ASSIGN(std::vector<Stored> b2, AppendBatch(*log, {9000, 2 << 20}, &next));
  ASSERT_OK(log->Seal(SegmentStream::kHot));
  std::atomic<bool> removed{false};
  std::thread remover;
  std::string got;
  absl::Status s = log->Read(b2[1].id, b2[1].loc, [&](absl::string_view p) {
    remover = std::thread([&] { removed = log->RemoveSegment(b2[1].loc.segment).ok(); });
    remover.join();
    got.assign(p.data(), p.size());
    return absl::OkStatus();
  });
  ASSERT_OK(s);
  EXPECT_TRUE(removed.load());
  EXPECT_EQ(got, b2[1].bytes);
  EXPECT_THAT(ReadBack(*log, b2[0].id, b2[0].loc), StatusIs(absl::StatusCode::kNotFound));
}

INSTANTIATE_TEST_SUITE_P(Backends, SegmentLogBackendTest,
                         ::testing::Values(Backend::kFault, Backend::kTempDir, Backend::kBuffered, Backend::kTmpfs,
                                           Backend::kBuildDir),
                         [](const auto& info) { return BackendName(info.param); });

// ------------------------------------------------------------ real files

class SegmentLogFileTest : public ::testing::Test {
 protected:
  SegmentLogOptions Options() const {
    SegmentLogOptions o;
    o.dir = temp_.Join("segments");
    o.quarantine_dir = temp_.Join("quarantine");
    o.segment_bytes = kSeg;
    o.instance = Instance(7);
    return o;
  }
  std::unique_ptr<SegmentLog> OpenLog(std::vector<std::string>* notes = nullptr,
                                      SegmentLogOptions o = {}) {
    if (o.dir.empty()) o = Options();
    absl::StatusOr<std::unique_ptr<SegmentLog>> log = SegmentLog::Open(o, notes);
    EXPECT_TRUE(log.ok()) << log.status();
    return log.ok() ? std::move(*log) : nullptr;
  }
  static void Patch(const std::string& path, uint64_t offset, absl::string_view bytes) {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT, 0644);
    ASSERT_GE(fd, 0) << path;
    ASSERT_EQ(pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset)),
              static_cast<ssize_t>(bytes.size()));
    fsync(fd);
    close(fd);
  }
  static void FlipBit(const std::string& path, uint64_t offset) {
    const int fd = open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << path;
    char c = 0;
    ASSERT_EQ(pread(fd, &c, 1, static_cast<off_t>(offset)), 1);
    c ^= 0x10;
    ASSERT_EQ(pwrite(fd, &c, 1, static_cast<off_t>(offset)), 1);
    fsync(fd);
    close(fd);
  }
  evoke::testing::TempDir temp_;
};

TEST_F(SegmentLogFileTest, FileHeaderBitFlipQuarantinesTheSegment) {
  std::unique_ptr<SegmentLog> log = OpenLog();
  ASSERT_NE(log, nullptr);
  uint64_t next = 1;
  ASSERT_OK_AND_ASSIGN(std::vector<Stored> a, AppendBatch(*log, {3 << 20}, &next));
  ASSERT_OK_AND_ASSIGN(std::vector<Stored> b, AppendBatch(*log, {3 << 20}, &next));
  ASSERT_NE(a[0].loc.segment, b[0].loc.segment);
  log.reset();
  FlipBit(SegPath(Options().dir, a[0].loc.segment), 20);  // In the segment id field.
  std::vector<std::string> notes;
  log = OpenLog(&notes);
  ASSERT_NE(log, nullptr);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_THAT(notes[0], HasSubstr("moved to"));
  EXPECT_EQ(log->Stats().quarantined_segments, 1u);
  EXPECT_TRUE(std::filesystem::exists(
      absl::StrFormat("%s/seg-%016x.evs", Options().quarantine_dir, a[0].loc.segment)));
  EXPECT_FALSE(std::filesystem::exists(SegPath(Options().dir, a[0].loc.segment)));
  EXPECT_FALSE(log->Contains(a[0].loc));
  EXPECT_THAT(ReadBack(*log, a[0].id, a[0].loc), StatusIs(absl::StatusCode::kNotFound));
  ExpectAllReadable(*log, b);
  // The quarantined id is never reused.
  ASSERT_OK_AND_ASSIGN(std::vector<Stored> c, AppendBatch(*log, {10}, &next));
  EXPECT_GT(c[0].loc.segment, b[0].loc.segment);
}

// A segment file cut inside its header block (whose header fields still
// verify) is quarantined, not opened with a valid end past its last byte.
// Found by fuzz_segment_open.
TEST_F(SegmentLogFileTest, AFileCutInsideItsHeaderIsQuarantined) {
  std::unique_ptr<SegmentLog> log = OpenLog();
  ASSERT_NE(log, nullptr);
  uint64_t next = 1;
  ASSERT_OK_AND_ASSIGN(std::vector<Stored> a, AppendBatch(*log, {4000}, &next));
  log.reset();
  ASSERT_EQ(::truncate(SegPath(Options().dir, a[0].loc.segment).c_str(), 3568), 0);
  std::vector<std::string> notes;
  log = OpenLog(&notes);
  ASSERT_NE(log, nullptr);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_THAT(notes[0], HasSubstr("ends inside its"));
  EXPECT_EQ(log->Stats().quarantined_segments, 1u);
  for (const SegmentInfo& info : log->Segments()) EXPECT_LE(info.valid_end, info.size);
  EXPECT_THAT(ReadBack(*log, a[0].id, a[0].loc), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(SegmentLogFileTest, SegmentFromAnotherInstanceIsQuarantined) {
  std::unique_ptr<SegmentLog> log = OpenLog();
  ASSERT_NE(log, nullptr);
  uint64_t next = 1;
  ASSERT_OK_AND_ASSIGN(std::vector<Stored> a, AppendBatch(*log, {4000}, &next));
  log.reset();
  SegmentLogOptions other = Options();
  other.instance = Instance(8);
  std::vector<std::string> notes;
  log = OpenLog(&notes, other);
  ASSERT_NE(log, nullptr);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_THAT(notes[0], HasSubstr("another data directory"));
  EXPECT_TRUE(log->Segments().empty());
  EXPECT_THAT(ReadBack(*log, a[0].id, a[0].loc), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(SegmentLogFileTest, BogusNamesAreIgnoredAndUnfinishedCreationsRemoved) {
  const std::string dir = Options().dir;
  std::filesystem::create_directories(dir);
  for (const char* name : {"seg-xyz.evs", "seg-0000000000000001.evs.bak", "notes.txt",
                           "seg-00000000000000AB.evs", "seg-1.evs"}) {
    Patch(dir + "/" + name, 0, "not a segment");
  }
  Patch(dir + "/seg-0000000000000009.evs.tmp", 0, std::string(8192, 'x'));
  std::vector<std::string> notes;
  std::unique_ptr<SegmentLog> log = OpenLog(&notes);
  ASSERT_NE(log, nullptr);
  EXPECT_TRUE(log->Segments().empty());
  EXPECT_EQ(log->Stats().quarantined_segments, 0u);
  ASSERT_EQ(notes.size(), 1u) << absl::StrJoin(notes, "\n");
  EXPECT_THAT(notes[0], HasSubstr("creation interrupted"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/notes.txt"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/seg-00000000000000AB.evs"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/seg-0000000000000009.evs.tmp"));
  uint64_t next = 1;
  ASSERT_OK_AND_ASSIGN(std::vector<Stored> a, AppendBatch(*log, {10}, &next));
  ExpectAllReadable(*log, a);
}

TEST_F(SegmentLogFileTest, RecordHeaderAndPayloadCorruption) {
  std::unique_ptr<SegmentLog> log = OpenLog();
  ASSERT_NE(log, nullptr);
  uint64_t next = 1;
  std::vector<Stored> all;
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(std::vector<Stored> b, AppendBatch(*log, {5000, 700}, &next));
    all.insert(all.end(), b.begin(), b.end());
  }
  const std::string path = SegPath(Options().dir, all[0].loc.segment);
  // A payload bit flip: Read returns the bytes (the engine verifies its
  // checksum); ForEachRecord reports the record as not matching.
  FlipBit(path, all[1].loc.offset + 64 + 100);
  ASSERT_OK_AND_ASSIGN(std::string got, ReadBack(*log, all[1].id, all[1].loc));
  EXPECT_NE(got, all[1].bytes);
  EXPECT_EQ(got.size(), all[1].bytes.size());
  std::map<BlockId, bool> ok;
  ASSERT_OK(log->ForEachRecord(all[0].loc.segment, [&](const SegmentRecord& r, bool good) {
    ok[r.id] = good;
    return absl::OkStatus();
  }));
  ASSERT_EQ(ok.size(), all.size());
  for (const Stored& s : all) EXPECT_EQ(ok[s.id], s.id != all[1].id);
  // A record header bit flip after Open: DATA_LOSS naming the place.
  FlipBit(path, all[4].loc.offset + 30);  // In the seq field.
  EXPECT_THAT(ReadBack(*log, all[4].id, all[4].loc),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr(absl::StrCat("offset ", all[4].loc.offset))));
  EXPECT_THAT(log->ForEachRecord(all[0].loc.segment,
                                 [](const SegmentRecord&, bool) { return absl::OkStatus(); }),
              StatusIs(absl::StatusCode::kDataLoss));
  // At the next Open the scan stops there: the records before stay, the
  // ones from there on are not served.
  log.reset();
  std::vector<std::string> notes;
  log = OpenLog(&notes);
  ASSERT_NE(log, nullptr);
  EXPECT_THAT(absl::StrJoin(notes, "\n"), HasSubstr("torn tail"));
  ExpectAllReadable(*log, {all[0], all[2], all[3]});
  for (size_t i = 4; i < all.size(); ++i) {
    EXPECT_FALSE(log->Contains(all[i].loc));
    EXPECT_THAT(ReadBack(*log, all[i].id, all[i].loc), StatusIs(absl::StatusCode::kNotFound));
  }
}

TEST_F(SegmentLogFileTest, SealedSegmentOpensFromItsFooter) {
  std::unique_ptr<SegmentLog> log = OpenLog();
  ASSERT_NE(log, nullptr);
  uint64_t next = 1;
  std::vector<Stored> all;
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(std::vector<Stored> b, AppendBatch(*log, {5000, 700}, &next));
    all.insert(all.end(), b.begin(), b.end());
  }
  ASSERT_OK(log->Seal(SegmentStream::kHot));
  log.reset();
  const std::string path = SegPath(Options().dir, all[0].loc.segment);
  FlipBit(path, all[3].loc.offset + 30);
  // The footer names the seal: the end is known without a scan, so a
  // damaged record in the middle costs that record only.
  log = OpenLog();
  ASSERT_NE(log, nullptr);
  EXPECT_LE(log->Stats().read_bytes, 2u * 4096);
  EXPECT_THAT(ReadBack(*log, all[3].id, all[3].loc), StatusIs(absl::StatusCode::kDataLoss));
  std::vector<Stored> rest = all;
  rest.erase(rest.begin() + 3);
  ExpectAllReadable(*log, rest);
  log.reset();
  // A damaged footer: the scan runs and stops at the damaged header.
  FlipBit(path, kSeg - 4096 + 10);
  std::vector<std::string> notes;
  log = OpenLog(&notes);
  ASSERT_NE(log, nullptr);
  EXPECT_GT(log->Stats().read_bytes, 2u * 4096);
  ExpectAllReadable(*log, {all[0], all[1], all[2]});
  for (size_t i = 3; i < all.size(); ++i) EXPECT_FALSE(log->Contains(all[i].loc));
}

// Torn tail on a real file: truncate, zero or scramble the segment from
// every 512-byte offset inside its last three records. Open always
// succeeds; records wholly before the damage read back byte-equal; records
// whose header is at or after it are never served; nothing else is served
// as another block.
TEST_F(SegmentLogFileTest, TornTailAtEveryOffset) {
  std::unique_ptr<SegmentLog> log = OpenLog();
  ASSERT_NE(log, nullptr);
  uint64_t next = 1;
  std::vector<Stored> all;
  for (size_t n : {3000, 200, 9000, 700, 5000, 64}) {
    ASSERT_OK_AND_ASSIGN(std::vector<Stored> b, AppendBatch(*log, {n}, &next));
    all.push_back(b[0]);
  }
  log.reset();  // Not sealed: the active segment at a crash.
  const std::string path = SegPath(Options().dir, all[0].loc.segment);
  std::string pristine;
  {
    std::ifstream in(path, std::ios::binary);
    pristine.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const uint64_t from = all[3].loc.offset / 512 * 512;
  const uint64_t to = (all[5].loc.offset + 4096) / 512 * 512;
  int cases = 0;
  std::mt19937_64 rng(5);
  for (int mode = 0; mode < 3; ++mode) {
    for (uint64_t x = from; x <= to; x += 512) {
      std::string image = pristine;
      if (mode == 0) {
        image.resize(x);
      } else {
        for (uint64_t i = x; i < image.size() && i < x + 16384; ++i) {
          image[i] = mode == 1 ? '\0' : static_cast<char>(rng());
        }
      }
      {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out.write(image.data(), static_cast<std::streamsize>(image.size()));
      }
      std::vector<std::string> notes;
      std::unique_ptr<SegmentLog> l = OpenLog(&notes);
      ASSERT_NE(l, nullptr) << "mode " << mode << " offset " << x;
      for (const Stored& s : all) {
        const uint64_t header_end = s.loc.offset + 64;
        const uint64_t record_end = s.loc.offset + SegmentRecordBytes(s.bytes.size());
        absl::StatusOr<std::string> got = ReadBack(*l, s.id, s.loc);
        if (record_end <= x) {
          ASSERT_TRUE(got.ok()) << got.status() << " mode " << mode << " x " << x;
          ASSERT_TRUE(*got == s.bytes) << "mode " << mode << " x " << x;
        } else if (header_end > x) {
          ASSERT_FALSE(got.ok()) << "mode " << mode << " x " << x << " record at "
                                 << s.loc.offset;
          EXPECT_FALSE(l->Contains(s.loc));
        }
        // In between (a header before the damage, its payload after it):
        // the record may be served with damaged bytes, which the engine's
        // checksum catches; truncation never serves it.
        if (mode == 0 && record_end > x) {
          EXPECT_FALSE(got.ok());
        }
      }
      ++cases;
    }
  }
  std::cout << "[ torn    ] " << cases << " damaged images reopened\n";
  EXPECT_GT(cases, 30);
}

TEST_F(SegmentLogFileTest, DiskFaultsMakeAppendsFailAsAFullDisk) {
  SegmentLogOptions o = Options();
  o.faults = std::make_shared<DiskFaults>();
  std::unique_ptr<SegmentLog> log = OpenLog(nullptr, o);
  ASSERT_NE(log, nullptr);
  uint64_t next = 1;
  ASSERT_OK_AND_ASSIGN(std::vector<Stored> a, AppendBatch(*log, {5000}, &next));
  // The segment exists: the next batch's pwrite hits the full disk.
  o.faults->NoSpaceAfter(100);
  EXPECT_THAT(AppendBatch(*log, {5000}, &next), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_GT(o.faults->failures(), 0u);
  // A new segment's fallocate hits it too.
  EXPECT_THAT(AppendBatch(*log, {5000}, &next), StatusIs(absl::StatusCode::kResourceExhausted));
  o.faults->Clear();
  ASSERT_OK_AND_ASSIGN(std::vector<Stored> b, AppendBatch(*log, {5000}, &next));
  EXPECT_NE(b[0].loc.segment, a[0].loc.segment);
  int poisoned = 0;
  for (const SegmentInfo& i : log->Segments()) poisoned += i.poisoned;
  EXPECT_EQ(poisoned, 1);
  ExpectAllReadable(*log, a);
  ExpectAllReadable(*log, b);
}

// ------------------------------------------------------------ the fault device

class SegmentLogFaultTest : public ::testing::Test {
 protected:
  SegmentLogOptions Options(std::shared_ptr<FaultSegmentIo> io) const {
    SegmentLogOptions o;
    o.dir = "/dev/fault/segments";
    o.quarantine_dir = "/dev/fault/quarantine";
    o.segment_bytes = kSeg;
    o.instance = Instance(7);
    o.io = std::move(io);
    return o;
  }
};

TEST_F(SegmentLogFaultTest, DeviceModelTearsOnlyUnsyncedSectors) {
  FaultSegmentIo io(1);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SegmentFile> f,
                       io.Open("/d/f", {.create = true, .truncate = false, .direct = true}));
  ASSERT_OK(f->Allocate(1 << 20));
  absl::StatusOr<AlignedBuffer> buf = AlignedBuffer::Allocate(64 << 10);
  ASSERT_OK(buf.status());
  memset(buf->data(), 'a', buf->size());
  ASSERT_OK(f->Write(0, buf->data(), buf->size()));
  ASSERT_OK(f->Sync());
  memset(buf->data(), 'b', buf->size());
  ASSERT_OK(f->Write(64 << 10, buf->data(), buf->size()));
  // Unaligned O_DIRECT I/O is refused as the kernel would.
  EXPECT_THAT(f->Write(100, buf->data(), 4096), StatusIs(absl::StatusCode::kUnavailable));
  io.Crash();
  ASSERT_OK_AND_ASSIGN(std::string img, io.ReadAll("/d/f"));
  ASSERT_EQ(img.size(), 1u << 20);
  EXPECT_EQ(img.substr(0, 64 << 10), std::string(64 << 10, 'a'));
  int kept_new = 0, kept_old = 0, garbage = 0;
  for (size_t s = (64 << 10); s < (128 << 10); s += 512) {
    const std::string sector = img.substr(s, 512);
    if (sector == std::string(512, 'b')) {
      ++kept_new;
    } else if (sector == std::string(512, '\0')) {
      ++kept_old;
    } else {
      ++garbage;
    }
  }
  EXPECT_GT(kept_new, 0);
  EXPECT_GT(kept_old, 0);
  EXPECT_GT(garbage, 0);
}

TEST_F(SegmentLogFaultTest, ErrorsPoisonTheSegmentAndTheNextAppendWorks) {
  auto io = std::make_shared<FaultSegmentIo>(3);
  absl::StatusOr<std::unique_ptr<SegmentLog>> opened = SegmentLog::Open(Options(io), nullptr);
  ASSERT_OK(opened.status());
  std::unique_ptr<SegmentLog> log = std::move(*opened);
  uint64_t next = 1;
  std::vector<Stored> good;

  // ENOSPC at fallocate: no segment is made.
  io->FailNextAllocate();
  EXPECT_THAT(AppendBatch(*log, {1000}, &next), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_TRUE(log->Segments().empty());
  ASSERT_OK_AND_ASSIGN(std::vector<Stored> a, AppendBatch(*log, {1000, 20000}, &next));
  good.insert(good.end(), a.begin(), a.end());

  struct Case {
    const char* what;
    std::function<void()> inject;
    absl::StatusCode code;
  };
  const std::vector<Case> cases = {
      {"ENOSPC at pwrite", [&] { io->FailNextWrite(5000, ENOSPC); },
       absl::StatusCode::kResourceExhausted},
      {"short write", [&] { io->FailNextWrite(4096, EIO); }, absl::StatusCode::kUnavailable},
      {"EIO at fdatasync", [&] { io->FailNextSync(); }, absl::StatusCode::kUnavailable},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ASSERT_OK_AND_ASSIGN(std::vector<Stored> before, AppendBatch(*log, {3000}, &next));
    good.insert(good.end(), before.begin(), before.end());
    const uint64_t seg = before[0].loc.segment;
    c.inject();
    const uint64_t first_failed = next;
    EXPECT_THAT(AppendBatch(*log, {6000, 7000, 100}, &next), StatusIs(c.code));
    bool poisoned = false;
    for (const SegmentInfo& i : log->Segments()) {
      if (i.id == seg) poisoned = i.poisoned && !i.active;
    }
    EXPECT_TRUE(poisoned);
    // The next append goes to a new segment and works.
    ASSERT_OK_AND_ASSIGN(std::vector<Stored> after, AppendBatch(*log, {6000}, &next));
    EXPECT_NE(after[0].loc.segment, seg);
    good.insert(good.end(), after.begin(), after.end());
    ExpectAllReadable(*log, good);
    (void)first_failed;
  }
  // Across a crash: everything acknowledged survives; nothing of the failed
  // batches is served as a block (their ids were never given locations).
  log.reset();
  io->Crash();
  opened = SegmentLog::Open(Options(io), nullptr);
  ASSERT_OK(opened.status());
  log = std::move(*opened);
  ExpectAllReadable(*log, good);
}

// Crash-point sweep: for many seeds, append batches, let the device die at
// a random operation (or fail a sync), crash (tearing unsynced sectors),
// reopen, and check: Open succeeds, every location whose Append returned
// OK reads back byte-equal, and no location is ever served as another
// block. Two crashes per seed, with appends after the first reopen.
TEST_F(SegmentLogFaultTest, CrashPointSweep) {
  const int seeds = getenv("EVOKE_TRIAL_LONG") != nullptr ? 2000 : 150;
  int crashes = 0, failed_appends = 0;
  uint64_t torn = 0;
  for (int seed = 0; seed < seeds; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    std::mt19937_64 rng(seed);
    auto io = std::make_shared<FaultSegmentIo>(seed * 31 + 7);
    std::vector<Stored> acked;
    uint64_t next = 1;
    for (int round = 0; round < 2; ++round) {
      absl::StatusOr<std::unique_ptr<SegmentLog>> opened = SegmentLog::Open(Options(io), nullptr);
      ASSERT_OK(opened.status());
      std::unique_ptr<SegmentLog> log = std::move(*opened);
      ExpectAllReadable(*log, acked);
      torn += log->Stats().torn_tail_bytes;
      const int batches = static_cast<int>(rng() % 12) + 1;
      const int die_at = static_cast<int>(rng() % batches);
      for (int b = 0; b < batches; ++b) {
        if (b == die_at) {
          if (rng() % 4 == 0) {
            io->FailNextSync();
          } else {
            io->DieAfter(rng() % 6);
          }
        }
        std::vector<size_t> sizes(rng() % 6 + 1);
        for (size_t& n : sizes) n = rng() % 4 == 0 ? rng() % (900 << 10) + 1 : rng() % 9000 + 1;
        absl::StatusOr<std::vector<Stored>> r = AppendBatch(*log, sizes, &next);
        if (r.ok()) {
          acked.insert(acked.end(), r->begin(), r->end());
        } else {
          ++failed_appends;
          EXPECT_TRUE(r.status().code() == absl::StatusCode::kUnavailable ||
                      r.status().code() == absl::StatusCode::kResourceExhausted)
              << r.status();
        }
      }
      log.reset();
      io->Crash();
      ++crashes;
    }
    absl::StatusOr<std::unique_ptr<SegmentLog>> opened = SegmentLog::Open(Options(io), nullptr);
    ASSERT_OK(opened.status());
    std::unique_ptr<SegmentLog> log = std::move(*opened);
    ExpectAllReadable(*log, acked);
    // No location is served as another block.
    for (size_t i = 0; i + 1 < acked.size(); ++i) {
      absl::StatusOr<std::string> wrong = ReadBack(*log, acked[i + 1].id, acked[i].loc);
      ASSERT_THAT(wrong, StatusIs(absl::StatusCode::kDataLoss));
    }
    if (HasFatalFailure()) return;
  }
  std::cout << "[ sweep   ] " << seeds << " seeds, " << crashes << " crashes, " << failed_appends
            << " failed appends, " << torn << " torn-tail bytes dropped\n";
}

TEST(SegmentIoTest, ErrnoMapping) {
  EXPECT_THAT(IoErrorStatus(ENOSPC, "pwrite", "/x"),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("/x")));
  EXPECT_THAT(IoErrorStatus(EDQUOT, "pwrite", "/x"),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(IoErrorStatus(EIO, "fdatasync", "/x"),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("Input/output error")));
  std::shared_ptr<SegmentIo> io = NewSegmentIo();
  EXPECT_THAT(io->Open("/nonexistent-dir/f", {}).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent-dir/f")));
}

}  // namespace
}  // namespace evoke
