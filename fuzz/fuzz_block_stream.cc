// fuzz_block_stream: the import stream reader (BlockStreamReader,
// include/evoke/block_file.h), which `evokectl import` runs on a file
// or on standard input that anyone may have written.
//
// Input: one mode byte, then the rest.
//   bit 0 = 1 (raw):   the rest is the stream, as given.
//   bit 0 = 0 (built): the rest describes blocks and damage. Blocks: a count
//                      byte (0..7), then for each a length byte and that many
//                      payload bytes; the harness writes them as a valid
//                      stream (block files with their checksums, the chain,
//                      the trailer), then applies the damage ops that follow
//                      (5 bytes each: op, u32 argument): flip a byte, cut the
//                      stream, drop / repeat / swap a record, append bytes.
//   bit 1 = 1: the reader gets a pipe (size unknown, as with `import -`);
//        = 0: a regular file (a memfd).
//
// Checked:
//   - Open and Next fail only with INVALID_ARGUMENT or DATA_LOSS, and
//     memory follows the bytes that arrive: a header that declares a 2 GiB
//     record makes no 2 GiB allocation (libFuzzer's -malloc_limit_mb);
//   - built mode: an undamaged stream yields exactly its blocks, in order,
//     then a clean end; a damaged one never ends cleanly (the chain and the
//     trailer detect every drop, repeat, swap, cut and flip), and every block
//     it yields before the error is one of those written, byte for byte.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "evoke/block_file.h"
#include "fuzz/fuzz_check.h"
#include "google/protobuf/stubs/logging.h"

namespace {

using evoke::BlockFile;
using evoke::BlockStreamReader;

void PutLE(std::string* out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t GetLE(const std::string& b, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{static_cast<uint8_t>(b[at + i])} << (8 * i);
  return v;
}

// A record of the format (block_file.h): 'B', u64 length, the block file.
std::string Record(const std::string& file) {
  std::string r(1, 'B');
  PutLE(&r, file.size(), 8);
  return r + file;
}

std::string Stream(const std::vector<std::string>& files) {
  std::string s(evoke::kBlockStreamMagic, 8);
  PutLE(&s, 1, 4);
  PutLE(&s, 0, 4);
  uint64_t chain = 0;
  for (const std::string& f : files) {
    s += Record(f);
    std::string step;
    PutLE(&step, chain, 8);
    PutLE(&step, f.size(), 8);
    PutLE(&step, GetLE(f, f.size() - 8, 8), 8);
    chain = evoke::ChunkChecksum(step.data(), step.size());
  }
  std::string trailer(1, 'E');
  PutLE(&trailer, files.size(), 8);
  PutLE(&trailer, chain, 8);
  PutLE(&trailer, evoke::ChunkChecksum(trailer.data(), trailer.size()), 8);
  return s + trailer;
}

struct Source {
  int fd = -1;
  std::thread writer;
  ~Source() {
    if (fd >= 0) ::close(fd);
    if (writer.joinable()) writer.join();
  }
};

// Returns the path the reader opens: /proc/self/fd/N of a memfd holding
// `bytes`, or of a pipe a thread writes them into.
std::string Serve(const std::string& bytes, bool pipe, Source* src) {
  if (!pipe) {
    src->fd = ::memfd_create("stream", MFD_CLOEXEC);
    FUZZ_CHECK(src->fd >= 0);
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t w = ::write(src->fd, bytes.data() + done, bytes.size() - done);
      FUZZ_CHECK(w > 0);
      done += static_cast<size_t>(w);
    }
    return absl::StrCat("/proc/self/fd/", src->fd);
  }
  int p[2];
  FUZZ_CHECK(::pipe2(p, O_CLOEXEC) == 0);
  src->fd = p[0];
  src->writer = std::thread([w = p[1], bytes] {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(w, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;  // libFuzzer's -timeout alarm.
      if (n <= 0) break;  // The reader stopped early (EPIPE).
      done += static_cast<size_t>(n);
    }
    ::close(w);
  });
  return absl::StrCat("/proc/self/fd/", p[0]);
}

bool Acceptable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInvalidArgument ||
         s.code() == absl::StatusCode::kDataLoss;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool raw = (data[0] & 1) != 0;
  const bool pipe = (data[0] & 2) != 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);

  std::vector<std::string> files;   // Built mode: the block files written.
  std::vector<BlockFile> blocks;    // ... and the blocks they hold.
  std::string bytes, original;
  if (raw) {
    bytes = rest;
  } else {
    size_t at = 0;
    const size_t count = rest.empty() ? 0 : static_cast<uint8_t>(rest[at++]) % 8;
    for (size_t i = 0; i < count && at < rest.size(); ++i) {
      const size_t len = static_cast<uint8_t>(rest[at++]);
      const std::string payload = rest.substr(at, len);
      at += payload.size();
      BlockFile b;
      b.payload = payload;
      b.meta.mutable_fingerprint()->set_namespace_("ns");
      b.meta.set_session_id(absl::StrCat("s", i));
      b.meta.set_checksum(evoke::PayloadChecksum(payload.data(), payload.size()));
      absl::StatusOr<std::string> file = evoke::EncodeBlockFile(b.meta, b.payload);
      FUZZ_CHECK(file.ok());
      files.push_back(*file);
      blocks.push_back(std::move(b));
    }
    std::vector<std::string> records = files;
    bool reshaped = false;
    std::vector<std::pair<uint8_t, uint32_t>> ops;
    for (; at + 5 <= rest.size() && ops.size() < 8; at += 5) {
      ops.emplace_back(static_cast<uint8_t>(rest[at]) % 6,
                       static_cast<uint32_t>(GetLE(rest, at + 1, 4)));
    }
    for (const auto& [op, arg] : ops) {  // Record-level damage first.
      if (records.empty()) break;
      const size_t i = arg % records.size(), j = (arg >> 16) % records.size();
      if (op == 2) {
        records.erase(records.begin() + static_cast<long>(i));
        reshaped = true;
      } else if (op == 3) {
        records.insert(records.begin() + static_cast<long>(i), records[i]);
        reshaped = true;
      } else if (op == 4 && i != j && records[i] != records[j]) {
        std::swap(records[i], records[j]);
        reshaped = true;
      }
    }
    original = Stream(files);
    if (reshaped) {  // The records moved, the trailer still describes `files`.
      bytes = Stream(records);
      bytes.replace(bytes.size() - 25, 25, original.substr(original.size() - 25));
    } else {
      bytes = original;
    }
    for (const auto& [op, arg] : ops) {  // Then byte-level damage.
      if (op == 0 && !bytes.empty()) {
        bytes[arg % bytes.size()] ^= static_cast<char>(1 + (arg >> 24) % 255);
      } else if (op == 1 && !bytes.empty()) {
        bytes.resize(arg % bytes.size());
      } else if (op == 5) {
        bytes.append(1 + arg % 16, static_cast<char>(arg >> 8));
      }
    }
  }

  Source src;
  const std::string path = Serve(bytes, pipe, &src);
  absl::StatusOr<std::unique_ptr<BlockStreamReader>> reader = BlockStreamReader::Open(path);
  if (!reader.ok()) {
    FUZZ_CHECK(Acceptable(reader.status()));
    FUZZ_CHECK(raw || bytes != original);
    return 0;
  }
  std::vector<BlockFile> got;
  bool clean = false;
  for (int n = 0; n < 64; ++n) {
    BlockFile b;
    absl::StatusOr<bool> more = (*reader)->Next(&b);
    if (!more.ok()) {
      FUZZ_CHECK(Acceptable(more.status()));
      break;
    }
    if (!*more) {
      clean = true;
      break;
    }
    FUZZ_CHECK(b.meta.checksum() == evoke::PayloadChecksum(b.payload.data(), b.payload.size()));
    got.push_back(std::move(b));
  }
  if (raw) return 0;
  for (const BlockFile& b : got) {  // Only blocks that were written.
    bool found = false;
    for (const BlockFile& w : blocks) {
      found = found || (w.payload == b.payload &&
                        w.meta.SerializeAsString() == b.meta.SerializeAsString());
    }
    FUZZ_CHECK(found);
  }
  if (bytes == original) {
    FUZZ_CHECK(clean);
    FUZZ_CHECK(got.size() == blocks.size());
    for (size_t i = 0; i < got.size(); ++i) FUZZ_CHECK(got[i].payload == blocks[i].payload);
  } else {
    FUZZ_CHECK(!clean);
  }
  return 0;
}
