// A fitness function that runs an external command (evoke-tune
// --fitness-cmd): a user's own engine benchmark, or the simulator.
//
// Protocol, per evaluation:
//   - the command runs as `/bin/sh -c COMMAND` (pipelines, redirections and
//     variables work), in its own process group, with the caller's
//     environment plus EVOKE_BUDGETS_FILE;
//   - its stdin receives the plan as budgets JSON (policy/layer_budgets.h:
//     {"method": "evolkv-candidate", "mean": ..., "budgets": [...]}), then
//     EOF; the same JSON is in the file named by EVOKE_BUDGETS_FILE (deleted
//     after the command ends);
//   - it prints its score on stdout: the last non-empty line, trimmed, is
//     parsed as a finite double (higher is better). Other stdout lines are
//     ignored; stderr is captured and its tail quoted in errors;
//   - it must exit with status 0 within the timeout. When it ends (or times
//     out) its whole process group is killed (SIGKILL), so nothing it
//     started in the background outlives the evaluation.
#ifndef EVOKE_TUNE_EXTERNAL_FITNESS_H_
#define EVOKE_TUNE_EXTERNAL_FITNESS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "tune/evolkv.h"

namespace evoke::tune {

struct ExternalFitnessOptions {
  // The shell command line. Required (not empty).
  std::string command;

  // Wall-clock limit per evaluation, seconds (> 0). When it passes, the
  // command's process group is killed. Default: 60.
  double timeout_s = 60;

  // Where the budgets file is created. Empty means $TMPDIR, or /tmp when
  // TMPDIR is unset. Default: empty.
  std::string temp_dir;
};

// RunFitnessCommand runs options.command once on `budgets` (the protocol
// above) and returns the number it printed. Blocks until the command ends or
// times out; thread-compatible (no global state is changed: SIGPIPE is not
// raised by writing to a command that does not read its stdin).
// Errors (each message names the command):
//   INVALID_ARGUMENT  empty command, timeout_s outside (0, 1e6], or the
//                     output's last non-empty line is missing or not a finite number
//                     (quoted in the message);
//   DEADLINE_EXCEEDED the command did not exit within timeout_s (killed);
//   ABORTED           it exited with a non-zero status or was killed by a
//                     signal (the stderr tail is quoted);
//   INTERNAL          the temp file, pipes or fork failed, or the command's
//                     exit status could not be had (SIGCHLD ignored by the
//                     process, or the child reaped by another waiter).
absl::StatusOr<double> RunFitnessCommand(const ExternalFitnessOptions& options,
                                         absl::Span<const uint32_t> budgets);

// MakeExternalFitness: a FitnessFn that calls RunFitnessCommand with a copy
// of `options`.
FitnessFn MakeExternalFitness(ExternalFitnessOptions options);

}  // namespace evoke::tune

#endif  // EVOKE_TUNE_EXTERNAL_FITNESS_H_
