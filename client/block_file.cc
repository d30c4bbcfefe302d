#include "evoke/block_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"

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

}  // namespace

absl::StatusOr<std::string> EncodeBlockFile(const v1::BlockMeta& meta,
                                            absl::string_view payload) {
  if (!meta.has_checksum() ||
      meta.checksum() != PayloadChecksum(payload.data(), payload.size())) {
    return absl::InvalidArgumentError(
        "meta.checksum: missing or does not match the payload");
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
  if (16 + meta_len + 8 + 8 > b.size()) {
    return absl::InvalidArgumentError("block file is truncated (metadata)");
  }
  const uint64_t payload_len = GetLE(b, 16 + meta_len, 8);
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
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return DecodeBlockFile(buffer.str());
}

}  // namespace evoke
