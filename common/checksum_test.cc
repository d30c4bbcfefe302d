#include "common/checksum.h"

#include <random>
#include <string>
#include <vector>

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

// Cuts `s` into pieces of `piece` bytes (the last shorter), with an empty
// piece in front and in the middle (a transport may hand those over).
std::vector<absl::string_view> Cut(const std::string& s, size_t piece) {
  std::vector<absl::string_view> out = {absl::string_view()};
  for (size_t at = 0; at < s.size(); at += piece) {
    out.emplace_back(s.data() + at, std::min(piece, s.size() - at));
    if (out.size() == 3) out.emplace_back();
  }
  return out;
}

// PayloadHasher gives PayloadChecksum whatever the updates' sizes.
TEST(ChecksumTest, PayloadHasherEqualsTheOneShotChecksum) {
  std::mt19937_64 rng(12);
  for (size_t size : {0ul, 1ul, (1ul << 20) - 1, 1ul << 20, (1ul << 20) + 1, (3ul << 20) + 5}) {
    std::string src(size, '\0');
    for (size_t i = 0; i < size; i += 8) src[i] = static_cast<char>(rng());
    for (size_t step : {1ul, 4093ul, 65536ul, 1ul << 20, 5ul << 20}) {
      if (step == 1 && size > 4096) continue;
      PayloadHasher hasher;
      for (size_t at = 0; at < size; at += step) {
        hasher.Update(src.data() + at, std::min(step, size - at));
      }
      EXPECT_EQ(hasher.Finish(), PayloadChecksum(src.data(), size)) << size << " " << step;
    }
  }
}

TEST(ChecksumTest, PiecesHashAndCopyAsTheirConcatenation) {
  std::mt19937_64 rng(11);
  for (size_t size : {0ul, 1ul, 4096ul, 1ul << 20, (1ul << 20) + 1, (3ul << 20) + 777}) {
    std::string src(size, '\0');
    for (char& c : src) c = static_cast<char>(rng());
    const uint64_t expected = PayloadChecksum(src.data(), size);
    // Pieces smaller than, equal to and larger than the hash's 128 KiB
    // steps and the 1 MiB chunks, and not aligned to either.
    for (size_t piece : {1ul, 7ul, 16384ul, 131072ul, 200000ul, 1ul << 20, 3ul << 20}) {
      if (piece == 1 && size > 4096) continue;  // A million pieces: slow, says nothing new.
      const std::vector<absl::string_view> pieces = Cut(src, piece);
      EXPECT_EQ(PiecesChecksum(pieces), expected) << size << " in " << piece;
      std::string copy(size, 'z');
      EXPECT_EQ(CopyPiecesHashingDestination(copy.data(), pieces), expected)
          << size << " in " << piece;
      EXPECT_TRUE(copy == src) << size << " in " << piece;
    }
  }
  // A chunk taken from the middle: ChunkChecksum of exactly those bytes.
  std::string src(3 << 20, '\0');
  for (char& c : src) c = static_cast<char>(rng());
  std::string chunk(kChecksumChunkBytes, 'z');
  EXPECT_EQ(CopyPiecesHashingDestinationChunk(chunk.data(), Cut(src, 40000), kChecksumChunkBytes,
                                              kChecksumChunkBytes),
            ChunkChecksum(src.data() + kChecksumChunkBytes, kChecksumChunkBytes));
  EXPECT_TRUE(chunk == src.substr(kChecksumChunkBytes, kChecksumChunkBytes));
}

}  // namespace
}  // namespace evoke
