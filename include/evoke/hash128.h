// Hash128: a 128-bit identifier (block ids, fingerprint digests).
//
// Public header of the client library (installed as <evoke/hash128.h>); it
// stands alone. evoke's own code reaches it as common/hash128.h, which
// includes this file.
#ifndef EVOKE_PUBLIC_HASH128_H_
#define EVOKE_PUBLIC_HASH128_H_

#include <compare>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace evoke {

// Hash128 is a value type: 16 bytes, ordered and hashed as the big-endian
// byte string (so ordering by Hash128 equals ordering by its bytes and by its
// hex form). Thread-compatible.
class Hash128 {
 public:
  constexpr Hash128() = default;
  constexpr Hash128(uint64_t hi, uint64_t lo) : hi_(hi), lo_(lo) {}

  // FromBytes parses exactly 16 bytes (big endian). INVALID_ARGUMENT
  // otherwise; the message says the length it got.
  static absl::StatusOr<Hash128> FromBytes(absl::string_view bytes);
  // FromHex parses exactly 32 hexadecimal digits (either case).
  // INVALID_ARGUMENT otherwise.
  static absl::StatusOr<Hash128> FromHex(absl::string_view hex);

  std::string ToBytes() const;  // 16 bytes, big endian.
  std::string ToHex() const;    // 32 lowercase hex digits.

  constexpr uint64_t hi() const { return hi_; }
  constexpr uint64_t lo() const { return lo_; }
  constexpr bool IsZero() const { return hi_ == 0 && lo_ == 0; }

  friend constexpr bool operator==(const Hash128&, const Hash128&) = default;
  friend constexpr std::strong_ordering operator<=>(const Hash128&,
                                                    const Hash128&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const Hash128& v) {
    return H::combine(std::move(h), v.hi_, v.lo_);
  }

 private:
  uint64_t hi_ = 0;
  uint64_t lo_ = 0;
};

// A block id (see BlockMeta.id).
using BlockId = Hash128;
// The digest of a normalized LayoutFingerprint (see fingerprint.h).
using FingerprintDigest = Hash128;

}  // namespace evoke

#endif  // EVOKE_PUBLIC_HASH128_H_
