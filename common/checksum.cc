#include "common/checksum.h"

#include <xxhash.h>

namespace evoke {

uint64_t PayloadChecksum(const void* data, size_t size) {
  return XXH3_64bits(data, size);
}

}  // namespace evoke
