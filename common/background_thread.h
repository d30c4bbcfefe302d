// Background work that must not compete with serving: a thread names itself
// (so that `top -H`, `perf` and the tests can find it) and lowers its own CPU
// priority. Linux nice values are per thread; a thread created afterwards by
// this one inherits its value.
#ifndef EVOKE_COMMON_BACKGROUND_THREAD_H_
#define EVOKE_COMMON_BACKGROUND_THREAD_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace evoke {

// Nice values of evoke's background threads: RPC and ring threads run at the
// process's own (0), so under contention each gets several times the CPU of
// a background thread.
inline constexpr int kWriteBehindNice = 10;  // Tier-3 write-behind.
inline constexpr int kPrefaultNice = 19;     // Faulting tier 1 in at start.

// BecomeBackgroundThread names the calling thread (at most 15 bytes kept)
// and raises its nice value to `nice` (best effort: a thread that may not
// lower its priority keeps it).
void BecomeBackgroundThread(absl::string_view name, int nice);

// NiceOfThread returns the nice value of this process's thread called
// `name`, nullopt when there is none (/proc/self/task/*/comm and stat).
std::optional<int> NiceOfThread(absl::string_view name);

}  // namespace evoke

#endif  // EVOKE_COMMON_BACKGROUND_THREAD_H_
