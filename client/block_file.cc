#include "evoke/block_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checksum.h"
#include "common/status_macros.h"

namespace evoke {
namespace {

constexpr char kMagic[8] = {'E', 'V', 'O', 'K', 'E', 'B', 'L', 'K'};
constexpr uint32_t kVersion = 1;

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetLE(absl::string_view b, size_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[at + i]);
  return v;
}

absl::Status MetaTooLong(uint64_t meta_len) {
  return absl::InvalidArgumentError(
      absl::StrCat("block file metadata length ", meta_len, " exceeds the limit of ",
                   kMaxBlockFileMetaBytes, " bytes"));
}
absl::Status PayloadTooLong(uint64_t payload_len) {
  return absl::InvalidArgumentError(
      absl::StrCat("block file payload length ", payload_len, " exceeds the limit of ",
                   kMaxBlockFilePayloadBytes, " bytes"));
}

// ReadFully appends exactly `n` bytes of `fd` to `out`; false at end of file
// (then `*eof` is set) or on an error (errno set).
// The buffer grows with what arrives (from 1 MiB, doubling), never by what a
// header declares: a stream that announces a 2 GiB record and then ends
// costs its own size, not 2 GiB.
bool ReadFully(int fd, size_t n, std::string* out, bool* eof) {
  constexpr size_t kFirstChunk = size_t{1} << 20;
  const size_t start = out->size();
  size_t done = 0;
  while (done < n) {
    if (out->size() == start + done) {
      out->resize(start + done + std::min(n - done, std::max(kFirstChunk, done)));
    }
    const size_t room = out->size() - start - done;
    const ssize_t r = ::read(fd, out->data() + start + done, room);
    if (r < 0) {
      if (errno == EINTR) continue;
      out->resize(start + done);
      return false;
    }
    if (r == 0) {
      *eof = true;
      out->resize(start + done);
      return false;
    }
    done += static_cast<size_t>(r);
  }
  return true;
}

absl::Status OpenError(const std::string& what, const std::string& path, int e) {
  const std::string message = absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(e));
  if (e == ENOENT) return absl::NotFoundError(message);
  if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(message);
  return absl::UnavailableError(message);
}

constexpr uint32_t kStreamVersion = 1;
constexpr char kRecordBlock = 'B';
constexpr char kRecordEnd = 'E';
constexpr size_t kTrailerBytes = 1 + 8 + 8 + 8;

// The stream checksum's step: folds one record (its length and its block
// file's own checksum, the file's last 8 bytes) into the chain.
uint64_t ChainStep(uint64_t chain, uint64_t length, uint64_t file_checksum) {
  std::string b;
  PutU64(&b, chain);
  PutU64(&b, length);
  PutU64(&b, file_checksum);
  return ChunkChecksum(b.data(), b.size());
}

}  // namespace

absl::StatusOr<std::string> EncodeBlockFile(const v1::BlockMeta& meta,
                                            absl::string_view payload) {
  if (!meta.has_checksum() ||
      meta.checksum() != PayloadChecksum(payload.data(), payload.size())) {
    return absl::InvalidArgumentError(
        "meta.checksum: missing or does not match the payload");
  }
  if (payload.size() > kMaxBlockFilePayloadBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload: ", payload.size(), " bytes exceed the block file limit of ",
                     kMaxBlockFilePayloadBytes));
  }
  if (meta.ByteSizeLong() > kMaxBlockFileMetaBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("meta: ", meta.ByteSizeLong(), " bytes exceed the block file limit of ",
                     kMaxBlockFileMetaBytes));
  }
  std::string meta_bytes;
  meta.SerializeToString(&meta_bytes);
  std::string out;
  out.reserve(8 + 8 + meta_bytes.size() + 8 + payload.size() + 8);
  out.append(kMagic, sizeof(kMagic));
  PutU32(&out, kVersion);
  PutU32(&out, static_cast<uint32_t>(meta_bytes.size()));
  out.append(meta_bytes);
  PutU64(&out, payload.size());
  out.append(payload.data(), payload.size());
  PutU64(&out, PayloadChecksum(out.data(), out.size()));
  return out;
}

absl::StatusOr<BlockFile> DecodeBlockFile(absl::string_view b) {
  if (b.size() < 8 + 8 + 8 + 8 || std::memcmp(b.data(), kMagic, 8) != 0) {
    return absl::InvalidArgumentError("not an evoke block file (bad magic)");
  }
  const uint32_t version = static_cast<uint32_t>(GetLE(b, 8, 4));
  if (version != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("block file version ", version, " is not supported (want 1)"));
  }
  const uint64_t meta_len = GetLE(b, 12, 4);
  // Before anything else: protobuf parses at most 2 GiB (an int), and a
  // length past that used to abort in ParseFromArray.
  if (meta_len > kMaxBlockFileMetaBytes) return MetaTooLong(meta_len);
  if (16 + meta_len + 8 + 8 > b.size()) {
    return absl::InvalidArgumentError("block file is truncated (metadata)");
  }
  const uint64_t payload_len = GetLE(b, 16 + meta_len, 8);
  if (payload_len > kMaxBlockFilePayloadBytes) return PayloadTooLong(payload_len);
  const uint64_t payload_at = 16 + meta_len + 8;
  if (payload_len > b.size() || payload_at + payload_len + 8 != b.size()) {
    return absl::InvalidArgumentError("block file is truncated or has trailing bytes");
  }
  const uint64_t file_sum = GetLE(b, payload_at + payload_len, 8);
  if (file_sum != PayloadChecksum(b.data(), payload_at + payload_len)) {
    return absl::DataLossError("block file checksum does not match its contents");
  }
  BlockFile file;
  if (!file.meta.ParseFromArray(b.data() + 16, static_cast<int>(meta_len))) {
    return absl::DataLossError("block file metadata is unreadable");
  }
  file.payload.assign(b.data() + payload_at, payload_len);
  if (!file.meta.has_checksum() ||
      file.meta.checksum() != PayloadChecksum(file.payload.data(), payload_len)) {
    return absl::DataLossError("block file payload does not match its checksum");
  }
  return file;
}

absl::Status WriteBlockFile(const std::string& path, const v1::BlockMeta& meta,
                            absl::string_view payload) {
  absl::StatusOr<std::string> bytes = EncodeBlockFile(meta, payload);
  if (!bytes.ok()) return bytes.status();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
    out.flush();
    if (!out) {
      return absl::UnavailableError(absl::StrCat("cannot write ", tmp, ": ",
                                                 std::strerror(errno)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<BlockFile> ReadBlockFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    const std::string message = absl::StrCat("cannot open ", path, ": ", std::strerror(e));
    return e == ENOENT ? absl::NotFoundError(message) : absl::UnavailableError(message);
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot stat ", path, ": ", std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is a directory, not a block file"));
  }
  const bool regular = S_ISREG(st.st_mode);
  std::string bytes;
  bool eof = false;
  auto read = [&](size_t n, absl::string_view what) -> absl::Status {
    if (ReadFully(fd, n, &bytes, &eof)) return absl::OkStatus();
    if (eof) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": block file is truncated (", what, ")"));
    }
    return absl::UnavailableError(
        absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  };
  auto prefix = [&](absl::Status s) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  };
  // Header: magic, version, metadata length.
  if (absl::Status s = read(16, "header"); !s.ok()) {
    return eof ? prefix(absl::InvalidArgumentError("not an evoke block file (too short)")) : s;
  }
  if (std::memcmp(bytes.data(), kMagic, 8) != 0) {
    return prefix(absl::InvalidArgumentError("not an evoke block file (bad magic)"));
  }
  const uint32_t version = static_cast<uint32_t>(GetLE(bytes, 8, 4));
  if (version != kVersion) {
    return prefix(absl::InvalidArgumentError(
        absl::StrCat("block file version ", version, " is not supported (want 1)")));
  }
  const uint64_t meta_len = GetLE(bytes, 12, 4);
  if (meta_len > kMaxBlockFileMetaBytes) return prefix(MetaTooLong(meta_len));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (regular && 16 + meta_len + 8 + 8 > size) {
    return prefix(absl::InvalidArgumentError("block file is truncated (metadata)"));
  }
  EVOKE_RETURN_IF_ERROR(read(meta_len + 8, "metadata"));
  const uint64_t payload_len = GetLE(bytes, 16 + meta_len, 8);
  if (payload_len > kMaxBlockFilePayloadBytes) return prefix(PayloadTooLong(payload_len));
  if (regular && 16 + meta_len + 8 + payload_len + 8 != size) {
    return prefix(absl::InvalidArgumentError(absl::StrCat(
        "block file is truncated or has trailing bytes (header says ",
        16 + meta_len + 8 + payload_len + 8, " bytes, the file has ", size, ")")));
  }
  EVOKE_RETURN_IF_ERROR(read(payload_len + 8, "payload"));
  // Nothing may follow (a pipe or a device has no size to check up front).
  char extra;
  ssize_t r;
  do {
    r = ::read(fd, &extra, 1);
  } while (r < 0 && errno == EINTR);
  if (r > 0) {
    return prefix(absl::InvalidArgumentError("block file has trailing bytes"));
  }
  if (r < 0) {
    return absl::UnavailableError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  absl::StatusOr<BlockFile> file = DecodeBlockFile(bytes);
  if (!file.ok()) return prefix(file.status());
  return file;
}

}  // namespace evoke

namespace evoke {

// ---------------------------------------------------------------------------
// Block streams.

BlockStreamWriter::BlockStreamWriter(int fd, std::string path, std::string tmp_path)
    : fd_(fd), path_(std::move(path)), tmp_path_(std::move(tmp_path)) {}

BlockStreamWriter::~BlockStreamWriter() {
  if (!tmp_path_.empty()) {
    if (fd_ >= 0) ::close(fd_);
    if (!finished_) ::unlink(tmp_path_.c_str());
  }
}

absl::StatusOr<std::unique_ptr<BlockStreamWriter>> BlockStreamWriter::Create(
    const std::string& path) {
  std::unique_ptr<BlockStreamWriter> w;
  if (path == "-") {
    w.reset(new BlockStreamWriter(STDOUT_FILENO, "standard output", ""));
  } else {
    const std::string tmp = path + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return OpenError("create", tmp, errno);
    w.reset(new BlockStreamWriter(fd, path, tmp));
  }
  std::string header(kBlockStreamMagic, sizeof(kBlockStreamMagic));
  PutU32(&header, kStreamVersion);
  PutU32(&header, 0);
  EVOKE_RETURN_IF_ERROR(w->Write(header));
  return w;
}

absl::Status BlockStreamWriter::Write(absl::string_view bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t r = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (r < 0) {
      if (errno == EINTR) continue;
      return OpenError("write", tmp_path_.empty() ? path_ : tmp_path_, errno);
    }
    done += static_cast<size_t>(r);
  }
  bytes_ += bytes.size();
  return absl::OkStatus();
}

absl::Status BlockStreamWriter::Append(const v1::BlockMeta& meta, absl::string_view payload) {
  if (finished_) return absl::FailedPreconditionError("block stream already finished");
  EVOKE_ASSIGN_OR_RETURN(const std::string file, EncodeBlockFile(meta, payload));
  std::string head(1, kRecordBlock);
  PutU64(&head, file.size());
  EVOKE_RETURN_IF_ERROR(Write(head));
  EVOKE_RETURN_IF_ERROR(Write(file));
  chain_ = ChainStep(chain_, file.size(), GetLE(file, file.size() - 8, 8));
  ++records_;
  return absl::OkStatus();
}

absl::Status BlockStreamWriter::Finish() {
  if (finished_) return absl::OkStatus();
  std::string trailer(1, kRecordEnd);
  PutU64(&trailer, records_);
  PutU64(&trailer, chain_);
  PutU64(&trailer, ChunkChecksum(trailer.data(), trailer.size()));
  EVOKE_RETURN_IF_ERROR(Write(trailer));
  if (tmp_path_.empty()) {
    finished_ = true;
    return absl::OkStatus();
  }
  if (::fsync(fd_) != 0) return OpenError("sync", tmp_path_, errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return OpenError("close", tmp_path_, errno);
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    return OpenError(absl::StrCat("rename ", tmp_path_, " to"), path_, errno);
  }
  finished_ = true;
  return absl::OkStatus();
}

BlockStreamReader::BlockStreamReader(int fd, std::string path, std::optional<uint64_t> size)
    : fd_(fd), close_fd_(fd != STDIN_FILENO), path_(std::move(path)), size_(size) {}

BlockStreamReader::~BlockStreamReader() {
  if (close_fd_) ::close(fd_);
}

absl::StatusOr<std::unique_ptr<BlockStreamReader>> BlockStreamReader::Open(
    const std::string& path) {
  int fd = STDIN_FILENO;
  std::string name = "standard input";
  if (path != "-") {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return OpenError("open", path, errno);
    name = path;
  }
  std::optional<uint64_t> size;
  struct stat st;
  if (::fstat(fd, &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      if (fd != STDIN_FILENO) ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(name, " is a directory, not a block file or block stream"));
    }
    if (S_ISREG(st.st_mode)) size = static_cast<uint64_t>(st.st_size);
  }
  std::unique_ptr<BlockStreamReader> r(new BlockStreamReader(fd, name, size));
  std::string header;
  EVOKE_ASSIGN_OR_RETURN(const bool full, r->Read(8, &header));
  const bool stream = full && std::memcmp(header.data(), kBlockStreamMagic, 8) == 0;
  const bool file = full && std::memcmp(header.data(), kMagic, 8) == 0;
  if (!stream && !file) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": not an evoke block file or block stream (",
        full ? "bad magic" : "too short", ")"));
  }
  r->stream_ = stream;
  if (stream) {
    EVOKE_ASSIGN_OR_RETURN(const bool got, r->Read(8, &header));
    if (!got) return absl::DataLossError(absl::StrCat(name, ": block stream is truncated in its header"));
    const uint32_t version = static_cast<uint32_t>(GetLE(header, 8, 4));
    const uint32_t flags = static_cast<uint32_t>(GetLE(header, 12, 4));
    if (version != kStreamVersion || flags != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": block stream version ", version, " flags ", flags,
          " is not supported (want version 1, flags 0)"));
    }
  }
  return r;
}

absl::StatusOr<bool> BlockStreamReader::Read(size_t n, std::string* out) {
  bool eof = false;
  const size_t before = out->size();
  const bool ok = ReadFully(fd_, n, out, &eof);
  offset_ += out->size() - before;
  if (ok) return true;
  if (eof) return false;
  return absl::UnavailableError(absl::StrCat("cannot read ", path_, ": ", std::strerror(errno)));
}

absl::Status BlockStreamReader::Corrupt(absl::string_view what) const {
  return absl::DataLossError(absl::StrCat(path_, ": block stream ", what, " (record ",
                                          records_ + 1, " at byte ", record_offset_, "; ",
                                          records_, " intact records before it)"));
}

absl::StatusOr<bool> BlockStreamReader::Next(BlockFile* block) {
  if (done_) return false;
  if (!stream_) {
    // A single block file: the 8 magic bytes are read; the rest as
    // ReadBlockFile checks it, lengths before allocations.
    std::string bytes(kMagic, sizeof(kMagic));
    auto truncated = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": block file is truncated (", what, ")"));
    };
    EVOKE_ASSIGN_OR_RETURN(bool got, Read(8, &bytes));
    if (!got) return truncated("header");
    const uint32_t version = static_cast<uint32_t>(GetLE(bytes, 8, 4));
    if (version != kVersion) {
      return absl::InvalidArgumentError(absl::StrCat(
          path_, ": block file version ", version, " is not supported (want 1)"));
    }
    const uint64_t meta_len = GetLE(bytes, 12, 4);
    if (meta_len > kMaxBlockFileMetaBytes) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": ", MetaTooLong(meta_len).message()));
    }
    if (size_.has_value() && offset_ + meta_len + 8 > *size_) return truncated("metadata");
    EVOKE_ASSIGN_OR_RETURN(got, Read(meta_len + 8, &bytes));
    if (!got) return truncated("metadata");
    const uint64_t payload_len = GetLE(bytes, 16 + meta_len, 8);
    if (payload_len > kMaxBlockFilePayloadBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": ", PayloadTooLong(payload_len).message()));
    }
    if (size_.has_value() && offset_ + payload_len + 8 > *size_) return truncated("payload");
    EVOKE_ASSIGN_OR_RETURN(got, Read(payload_len + 8, &bytes));
    if (!got) return truncated("payload");
    std::string extra;
    EVOKE_ASSIGN_OR_RETURN(got, Read(1, &extra));
    if (!extra.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": block file has trailing bytes"));
    }
    absl::StatusOr<BlockFile> file = DecodeBlockFile(bytes);
    if (!file.ok()) {
      return absl::Status(file.status().code(),
                          absl::StrCat(path_, ": ", file.status().message()));
    }
    *block = *std::move(file);
    done_ = true;
    ++records_;
    return true;
  }
  record_offset_ = offset_;
  std::string head;
  EVOKE_ASSIGN_OR_RETURN(bool got, Read(1 + 8, &head));
  if (!got) {
    return Corrupt(head.empty() ? "is truncated: it ends without its trailer"
                                : "is truncated in a record header");
  }
  const char kind = head[0];
  if (kind == kRecordEnd) {
    std::string trailer = head;
    EVOKE_ASSIGN_OR_RETURN(got, Read(kTrailerBytes - trailer.size(), &trailer));
    if (!got) return Corrupt("is truncated in its trailer");
    if (GetLE(trailer, 17, 8) != ChunkChecksum(trailer.data(), 17)) {
      return Corrupt("trailer checksum does not match (the trailer is damaged)");
    }
    const uint64_t count = GetLE(trailer, 1, 8);
    if (count != records_) {
      return Corrupt(absl::StrCat("trailer counts ", count, " records but ", records_,
                                  " were read (records are missing)"));
    }
    if (GetLE(trailer, 9, 8) != chain_) {
      return Corrupt("checksum does not match (records were changed, dropped or reordered)");
    }
    std::string extra;
    EVOKE_ASSIGN_OR_RETURN(got, Read(1, &extra));
    if (!extra.empty()) {
      record_offset_ = offset_ - 1;
      return Corrupt("has bytes after its trailer");
    }
    done_ = true;
    return false;
  }
  if (kind != kRecordBlock) {
    return Corrupt(absl::StrFormat("has an unknown record kind 0x%02x (damaged)",
                                   static_cast<unsigned>(static_cast<uint8_t>(kind))));
  }
  const uint64_t length = GetLE(head, 1, 8);
  if (length < 32 || length > kMaxBlockStreamRecordBytes) {
    return Corrupt(absl::StrCat("record length ", length, " is impossible (damaged)"));
  }
  if (size_.has_value() && offset_ + length > *size_) {
    return Corrupt(absl::StrCat("is truncated: the record needs ", length,
                                " bytes, the file ends first"));
  }
  std::string file;
  EVOKE_ASSIGN_OR_RETURN(got, Read(length, &file));
  if (!got) return Corrupt("is truncated inside a record");
  absl::StatusOr<BlockFile> decoded = DecodeBlockFile(file);
  if (!decoded.ok()) return Corrupt(absl::StrCat("record is damaged: ", decoded.status().message()));
  chain_ = ChainStep(chain_, length, GetLE(file, file.size() - 8, 8));
  *block = *std::move(decoded);
  ++records_;
  return true;
}

}  // namespace evoke
