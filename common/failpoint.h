// Failpoints: named places in evoked where a crash trial can kill the process
// (SIGKILL, as kill -9 would) at an exact moment, e.g. right after a durable
// write was fsync'd and before its Save is acknowledged.
//
//   EVOKE_FAILPOINT("save.durable.before_ack");
//
// They are armed only by the environment of the process:
//
//   EVOKE_FAILPOINTS="name[=when][,name[=when]...]"
//
// where `when` is
//   (nothing)   the first hit kills;
//   N           (an integer >= 1) the N-th hit kills, earlier ones pass;
//   P           (a number with a '.', 0 < P <= 1) each hit kills with
//               probability P (seeded by $EVOKE_FAILPOINTS_SEED when set,
//               else by the pid and the clock).
// Before the kill, one line "evoke failpoint NAME fired (hit N)" goes to
// stderr, so that a trial can tell a failpoint kill from any other death.
//
// Unset (every production run) a failpoint costs one relaxed atomic load and
// a predicted branch. A spec that does not parse is reported on stderr once
// and arms nothing: a typo must not crash a daemon that was not meant to.
#ifndef EVOKE_COMMON_FAILPOINT_H_
#define EVOKE_COMMON_FAILPOINT_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace evoke {

namespace failpoint_internal {
// True while any failpoint is armed; read on every EVOKE_FAILPOINT.
extern std::atomic<bool> g_armed;
// The slow path: counts the hit of an armed `name` and kills when due.
void Hit(const char* name);
}  // namespace failpoint_internal

// SetFailpoints replaces the armed set with `spec` (the EVOKE_FAILPOINTS
// syntax; "" disarms all) and resets hit counts. INVALID_ARGUMENT, leaving
// the armed set as it was, when `spec` does not parse. For tests; evoked
// arms from its environment at start.
absl::Status SetFailpoints(absl::string_view spec);

// FailpointHits returns how often the armed failpoint `name` was reached
// since it was armed (0 when it is not armed).
uint64_t FailpointHits(absl::string_view name);

}  // namespace evoke

#define EVOKE_FAILPOINT(name)                                                 \
  do {                                                                        \
    if (__builtin_expect(                                                     \
            ::evoke::failpoint_internal::g_armed.load(std::memory_order_relaxed), \
            0)) {                                                             \
      ::evoke::failpoint_internal::Hit(name);                                 \
    }                                                                         \
  } while (0)

#endif  // EVOKE_COMMON_FAILPOINT_H_
