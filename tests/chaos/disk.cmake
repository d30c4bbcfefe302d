# Disk faults (issue #11): a full disk (a real small tmpfs; needs root, skips
# otherwise) and corrupt RocksDB files (bit flips in every file kind). Short
# forms here; EVOKE_TRIAL_LONG=1 runs the long forms (commands in
# RELIABILITY.md).
evoke_add_test(disk_full_e2e_test SOURCES disk_full_e2e_test.cc
  DEPS ${CHAOS_DEPS} LABELS "e2e;chaos" TIMEOUT 300)
if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/disk_corrupt_e2e_test.cc)
  evoke_add_test(disk_corrupt_e2e_test SOURCES disk_corrupt_e2e_test.cc
    DEPS ${CHAOS_DEPS} LABELS "e2e;chaos" TIMEOUT 600)
endif()
