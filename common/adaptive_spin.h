// AdaptiveSpin: how long a thread that waits for its peer through shared
// memory (a ring's thread for submissions, a client for completions) polls
// before it sleeps on a futex, learned from how long its recent waits took.
//
// A fixed window is wrong both ways: too short, and a peer that answers a
// little later than the window pays two futex wake-ups per operation (tens
// of microseconds each on a VM); too long, and an idle ring burns a core.
// So the window follows the recent mean wait: twice that mean while it is
// under half of `max` (the peer answers soon enough to be worth polling
// for), and `base` otherwise (a slow peer costs one short poll, then sleep).
//
// Header-only; not thread-safe (each waiter owns one, or guards it).
#ifndef EVOKE_COMMON_ADAPTIVE_SPIN_H_
#define EVOKE_COMMON_ADAPTIVE_SPIN_H_

#include <sched.h>

#include <algorithm>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/futex.h"

namespace evoke {

class AdaptiveSpin {
 public:
  // `base`: the window with no history and for slow peers. `max`: the
  // longest window; at or under `base`, the window is always `base`.
  AdaptiveSpin(absl::Duration base, absl::Duration max)
      : base_ns_(absl::ToInt64Nanoseconds(base)),
        max_ns_(std::max(base_ns_, absl::ToInt64Nanoseconds(max))),
        mean_ns_(max_ns_) {}

  // How long to poll before sleeping, for the next wait.
  absl::Duration window() const {
    const int64_t w = 2 * mean_ns_;
    return absl::Nanoseconds(w <= max_ns_ ? std::max(base_ns_, w) : base_ns_);
  }

  // Record how long a wait took, polling and sleeping, until the peer
  // answered. Waits past `max` count as `max` (an idle peer is "slow", not
  // infinitely so), weighted 1/8 against the past.
  void Record(absl::Duration waited) {
    const int64_t sample = std::clamp<int64_t>(absl::ToInt64Nanoseconds(waited), 0, max_ns_);
    mean_ns_ += (sample - mean_ns_) / 8;
  }

 private:
  const int64_t base_ns_;
  const int64_t max_ns_;
  int64_t mean_ns_;  // Starts slow: the first waits poll for `base`.
};

// PollUntil calls `ready` until it returns true (then true) or `until` has
// passed (then false), pausing the core between calls. Every few
// microseconds it yields the core (sched_yield), so that pollers do not
// starve the threads doing the work when there are more runnable threads
// than cores; the yield returns at once otherwise.
template <typename Ready>
bool PollUntil(absl::Time until, Ready ready) {
  for (int i = 0;; ++i) {
    if (ready()) return true;
    if ((i & 63) == 63 && absl::Now() >= until) return false;
    if ((i & 255) == 255) sched_yield();
    CpuRelax();
  }
}

}  // namespace evoke

#endif  // EVOKE_COMMON_ADAPTIVE_SPIN_H_
