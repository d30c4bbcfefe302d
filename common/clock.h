// Clock: where evoke reads the wall clock, so that tests can move time.
#ifndef EVOKE_COMMON_CLOCK_H_
#define EVOKE_COMMON_CLOCK_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace evoke {

// Clock gives timestamps (last access, uptime, lease expiry). Waits on
// condition variables keep using real time: a Clock moves what is recorded
// and compared, not how long a thread sleeps.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // Real returns the process-wide wall clock (absl::Now). Never null.
  static const Clock* Real();
};

namespace internal {
class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};
}  // namespace internal

inline const Clock* Clock::Real() {
  static const internal::RealClock clock;
  return &clock;
}

}  // namespace evoke

#endif  // EVOKE_COMMON_CLOCK_H_
