// OpenMemoryEngine: a TierManager over a 1 MiB unlocked arena and the given
// disk tier, as the fuzz targets that need a real engine open it.
#ifndef EVOKE_FUZZ_FUZZ_ENGINE_H_
#define EVOKE_FUZZ_FUZZ_ENGINE_H_

#include <memory>
#include <utility>

#include "fuzz/fuzz_check.h"
#include "storage/pinned_arena.h"
#include "storage/tier.h"
#include "storage/tier_manager.h"

namespace evoke::fuzz {

inline std::unique_ptr<TierManager> OpenMemoryEngine(const TierManagerOptions& options,
                                                     std::unique_ptr<Tier> disk) {
  PinnedArenaOptions arena_options;
  arena_options.capacity_bytes = 1 << 20;
  arena_options.lock_memory = false;
  absl::StatusOr<std::unique_ptr<PinnedArena>> arena = PinnedArena::Create(arena_options);
  FUZZ_CHECK(arena.ok());
  // A start never fails because of what the disk tier holds.
  absl::StatusOr<std::unique_ptr<TierManager>> tm =
      TierManager::Open(options, std::move(*arena), std::move(disk));
  FUZZ_CHECK(tm.ok());
  return std::move(*tm);
}

}  // namespace evoke::fuzz

#endif  // EVOKE_FUZZ_FUZZ_ENGINE_H_
