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

}  // namespace
}  // namespace evoke
