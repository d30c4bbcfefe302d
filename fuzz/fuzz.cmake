# libFuzzer targets (issue #11): each one feeds hostile bytes to a parser or
# validator that reads what another process or the disk wrote, in process, with
# no socket and no gRPC server. Built only with clang (option EVOKE_FUZZ), each
# with -fsanitize=fuzzer,address,undefined; the evoke libraries they link get
# coverage instrumentation (-fsanitize=fuzzer-no-link) so that libFuzzer sees
# inside them, and should be built with EVOKE_SANITIZE=address,undefined.
#
#   scripts/fuzz.sh [seconds-per-target]   configures build-fuzz, builds, runs
#
# Targets, with a seed corpus in fuzz/corpus/<target>/ (fuzz/make_seeds.cc
# writes it) and crash inputs kept as regressions in fuzz/regressions/<target>/:
#   fuzz_request_validation  Save/Load/Recover/List/ids requests -> validators,
#                            valid blocks -> RecoveryIndex Add and Search
#   fuzz_block_file          evokectl import/export files -> DecodeBlockFile
#   fuzz_block_stream        evokectl import's streams, from a file or a pipe
#                            -> BlockStreamReader (built streams with damage)
#   fuzz_spill_record        records on disk -> TierManager::Open's rebuild,
#                            then List, Describe, Load, Verify, Recover, Delete
#   fuzz_remote_record       tier-3 objects another host (or anyone with pool
#                            access) wrote -> a Load's fetch, Describe, Verify
#   fuzz_segment_open        tier-2 payload segment files (real ones, edited)
#                            -> SegmentLog::Open, Read, Contains, ForEachRecord
#   fuzz_daemon_flags        argv and --config file -> ParseDaemonFlags
#   fuzz_seq_state           llama.cpp sequence-state blobs -> ParseSeqState,
#                            ToCanonical (engines/llama/seq_state.cc builds
#                            without llama.cpp, so it is compiled in here)
#   fuzz_inline_save         SaveRequest bytes in slices -> the inline Save
#                            parser (inline_wire.h), against protobuf's parse
#   fuzz_ring_service        ring submissions (Save, Load; any meta, flags,
#                            ids, slices) -> the real RingHandler,
#                            KvTierService, TierManager and a shm region
#   fuzz_fd_channel          one client connection to the fd socket (request
#                            bytes in pieces, any descriptors) -> the real
#                            FdChannel, parser and LeaseManager
#   fuzz_access_policy       --policy text -> AccessPolicy::Parse, then the
#                            rights of callers it accepts (trust groups)
#   fuzz_bearer_token        token files, TCP call metadata -> BearerToken,
#                            TokenCaller, BearerTokenProcessor
#   fuzz_openai_request      an HTTP body of evoke-serve's generation routes ->
#                            ParseGenerationRequest; text -> StopMatcher
#   fuzz_ring                a hostile client's command ring (header, entries,
#                            index moves, wake words) -> RingSet's ring thread,
#                            with a checking fake RingHandler (its seeds are
#                            written by the target itself: see fuzz_ring.cc)
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  set(_evoke_fuzz_default ON)
else()
  set(_evoke_fuzz_default OFF)
endif()
option(EVOKE_FUZZ "Build the libFuzzer targets in fuzz/ (clang only)" ${_evoke_fuzz_default})
if(NOT EVOKE_FUZZ)
  return()
endif()
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "EVOKE_FUZZ needs clang (libFuzzer): configure with "
                      "CC=clang-14 CXX=clang++-14, or -DEVOKE_FUZZ=OFF")
endif()

set(_evoke_fuzz_flags -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
                      -fno-omit-frame-pointer)
# Coverage in the code under test. Only evoke's own libraries: the Debian
# ones (protobuf, gRPC, RocksDB, abseil) stay uninstrumented.
foreach(_lib evoke_common evoke_storage evoke_recovery evoke_daemon evoke_client evoke_gpu)
  if(TARGET ${_lib})
    target_compile_options(${_lib} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
  endif()
endforeach()

# clang 14 rejects __builtin_cpu_supports("f16c") in common/rope.cc; a
# force-included shim answers it from CPUID (fuzz/clang14_cpu_supports.h).
if(CMAKE_CXX_COMPILER_VERSION VERSION_LESS 15)
  set_source_files_properties(${PROJECT_SOURCE_DIR}/common/rope.cc
    DIRECTORY ${PROJECT_SOURCE_DIR}/common
    PROPERTIES COMPILE_OPTIONS "-include;${CMAKE_CURRENT_LIST_DIR}/clang14_cpu_supports.h")
endif()

set(EVOKE_FUZZ_TARGETS "")
# evoke_add_fuzzer(name SOURCES ... DEPS ...)
function(evoke_add_fuzzer name)
  cmake_parse_arguments(F "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${F_SOURCES})
  evoke_target_options(${name})
  target_compile_options(${name} PRIVATE ${_evoke_fuzz_flags})
  target_link_options(${name} PRIVATE -fsanitize=fuzzer,address,undefined)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PRIVATE ${F_DEPS})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
  set(EVOKE_FUZZ_TARGETS ${EVOKE_FUZZ_TARGETS} ${name} PARENT_SCOPE)
endfunction()

set(_fuzz_dir ${CMAKE_CURRENT_LIST_DIR})
set(_src ${PROJECT_SOURCE_DIR})
# The few daemon/ and client/ files under test are compiled into their
# targets rather than linking evoke_daemon and evoke_client, whose other
# (gRPC) sources would double the clang build that CI pays for.
evoke_add_fuzzer(fuzz_request_validation
  SOURCES ${_fuzz_dir}/fuzz_request_validation.cc ${_src}/daemon/request_validation.cc
  DEPS evoke_recovery evoke_common)
evoke_add_fuzzer(fuzz_block_file
  SOURCES ${_fuzz_dir}/fuzz_block_file.cc ${_src}/client/block_file.cc
  DEPS evoke_common)
evoke_add_fuzzer(fuzz_block_stream
  SOURCES ${_fuzz_dir}/fuzz_block_stream.cc ${_src}/client/block_file.cc
  DEPS evoke_common)
evoke_add_fuzzer(fuzz_spill_record
  SOURCES ${_fuzz_dir}/fuzz_spill_record.cc
  DEPS evoke_storage evoke_recovery evoke_common)
evoke_add_fuzzer(fuzz_remote_record
  SOURCES ${_fuzz_dir}/fuzz_remote_record.cc ${_src}/testing/memory_tier.cc
  DEPS evoke_storage evoke_recovery evoke_common)
evoke_add_fuzzer(fuzz_segment_open
  SOURCES ${_fuzz_dir}/fuzz_segment_open.cc
  DEPS evoke_storage evoke_common)
evoke_add_fuzzer(fuzz_daemon_flags
  SOURCES ${_fuzz_dir}/fuzz_daemon_flags.cc ${_src}/daemon/daemon_flags.cc
          ${_src}/daemon/daemon_options.cc
  DEPS evoke_common)
target_include_directories(fuzz_daemon_flags PRIVATE ${CLI11_INCLUDE_DIR})
evoke_add_fuzzer(fuzz_seq_state
  SOURCES ${_fuzz_dir}/fuzz_seq_state.cc ${_src}/engines/llama/seq_state.cc
  DEPS evoke_common)
evoke_add_fuzzer(fuzz_ring
  SOURCES ${_fuzz_dir}/fuzz_ring.cc ${_src}/daemon/ring_server.cc ${_src}/daemon/region.cc
  DEPS evoke_gpu evoke_common)
# The real service behind the ring (links the daemon library and gRPC).
evoke_add_fuzzer(fuzz_ring_service
  SOURCES ${_fuzz_dir}/fuzz_ring_service.cc ${_src}/testing/memory_tier.cc
          ${_src}/testing/host_device_copier.cc
  DEPS evoke_daemon evoke_storage evoke_recovery evoke_gpu evoke_common)
evoke_add_fuzzer(fuzz_fd_channel
  SOURCES ${_fuzz_dir}/fuzz_fd_channel.cc ${_src}/testing/memory_tier.cc
  DEPS evoke_daemon evoke_storage evoke_recovery evoke_gpu evoke_common)
evoke_add_fuzzer(fuzz_access_policy
  SOURCES ${_fuzz_dir}/fuzz_access_policy.cc ${_src}/daemon/access_policy.cc
  DEPS evoke_common)
evoke_add_fuzzer(fuzz_bearer_token
  SOURCES ${_fuzz_dir}/fuzz_bearer_token.cc ${_src}/daemon/tcp_auth.cc ${_src}/daemon/peer_listener.cc
          ${_src}/daemon/access_policy.cc
  DEPS evoke_common gRPC::grpc++)
# The header-only parser; gRPC only for its Slice type.
evoke_add_fuzzer(fuzz_inline_save
  SOURCES ${_fuzz_dir}/fuzz_inline_save.cc
  DEPS evoke_storage evoke_common gRPC::grpc++)

# make_seeds writes the seed corpora (run once; its output is committed):
#   build-fuzz/fuzz/make_seeds fuzz/corpus
add_executable(evoke_fuzz_make_seeds ${_fuzz_dir}/make_seeds.cc
  ${_src}/engines/llama/seq_state.cc ${_src}/client/block_file.cc
  ${_src}/daemon/daemon_flags.cc ${_src}/daemon/daemon_options.cc)
evoke_target_options(evoke_fuzz_make_seeds)
target_include_directories(evoke_fuzz_make_seeds PRIVATE ${PROJECT_SOURCE_DIR}
  ${CLI11_INCLUDE_DIR})
target_link_libraries(evoke_fuzz_make_seeds PRIVATE evoke_storage evoke_common)
# The libraries carry coverage hooks; the sanitizer runtimes define them.
target_link_options(evoke_fuzz_make_seeds PRIVATE -fsanitize=address,undefined)
set_target_properties(evoke_fuzz_make_seeds PROPERTIES
  RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz OUTPUT_NAME make_seeds)

find_package(nlohmann_json CONFIG REQUIRED)
evoke_add_fuzzer(fuzz_openai_request
  SOURCES ${_fuzz_dir}/fuzz_openai_request.cc ${_src}/serve/openai_api.cc
  DEPS nlohmann_json::nlohmann_json absl::strings)

add_custom_target(evoke_fuzzers DEPENDS ${EVOKE_FUZZ_TARGETS})
