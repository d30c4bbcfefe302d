# Hostile and slow shared-memory clients against a real evoked (issue #11):
# sparse memfds, floods of tiny registrations, idle and trickling fd-socket
# connections, hostile descriptors, another uid. Short form in CI; the long
# flood (70,000 registrations) with EVOKE_TRIAL_LONG=1.
evoke_add_test(hostile_e2e_test SOURCES hostile_e2e_test.cc
  DEPS ${CHAOS_DEPS} LABELS "e2e;chaos" TIMEOUT 300)
if(TARGET hostile_e2e_test)
  add_dependencies(hostile_e2e_test evoked)
endif()
