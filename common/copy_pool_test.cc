#include "common/copy_pool.h"

#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "gtest/gtest.h"

namespace evoke {
namespace {

std::string RandomBytes(size_t size, std::mt19937_64& rng) {
  std::string out(size, '\0');
  for (size_t i = 0; i < size; i += 8) out[i] = static_cast<char>(rng());
  return out;
}

// Both copies of `src` through `pool` give its bytes and PayloadChecksum.
void ExpectCopiesAsTheDefinition(CopyPool& pool, const std::string& src) {
  const size_t size = src.size();
  const uint64_t expected = PayloadChecksum(src.data(), size);
  std::string a(size, 'a'), b(size, 'b');
  EXPECT_EQ(pool.CopyHashingDestination(a.data(), src.data(), size), expected) << size;
  EXPECT_EQ(pool.CopyHashingSource(b.data(), src.data(), size), expected) << size;
  EXPECT_TRUE(a == src) << size;
  EXPECT_TRUE(b == src) << size;
}

TEST(CopyPoolTest, ParallelResultsEqualTheSerialDefinition) {
  CopyPool pool(3);
  std::mt19937_64 rng(9);
  for (size_t size : {1ul, 4096ul, (1ul << 20), (2ul << 20) + 1, (5ul << 20) + 12345,
                      16ul << 20}) {
    const std::string src = RandomBytes(size, rng);
    ExpectCopiesAsTheDefinition(pool, src);
    EXPECT_EQ(pool.Checksum(src.data(), size), PayloadChecksum(src.data(), size)) << size;
  }
}

// Payloads of kSplitCopyBytes to two chunks are copied by two threads and
// hashed in order by one: every size around the piece and chunk edges, with
// one worker and with several, and with the workers kept busy elsewhere
// (the caller then copies every piece itself).
TEST(CopyPoolTest, SplitCopiesEqualTheSerialDefinition) {
  std::mt19937_64 rng(11);
  const size_t split = CopyPool::kSplitCopyBytes;
  for (int workers : {1, 3}) {
    CopyPool pool(workers);
    for (size_t size : {split - 1, split, split + 1, (1ul << 20) - 1, 1ul << 20,
                        (1ul << 20) + 1, (1ul << 20) + 65536, (2ul << 20) - 7, 2ul << 20}) {
      ExpectCopiesAsTheDefinition(pool, RandomBytes(size, rng));
    }
  }
  CopyPool pool(1);
  const size_t size = 1 << 20;
  std::string src(size, 'x'), dst(size, '\0');
  src[size - 1] = 'y';
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    std::string big(8 << 20, 'b'), out(8 << 20, '\0');
    while (!stop.load()) pool.CopyHashingDestination(out.data(), big.data(), big.size());
  });
  for (int i = 0; i < 200; ++i) {
    ASSERT_EQ(pool.CopyHashingSource(dst.data(), src.data(), size),
              PayloadChecksum(src.data(), size));
    ASSERT_TRUE(dst == src);
    dst.assign(size, '\0');
  }
  stop = true;
  busy.join();
}

TEST(CopyPoolTest, PiecesCopyInParallelAsTheSerialDefinition) {
  CopyPool pool(3);
  std::mt19937_64 rng(10);
  for (size_t size : {1ul, (2ul << 20) + 1, (5ul << 20) + 12345, 16ul << 20}) {
    const std::string src = RandomBytes(size, rng);
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
