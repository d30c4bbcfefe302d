// Disk full (issue #11): a real evoked on a small tmpfs that fills up.
//
// What is promised: no crash; saves that need the disk (durable saves,
// spills) fail with RESOURCE_EXHAUSTED or UNAVAILABLE and a reason; tier-1
// saves that fit and loads from either tier keep working; blocks acknowledged
// in tier 1 are never lost to a failed write-back; evoked starts on a full
// disk (tier 2 read-only) and writes resume within seconds of space
// returning. Needs root (mount); skips otherwise.
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/e2e_fixture.h"

namespace evoke::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// Fills `path`'s filesystem with a file until fewer than `leave` bytes are
// free (or ENOSPC). Returns the file's path.
std::string FillFilesystem(const std::string& dir, const std::string& name, uint64_t leave) {
  const std::string path = dir + "/" + name;
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (fd < 0) return path;
  const std::string chunk(256 << 10, 'f');
  for (;;) {
    struct statvfs st {};
    if (statvfs(dir.c_str(), &st) != 0) break;
    const uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
    if (free_bytes <= leave) break;
    const size_t n = std::min<uint64_t>(chunk.size(), free_bytes - leave);
    if (write(fd, chunk.data(), n) <= 0) break;
  }
  close(fd);
  return path;
}

uint64_t FreeBytes(const std::string& dir) {
  struct statvfs st {};
  if (statvfs(dir.c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

bool IsDiskError(const absl::Status& s) {
  return s.code() == absl::StatusCode::kResourceExhausted ||
         s.code() == absl::StatusCode::kUnavailable;
}

class DiskFullTest : public E2eTest {
 protected:
  void SetUp() override {
    mount_ = dir_.Join("fs");
    std::filesystem::create_directories(mount_);
    if (mount("tmpfs", mount_.c_str(), "tmpfs", 0, "size=64m,mode=0700") != 0) {
      GTEST_SKIP() << "cannot mount a tmpfs at " << mount_ << " (" << std::strerror(errno)
                   << "); this test needs root";
    }
    mounted_ = true;
  }
  void TearDown() override {
    daemon_.reset();
    client_.reset();
    if (mounted_) umount2(mount_.c_str(), MNT_DETACH);
  }
  void StartOnFs() {
    StartDaemon({"--data-dir", mount_ + "/data", "--pinned-bytes", "16MiB",
                 "--save-wait-ms", "500"});
  }
  // Loads `blocks` one by one and checks their bytes; returns how many came back.
  int LoadAll(const std::vector<TestBlock>& blocks, bool expect_all) {
    int ok = 0;
    for (const TestBlock& b : blocks) {
      absl::StatusOr<std::vector<LoadedBlock>> got = client_->Load({b.id()}, SmallFingerprint());
      if (!got.ok()) {
        EXPECT_FALSE(expect_all) << got.status();
        continue;
      }
      EXPECT_EQ((*got)[0].payload, b.payload) << "wrong bytes served";
      ok += (*got)[0].payload == b.payload;
    }
    return ok;
  }

  std::string mount_;
  bool mounted_ = false;
};

TEST_F(DiskFullTest, FullDiskDegradesAndResumes) {
  ASSERT_NO_FATAL_FAILURE(StartOnFs());
  // Blocks on disk before the disk fills: durable, 512 KiB each.
  std::vector<TestBlock> durable;
  for (int i = 0; i < 8; ++i) durable.push_back(SessionBlock("durable", i, 256));
  ASSERT_OK(SaveBlocks(*client_, durable, /*durable=*/true));

  const std::string filler = FillFilesystem(mount_, "filler", 256 << 10);
  ASSERT_LT(FreeBytes(mount_), 1 * kMiB);

  // A durable save needs the disk: refused with a reason, not a crash.
  const std::vector<TestBlock> more = {SessionBlock("more", 0, 256)};
  absl::Status s = SaveBlocks(*client_, more, /*durable=*/true);
  EXPECT_TRUE(IsDiskError(s)) << s;
  EXPECT_FALSE(s.message().empty());

  // Tier-1 saves that fit keep working, and so do loads from both tiers.
  std::vector<TestBlock> hot;
  for (int i = 0; i < 4; ++i) hot.push_back(SessionBlock("hot", i, 256));
  ASSERT_OK(SaveBlocks(*client_, hot));
  EXPECT_EQ(LoadAll(hot, true), 4);
  EXPECT_EQ(LoadAll(durable, true), 8);

  // Past tier 1's high watermark the spiller cannot write back: saves wait
  // and then fail; blocks already acknowledged stay loadable.
  std::vector<TestBlock> acked = hot;
  absl::Status overflow;
  for (int i = 0; i < 64 && overflow.ok(); ++i) {
    TestBlock b = SessionBlock("overflow", i, 256);
    overflow = SaveBlocks(*client_, {b});
    if (overflow.ok()) acked.push_back(b);
  }
  EXPECT_TRUE(IsDiskError(overflow)) << overflow;
  const v1::StatResponse stat = Stat();
  EXPECT_GT(stat.counters().spill_errors(), 0u);
  EXPECT_EQ(LoadAll(acked, true), static_cast<int>(acked.size()));
  ASSERT_EQ(waitpid(daemon_->pid(), nullptr, WNOHANG), 0) << daemon_->Log();

  // A restart on the full disk: starts, serves what is on disk. The
  // shutdown cannot flush tier 1 (exit 1, logged), but it exits cleanly: no
  // signal, no abort.
  {
    absl::StatusOr<int> code = daemon_->Terminate();
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_GE(*code, 0) << daemon_->Log();
  }
  ASSERT_NO_FATAL_FAILURE(Restart());
  EXPECT_EQ(LoadAll(durable, true), 8);
  s = SaveBlocks(*client_, more, /*durable=*/true);
  EXPECT_TRUE(IsDiskError(s)) << s;

  // Space returns: durable saves work again within seconds.
  ASSERT_EQ(unlink(filler.c_str()), 0);
  const absl::Time freed = absl::Now();
  absl::Status resumed;
  const bool ok = WaitUntil(
      [&] {
        resumed = SaveBlocks(*client_, more, /*durable=*/true);
        return resumed.ok();
      },
      absl::Seconds(10), absl::Milliseconds(50));
  EXPECT_TRUE(ok) << resumed << "\n" << daemon_->Log();
  std::cerr << "[ disk full ] writes resumed " << absl::ToDoubleSeconds(absl::Now() - freed)
            << " s after space returned\n";
  EXPECT_EQ(LoadAll(durable, true), 8);
  EXPECT_EQ(LoadAll(more, true), 1);
}

}  // namespace
}  // namespace evoke::testing
