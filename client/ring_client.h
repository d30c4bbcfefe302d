// The client's side of a command ring (common/ring_format.h): submissions
// written into shared memory, completions reaped from it. Internal to the
// client library; evoke::Client exposes it as SubmitSave / SubmitLoad /
// Wait.
#ifndef EVOKE_CLIENT_RING_CLIENT_H_
#define EVOKE_CLIENT_RING_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/adaptive_spin.h"
#include "common/ring_format.h"
#include "evoke/client.h"

namespace evoke {

// The geometry a client asks for: `entries` submissions (a power of two),
// twice as many completions.
ring::RingGeometry ClientRingGeometry(uint32_t entries);

// RingClient drives one ring in `region` (which it owns), whose header
// Init wrote and which the daemon attached. Thread-safe.
class RingClient {
 public:
  // Init writes the header of a fresh (zeroed) region for `geometry`.
  static void Init(uint8_t* base, const ring::RingGeometry& geometry);

  RingClient(std::unique_ptr<SharedRegion> region, const ring::RingGeometry& geometry,
             absl::Duration spin, absl::Duration spin_max);
  RingClient(const RingClient&) = delete;
  RingClient& operator=(const RingClient&) = delete;

  // SubmitSave queues one save; the block's payload is a region slice or a
  // gather list. INVALID_ARGUMENT when its meta and slices do not fit in a
  // submission's argument area (the caller then uses the RPC).
  absl::StatusOr<uint64_t> SubmitSave(const BlockToSave& block, bool durable,
                                      absl::Time deadline);
  // SubmitLoad queues one load into `destination` (one slice, or a scatter
  // list). `fingerprint` is the serialized LayoutFingerprint.
  absl::StatusOr<uint64_t> SubmitLoad(const BlockId& id, absl::string_view fingerprint,
                                      absl::Span<const v1::RegionSlice> destination,
                                      std::optional<int32_t> first_position, bool want_meta,
                                      absl::Time deadline);
  // SubmitAcquire queues one Acquire of `ids` (ACQUIRE_MODE_ALL when `all`);
  // its completion has the handle, and the tiers of the blocks held.
  // INVALID_ARGUMENT when the ids do not fit in the argument area.
  absl::StatusOr<uint64_t> SubmitAcquire(absl::Span<const BlockId> ids, bool all,
                                         absl::Time deadline);
  // FitsAcquire: an Acquire of `n` ids fits in one submission, and the
  // tiers of all of them in its completion.
  bool FitsAcquire(size_t n) const {
    return n > 0 && n * 16 <= g_.arg_bytes && n <= g_.msg_bytes;
  }
  // SubmitRelease queues one Release of `handle`.
  absl::StatusOr<uint64_t> SubmitRelease(uint64_t handle, absl::Time deadline);
  // Wait returns the completion of `ticket` (DEADLINE_EXCEEDED past
  // `deadline`, the ticket still valid; NOT_FOUND for a ticket that is
  // unknown or already waited; UNAVAILABLE once the ring is dead).
  absl::StatusOr<RingCompletion> Wait(uint64_t ticket, absl::Time deadline);

  // MarkDead fails every waiting and later call with UNAVAILABLE (the
  // lease ended: the daemon went away or stopped serving the ring).
  void MarkDead();
  bool alive() const;
  uint64_t region_id() const { return region_->id(); }

 private:
  // What a completion's message holds for the caller.
  enum class Message : uint8_t { kNone, kMeta, kTiers };
  // Submit writes one entry (and `args`, `arg_len` bytes) and publishes it.
  absl::StatusOr<uint64_t> Submit(ring::RingSqe sqe, const uint8_t* args, uint32_t arg_len,
                                  Message message, absl::Time deadline);
  // Reap moves every posted completion into done_; returns how many.
  size_t Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DeadStatus() const;

  const std::unique_ptr<SharedRegion> region_;
  const ring::RingGeometry g_;
  // How long a waiter polls for a completion before it sleeps, from how
  // long recent completions took (common/adaptive_spin.h).
  AdaptiveSpin spin_ ABSL_GUARDED_BY(mu_);
  uint8_t* const base_;
  ring::RingHeader* const header_;
  std::atomic<bool> dead_{false};

  absl::Mutex mu_;
  absl::CondVar reaped_;
  uint32_t sq_tail_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t cq_head_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  // Submitted, not yet completed: what its message holds.
  absl::flat_hash_map<uint64_t, Message> pending_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, RingCompletion> done_ ABSL_GUARDED_BY(mu_);
  bool sleeper_ ABSL_GUARDED_BY(mu_) = false;  // A thread sleeps on the futex.
  std::string scratch_ ABSL_GUARDED_BY(mu_);    // Serialized arguments.
};

}  // namespace evoke

#endif  // EVOKE_CLIENT_RING_CLIENT_H_
