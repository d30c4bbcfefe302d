// evoke::policy::SessionDriver: runs a Policy over one engine cache.
//
// The engine reports each decoded token and asks for room before decoding;
// at recovery points (a new user turn, a decode chunk) it hands the driver
// the query it is about to decode. The driver keeps the books (resident
// blocks, stored blocks), asks the policy, and tells the engine what to do
// through BlockEngine:
//   Evict  save the block to evoked (unless a copy is stored already) and
//          remove it from the cache, in that order;
//   Bring  load a stored block at the tail of the cache, K re-anchored.
// An engine whose source is an EvokedRecoverySource keeps the source's
// books in these two calls: Evict registers a block it saves
// (Register(handle, id, n_tokens)) or marks a stored one not resident
// (SetResident(handle, false)); Bring marks it resident.
// Blocks form as tokens arrive: the first `sink_tokens` tokens make block 0
// (so that sinks are a block of their own), then every `block_tokens` tokens
// make the next one.
//
// Degradation: when the recovery source or Bring fails (the daemon is down),
// the driver counts it (DriverStats::recovery_failures), logs it once per
// outage and returns OK: decoding goes on without recovery. A failed Evict
// is returned (the block stays resident; the engine must not decode past
// its budget).
// Not thread-safe.
#ifndef EVOKE_POLICY_SESSION_DRIVER_H_
#define EVOKE_POLICY_SESSION_DRIVER_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "policy/attention_stats.h"
#include "policy/policy.h"

namespace evoke::policy {

// What the driver asks of an engine. Implementations: the llama.cpp
// adapter's (engines/llama/policy_engine.h), the simulator's (sim/).
class BlockEngine {
 public:
  virtual ~BlockEngine() = default;
  // Evict saves `block` to evoked unless `stored`, then removes its tokens
  // from the cache. Returns the payload bytes moved (0 when stored). On error
  // the cache is as it was.
  virtual absl::StatusOr<uint64_t> Evict(const ResidentBlock& block, bool stored) = 0;
  // Bring loads stored block `handle` (n_tokens tokens) so that its first
  // token sits at `first_position` (the tail), K re-anchored, V as stored.
  // Returns the payload bytes moved.
  virtual absl::StatusOr<uint64_t> Bring(BlockHandle handle, uint32_t n_tokens,
                                         int64_t first_position) = 0;
};

// block_tokens and sink_tokens should match the policy's PolicyParams (the
// policy recognizes sinks by first_token < its sink_tokens).
struct DriverOptions {
  uint64_t budget_tokens = 0;  // Required.
  uint32_t block_tokens = 64;
  uint32_t sink_tokens = 4;    // 0: no separate first block.
  int32_t layer = CacheView::kAll;  // The scope reported in CacheView.
  int32_t head = CacheView::kAll;
};

struct DriverStats {
  uint64_t blocks_saved = 0;      // Evictions that saved bytes.
  uint64_t blocks_dropped = 0;    // Evictions of blocks stored already.
  uint64_t blocks_recovered = 0;  // Bring calls that succeeded.
  uint64_t bytes_moved = 0;       // Saved + loaded payload bytes.
  uint64_t recovery_points = 0;
  uint64_t recovery_failures = 0;  // Source or Bring errors, decoding went on.
  absl::Duration engine_time;      // Time inside BlockEngine and the source.
};

class SessionDriver {
 public:
  // `policy`, `engine`, `source` (may be null for recovery-less policies)
  // and `attention` (may be null) must outlive the driver.
  SessionDriver(Policy* policy, BlockEngine* engine, RecoverySource* source,
                AttentionStats* attention, const DriverOptions& options);

  // MakeRoom evicts by policy until `incoming` more tokens fit the budget.
  // RESOURCE_EXHAUSTED when the policy cannot make room; engine errors as
  // they come.
  absl::Status MakeRoom(uint64_t incoming = 1);

  // TokenDecoded records that the next token of the session now sits at
  // cache position `position`. When it completes a block, returns the new
  // block's handle (the engine may then SetSummary for it).
  absl::StatusOr<std::optional<BlockHandle>> TokenDecoded(int64_t position);

  // PositionsShifted records that the engine moved every cached token at
  // position >= `from` by `delta` (e.g. llama.cpp's compaction after an
  // eviction: seq_rm then seq_add(-n_tokens)): resident blocks and pending
  // tokens starting there follow. Order is what policies read, so an engine
  // that never calls it still gets the same decisions.
  void PositionsShifted(int64_t from, int64_t delta);

  // SetSummary attaches pre-RoPE mean keys to a resident block (see
  // ResidentBlock::summary). INVALID_ARGUMENT for an unknown block.
  absl::Status SetSummary(BlockHandle block, std::vector<float> summary);

  // RecoveryPoint asks the policy what to recover for `query`, makes room
  // and brings the blocks to the tail starting at `*next_position`, which it
  // advances by the tokens placed. Source and Bring failures degrade (see
  // above). Candidates that are not stored blocks of this session, or are
  // resident, are skipped; when the rest cannot all fit the budget, the
  // weakest (first) are dropped until they do. Recovered blocks keep their
  // handle and first_token, get recovered = true, and get back the summary
  // they had. Errors: those of Evict while making room (the blocks evicted
  // before stay evicted; nothing is brought).
  // Called while tokens are pending (pending_tokens() > 0), the recovered
  // blocks land after the pending tokens, and the block those tokens
  // complete will hold positions with a gap: engines that need contiguous
  // blocks call it at block boundaries only (the llama.cpp session does);
  // the others save such blocks with per-token positions (the simulator).
  absl::Status RecoveryPoint(const RecoveryQuery& query, int64_t* next_position);

  // DropPendingTokens forgets the tokens decoded since the last block
  // boundary (pending_tokens() of them), which the engine has removed from
  // its cache: the session's token count goes back by as many, so the next
  // TokenDecoded starts the same block again. Used to run a recovery point
  // at a block boundary and decode those tokens again after it (see
  // LlamaPolicySession::RecoverAtPromptEnd). Returns how many were dropped.
  uint64_t DropPendingTokens();

  // The books.
  absl::Span<const ResidentBlock> resident() const { return resident_; }
  bool IsStored(BlockHandle block) const { return stored_.contains(block); }
  uint64_t resident_tokens() const;  // Blocks + pending.
  uint64_t pending_tokens() const { return pending_; }
  // Tokens the session takes until the next block boundary (the next
  // TokenDecoded that completes a block is the this-many-th).
  uint64_t tokens_to_boundary() const;
  const DriverStats& stats() const { return stats_; }
  CacheView View() const;

 private:
  // Evicts `victims` through the engine and keeps the books.
  absl::Status EvictBlocks(absl::Span<const BlockHandle> victims);

  Policy* policy_;
  BlockEngine* engine_;
  RecoverySource* source_;
  AttentionStats* attention_;
  DriverOptions options_;
  std::vector<ResidentBlock> resident_;
  absl::flat_hash_map<BlockHandle, std::vector<float>> summaries_;
  struct StoredBlock {
    uint64_t first_token = 0;
    uint32_t n_tokens = 0;
  };
  // Stored blocks (resident or not).
  absl::flat_hash_map<BlockHandle, StoredBlock> stored_;
  // A source or Bring failure; logs once per outage.
  void RecoveryFailed(const absl::Status& status);
  uint64_t session_tokens_ = 0;
  uint64_t pending_ = 0;
  int64_t pending_first_position_ = 0;
  BlockHandle next_handle_ = 0;
  bool source_down_ = false;
  DriverStats stats_;
};

}  // namespace evoke::policy

#endif  // EVOKE_POLICY_SESSION_DRIVER_H_
