# The inline data path without fresh buffers (issue #12): the hand-written
# wire format of Save and Load (daemon/inline_wire.h, client/inline_calls.h)
# against protobuf's, the raw handlers in this process (label unit), and
# against a real evoked (label e2e).
evoke_add_test(inline_path_unit_test SOURCES inline_path_unit_test.cc
  DEPS evoke_daemon evoke_client evoke_testing_fakes gRPC::grpc++ TIMEOUT 120)
evoke_add_test(inline_path_e2e_test SOURCES inline_path_e2e_test.cc
  DEPS ${E2E_DEPS} LABELS e2e TIMEOUT 600)
if(TARGET inline_path_e2e_test)
  add_dependencies(inline_path_e2e_test evoked)
endif()

# A measurement, not a test: the daemon's per-request CPU for one inline
# payload, protobuf's way against inline_wire.h (no socket).
if(EVOKE_BUILD_TESTS)
  add_executable(inline_path_micro inline_path_micro.cc)
  evoke_target_options(inline_path_micro)
  target_link_libraries(inline_path_micro PRIVATE evoke_daemon evoke_testing gRPC::grpc++)
endif()
