# Crash trials (issue #11): several client threads drive a real evoked on
# real RocksDB while it is killed (SIGKILL at random moments, and at the
# failpoints of common/failpoint.h at each acknowledgement boundary); after
# each restart every block is checked against a client-side expected-state
# model (crash_model.h). Short form in CI (label chaos, ~1 min); the long
# form and its recorded results: tests/chaos/run_crash_trials.sh.

evoke_add_test(crash_model_test
  SOURCES crash_model_test.cc crash_model.cc
  DEPS evoke_testing absl::synchronization absl::strings)

evoke_add_test(crash_trial_test
  SOURCES crash_trial_test.cc crash_trial.cc crash_model.cc
  DEPS ${CHAOS_DEPS}
  LABELS chaos TIMEOUT 600)
if(TARGET crash_trial_test)
  add_dependencies(crash_trial_test evoked)
endif()
