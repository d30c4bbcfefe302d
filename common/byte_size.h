// Human-readable byte sizes for flags and output: "64MiB", "1.5GiB", "4096".
#ifndef EVOKE_COMMON_BYTE_SIZE_H_
#define EVOKE_COMMON_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace evoke {

// ParseByteSize parses a non-negative size: a number (integer or decimal)
// optionally followed by a unit, case-insensitive, spaces allowed between:
//   B; KiB MiB GiB TiB and their short forms K M G T (powers of 1024);
//   KB MB GB TB (powers of 1000).
// Returns INVALID_ARGUMENT for anything else, for a negative number and on
// overflow of uint64.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

// FormatByteSize renders `bytes` with a binary unit, e.g. "64 MiB",
// "1.50 GiB", "512 B". Exact multiples print without decimals.
std::string FormatByteSize(uint64_t bytes);

}  // namespace evoke

#endif  // EVOKE_COMMON_BYTE_SIZE_H_
