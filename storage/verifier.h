// VerifyBlocks: the scrub behind TierManager::Verify (evokectl verify).
#ifndef EVOKE_STORAGE_VERIFIER_H_
#define EVOKE_STORAGE_VERIFIER_H_

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/hash128.h"
#include "storage/engine_core.h"
#include "storage/tier_types.h"

namespace evoke {

// VerifyBlocks re-reads `ids` (every block when empty) from each tier that
// holds them and checks their checksums, one block at a time (the index lock
// is held only to look each one up). A corrupt tier-1 copy is quarantined, a
// corrupt tier-2 copy dropped (the block keeps its other copy or becomes a
// breadcrumb); both are counted in checksum_failures and reported. Blocks
// that vanish meanwhile count as missing. Errors: UNAVAILABLE (tier 2).
absl::StatusOr<VerifyReport> VerifyBlocks(EngineCore* core, absl::Span<const BlockId> ids);

}  // namespace evoke

#endif  // EVOKE_STORAGE_VERIFIER_H_
