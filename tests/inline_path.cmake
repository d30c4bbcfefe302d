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
