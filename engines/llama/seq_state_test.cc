// Unit tests of the llama.cpp sequence-state <-> canonical conversion, with
// synthetic blobs (the real engine's blobs are exercised by
// tests/llama_e2e_test.cc).
#include "engines/llama/seq_state.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "common/block_validation.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

// The largest single allocation asked for while g_track_allocations is set.
// Requests above 256 MiB throw std::bad_alloc instead of being tried (the
// unfixed parser asked for 16 GiB and more; the test must not take it).
namespace evoke::llama {
std::atomic<bool> g_track_allocations{false};
std::atomic<size_t> g_largest_allocation{0};
}  // namespace evoke::llama

void* operator new(size_t size) {
  if (evoke::llama::g_track_allocations.load(std::memory_order_relaxed)) {
    size_t seen = evoke::llama::g_largest_allocation.load(std::memory_order_relaxed);
    while (size > seen &&
           !evoke::llama::g_largest_allocation.compare_exchange_weak(seen, size)) {
    }
    if (size > (256u << 20)) throw std::bad_alloc();
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
// GCC takes free() in a replaced operator delete for a mismatch once it is
// inlined where `new` was called; the pair is malloc / free here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

namespace evoke::llama {
namespace {

using ::testing::HasSubstr;

// LargestAllocationOfParse parses `blob` and returns the largest single
// allocation it asked for (0 when a std::bad_alloc escaped: then *escaped).
size_t LargestAllocationOfParse(const std::string& blob, absl::Status* status, bool* escaped) {
  g_largest_allocation = 0;
  g_track_allocations = true;
  *escaped = false;
  try {
    *status = ParseSeqState(blob).status();
  } catch (const std::bad_alloc&) {
    *escaped = true;
  }
  g_track_allocations = false;
  return g_largest_allocation;
}

std::string Pattern(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    s[i] = static_cast<char>(x >> 24);
  }
  return s;
}

CacheFormat Format(v1::DType k, v1::DType v, bool v_trans) {
  return CacheFormat{3, 2, 8, k, v, v_trans};
}

uint64_t PayloadBytes(const CacheFormat& f, size_t n) {
  return f.n_layer * n * f.n_kv_heads * f.head_dim * (DTypeBytes(f.k_dtype) + DTypeBytes(f.v_dtype));
}

class RoundTrip : public ::testing::TestWithParam<std::tuple<v1::DType, bool>> {};

TEST_P(RoundTrip, CanonicalToBlobAndBack) {
  const auto [dtype, v_trans] = GetParam();
  const CacheFormat f = Format(dtype, dtype, v_trans);
  const std::vector<int32_t> positions = {10, 11, 12, 13, 20};
  const std::string payload = Pattern(PayloadBytes(f, positions.size()), 7);
  absl::StatusOr<std::string> blob = ToSeqStateBlob(payload, positions, f, 3);
  ASSERT_TRUE(blob.ok()) << blob.status();
  absl::StatusOr<SeqState> state = ParseSeqState(*blob);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->positions, positions);
  EXPECT_EQ(state->n_layer, 3u);
  EXPECT_EQ(state->v_trans, v_trans);
  EXPECT_EQ(state->k_type, GgmlTypeOfDType(dtype));
  absl::StatusOr<CanonicalRange> back = ToCanonical(*state, 2, 8);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->positions, positions);
  EXPECT_TRUE(back->payload == payload) << "payload changed in the round trip";
}

INSTANTIATE_TEST_SUITE_P(Types, RoundTrip,
                         ::testing::Combine(::testing::Values(v1::DTYPE_F16, v1::DTYPE_F32,
                                                              v1::DTYPE_BF16),
                                            ::testing::Bool()));

TEST(SeqStateTest, TransposedVIsElementMajorInTheBlob) {
  // One layer, one head of 2 elements, 3 cells, f32: V rows (a0 a1), (b0 b1),
  // (c0 c1) must appear as a0 b0 c0 a1 b1 c1 in a transposed blob.
  const CacheFormat f{1, 1, 2, v1::DTYPE_F32, v1::DTYPE_F32, true};
  std::vector<float> payload = {/*K*/ 0, 0, 0, 0, 0, 0, /*V*/ 1, 2, 3, 4, 5, 6};
  absl::StatusOr<std::string> blob = ToSeqStateBlob(
      absl::string_view(reinterpret_cast<const char*>(payload.data()), payload.size() * 4),
      {0, 1, 2}, f, 0);
  ASSERT_TRUE(blob.ok()) << blob.status();
  std::vector<float> tail(6);
  std::memcpy(tail.data(), blob->data() + blob->size() - 24, 24);
  EXPECT_EQ(tail, (std::vector<float>{1, 3, 5, 2, 4, 6}));
}

TEST(SeqStateTest, CellsOutOfPositionOrderAreSorted) {
  // Cells in cache order hold positions 7, 5, 6: canonical order is 5, 6, 7.
  const CacheFormat f{1, 1, 2, v1::DTYPE_F32, v1::DTYPE_F32, false};
  // K rows per cell: cell c = (c, c); V rows: (10 + c, 10 + c).
  std::vector<float> cells = {0, 0, 1, 1, 2, 2, 10, 10, 11, 11, 12, 12};
  absl::StatusOr<std::string> blob = ToSeqStateBlob(
      absl::string_view(reinterpret_cast<const char*>(cells.data()), cells.size() * 4),
      {7, 5, 6}, f, 1);
  ASSERT_TRUE(blob.ok()) << blob.status();
  absl::StatusOr<SeqState> state = ParseSeqState(*blob);
  ASSERT_TRUE(state.ok()) << state.status();
  absl::StatusOr<CanonicalRange> c = ToCanonical(*state, 1, 2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->positions, (std::vector<int32_t>{5, 6, 7}));
  std::vector<float> got(12);
  std::memcpy(got.data(), c->payload.data(), 48);
  EXPECT_EQ(got, (std::vector<float>{1, 1, 2, 2, 0, 0, 11, 11, 12, 12, 10, 10}));
}

TEST(SeqStateTest, EmptySequenceParsesToNoCells) {
  std::string blob(16, '\0');
  const uint32_t words[4] = {kSeqStateMagic, 1, 1, 0};
  std::memcpy(blob.data(), words, 16);
  absl::StatusOr<SeqState> state = ParseSeqState(blob);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_TRUE(state->positions.empty());
}

TEST(SeqStateTest, RefusesOtherMagicSeveralStreamsAndTruncation) {
  const CacheFormat f = Format(v1::DTYPE_F16, v1::DTYPE_F16, false);
  const std::string payload = Pattern(PayloadBytes(f, 2), 1);
  std::string blob = ToSeqStateBlob(payload, {0, 1}, f, 0).value();

  std::string bad_magic = blob;
  bad_magic[0] ^= 1;
  EXPECT_EQ(ParseSeqState(bad_magic).status().code(), absl::StatusCode::kFailedPrecondition);

  std::string two_streams = blob;
  two_streams[8] = 2;
  absl::Status s = ParseSeqState(two_streams).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("kv_unified"));

  // A row size whose product with the cell count wraps around 2^64.
  std::string huge_rows = blob;
  const uint64_t wraps = (uint64_t{1} << 63) + 8;  // x 2 cells = 16 (mod 2^64)
  std::memcpy(huge_rows.data() + 52, &wraps, 8);   // layer 0's K row size
  s = ParseSeqState(huge_rows).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("K rows"));

  s = ParseSeqState(blob.substr(0, blob.size() - 1)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("V rows"));
  EXPECT_EQ(ParseSeqState(blob + "x").status().code(), absl::StatusCode::kDataLoss);
}

TEST(SeqStateTest, RefusesQuantizedCachesByName) {
  const CacheFormat f = Format(v1::DTYPE_F16, v1::DTYPE_F16, false);
  std::string blob = ToSeqStateBlob(Pattern(PayloadBytes(f, 1), 2), {4}, f, 0).value();
  // First K type field: after magic, seq, n_stream, cell_count (16 bytes),
  // one cell (12 bytes), v_trans and n_layer (8 bytes).
  const int32_t q8_0 = 8;
  std::memcpy(blob.data() + 36, &q8_0, 4);
  absl::StatusOr<SeqState> state = ParseSeqState(blob);
  ASSERT_FALSE(state.ok());  // layer 1 now disagrees with layer 0
  EXPECT_EQ(state.status().code(), absl::StatusCode::kFailedPrecondition);

  absl::Status s = DTypeOfGgmlType(q8_0, "type_k").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("type_k"));
  EXPECT_THAT(s.message(), HasSubstr("quantized"));
}

TEST(SeqStateTest, RefusesDuplicatePositionsAndWrongSizes) {
  const CacheFormat f = Format(v1::DTYPE_F32, v1::DTYPE_F32, false);
  std::string blob = ToSeqStateBlob(Pattern(PayloadBytes(f, 2), 3), {9, 9}, f, 0).value();
  absl::StatusOr<SeqState> state = ParseSeqState(blob);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(ToCanonical(*state, 2, 8).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ToCanonical(*state, 2, 4).status().code(), absl::StatusCode::kInvalidArgument);

  absl::Status s = ToSeqStateBlob("short", {0}, f, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("payload"));
}

void Put32(std::string* blob, size_t at, uint32_t v) { std::memcpy(blob->data() + at, &v, 4); }

// Issue #11: the parser sized its vectors from the blob's counts before
// checking them against the bytes left: 20 bytes claiming 2^32 - 1 cells
// asked for 16 GiB, a layer count of 2^32 - 1 for 128 GiB.
TEST(SeqStateTest, CountsAreCheckedBeforeAllocating) {
  const CacheFormat f = Format(v1::DTYPE_F16, v1::DTYPE_F16, false);
  const std::string good = ToSeqStateBlob(Pattern(PayloadBytes(f, 2), 5), {0, 1}, f, 0).value();
  struct Case {
    const char* name;
    std::string blob;
  };
  std::vector<Case> cases;
  // Header only, 2^32 - 1 cells.
  cases.push_back({"cells", good.substr(0, 16)});
  Put32(&cases.back().blob, 12, 0xffffffffu);
  // The cells of the good blob, then 2^32 - 1 layers.
  cases.push_back({"layers", good});
  Put32(&cases.back().blob, 16 + 2 * 12 + 4, 0xffffffffu);
  // 2^32 - 1 layers, transposed V.
  cases.push_back({"layers v_trans", good});
  Put32(&cases.back().blob, 16 + 2 * 12, 1);
  Put32(&cases.back().blob, 16 + 2 * 12 + 4, 0xffffffffu);
  for (const Case& c : cases) {
    absl::Status status;
    bool escaped = false;
    const size_t largest = LargestAllocationOfParse(c.blob, &status, &escaped);
    EXPECT_FALSE(escaped) << c.name << ": std::bad_alloc escaped the parser";
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << c.name << ": " << status;
    EXPECT_LE(largest, 2 * c.blob.size() + 1024) << c.name;
  }
}

// Random damage to valid blobs (counts, sizes, types, truncation): the
// parser returns a status, never throws, never allocates more than about
// twice the blob, and what it accepts converts without reading out of bounds.
TEST(SeqStateTest, DamagedBlobsAreRefusedWithinBoundedMemory) {
  std::mt19937_64 rng(11);
  int accepted = 0;
  for (const bool v_trans : {false, true}) {
    const CacheFormat f = Format(v1::DTYPE_F16, v1::DTYPE_F32, v_trans);
    const std::string good =
        ToSeqStateBlob(Pattern(PayloadBytes(f, 3), 9), {2, 0, 1}, f, 4).value();
    for (int trial = 0; trial < 3000; ++trial) {
      std::string blob = good;
      const int edits = 1 + static_cast<int>(rng() % 3);
      for (int e = 0; e < edits; ++e) {
        const size_t at = rng() % (blob.size() - 3) & ~size_t{3};  // A 32-bit field.
        switch (rng() % 4) {
          case 0: Put32(&blob, at, static_cast<uint32_t>(rng())); break;
          case 1: Put32(&blob, at, 0xffffffffu - static_cast<uint32_t>(rng() % 4)); break;
          case 2: Put32(&blob, at, static_cast<uint32_t>(rng() % 64)); break;
          default: blob.resize(rng() % blob.size()); break;
        }
        if (blob.size() < 4) break;
      }
      absl::Status status;
      bool escaped = false;
      const size_t largest = LargestAllocationOfParse(blob, &status, &escaped);
      ASSERT_FALSE(escaped) << "trial " << trial;
      ASSERT_LE(largest, 2 * blob.size() + 1024) << "trial " << trial;
      if (status.ok()) {
        ++accepted;
        absl::StatusOr<SeqState> state = ParseSeqState(blob);
        ASSERT_TRUE(state.ok());
        (void)ToCanonical(*state, 2, 8);  // Any status; no out-of-bounds read.
      }
    }
  }
  EXPECT_GT(accepted, 0);  // Some edits (positions, seq ids) leave a valid blob.
}

}  // namespace
}  // namespace evoke::llama
