#include "evoke/block_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
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
bool ReadFully(int fd, size_t n, std::string* out, bool* eof) {
  const size_t start = out->size();
  out->resize(start + n);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::read(fd, out->data() + start + done, n - done);
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
