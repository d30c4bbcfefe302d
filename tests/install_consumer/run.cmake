# run.cmake: installs the current build of evoke into a fresh prefix, then
# configures, builds and runs tests/install_consumer against that prefix
# alone. ctest runs it as test install_consumer (tests/CMakeLists.txt):
#
#   cmake -DEVOKE_BUILD_DIR=<build> -DWORK_DIR=<scratch dir>
#         -DCONSUMER_SOURCE_DIR=<this folder> -DGENERATOR=<generator>
#         [-DCXX_COMPILER=... -DC_COMPILER=... -DCOMPILER_LAUNCHER=...]
#         -P run.cmake
# The consumer builds in its default configuration (no build type): the
# package's imported libraries serve whatever configuration asks.
foreach(var EVOKE_BUILD_DIR WORK_DIR CONSUMER_SOURCE_DIR GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run.cmake: -D${var}=... is required")
  endif()
endforeach()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "install_consumer: failed (${rc}): ${cmd}")
  endif()
endfunction()

set(prefix ${WORK_DIR}/prefix)
set(consumer_build ${WORK_DIR}/consumer)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

# 1. Install, as a user would.
run(${CMAKE_COMMAND} --install ${EVOKE_BUILD_DIR} --prefix ${prefix})

# 2. The installed tree names neither the source nor the build tree, and
# holds no internal header.
get_filename_component(source_dir ${CONSUMER_SOURCE_DIR}/../.. ABSOLUTE)
file(GLOB_RECURSE cmake_files ${prefix}/*.cmake)
foreach(f IN LISTS cmake_files)
  file(READ ${f} text)
  foreach(tree ${source_dir} ${EVOKE_BUILD_DIR})
    string(FIND "${text}" "${tree}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "install_consumer: ${f} names ${tree}")
    endif()
  endforeach()
endforeach()
foreach(must bin/evoked bin/evokectl include/evoke/client.h include/evoke/version.h
        include/evoke/v1/kvtier.pb.h)
  if(NOT EXISTS ${prefix}/${must})
    message(FATAL_ERROR "install_consumer: ${prefix}/${must} was not installed")
  endif()
endforeach()
foreach(internal common storage daemon gpu recovery policy testing)
  if(EXISTS ${prefix}/include/${internal})
    message(FATAL_ERROR "install_consumer: internal headers installed: include/${internal}")
  endif()
endforeach()

# 3. Configure and build the consumer against the prefix only.
set(configure ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${consumer_build}
    -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
foreach(pair CXX_COMPILER:CMAKE_CXX_COMPILER C_COMPILER:CMAKE_C_COMPILER)
  string(REPLACE ":" ";" pair ${pair})
  list(GET pair 0 from)
  list(GET pair 1 to)
  if(${from})
    list(APPEND configure -D${to}=${${from}})
  endif()
endforeach()
if(COMPILER_LAUNCHER)
  list(APPEND configure -DCMAKE_CXX_COMPILER_LAUNCHER=${COMPILER_LAUNCHER}
                        -DCMAKE_C_COMPILER_LAUNCHER=${COMPILER_LAUNCHER})
endif()
run(${configure})
run(${CMAKE_COMMAND} --build ${consumer_build} --parallel 2)

# 4. Run it.
run(${consumer_build}/evoke_consumer)
