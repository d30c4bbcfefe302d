#include "common/hash128.h"

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace evoke {
namespace {

uint64_t LoadBigEndian64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

void StoreBigEndian64(uint64_t v, char* p) {
  for (int i = 7; i >= 0; --i) {
    p[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

absl::StatusOr<Hash128> Hash128::FromBytes(absl::string_view bytes) {
  if (bytes.size() != 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("must be 16 bytes, got ", bytes.size()));
  }
  return Hash128(LoadBigEndian64(bytes.data()),
                 LoadBigEndian64(bytes.data() + 8));
}

absl::StatusOr<Hash128> Hash128::FromHex(absl::string_view hex) {
  if (hex.size() != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("must be 32 hex digits, got ", hex.size(), " characters"));
  }
  uint64_t words[2] = {0, 0};
  for (size_t i = 0; i < 32; ++i) {
    const int d = HexDigit(hex[i]);
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("not a hex digit at position ", i));
    }
    words[i / 16] = (words[i / 16] << 4) | static_cast<uint64_t>(d);
  }
  return Hash128(words[0], words[1]);
}

std::string Hash128::ToBytes() const {
  std::string out(16, '\0');
  StoreBigEndian64(hi_, out.data());
  StoreBigEndian64(lo_, out.data() + 8);
  return out;
}

std::string Hash128::ToHex() const { return absl::BytesToHexString(ToBytes()); }

}  // namespace evoke
