# Scatter/gather (issue #12): paged-cache pages gathered into one block and
# scattered back, through a shared-memory region of a real evoked.
# Included by tests/CMakeLists.txt. EVOKE_SG_BENCH=1 adds a timing run.
evoke_add_test(scatter_gather_e2e_test SOURCES scatter_gather_e2e_test.cc
  DEPS evoke_testing_daemon evoke_test_protos gRPC::grpc++ LABELS e2e TIMEOUT 600)
if(TARGET scatter_gather_e2e_test)
  add_dependencies(scatter_gather_e2e_test evoked)
endif()
