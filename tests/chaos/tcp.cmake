# TCP (issue #11): evoked with --tcp-listen on 127.0.0.1, TLS with a
# certificate made at test time (skips without the openssl command) and a
# bearer token per principal; tokens never in the log.
evoke_add_test(tcp_e2e_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/tcp_e2e_test.cc
  DEPS ${CHAOS_DEPS} LABELS "e2e;chaos" TIMEOUT 120)
if(TARGET tcp_e2e_test)
  add_dependencies(tcp_e2e_test evoked)
endif()
