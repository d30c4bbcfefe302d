// Helpers shared by the policies (policies_internal.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "policy/policies_internal.h"
#include "policy/policy.h"

namespace evoke::policy::internal {

uint64_t HeldTokens(const CacheView& view) {
  uint64_t held = view.pending_tokens;
  for (const ResidentBlock& b : view.resident) held += b.n_tokens;
  return held;
}

absl::StatusOr<std::vector<BlockHandle>> EvictInOrder(const CacheView& view,
                                                      uint64_t incoming_tokens,
                                                      absl::Span<const uint32_t> order,
                                                      absl::string_view policy) {
  const uint64_t held = HeldTokens(view);
  std::vector<BlockHandle> out;
  if (Fits(view, incoming_tokens)) return out;
  // held + incoming - budget, saturating: more than any eviction can free.
  const uint64_t excess = incoming_tokens > UINT64_MAX - held
                              ? UINT64_MAX
                              : held + incoming_tokens - view.budget_tokens;
  uint64_t freed = 0;
  for (uint32_t i : order) {
    const ResidentBlock& b = view.resident[i];
    out.push_back(b.handle);
    freed += b.n_tokens;
    if (freed >= excess) return out;
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      policy, ": budget_tokens ", view.budget_tokens, " cannot hold what the policy protects (",
      held - freed, " tokens kept, of which ", view.pending_tokens, " pending) plus ",
      incoming_tokens, " incoming"));
}

void SortRecoveriesAscending(std::vector<Candidate>* candidates) {
  std::stable_sort(candidates->begin(), candidates->end(),
                   [](const Candidate& a, const Candidate& b) { return a.score < b.score; });
}

uint64_t RecentGuardBlocks(double share, uint64_t budget_tokens, uint32_t block_tokens) {
  const double tokens = share * static_cast<double>(budget_tokens);
  const uint64_t blocks = static_cast<uint64_t>(std::ceil(tokens / block_tokens));
  return std::max<uint64_t>(1, blocks);
}

}  // namespace evoke::policy::internal
