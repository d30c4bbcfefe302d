// FakeClock: an evoke::Clock (common/clock.h) that tests set and advance.
//
//   evoke::testing::FakeClock clock;               // starts at 2024-01-01
//   LeaseManagerOptions options;
//   options.clock = &clock;
//   ...
//   clock.Advance(absl::Minutes(5));               // what is compared moves
//
// Only recorded and compared times move; threads that wait on condition
// variables still wait in real time (see common/clock.h).
#ifndef EVOKE_TESTING_FAKE_CLOCK_H_
#define EVOKE_TESTING_FAKE_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace evoke::testing {

// Thread-safe: Now, Set and Advance may be called from any thread.
class FakeClock final : public Clock {
 public:
  // Starts at `start` (default: 2024-01-01 00:00:00 UTC, a fixed instant so
  // that tests do not depend on the wall clock).
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1704067200))
      : now_(start) {}

  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }

  // Set moves the clock to `t` (backwards too: a wall clock can jump).
  void Set(absl::Time t) {
    absl::MutexLock lock(&mu_);
    now_ = t;
  }

  // Advance moves the clock by `d` (negative: backwards).
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace evoke::testing

#endif  // EVOKE_TESTING_FAKE_CLOCK_H_
