// The screen of `evokectl top`, computed from two Stat answers: a pure
// function (no I/O, no clock, no escape codes) so that every figure on it
// can be tested with made-up StatResponses.
#ifndef EVOKE_CLIENT_EVOKECTL_TOP_VIEW_H_
#define EVOKE_CLIENT_EVOKECTL_TOP_VIEW_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "evoke/v1/kvtier.pb.h"

namespace evoke::ctl {

// A latency quantile from histogram counts: the bound it falls under,
// interpolated linearly inside its bucket; `overflow` when it falls in the
// bucket past the last bound (then `seconds` is that last bound).
struct Quantile {
  double seconds = 0;
  bool overflow = false;
};

// HistogramQuantile returns quantile q (0..1) of `counts` (non-cumulative,
// one more than `upper_bounds`: the last counts calls above every bound);
// nullopt when there are no calls or the shapes do not match.
std::optional<Quantile> HistogramQuantile(const std::vector<double>& upper_bounds,
                                          const std::vector<uint64_t>& counts, double q);

// What happened to one RPC method between two Stat answers.
struct RpcDelta {
  std::string method;
  uint64_t calls = 0;        // Over the interval.
  uint64_t errors = 0;
  double seconds_sum = 0;
  uint64_t total_calls = 0;  // Since start.
  std::vector<double> upper_bounds;
  std::vector<uint64_t> counts;  // Interval deltas, non-cumulative.
};

// RpcDeltas pairs cur's methods with prev's (absent in prev, or counters
// that went backwards after a restart: the whole of cur counts).
std::vector<RpcDelta> RpcDeltas(const v1::StatResponse* prev, const v1::StatResponse& cur);

struct TopInput {
  // The previous answer; null on the first frame (then rates and latencies
  // are over the daemon's whole uptime). Ignored when the daemon restarted
  // in between (pid changed or uptime went backwards).
  const v1::StatResponse* prev = nullptr;
  const v1::StatResponse* cur = nullptr;
  double elapsed_seconds = 0;  // Between prev and cur.
  int width = 80;              // Lines are cut to this many columns.
  std::string target;          // Shown in the title line.
  // Empty while connected; else why the daemon cannot be reached (then
  // `cur`, when set, is the last answer, shown below the notice).
  std::string disconnected;
};

// RenderTop returns the screen's lines, none longer than `width` (at least
// 20 columns are assumed).
std::vector<std::string> RenderTop(const TopInput& in);

}  // namespace evoke::ctl

#endif  // EVOKE_CLIENT_EVOKECTL_TOP_VIEW_H_
