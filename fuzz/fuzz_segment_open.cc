// fuzz_segment_open: segment files at start-up (storage/tier2/segment_log.h). Every
// start of evoked opens every payload segment of tier 2: the file headers,
// the unsealed segments' record headers up to their torn tail, the sealed
// ones' footers and seals. A disk, a crash, an older version or anyone with
// access to the data dir may have left any bytes there; a file that crashes
// Open is a crash loop.
//
// Once per process the target writes real segments with SegmentLog itself
// (three batches of blocks over two streams, one segment sealed, one left
// open) and keeps their bytes. One input then changes a fresh copy of that
// directory (FuzzedDataProvider, up to 12 edits): bytes flipped or set in a
// file (mostly in the pages that hold data: headers, records, footers), a
// file cut or grown, a page zeroed, a file copied under another segment id,
// removed, or a file of raw bytes added under a segment name; then Open
// runs over it.
//
// Checked:
//   - Open never fails for what is in the files (only the directory's own
//     errors may fail it), and never crashes;
//   - every location written before is, after Open, either readable with
//     its own length and block id, or NOT_FOUND / DATA_LOSS; Contains is
//     false for every location Read answers NOT_FOUND for past a valid end;
//   - an untouched segment serves its records byte for byte;
//   - ForEachRecord of each segment visits only records inside the file,
//     each of a length its location states.
#include <fcntl.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hash128.h"
#include "fuzz/fuzz_check.h"
#include "storage/tier2/segment_log.h"

namespace evoke {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kPage = 4096;

struct File {
  uint64_t size = 0;
  std::map<uint64_t, std::string> pages;  // Offset -> a 4 KiB page with data.
};

struct Written {
  BlockId id;
  PayloadLocation location;
  std::string payload;
};

struct Pristine {
  std::map<std::string, File> files;  // Name -> contents.
  std::vector<Written> records;
  std::array<uint8_t, 16> instance{};
};

SegmentLogOptions Options(const std::string& dir, const std::array<uint8_t, 16>& instance) {
  SegmentLogOptions o;
  o.dir = dir;
  o.quarantine_dir = dir + "/../quarantine";
  o.segment_bytes = 4ull << 20;
  o.instance = instance;
  o.direct_io = false;
  return o;
}

File ReadFile(const std::string& path) {
  File f;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FUZZ_CHECK(fd >= 0);
  struct stat st;
  FUZZ_CHECK(::fstat(fd, &st) == 0);
  f.size = static_cast<uint64_t>(st.st_size);
  std::string page(kPage, '\0');
  for (uint64_t off = 0; off < f.size; off += kPage) {
    const ssize_t r = ::pread(fd, page.data(), kPage, static_cast<off_t>(off));
    FUZZ_CHECK(r >= 0);
    const std::string got = page.substr(0, static_cast<size_t>(r));
    if (got.find_first_not_of('\0') != std::string::npos) f.pages[off] = got;
  }
  ::close(fd);
  return f;
}

const Pristine& Make() {
  static Pristine* p = [] {
    auto* out = new Pristine();
    for (size_t i = 0; i < 16; ++i) out->instance[i] = static_cast<uint8_t>(0xa0 + i);
    char tmpl[] = "/tmp/fuzz_segment_seed.XXXXXX";
    FUZZ_CHECK(::mkdtemp(tmpl) != nullptr);
    const std::string dir = std::string(tmpl) + "/segments";
    std::vector<std::string> notes;
    absl::StatusOr<std::unique_ptr<SegmentLog>> log =
        SegmentLog::Open(Options(dir, out->instance), &notes);
    FUZZ_CHECK(log.ok());
    uint64_t n = 0;
    for (int batch = 0; batch < 3; ++batch) {
      std::vector<SegmentAppend> appends;
      std::vector<Written> written;
      for (int k = 0; k < 3; ++k, ++n) {
        Written w;
        std::array<uint8_t, 16> bytes{};
        for (size_t i = 0; i < 16; ++i) bytes[i] = static_cast<uint8_t>(n * 31 + i);
        w.id = *BlockId::FromBytes(std::string(bytes.begin(), bytes.end()));
        w.payload.assign(100 + 700 * k, static_cast<char>('a' + n));
        written.push_back(std::move(w));
      }
      for (const Written& w : written) appends.push_back({w.id, w.payload, 0x1234 + n});
      absl::StatusOr<std::vector<PayloadLocation>> locs =
          (*log)->Append(appends, batch == 1 ? SegmentStream::kCompaction : SegmentStream::kHot);
      FUZZ_CHECK(locs.ok() && locs->size() == written.size());
      for (size_t i = 0; i < written.size(); ++i) {
        written[i].location = (*locs)[i];
        out->records.push_back(written[i]);
      }
      if (batch == 1) FUZZ_CHECK((*log)->Seal(SegmentStream::kCompaction).ok());
    }
    log->reset();
    for (const auto& e : fs::directory_iterator(dir)) {
      out->files[e.path().filename().string()] = ReadFile(e.path().string());
    }
    FUZZ_CHECK(out->files.size() >= 2);
    fs::remove_all(tmpl);
    return out;
  }();
  return *p;
}

void WriteFile(const std::string& path, const File& f) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  FUZZ_CHECK(fd >= 0);
  FUZZ_CHECK(::ftruncate(fd, static_cast<off_t>(f.size)) == 0);
  for (const auto& [off, page] : f.pages) {
    if (off >= f.size) continue;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(page.size(), f.size - off));
    FUZZ_CHECK(::pwrite(fd, page.data(), n, static_cast<off_t>(off)) == static_cast<ssize_t>(n));
  }
  ::close(fd);
}

void Edit(FuzzedDataProvider& in, std::map<std::string, File>* files,
          std::map<std::string, bool>* touched) {
  if (files->empty()) return;
  auto it = files->begin();
  std::advance(it, in.ConsumeIntegralInRange<size_t>(0, files->size() - 1));
  File& f = it->second;
  (*touched)[it->first] = true;
  // An offset, mostly in a page that holds data.
  uint64_t off = 0;
  if (!f.pages.empty() && in.ConsumeIntegralInRange<int>(0, 7) != 0) {
    auto p = f.pages.begin();
    std::advance(p, in.ConsumeIntegralInRange<size_t>(0, f.pages.size() - 1));
    off = p->first + in.ConsumeIntegralInRange<uint64_t>(0, kPage - 1);
  } else {
    off = in.ConsumeIntegralInRange<uint64_t>(0, f.size + kPage);
  }
  const uint64_t page = off / kPage * kPage;
  auto byte_at = [&](uint64_t at) -> char& {
    std::string& pg = f.pages[at / kPage * kPage];
    if (pg.size() < kPage) pg.resize(kPage, '\0');
    return pg[at % kPage];
  };
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: byte_at(off) ^= static_cast<char>(1 << in.ConsumeIntegralInRange<int>(0, 7)); break;
    case 1: {  // Set 8 bytes (a length, an offset, a seq).
      const uint64_t v = in.ConsumeIntegral<uint64_t>();
      for (int i = 0; i < 8; ++i) byte_at(off + i) = static_cast<char>(v >> (8 * i));
      break;
    }
    case 2: f.size = std::min(off, f.size); break;   // Cut.
    case 3: f.size = f.size + in.ConsumeIntegralInRange<uint64_t>(1, 3 * kPage); break;
    case 4: f.pages.erase(page); break;              // A page of zeros.
    case 5: {  // The same file under another segment id.
      const std::string name = absl::StrCat(
          "seg-", absl::Hex(in.ConsumeIntegralInRange<uint64_t>(0, 9), absl::kZeroPad16), ".evs");
      File copy = f;
      (*files)[name] = std::move(copy);
      (*touched)[name] = true;
      break;
    }
    case 6: files->erase(it); break;
    default: {  // Raw bytes under a segment name.
      const std::string name = absl::StrCat(
          "seg-", absl::Hex(in.ConsumeIntegralInRange<uint64_t>(0, 9), absl::kZeroPad16), ".evs");
      File raw;
      const std::string bytes = in.ConsumeRandomLengthString(2 * kPage);
      raw.size = bytes.size();
      for (uint64_t o = 0; o < bytes.size(); o += kPage) raw.pages[o] = bytes.substr(o, kPage);
      (*files)[name] = std::move(raw);
      (*touched)[name] = true;
    }
  }
}

void Run(FuzzedDataProvider& in) {
  const Pristine& p = Make();
  std::map<std::string, File> files = p.files;
  std::map<std::string, bool> touched;
  for (int n = in.ConsumeIntegralInRange<int>(0, 12); n > 0; --n) Edit(in, &files, &touched);

  char tmpl[] = "/tmp/fuzz_segment_open.XXXXXX";
  FUZZ_CHECK(::mkdtemp(tmpl) != nullptr);
  const std::string dir = std::string(tmpl) + "/segments";
  fs::create_directory(dir);
  for (const auto& [name, f] : files) WriteFile(dir + "/" + name, f);

  std::vector<std::string> notes;
  absl::StatusOr<std::unique_ptr<SegmentLog>> log = SegmentLog::Open(Options(dir, p.instance),
                                                                     &notes);
  FUZZ_CHECK(log.ok());
  (void)(*log)->Stats();
  const std::vector<SegmentInfo> segments = (*log)->Segments();
  for (const Written& w : p.records) {
    std::string got;
    const absl::Status s = (*log)->Read(w.id, w.location, [&](absl::string_view payload) {
      got = std::string(payload);
      return absl::OkStatus();
    });
    const std::string name = absl::StrCat("seg-", absl::Hex(w.location.segment, absl::kZeroPad16),
                                          ".evs");
    if (s.ok()) {
      FUZZ_CHECK(got.size() == w.location.length);
      FUZZ_CHECK((*log)->Contains(w.location));
      if (!touched[name] && files.count(name)) FUZZ_CHECK(got == w.payload);
    } else {
      FUZZ_CHECK(s.code() == absl::StatusCode::kNotFound ||
                 s.code() == absl::StatusCode::kDataLoss);
      if (!touched[name] && files.count(name)) {
        fprintf(stderr, "untouched %s: %s\n", name.c_str(), s.ToString().c_str());
        FUZZ_CHECK(touched[name] || !files.count(name));
      }
    }
  }
  for (const SegmentInfo& info : segments) {
    if (info.valid_end > info.size) {
      fprintf(stderr, "segment %lu: valid_end %lu, size %lu\n", static_cast<unsigned long>(info.id),
              static_cast<unsigned long>(info.valid_end), static_cast<unsigned long>(info.size));
      for (const std::string& n : notes) fprintf(stderr, "  note: %s\n", n.c_str());
    }
    FUZZ_CHECK(info.valid_end <= info.size);
    (void)(*log)->ForEachRecord(info.id, [&](const SegmentRecord& r, bool) {
      FUZZ_CHECK(r.payload.size() == r.location.length);
      FUZZ_CHECK(r.location.offset + 64 + r.location.length <= info.size);
      return absl::OkStatus();
    });
  }
  log->reset();
  fs::remove_all(tmpl);
}

}  // namespace
}  // namespace evoke

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  evoke::Run(in);
  return 0;
}
