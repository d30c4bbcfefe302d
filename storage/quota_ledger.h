// QuotaLedger: the bytes that Saves have reserved against quotas and the
// metadata budget between their check and their commit. A Save is charged
// when its check passes, in the same critical section, so concurrent Saves
// cannot each pass a check that only one of them fits; it is settled when
// what it stored is in the index (usage counts it) or when it fails.
//
// Not thread-safe: the engine guards it with its own mutex (EngineCore::mu_),
// the one that guards the index whose usage it complements.
#ifndef EVOKE_STORAGE_QUOTA_LEDGER_H_
#define EVOKE_STORAGE_QUOTA_LEDGER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace evoke {

// What a Save may add to one namespace, at most.
struct QuotaNeed {
  uint64_t tier1 = 0;     // Payload bytes that land in tier 1.
  uint64_t tier2 = 0;     // Payload bytes written to tier 2 before the ack (durable).
  uint64_t metadata = 0;  // Accounted metadata bytes, summaries the daemon adds included.
};

class QuotaLedger {
 public:
  // One Save's reservation. Move-only; settle it (QuotaLedger::Settle)
  // before it is destroyed.
  class Hold {
   public:
    Hold() = default;
    Hold(Hold&&) = default;
    Hold& operator=(Hold&&) = default;
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    bool empty() const { return parts_.empty(); }

   private:
    friend class QuotaLedger;
    std::vector<std::pair<std::string, QuotaNeed>> parts_;
  };

  // Reserved and not yet settled, for `ns` and over every namespace.
  QuotaNeed Pending(absl::string_view ns) const;
  uint64_t pending_metadata() const { return pending_metadata_; }

  // Charge reserves `needs` (namespace -> need) and returns the hold.
  Hold Charge(const absl::flat_hash_map<std::string, QuotaNeed>& needs);
  // SettleCommitted releases the hold's tier-1 and metadata parts: the
  // Save's blocks are in the index, whose usage counts them now. Its tier-2
  // part stays until the blocks are on disk (Settle).
  void SettleCommitted(Hold* hold);
  // Settle releases what is left of the hold (idempotent).
  void Settle(Hold* hold);

 private:
  void Subtract(const std::string& ns, const QuotaNeed& need);

  absl::flat_hash_map<std::string, QuotaNeed> pending_;
  uint64_t pending_metadata_ = 0;
};

}  // namespace evoke

#endif  // EVOKE_STORAGE_QUOTA_LEDGER_H_
