// Corrupt files (issue #11): one flipped bit in each kind of file (RocksDB's
// SST, MANIFEST, WAL tail, CURRENT, OPTIONS, and the payload segment files)
// of a real evoked's data dir, then a restart. What is promised: evoked starts every time; every
// block loads with its exact bytes or fails (0 wrong bytes served); every
// block whose payload is intact loads (damaged metadata is rebuilt from the
// segment files); a block that fails can be deleted, and stays deleted
// after a restart.
//
// CI runs one offset per kind; EVOKE_TRIAL_LONG=1 runs five offsets and
// three seeds per kind and prints the counts.
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/e2e_fixture.h"

namespace evoke::testing {
namespace {

namespace fs = std::filesystem;

bool LongForm() {
  const char* v = std::getenv("EVOKE_TRIAL_LONG");
  return v != nullptr && std::string(v) == "1";
}

// The files of `kind` in `dir`, newest (largest number) last.
std::vector<fs::path> FilesOf(const std::string& data, const std::string& kind) {
  std::vector<fs::path> out;
  const std::string dir = kind == "segment" ? data + "/segments" : data;
  for (const auto& f : fs::directory_iterator(dir)) {
    if (!f.is_regular_file() || f.file_size() == 0) continue;
    const std::string name = f.path().filename().string();
    const bool match = kind == "sst"        ? absl::EndsWith(name, ".sst")
                       : kind == "segment"  ? absl::EndsWith(name, ".evs")
                       : kind == "wal"      ? absl::EndsWith(name, ".log")
                       : kind == "manifest" ? absl::StartsWith(name, "MANIFEST-")
                       : kind == "current"  ? name == "CURRENT"
                       : kind == "options"  ? absl::StartsWith(name, "OPTIONS-")
                                            : false;
    if (match) out.push_back(f.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Bytes up to the last non-zero one: what was written of a preallocated
// segment file.
uint64_t WrittenBytes(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::string chunk(1 << 20, '\0');
  uint64_t offset = 0, end = 0;
  while (f.read(chunk.data(), static_cast<std::streamsize>(chunk.size())) || f.gcount() > 0) {
    const uint64_t n = static_cast<uint64_t>(f.gcount());
    for (uint64_t i = n; i > 0; --i) {
      if (chunk[i - 1] != '\0') {
        end = offset + i;
        break;
      }
    }
    offset += n;
  }
  return end;
}

// Flips bit `bit` of the byte at `fraction` of the file (for the WAL, of its
// last quarter: a torn or rotted tail; for a segment, of what was written).
bool FlipBit(const fs::path& path, double fraction, int bit, bool tail, bool written) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  if (!f) return false;
  const uint64_t size = written ? WrittenBytes(path) : fs::file_size(path);
  if (size == 0) return false;
  uint64_t offset = static_cast<uint64_t>(fraction * static_cast<double>(size));
  if (tail) offset = size - 1 - static_cast<uint64_t>(fraction * static_cast<double>(size / 4));
  offset = std::min(offset, size - 1);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ (1 << bit));
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
  return static_cast<bool>(f);
}

struct Counts {
  int trials = 0, starts_failed = 0, loads = 0, exact = 0, errors = 0, wrong = 0,
      deleted = 0, delete_failed = 0, resurrected = 0;
};

class DiskCorruptTest : public E2eTest {
 protected:
  // One trial: fill, stop, flip, restart, check.
  void Trial(const std::string& kind, double fraction, int bit, Counts* c) {
    ++c->trials;
    TempDir dir;
    const std::vector<std::string> flags = {"--pinned-bytes", "16MiB"};
    absl::StatusOr<std::unique_ptr<DaemonProcess>> d = DaemonProcess::Start(dir.path(), flags);
    ASSERT_TRUE(d.ok()) << d.status();
    std::unique_ptr<Client> client = (*d)->Connect();
    ASSERT_NE(client, nullptr);
    // Flushed blocks (records in SSTs, payloads in segments), then durable
    // ones whose records are only in the WAL.
    std::vector<TestBlock> blocks;
    for (int i = 0; i < 24; ++i) blocks.push_back(SessionBlock("flushed", i, 16 + i));
    ASSERT_OK(SaveBlocks(*client, blocks, /*durable=*/true));
    ASSERT_TRUE(client->Flush(/*evict=*/true).ok());
    std::vector<TestBlock> wal;
    for (int i = 0; i < 8; ++i) wal.push_back(SessionBlock("wal", i, 16 + i));
    ASSERT_OK(SaveBlocks(*client, wal, /*durable=*/true));
    blocks.insert(blocks.end(), wal.begin(), wal.end());
    client.reset();
    (*d)->KillHard();  // Keep the WAL as it is.
    const std::string data = (*d)->data_dir();
    d->reset();

    const std::vector<fs::path> files = FilesOf(data, kind);
    if (files.empty()) {
      ADD_FAILURE() << "no " << kind << " file in " << data;
      return;
    }
    const fs::path victim = files[static_cast<size_t>(fraction * 7) % files.size()];
    ASSERT_TRUE(FlipBit(victim, fraction, bit, kind == "wal", kind == "segment")) << victim;
    const std::string what = absl::StrCat(kind, " ", victim.filename().string(), " at ",
                                          fraction, " bit ", bit);

    d = DaemonProcess::Start(dir.path(), flags);
    if (!d.ok()) {
      ++c->starts_failed;
      ADD_FAILURE() << what << ": evoked did not start: " << d.status();
      return;
    }
    client = (*d)->Connect();
    ASSERT_NE(client, nullptr);
    std::vector<BlockId> bad;
    for (const TestBlock& b : blocks) {
      ++c->loads;
      absl::StatusOr<std::vector<LoadedBlock>> got = client->Load({b.id()}, SmallFingerprint());
      if (!got.ok()) {
        ++c->errors;
        bad.push_back(b.id());
        continue;
      }
      if ((*got)[0].payload == b.payload) {
        ++c->exact;
      } else {
        ++c->wrong;
        ADD_FAILURE() << what << ": wrong bytes served for " << b.id().ToHex();
      }
    }
    // Whatever failed can be deleted (absent ones are NOT_FOUND).
    for (const BlockId& id : bad) {
      const absl::Status s = client->Delete({id});
      if (s.ok()) {
        ++c->deleted;
      } else if (s.code() != absl::StatusCode::kNotFound) {
        ++c->delete_failed;
        ADD_FAILURE() << what << ": delete of " << id.ToHex() << ": " << s;
      }
    }
    EXPECT_TRUE(client->Verify({}).ok()) << what;
    // After a restart the deleted blocks stay deleted.
    client.reset();
    ASSERT_TRUE((*d)->Terminate().ok()) << what;
    d = DaemonProcess::Start(dir.path(), flags);
    if (!d.ok()) {
      ++c->starts_failed;
      ADD_FAILURE() << what << ": evoked did not restart: " << d.status();
      return;
    }
    client = (*d)->Connect();
    ASSERT_NE(client, nullptr);
    for (const BlockId& id : bad) {
      absl::StatusOr<v1::BlockInfo> info = client->Describe(id);
      if (info.ok()) {
        ++c->resurrected;
        ADD_FAILURE() << what << ": " << id.ToHex() << " came back after its delete";
      }
    }
    if (HasFailure()) std::cerr << (*d)->Log() << "\n";
  }
};

TEST_F(DiskCorruptTest, BitFlipsInEveryFileKind) {
  const std::vector<std::string> kinds = {"sst", "segment", "manifest", "wal", "current", "options"};
  const std::vector<double> fractions =
      LongForm() ? std::vector<double>{0.02, 0.25, 0.5, 0.75, 0.98} : std::vector<double>{0.5};
  const int seeds = LongForm() ? 3 : 1;
  std::map<std::string, Counts> counts;
  for (const std::string& kind : kinds) {
    for (double fraction : fractions) {
      for (int seed = 0; seed < seeds; ++seed) {
        Trial(kind, fraction, (seed * 3 + 1) % 8, &counts[kind]);
      }
    }
  }
  Counts total;
  for (const auto& [kind, c] : counts) {
    std::cerr << "[ bit flips ] " << kind << ": trials " << c.trials << ", failed starts "
              << c.starts_failed << ", loads " << c.loads << " (exact " << c.exact
              << ", errors " << c.errors << ", wrong " << c.wrong << "), deleted " << c.deleted
              << ", delete failures " << c.delete_failed << ", resurrected " << c.resurrected
              << "\n";
    // Salvage rebuilds what damaged metadata loses: only a flip in a
    // segment file may cost a block (the one whose record it hit).
    EXPECT_LE(c.errors, kind == "segment" ? c.trials : 0) << kind;
    EXPECT_EQ(c.resurrected, 0) << kind;
    total.trials += c.trials;
    total.wrong += c.wrong;
    total.starts_failed += c.starts_failed;
  }
  EXPECT_EQ(total.wrong, 0);
  EXPECT_EQ(total.starts_failed, 0);
}

}  // namespace
}  // namespace evoke::testing
