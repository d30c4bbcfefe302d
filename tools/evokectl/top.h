// `evokectl top`: a live view of evoked (tiers, hit rates, throughput,
// per-RPC latency), redrawn every interval on a terminal, or printed as plain
// snapshots when stdout is not one.
#ifndef EVOKE_CLIENT_EVOKECTL_TOP_H_
#define EVOKE_CLIENT_EVOKECTL_TOP_H_

#include <cstdint>
#include <string>

namespace evoke::ctl {

struct TopOptions {
  std::string socket;        // As --socket (empty: $EVOKE_SOCKET, ...).
  double interval_seconds = 1;
  int64_t iterations = 0;    // Frames to show, then exit; 0: until q or a signal.
  double timeout_seconds = 5;  // Per Stat call.
};

// RunTop returns the exit status: 0 when it ended on q, SIGINT, SIGTERM or
// after `iterations` frames of which at least one reached evoked; 4
// (unavailable) when none did.
int RunTop(const TopOptions& options);

}  // namespace evoke::ctl

#endif  // EVOKE_CLIENT_EVOKECTL_TOP_H_
