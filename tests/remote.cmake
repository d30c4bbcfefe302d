# The remote tier (issue #14) against a real throwaway Ceph cluster on
# loopback (scripts/ceph-dev-cluster.sh via testing/ceph_cluster.h): two
# evoked daemons as two hosts, and the failure drills. Built when evoked has
# the remote tier (EVOKE_WITH_RADOS). One ctest entry for the whole binary
# (not one per TEST): the binary starts one cluster (~15 s) for all drills;
# RESOURCE_LOCK keeps it from running beside the other Ceph test on 2 cores.
# Skips, saying how to install Ceph, when Ceph is missing
# (EVOKE_REQUIRE_CEPH=1: fails instead).
# TEMPORARY until the remote tier's proto lands: build only when
# kvtier.proto has RemoteStat.
file(STRINGS ${PROJECT_SOURCE_DIR}/proto/evoke/v1/kvtier.proto _remote_stat
  REGEX "^message RemoteStat")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/proto/evoke/v1/kvtier.proto)
if(EVOKE_WITH_RADOS AND EVOKE_BUILD_TESTS AND _remote_stat)
  add_executable(remote_tier_e2e_test remote_tier_e2e_test.cc)
  evoke_target_options(remote_tier_e2e_test)
  target_link_libraries(remote_tier_e2e_test PRIVATE evoke_testing_daemon
    evoke_testing_ceph GTest::gmock GTest::gtest_main)
  add_dependencies(remote_tier_e2e_test evoked evokectl)
  add_test(NAME remote_tier_e2e_test COMMAND remote_tier_e2e_test)
  set_tests_properties(remote_tier_e2e_test PROPERTIES
    LABELS "e2e;slow;remote" TIMEOUT 600 RESOURCE_LOCK ceph_dev_cluster)
endif()
