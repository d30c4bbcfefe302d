// evoke::policy::EvokedRecoverySource: evoked's Recover as a RecoverySource.
//
// The engine registers each block it stores in evoked (its engine-local
// handle, its evoked BlockId, its token count) and tells the source which
// registered blocks are resident. Rank then asks evoked's Recover for the
// session's stored blocks best matching the query, excluding the resident
// ones, and translates evoked's ids back to handles:
//
//   EvokedRecoverySource source(client, {.ns = "default", .session_id = "s1",
//                                        .layer = 20});
//   source.Register(handle, evoke::BlockIdOf(meta), 64);  // evicted: saved
//   source.SetResident(handle, true);                      // after a Bring
//   source.SetResident(handle, false);                     // evicted again
//   auto ranked = source.Rank(query, 4, std::nullopt);
//
// Not thread-safe (one decode loop drives it); the Client may be shared.
#ifndef EVOKE_POLICY_EVOKED_SOURCE_H_
#define EVOKE_POLICY_EVOKED_SOURCE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/hash128.h"
#include "evoke/client.h"
#include "policy/policy.h"

namespace evoke::policy {

struct EvokedSourceOptions {
  // The session's scope in evoked (RecoverRequest.session). Required.
  std::string ns;
  std::string session_id;
  // The layer whose summaries are scored. Default: 0.
  uint32_t layer = 0;
  // SUMMARY_MEAN_KEYS (default; evoked computes it for canonical blocks) or
  // SUMMARY_REPR_KEYS (InfLLM's representative keys, saved by the engine).
  v1::SummaryKind kind = v1::SUMMARY_MEAN_KEYS;
  // Skip breadcrumbs (blocks whose bytes evoked dropped): they cannot be
  // brought back. Default: true.
  bool require_bytes = true;
  // Preloading (EVOKE's warm tier): after each Rank, the `prefetch` stored
  // blocks ranked next after the k returned are sent to evoked's Prefetch
  // without waiting, so that a later step that brings them finds them in
  // tier 1 rather than on disk. 0: none (default).
  uint32_t prefetch = 0;
};

class EvokedRecoverySource final : public RecoverySource {
 public:
  // `client` must outlive the source.
  EvokedRecoverySource(Client* client, EvokedSourceOptions options);

  // Register maps `handle` to evoked block `id` (a block of this session,
  // saved with a summary of options.kind, or canonical for MEAN_KEYS) of
  // `n_tokens` tokens. A stored block is usually not resident any more
  // (it was saved on eviction): `resident` defaults to false. Registering a
  // handle again replaces its entry.
  void Register(BlockHandle handle, const BlockId& id, uint32_t n_tokens, bool resident = false);
  // Forget drops a handle (no-op if unknown).
  void Forget(BlockHandle handle);
  // SetResident marks a registered block resident (excluded from Rank) or
  // not (no-op for an unknown handle).
  void SetResident(BlockHandle handle, bool resident);

  std::optional<BlockId> IdOf(BlockHandle handle) const;
  size_t registered() const { return blocks_.size(); }
  // Blocks sent to Prefetch, and Prefetch calls that failed (decoding went
  // on: a prefetch is only a hint).
  uint64_t prefetched() const { return prefetched_; }
  uint64_t prefetch_failures() const { return prefetch_failures_; }

  // Rank (see RecoverySource) sends a Recover: session scope, options'
  // kind and layer, aggregation MEAN, `k` (capped at evoked's 1024), the
  // resident registered blocks as exclude_ids. Returned blocks that are not
  // registered here (or are resident) are skipped; when that leaves fewer
  // than `k` of a full answer, it asks once more for 1024, so fewer than `k`
  // come back only when evoked has no more (or past 1024 unregistered ones).
  // With options.prefetch, asks for k + prefetch and prefetches those past
  // the first k. With no registered block that is not resident, or k = 0,
  // returns an empty list without asking evoked. Errors of the client come
  // back unchanged: UNAVAILABLE (daemon down), NOT_FOUND (evoked holds no
  // summary of this kind and layer for the session), INVALID_ARGUMENT (query
  // shape).
  absl::StatusOr<std::vector<Candidate>> Rank(const RecoveryQuery& query, uint32_t k,
                                              std::optional<float> min_score) override;

 private:
  struct Entry {
    BlockId id;
    uint32_t n_tokens = 0;
    bool resident = false;
  };
  Client* client_;
  EvokedSourceOptions options_;
  absl::flat_hash_map<BlockHandle, Entry> blocks_;
  absl::flat_hash_map<BlockId, BlockHandle> handles_;
  uint64_t prefetched_ = 0;
  uint64_t prefetch_failures_ = 0;
};

}  // namespace evoke::policy

#endif  // EVOKE_POLICY_EVOKED_SOURCE_H_
