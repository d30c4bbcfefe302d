// Google Benchmark micro-benchmarks of the hot loops under evoked's data
// paths, each beside its baseline in the same run:
//   memcpy vs the fused copy+checksum the daemon uses (CopyHashing*, alone
//   and through a CopyPool), and
//   the xxh3 checksum alone; the tier-1 allocator.
//   build/bench/evoke_micro_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/chain_hash.h"
#include "common/checksum.h"
#include "common/copy_pool.h"
#include "common/fingerprint.h"
#include "storage/pinned_arena.h"
#include "storage/tier2/spill_store.h"
#include "storage/tier_manager.h"
#include "testing/blocks.h"
#include "testing/temp_dir.h"

namespace evoke {
namespace {

// Source and destination rotate over 256 MiB so copies are cache-cold, like
// copies into tier 1.
constexpr size_t kWorkingSet = 256ull << 20;

struct Buffers {
  std::vector<char> src, dst;
  Buffers() : src(kWorkingSet, 1), dst(kWorkingSet, 2) {}
};

Buffers& Bufs() {
  static Buffers* b = new Buffers();
  return *b;
}

template <typename Fn>
void CopyLoop(benchmark::State& state, Fn fn) {
  const size_t n = state.range(0);
  Buffers& b = Bufs();
  size_t off = 0;
  for (auto _ : state) {
    if (off + n > kWorkingSet) off = 0;
    benchmark::DoNotOptimize(fn(b.dst.data() + off, b.src.data() + off, n));
    off += n;
  }
  state.SetBytesProcessed(state.iterations() * n);
}

void BM_Memcpy(benchmark::State& state) {
  CopyLoop(state, [](void* d, const void* s, size_t n) { return std::memcpy(d, s, n); });
}
void BM_CopyHashingDestination(benchmark::State& state) {
  CopyLoop(state, [](void* d, const void* s, size_t n) {
    return CopyHashingDestination(d, s, n);
  });
}
void BM_CopyHashingSource(benchmark::State& state) {
  CopyLoop(state, [](void* d, const void* s, size_t n) { return CopyHashingSource(d, s, n); });
}
void BM_Checksum(benchmark::State& state) {
  CopyLoop(state, [](void*, const void* s, size_t n) { return PayloadChecksum(s, n); });
}

// The same through a CopyPool of evoked's default size (2 workers): above
// CopyPool::kSplitCopyBytes, one chunk copied by two threads.
CopyPool& Pool() {
  static CopyPool* pool = new CopyPool(2);
  return *pool;
}
void BM_PoolCopyHashingDestination(benchmark::State& state) {
  CopyLoop(state, [](void* d, const void* s, size_t n) {
    return Pool().CopyHashingDestination(d, s, n);
  });
}
void BM_PoolCopyHashingSource(benchmark::State& state) {
  CopyLoop(state, [](void* d, const void* s, size_t n) {
    return Pool().CopyHashingSource(d, s, n);
  });
}

// The same copy from a payload in 16 KiB pieces (an inline Save's bytes as
// gRPC received them, HTTP/2 DATA frames), as the TierManager copies it.
void BM_CopyPiecesHashingDestination(benchmark::State& state) {
  std::vector<absl::string_view> pieces;
  CopyLoop(state, [&](void* d, const void* s, size_t n) {
    pieces.clear();
    for (size_t at = 0; at < n; at += 16384) {
      pieces.emplace_back(static_cast<const char*>(s) + at, std::min<size_t>(16384, n - at));
    }
    return CopyPiecesHashingDestination(d, pieces);
  });
}

BENCHMARK(BM_Memcpy)->RangeMultiplier(4)->Range(64 << 10, 16 << 20);
BENCHMARK(BM_CopyPiecesHashingDestination)->RangeMultiplier(4)->Range(64 << 10, 16 << 20);
BENCHMARK(BM_CopyHashingDestination)->RangeMultiplier(4)->Range(64 << 10, 16 << 20);
BENCHMARK(BM_CopyHashingSource)->RangeMultiplier(4)->Range(64 << 10, 16 << 20);
BENCHMARK(BM_PoolCopyHashingDestination)->Arg(256 << 10)->Arg(512 << 10)->Arg(1 << 20)->Arg(2 << 20);
BENCHMARK(BM_PoolCopyHashingSource)->Arg(256 << 10)->Arg(512 << 10)->Arg(1 << 20)->Arg(2 << 20);
BENCHMARK(BM_Checksum)->RangeMultiplier(4)->Range(64 << 10, 16 << 20);

void BM_ArenaAllocateFree(benchmark::State& state) {
  PinnedArenaOptions options;
  options.capacity_bytes = 1ull << 30;
  options.lock_memory = false;
  auto arena = PinnedArena::Create(options).value();
  std::vector<Extent> live;
  size_t i = 0;
  for (auto _ : state) {
    const uint64_t size = (16 + (i * 7919) % 1000) << 10;
    auto e = arena->Allocate(size);
    if (e.ok()) live.push_back(*e);
    if (live.size() > 512 || !e.ok()) {
      arena->Free(live[i % live.size()]);
      live[i % live.size()] = live.back();
      live.pop_back();
    }
    ++i;
  }
  for (const Extent& e : live) arena->Free(e);
}
BENCHMARK(BM_ArenaAllocateFree);

void BM_DigestFingerprint(benchmark::State& state) {
  const v1::LayoutFingerprint fp = testing::OpaqueFingerprint("bench", "bench");
  for (auto _ : state) benchmark::DoNotOptimize(DigestFingerprint(fp));
}
BENCHMARK(BM_DigestFingerprint);

// The TierManager alone (no gRPC): a batch of `range(0)` blocks of 64 KiB
// saved, loaded back, then deleted, per iteration.
void BM_TierManagerBatch(benchmark::State& state) {
  const int n = state.range(0);
  constexpr size_t kBlock = 64 << 10;
  evoke::testing::TempDir dir;
  PinnedArenaOptions arena;
  arena.capacity_bytes = 256ull << 20;
  arena.lock_memory = false;
  SpillStoreOptions spill;
  spill.path = dir.Join("db");
  auto tm = TierManager::Open(TierManagerOptions(), PinnedArena::Create(arena).value(),
                              SpillStore::Open(spill).value())
                .value();
  const v1::LayoutFingerprint fp = testing::OpaqueFingerprint("bench", "bench");
  std::vector<v1::BlockMeta> metas(n);
  std::vector<SaveItem> items(n);
  std::vector<BlockId> ids(n);
  std::string payload(n * kBlock, 'p');
  std::vector<absl::string_view> views;
  for (int i = 0; i < n; ++i) {
    v1::BlockMeta& m = metas[i];
    m = testing::SessionMeta(fp, "s", i, /*n_tokens=*/1, 0, 1, 0);
    items[i] = SaveItem{&m, kBlock, false};
    ids[i] = testing::IdOf(m);
    views.push_back(absl::string_view(payload.data() + i * kBlock, kBlock));
  }
  for (auto _ : state) {
    HostSaveSource source(views);
    benchmark::DoNotOptimize(tm->Save(items, source, false, absl::InfiniteFuture()));
    StringLoadSink sink;
    std::vector<v1::BlockMeta> out;
    std::vector<LoadedInfo> infos;
    benchmark::DoNotOptimize(tm->Load(ids, fp, sink, &out, &infos));
    benchmark::DoNotOptimize(tm->Delete(ids));
  }
  state.SetBytesProcessed(state.iterations() * n * kBlock * 2);
}
BENCHMARK(BM_TierManagerBatch)->Arg(1)->Arg(64);

}  // namespace
}  // namespace evoke

BENCHMARK_MAIN();
