// Engines for storage tests: a TierManager over a real SpillStore, and
// blocks saved into it. Header only: the tests that include it link
// evoke_storage.
#ifndef EVOKE_TESTING_ENGINE_H_
#define EVOKE_TESTING_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "storage/pinned_arena.h"
#include "storage/tier2/spill_store.h"
#include "storage/tier_manager.h"
#include "testing/blocks.h"

namespace evoke::testing {

// An engine over a real SpillStore at `path` (handed to `wrap` first, when
// given) with a tier 1 of `tier1_bytes`; `tier1` gets the arena.
inline absl::StatusOr<std::unique_ptr<TierManager>> OpenEngine(
    const std::string& path, uint64_t tier1_bytes, const TierManagerOptions& options,
    const std::function<std::unique_ptr<SpillStore>(std::unique_ptr<SpillStore>)>& wrap,
    PinnedArena** tier1 = nullptr) {
  PinnedArenaOptions arena_options;
  arena_options.capacity_bytes = tier1_bytes;
  arena_options.lock_memory = false;
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<PinnedArena> arena, PinnedArena::Create(arena_options));
  if (tier1 != nullptr) *tier1 = arena.get();
  SpillStoreOptions spill_options;
  spill_options.path = path;
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<SpillStore> spill, SpillStore::Open(spill_options));
  if (wrap) spill = wrap(std::move(spill));
  return TierManager::Open(options, std::move(arena), std::move(spill));
}

// SaveBlocks saves `n` session blocks of `block_bytes` (payload seeds from
// `seed`), one Save each under pin owner `owner`, and appends their metas
// and ids.
inline absl::Status SaveBlocks(TierManager& tm, absl::string_view session, uint64_t n,
                               uint64_t seed, bool durable, std::vector<v1::BlockMeta>* metas,
                               std::vector<BlockId>* ids, uint64_t block_bytes = 64 << 10,
                               PinOwner owner = 1) {
  for (uint64_t i = 0; i < n; ++i) {
    metas->push_back(SessionMeta(OpaqueFingerprint(), std::string(session), i, 16, 0, 1, 0));
    ids->push_back(IdOf(metas->back()));
    const std::string payload = Payload(seed + i, block_bytes);
    const SaveItem item{&metas->back(), payload.size(), false};
    HostSaveSource source({payload});
    EVOKE_RETURN_IF_ERROR(
        tm.Save({&item, 1}, source, durable, absl::InfiniteFuture(), owner).status());
  }
  return absl::OkStatus();
}

}  // namespace evoke::testing

#endif  // EVOKE_TESTING_ENGINE_H_
