// evoke_list_bench: what a filtered listing (evokectl ls --namespace) costs
// the saves running next to it. The index holds `n` blocks of one busy
// namespace (spilled: index entries, no tier-1 bytes) and 16 of a rare one;
// one thread saves 4 KiB blocks while another lists the rare namespace in a
// loop. Same-run baseline: the same saves with no lister (lister:0).
//
//   evoke_list_bench --benchmark_min_time=2
//
// Build with -DEVOKE_LIST_BENCH_OLD_API to run it against the TierManager
// before issue #10 (its List took (after, has_after) and scanned the whole
// index under the lock).
#include <atomic>
#include <cstdint>
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "storage/pinned_arena.h"
#include "storage/tier2/spill_store.h"
#include "storage/tier_manager.h"
#include "testing/blocks.h"
#include "testing/temp_dir.h"

namespace evoke {
namespace {

v1::BlockMeta Meta(const std::string& ns, const std::string& session, uint64_t seq) {
  return evoke::testing::SessionMeta(evoke::testing::OpaqueFingerprint(ns, "bench"), session,
                                     seq, /*n_tokens=*/16, /*layer_begin=*/0, /*layer_end=*/1,
                                     /*first_position=*/0);
}

// One engine per index size, filled once: saving a million blocks takes a
// while, and every benchmark reads the same index.
struct Filled {
  evoke::testing::TempDir dir;
  std::unique_ptr<TierManager> tm;
  uint64_t next_seq = 0;
};

Filled* Fill(int64_t n) {
  static std::map<int64_t, std::unique_ptr<Filled>>* cache =
      new std::map<int64_t, std::unique_ptr<Filled>>();
  auto it = cache->find(n);
  if (it != cache->end()) return it->second.get();
  auto f = std::make_unique<Filled>();
  PinnedArenaOptions arena;
  arena.capacity_bytes = 512ull << 20;
  arena.lock_memory = false;
  SpillStoreOptions spill;
  spill.path = f->dir.Join("db");
  TierManagerOptions options;
  options.spill_bytes = 64ull << 30;
  f->tm = TierManager::Open(options, PinnedArena::Create(arena).value(),
                            SpillStore::Open(spill).value())
              .value();
  const std::string payload(64, 'p');
  constexpr int64_t kBatch = 1024;
  for (int64_t base = 0; base < n; base += kBatch) {
    std::vector<v1::BlockMeta> metas;
    std::vector<SaveItem> items;
    std::vector<absl::string_view> views;
    metas.reserve(kBatch);
    for (int64_t i = base; i < std::min(n, base + kBatch); ++i) {
      metas.push_back(Meta("bulk", "s" + std::to_string(i / 4096), i));
    }
    for (const v1::BlockMeta& m : metas) {
      items.push_back(SaveItem{&m, payload.size(), false});
      views.push_back(payload);
    }
    HostSaveSource source(views);
    if (!f->tm->Save(items, source, false, absl::InfiniteFuture()).ok()) std::abort();
    if ((base / kBatch) % 64 == 63) {
      if (!f->tm->Flush(/*evict=*/true).ok()) std::abort();
    }
  }
  for (int i = 0; i < 16; ++i) {
    const v1::BlockMeta m = Meta("rare", "r", i);
    const SaveItem item{&m, payload.size(), false};
    HostSaveSource source({payload});
    if (!f->tm->Save({&item, 1}, source, false, absl::InfiniteFuture()).ok()) std::abort();
  }
  if (!f->tm->Flush(/*evict=*/true).ok()) std::abort();
  Filled* raw = f.get();
  cache->emplace(n, std::move(f));
  return raw;
}

size_t ListRare(TierManager* tm) {
  ListFilter filter;
  filter.ns = "rare";
  bool more = false;
#ifdef EVOKE_LIST_BENCH_OLD_API
  return tm->List(filter, BlockId(), false, 100, &more).size();
#else
  return tm->List(filter, nullptr, 100, &more).size();
#endif
}

void BM_SaveWhileListing(benchmark::State& state) {
  Filled* f = Fill(state.range(0));
  const bool listing = state.range(1) != 0;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> lists{0};
  std::thread lister;
  if (listing) {
    lister = std::thread([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        if (ListRare(f->tm.get()) != 16) std::abort();
        lists.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  const std::string payload(4096, 'w');
  std::vector<BlockId> written;
  for (auto _ : state) {
    const v1::BlockMeta m = Meta("writer", "w", f->next_seq++);
    const SaveItem item{&m, payload.size(), false};
    HostSaveSource source({payload});
    if (!f->tm->Save({&item, 1}, source, false, absl::InfiniteFuture()).ok()) {
      state.SkipWithError("save failed");
      break;
    }
    written.push_back(BlockId::FromBytes(m.id()).value());
  }
  stop = true;
  if (lister.joinable()) lister.join();
  state.SetItemsProcessed(state.iterations());
  state.counters["lists_per_s"] =
      benchmark::Counter(static_cast<double>(lists.load()), benchmark::Counter::kIsRate);
  // Keep the index the size it was for the next run (after the timed loop).
  for (size_t i = 0; i < written.size(); i += 1024) {
    const size_t end = std::min(written.size(), i + 1024);
    if (!f->tm->Delete(absl::MakeSpan(written).subspan(i, end - i)).ok()) std::abort();
  }
}
BENCHMARK(BM_SaveWhileListing)
    ->ArgNames({"blocks", "lister"})
    ->Args({1 << 20, 0})
    ->Args({1 << 20, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace evoke

BENCHMARK_MAIN();
