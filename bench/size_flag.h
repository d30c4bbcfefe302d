// SizeOrDie: a byte-size flag ("256MiB", "4 KiB", "1048576") of the bench
// tools, or exit 2 naming the flag. Zero is refused too.
#ifndef EVOKE_BENCH_SIZE_FLAG_H_
#define EVOKE_BENCH_SIZE_FLAG_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "common/byte_size.h"

namespace evoke {

inline uint64_t SizeOrDie(const std::string& text, const char* flag) {
  absl::StatusOr<uint64_t> v = ParseByteSize(text);
  if (!v.ok() || *v == 0) {
    absl::FPrintF(stderr, "%s: bad size %s\n", flag, text);
    std::exit(2);
  }
  return *v;
}

}  // namespace evoke

#endif  // EVOKE_BENCH_SIZE_FLAG_H_
