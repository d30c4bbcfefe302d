// Offline cache-policy simulation over the agent trace (issue #28): which
// eviction policy for tier 1 would keep more of what the next turns read?
//
// The trace becomes a stream of block accesses in time order: each turn
// reads its context (its system prompt's blocks, then its session's blocks)
// and then writes its new blocks. A cache of `capacity` blocks serves it; a
// read it holds is a hit, a read it misses brings the block in (as evoke's
// tier 1 promotes a block a Load reads from tier 2), a write inserts it.
// Policies differ only in what they evict and, for the ones with an
// admission filter, in what they let in. `kOptimal` is Belady's offline
// bound (it knows every future access, and bypasses a block whose next use
// is farther than everything it holds): no online policy can beat it, so
// it says how much room there is above LRU on a trace.
//
// This is a model, not the engine: no watermarks, no spiller thread, no
// tier-2 budget. evoke-agent-trace runs the engine itself; the two LRU rows
// are compared to show how close the model is.
#ifndef EVOKE_SIM_CACHE_POLICY_H_
#define EVOKE_SIM_CACHE_POLICY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sim/agent_trace.h"

namespace evoke::sim {

struct BlockAccess {
  uint64_t key = 0;      // A block.
  uint32_t turn = 0;     // The turn's index in the trace.
  uint32_t owner = 0;    // Its session, or a prompt's id past every session.
  double time_s = 0;
  bool write = false;    // A new block stored (not counted as a read).
};

// The accesses of a trace, in order. Keys are distinct per (session, seq)
// and per (prompt, seq); owners are the session (prompt blocks: sessions +
// prompt).
std::vector<BlockAccess> AgentTraceAccesses(const AgentTrace& trace);

enum class CachePolicyKind {
  kLru,
  kSlru,       // Segmented LRU: 20% probation, 80% protected (a re-read).
  kArc,        // Adaptive Replacement Cache (Megiddo & Modha).
  kTinyLfu,    // W-TinyLFU: 1% LRU window, SLRU main, frequency admission.
  kSessionLru, // LRU over sessions: the least recently active session's
               // blocks go first, oldest block first within it.
  kLruTurns,   // LRU that evicts only once a turn's accesses are done, as
               // the engine does (a turn's Load touches or promotes all it
               // reads; the spiller evicts after), so a turn never evicts
               // its own context while reading it.
  kOptimal,    // Belady with bypass: the offline bound.
};

absl::StatusOr<CachePolicyKind> ParseCachePolicy(const std::string& name);
std::string CachePolicyName(CachePolicyKind kind);

struct CacheSimResult {
  uint64_t reads = 0;
  uint64_t hits = 0;
  uint64_t writes = 0;
  uint64_t max_resident = 0;  // Never above the capacity.
  double hit_ratio() const { return reads == 0 ? 0 : static_cast<double>(hits) / reads; }
};

CacheSimResult SimulateCache(const std::vector<BlockAccess>& accesses, CachePolicyKind kind,
                             uint64_t capacity);

}  // namespace evoke::sim

#endif  // EVOKE_SIM_CACHE_POLICY_H_
