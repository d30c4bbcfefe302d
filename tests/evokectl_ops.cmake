# evokectl for people (issue #15): `top`, progress bars, block streams,
# exit codes. Included by tests/CMakeLists.txt (optional).

# Without a daemon: top's screen from made-up Stat answers, the exit-code
# table, progress lines, the block stream format.
evoke_add_test(evokectl_unit_test SOURCES evokectl_unit_test.cc
  DEPS evokectl_lib evoke_client evoke_testing)

# `evokectl top` in a real terminal (tmux) against a real evoked.
evoke_add_test(evokectl_top_test SOURCES evokectl_top_test.cc
  DEPS ${E2E_DEPS} LABELS e2e TIMEOUT 180)
if(TARGET evokectl_top_test)
  add_dependencies(evokectl_top_test evoked evokectl)
endif()
