// ExpectedState: the client-side model of what evoked must hold, for crash
// trials (after RocksDB's db_stress expected state: each key's acknowledged
// state plus what is in flight, so that a crash in the middle of an
// operation accepts exactly the old or the new value and nothing else).
//
// The trial's blocks are `slots`: slot i is one session block id; each Save
// of a slot after it was deleted writes a new `version` (different size and
// bytes), and re-saving a stored slot writes the same version again (evoked
// refuses other content under a stored session id). Each slot is driven by
// one client thread at a time, so a slot has at most one operation in flight.
//
// What evoked promises (README "Blocks, identity and durability",
// ARCHITECTURE "What is durable when"), in the model's terms:
//   acknowledged Save              kVolatile: while evoked lives, Load gives
//                                  exactly these bytes; after kill -9 they
//                                  are these bytes or NOT_FOUND (a block that
//                                  reached tier 2 survives; one only in tier
//                                  1 is gone).
//   acknowledged Save, durable     kDurable: these bytes, also after kill -9.
//   acknowledged Flush             every block acknowledged before the Flush
//                                  was sent becomes kDurable.
//   acknowledged Delete            kAbsent: NOT_FOUND, also after kill -9
//                                  (tier 2 is deleted first; a process crash
//                                  loses no RocksDB write).
//   seen after a restart           kDurable: it is in tier 2 now.
//   an operation not acknowledged  (in flight at the kill, or failed) its
//                                  effect may or may not have happened: the
//                                  old and the new outcome are both allowed
//                                  until the next restart's verification.
// This holds only with a spill budget that is never reached (past it evoked
// drops payloads on purpose, leaving breadcrumbs); the trial sets one.
#ifndef EVOKE_TESTS_CHAOS_CRASH_MODEL_H_
#define EVOKE_TESTS_CHAOS_CRASH_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace evoke::chaos {

enum class Presence { kAbsent, kVolatile, kDurable };

// What a Load of a slot may observe: NOT_FOUND (when absent_ok) or the
// bytes of one of `versions`. `durable` says why absence is not allowed
// (a durable block, rather than a live tier-1 block).
struct Allowed {
  bool absent_ok = false;
  std::vector<uint32_t> versions;
  bool durable = false;
  bool Allows(std::optional<uint32_t> observed) const;
};

// What a Load of a slot observed, classified against Allowed.
enum class Verdict {
  kOk,
  kLostDurable,    // NOT_FOUND, but the block was durable.
  kLostLive,       // NOT_FOUND while evoked lived, but the block was stored.
  kResurrected,    // Bytes of a version that was deleted (or superseded).
  kPhantom,        // Bytes where no version could be (never saved).
};
const char* VerdictName(Verdict v);

class ExpectedState {
 public:
  explicit ExpectedState(size_t slots);

  size_t slots() const { return slots_.size(); }

  // Saves. BeginSave picks the version a Save of `slot` writes: the stored
  // one when the slot is present (a re-save, deduplicated by evoked), else a
  // new one. The caller then saves it and reports the answer.
  uint32_t BeginSave(size_t slot, bool durable);
  void AckSave(size_t slot);
  // A Save that was not acknowledged (error, or the daemon died): its effect
  // is unknown until the next restart's verification; the slot is frozen
  // (Busy) until then.
  void FailSave(size_t slot);

  void BeginDelete(size_t slot);
  void AckDelete(size_t slot);
  void FailDelete(size_t slot);

  // Flush: BeginFlush right before the request is sent, AckFlush with its
  // ticket once it is acknowledged.
  struct FlushTicket {
    std::vector<std::pair<size_t, uint64_t>> volatile_slots;  // slot, epoch.
  };
  FlushTicket BeginFlush();
  // Returns how many slots became durable.
  size_t AckFlush(const FlushTicket& ticket);

  // Whether the slot has an operation in flight or an unknown outcome (the
  // owner must not start another one; live checks are then loose).
  bool Busy(size_t slot) const;
  Presence presence(size_t slot) const;
  // The highest version ever written to `slot` (0: none).
  uint32_t max_version(size_t slot) const;

  // While evoked lives (no crash since the last verification).
  Allowed AllowedLive(size_t slot) const;
  // After a crash and restart.
  Allowed AllowedAfterCrash(size_t slot) const;
  // Classify an observation (nullopt: NOT_FOUND; else the version whose
  // bytes were served) against `allowed`.
  Verdict Classify(size_t slot, const Allowed& allowed,
                   std::optional<uint32_t> observed) const;

  // After a restart's verification: the slot is what was observed (present
  // blocks are in tier 2 now, so durable), nothing is in flight.
  void Resolve(size_t slot, std::optional<uint32_t> observed);

  // "slot 12: durable v3, pending delete" for failure messages.
  std::string Describe(size_t slot) const;

 private:
  struct Slot {
    Presence presence = Presence::kAbsent;
    uint32_t version = 0;      // Valid unless kAbsent.
    uint32_t max_version = 0;  // Highest version ever begun.
    uint64_t epoch = 0;        // Bumped on every change of the base state.
    // In flight (or failed) and not yet acknowledged.
    bool op_open = false;
    bool pending_absent = false;              // A Delete that may have happened.
    std::optional<uint32_t> pending_version;  // A Save that may have happened.
    bool pending_durable = false;
    bool frozen = false;                      // Failed: unknown until resolved.
  };
  Allowed AllowedLocked(const Slot& s, bool crashed) const;

  mutable absl::Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
};

}  // namespace evoke::chaos

#endif  // EVOKE_TESTS_CHAOS_CRASH_MODEL_H_
