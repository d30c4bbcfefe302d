#!/usr/bin/env bash
# run_crash_trials.sh: the long form of the crash trials (issue #11):
# >= 200 SIGKILLs at random moments of mixed traffic from 4 client threads,
# then >= 10 kills at each failpoint compiled into evoked, every block checked
# against the expected-state model after each restart. Prints the seed and the
# counts (blocks checked, wrong bytes, durable blocks lost, restarts failed,
# recovery p50/p99) that RELIABILITY.md records.
#
#   tests/chaos/run_crash_trials.sh [BUILD_DIR] [LOG]
#
# BUILD_DIR defaults to build; LOG to BUILD_DIR/crash-trials.log. The
# environment passes through: EVOKE_TRIAL_SEED (repeat a run's plan),
# EVOKE_TRIAL_KILLS, EVOKE_TRIAL_FP_TRIALS, EVOKE_TRIAL_FAILPOINTS,
# EVOKE_TRIAL_FLAGS (e.g. "--spill-sync true"), EVOKE_EVOKED. Runs at low
# priority (nice 19): about 20 min for the random kills on 2 busy cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
log="${2:-$build/crash-trials.log}"
test_bin="$build/tests/chaos/crash_trial_test"
if [[ ! -x "$test_bin" ]]; then
  echo "run_crash_trials.sh: $test_bin not built (ninja -C $build crash_trial_test evoked)" >&2
  exit 2
fi
export EVOKE_TRIAL_LONG=1
export EVOKE_TRIAL_SEED="${EVOKE_TRIAL_SEED:-$(date +%s)}"
echo "crash trials: seed $EVOKE_TRIAL_SEED, log $log" >&2
status=0
nice -n 19 "$test_bin" 2>&1 | tee "$log" | grep -v '^crash trial [0-9]' || status=$?
exit "$status"
