#include "common/copy_pool.h"

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "gtest/gtest.h"

namespace evoke {
namespace {

TEST(CopyPoolTest, ParallelResultsEqualTheSerialDefinition) {
  CopyPool pool(3);
  std::mt19937_64 rng(9);
  for (size_t size : {1ul, 4096ul, (1ul << 20), (2ul << 20) + 1, (5ul << 20) + 12345,
                      16ul << 20}) {
    std::string src(size, '\0');
    for (size_t i = 0; i < size; i += 8) src[i] = static_cast<char>(rng());
    const uint64_t expected = PayloadChecksum(src.data(), size);
    std::string a(size, 'a'), b(size, 'b');
    EXPECT_EQ(pool.CopyHashingDestination(a.data(), src.data(), size), expected) << size;
    EXPECT_EQ(pool.CopyHashingSource(b.data(), src.data(), size), expected) << size;
    EXPECT_EQ(pool.Checksum(src.data(), size), expected) << size;
    EXPECT_EQ(a, src);
    EXPECT_EQ(b, src);
  }
}

TEST(CopyPoolTest, PiecesCopyInParallelAsTheSerialDefinition) {
  CopyPool pool(3);
  std::mt19937_64 rng(10);
  for (size_t size : {1ul, (2ul << 20) + 1, (5ul << 20) + 12345, 16ul << 20}) {
    std::string src(size, '\0');
    for (size_t i = 0; i < size; i += 8) src[i] = static_cast<char>(rng());
    std::vector<absl::string_view> pieces;
    for (size_t at = 0; at < size; at += 16384 + 3) {
      pieces.emplace_back(src.data() + at, std::min<size_t>(16384 + 3, size - at));
    }
    std::string a(size, 'a');
    EXPECT_EQ(pool.CopyHashingDestination(a.data(), pieces),
              PayloadChecksum(src.data(), size)) << size;
    EXPECT_TRUE(a == src) << size;
  }
}

TEST(CopyPoolTest, ManyConcurrentCallers) {
  CopyPool pool(2);
  const size_t size = (6 << 20) + 3;
  std::string src(size, 'z');
  for (size_t i = 0; i < size; i += 4096) src[i] = static_cast<char>(i);
  const uint64_t expected = PayloadChecksum(src.data(), size);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      std::string dst(size, '\0');
      for (int k = 0; k < 10; ++k) {
        if (pool.CopyHashingDestination(dst.data(), src.data(), size) != expected ||
            dst != src) {
          ++wrong;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(CopyPoolTest, NoWorkersIsSerial) {
  CopyPool pool(0);
  std::string src(3 << 20, 'q'), dst(3 << 20, '\0');
  EXPECT_EQ(pool.CopyHashingDestination(dst.data(), src.data(), src.size()),
            PayloadChecksum(src.data(), src.size()));
  EXPECT_EQ(dst, src);
}

}  // namespace
}  // namespace evoke
