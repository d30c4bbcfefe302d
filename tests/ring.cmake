# The command ring, end to end (daemon/ring_server, client/ring_client).
evoke_add_test(ring_e2e_test SOURCES ring_e2e_test.cc
  DEPS ${E2E_DEPS} LABELS e2e TIMEOUT 600)
