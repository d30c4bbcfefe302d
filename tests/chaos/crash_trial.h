// Crash trials: real evoked processes on real RocksDB, driven by several
// client threads (Save durable and not, Load, Delete, Flush, Recover, with
// random block sizes and ids), killed with SIGKILL at random moments or at
// named failpoints (common/failpoint.h), restarted, and every block checked
// against the client-side expected state (crash_model.h).
//
// The random choices (operations, slots, sizes, kill times, failpoint hit
// numbers) derive from one printed seed; the interleaving of threads and the
// daemon does not, so a seed replays the same plan, not the same schedule.
#ifndef EVOKE_TESTS_CHAOS_CRASH_TRIAL_H_
#define EVOKE_TESTS_CHAOS_CRASH_TRIAL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace evoke::chaos {

struct CrashTrialOptions {
  uint64_t seed = 1;
  // Directory of the daemon's socket, data and log (kept across trials:
  // every trial restarts on what the previous one left).
  std::string dir;
  // Trials killed with SIGKILL at a random moment of the traffic.
  int random_kills = 10;
  // Traffic runs for a uniform time in [min, max] before the kill.
  absl::Duration min_traffic = absl::Milliseconds(1000);
  absl::Duration max_traffic = absl::Milliseconds(3000);
  // Failpoints to kill at (each `trials_per_failpoint` times): evoked gets
  // EVOKE_FAILPOINTS=NAME=N with a random N, and traffic runs until the
  // failpoint kills it or `failpoint_window` passes (then a SIGKILL, counted
  // as not reached).
  std::vector<std::string> failpoints;
  int trials_per_failpoint = 10;
  absl::Duration failpoint_window = absl::Seconds(6);
  int client_threads = 4;
  int slots_per_thread = 96;
  // Blocks have 1..max_tokens tokens of 2 KiB (SmallFingerprint).
  uint32_t max_tokens = 128;
  // Added to evoked's command line after the trial's own flags.
  std::vector<std::string> extra_flags;
  // Progress lines on stderr.
  bool verbose = true;
};

struct FailpointCount {
  int fired = 0;        // The failpoint killed evoked.
  int not_reached = 0;  // Not hit often enough in the window; SIGKILL instead.
};

struct CrashTrialReport {
  uint64_t seed = 0;
  int trials = 0;
  int random_kills = 0;
  std::map<std::string, FailpointCount> failpoints;

  // Checks after each restart (one Load per slot) and during traffic.
  uint64_t blocks_checked = 0;
  uint64_t live_loads_checked = 0;
  uint64_t cross_loads_checked = 0;  // Other threads' blocks: bytes only.
  uint64_t recovers_checked = 0;

  // Must stay 0.
  uint64_t wrong_bytes = 0;         // A payload that is no version of its block.
  uint64_t durable_lost = 0;        // Durable (or flushed, or restarted) block gone.
  uint64_t live_lost = 0;           // Stored block NOT_FOUND while evoked lived.
  uint64_t resurrected = 0;         // Deleted or superseded bytes served.
  uint64_t phantom = 0;             // Served or recovered, never saved.
  uint64_t data_loss_errors = 0;    // DATA_LOSS answers (a checksum caught).
  uint64_t restarts_failed = 0;
  uint64_t checksum_failures = 0;   // Stat after each restart, summed.
  uint64_t invalid_records = 0;     // Stat after each restart, summed.

  // Allowed by the model, reported to show what the trials exercised.
  uint64_t volatile_lost = 0;       // Acknowledged, not durable, gone after kill.
  uint64_t volatile_kept = 0;       // Acknowledged, not durable, kept (spilled).
  uint64_t in_flight_at_kill = 0;   // Operations without an answer at the kill.
  uint64_t in_flight_applied = 0;   // ... whose effect was found after restart.
  uint64_t flush_promoted = 0;      // Blocks a Flush acknowledgement made durable.
  uint64_t unexpected_errors = 0;   // Errors while evoked lived (other codes).
  std::map<std::string, uint64_t> acked;  // Acknowledged operations by kind.

  // After each kill: spawn to evoked's own "serving on" log line (RocksDB
  // open and the index rebuilt), and spawn to a client's first successful
  // health check and Stat (adds the trial's polling and scheduling).
  std::vector<double> recovery_ms;
  std::vector<double> ready_ms;
  std::vector<std::string> violations;  // The first few, described.

  uint64_t Violations() const {
    return wrong_bytes + durable_lost + live_lost + resurrected + phantom +
           data_loss_errors + restarts_failed + checksum_failures;
  }
  static double Percentile(const std::vector<double>& ms, double p);
  // Several lines: every count above.
  std::string Summary() const;
};

// RunCrashTrials runs the random-kill trials, then the failpoint trials.
// An error only when the trials could not run at all (evoked would not
// start the first time); every other failure is counted in the report.
absl::StatusOr<CrashTrialReport> RunCrashTrials(const CrashTrialOptions& options);

// FailpointsIn returns the names of `candidates` that are compiled into the
// program at `binary` (their names appear in it), so that trials skip the
// failpoints a build does not have.
std::vector<std::string> FailpointsIn(const std::string& binary,
                                      const std::vector<std::string>& candidates);

// The failpoints the daemon is meant to have, one per acknowledgement
// boundary (see tests/chaos/crash.cmake and the report of issue #11).
const std::vector<std::string>& KnownFailpoints();

}  // namespace evoke::chaos

#endif  // EVOKE_TESTS_CHAOS_CRASH_TRIAL_H_
