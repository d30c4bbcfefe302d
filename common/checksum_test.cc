#include "common/checksum.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace evoke {
namespace {

TEST(ChecksumTest, FusedCopiesMatchOneShotHash) {
  std::mt19937_64 rng(7);
  for (size_t size : {0ul, 1ul, 100ul, 65535ul, 65536ul, 65537ul, 1000000ul, 3ul << 20}) {
    std::string src(size, '\0');
    for (char& c : src) c = static_cast<char>(rng());
    std::string a(size, 'x'), b(size, 'y');
    EXPECT_EQ(CopyHashingDestination(a.data(), src.data(), size),
              PayloadChecksum(src.data(), size)) << size;
    EXPECT_EQ(CopyHashingSource(b.data(), src.data(), size),
              PayloadChecksum(src.data(), size)) << size;
    EXPECT_EQ(a, src);
    EXPECT_EQ(b, src);
  }
}

TEST(ChecksumTest, DefinitionIsChunkedPastOneMiB) {
  std::string small(kChecksumChunkBytes, 's');
  // Up to 1 MiB: one chunk, XXH3 of the bytes.
  EXPECT_EQ(PayloadChecksum(small.data(), small.size()),
            ChunkChecksum(small.data(), small.size()));
  // Past it: XXH3 over the length and the chunk checksums.
  std::string big(2 * kChecksumChunkBytes + 5, 'b');
  big[kChecksumChunkBytes + 7] = 'x';
  const uint64_t chunks[] = {
      ChunkChecksum(big.data(), kChecksumChunkBytes),
      ChunkChecksum(big.data() + kChecksumChunkBytes, kChecksumChunkBytes),
      ChunkChecksum(big.data() + 2 * kChecksumChunkBytes, 5)};
  EXPECT_EQ(PayloadChecksum(big.data(), big.size()), CombineChunkChecksums(chunks, big.size()));
  // Any byte matters, including in later chunks.
  std::string other = big;
  other[2 * kChecksumChunkBytes + 2] = 'y';
  EXPECT_NE(PayloadChecksum(big.data(), big.size()),
            PayloadChecksum(other.data(), other.size()));
}

}  // namespace
}  // namespace evoke
