#include "common/byte_size.h"

#include <cmath>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace evoke {

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  size_t split = 0;
  while (split < trimmed.size() &&
         (absl::ascii_isdigit(trimmed[split]) || trimmed[split] == '.')) {
    ++split;
  }
  const absl::string_view number = trimmed.substr(0, split);
  const std::string unit =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(trimmed.substr(split)));
  if (number.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text, "' is not a byte size (expected e.g. 4096, 64MiB, 1.5GiB)"));
  }
  double multiplier = 0;
  if (unit.empty() || unit == "b") {
    multiplier = 1;
  } else if (unit == "k" || unit == "kib") {
    multiplier = 1024.0;
  } else if (unit == "m" || unit == "mib") {
    multiplier = 1024.0 * 1024;
  } else if (unit == "g" || unit == "gib") {
    multiplier = 1024.0 * 1024 * 1024;
  } else if (unit == "t" || unit == "tib") {
    multiplier = 1024.0 * 1024 * 1024 * 1024;
  } else if (unit == "kb") {
    multiplier = 1e3;
  } else if (unit == "mb") {
    multiplier = 1e6;
  } else if (unit == "gb") {
    multiplier = 1e9;
  } else if (unit == "tb") {
    multiplier = 1e12;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text, "': unknown unit '", unit,
        "' (use B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB)"));
  }
  uint64_t integer = 0;
  if (number.find('.') == absl::string_view::npos &&
      absl::SimpleAtoi(number, &integer)) {
    const uint64_t m = static_cast<uint64_t>(multiplier);
    if (integer != 0 && m > UINT64_MAX / integer) {
      return absl::InvalidArgumentError(absl::StrCat("'", text, "' overflows"));
    }
    return integer * m;
  }
  double value = 0;
  if (!absl::SimpleAtod(number, &value) || !std::isfinite(value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a byte size"));
  }
  const double bytes = std::floor(value * multiplier);
  if (bytes >= 18446744073709551615.0) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' overflows"));
  }
  return static_cast<uint64_t>(bytes);
}

std::string FormatByteSize(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB",
                                           "PiB"};
  int unit = 0;
  uint64_t divisor = 1;
  while (unit < 5 && bytes >= divisor * 1024) {
    divisor *= 1024;
    ++unit;
  }
  if (bytes % divisor == 0) {
    return absl::StrCat(bytes / divisor, " ", kUnits[unit]);
  }
  return absl::StrFormat("%.2f %s", static_cast<double>(bytes) / divisor,
                         kUnits[unit]);
}

}  // namespace evoke
