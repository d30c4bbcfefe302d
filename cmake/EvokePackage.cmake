# Install rules and the CMake package of evoke (included once, at the end of
# the top-level CMakeLists.txt, when every target exists).
#
# Components:
#   runtime  evoked and evokectl (their rules sit next to the targets, in
#            daemon/ and client/)
#   devel    the client library for engines: static libraries, the public
#            headers (<evoke/...>: include/evoke/, the generated
#            <evoke/version.h> and the generated protobuf/gRPC headers
#            <evoke/v1/*.pb.h>) and the package files under
#            lib/cmake/evoke/, so that an engine does
#
#     find_package(evoke 0.1 REQUIRED)                     # evoke::client
#     find_package(evoke 0.1 REQUIRED COMPONENTS policy)   # + evoke::policy
#     target_link_libraries(engine PRIVATE evoke::client)
#
# The client is a static library; the package carries the static libraries
# it is built from (evoke::common, evoke::proto, evoke::gpu; link
# evoke::client, not them) and finds their third-party dependencies itself
# (cmake/evokeConfig.cmake.in). The build tree is a package too
# (-Devoke_DIR=<build dir>).
include(CMakePackageConfigHelpers)

set(EVOKE_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/evoke)

# The libraries below the client name directories of the source and build
# trees in their usage requirements; those hold in the build tree only. The
# installed package's include directory comes from INCLUDES DESTINATION.
function(_evoke_build_tree_includes target)
  get_target_property(dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
  if(NOT dirs)
    return()
  endif()
  set(wrapped "")
  foreach(dir IN LISTS dirs)
    if(dir MATCHES "^\\$<")
      list(APPEND wrapped "${dir}")
    else()
      list(APPEND wrapped "$<BUILD_INTERFACE:${dir}>")
    endif()
  endforeach()
  set_property(TARGET ${target} PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${wrapped}")
endfunction()

# Exported name = evoke::<name>.
set(_evoke_client_targets evoke_common evoke_proto evoke_gpu evoke_client)
set(_evoke_policy_targets evoke_policy evoke_policy_c)
set_target_properties(evoke_common PROPERTIES EXPORT_NAME common)
set_target_properties(evoke_proto PROPERTIES EXPORT_NAME proto)
set_target_properties(evoke_gpu PROPERTIES EXPORT_NAME gpu)
set_target_properties(evoke_client PROPERTIES EXPORT_NAME client)
# evoke_policy is the C++ library behind the C API of <evoke/evoke_policy.h>
# (evoke_policy_c); its own headers are not installed.
set_target_properties(evoke_policy PROPERTIES EXPORT_NAME policy_impl)
set_target_properties(evoke_policy_c PROPERTIES EXPORT_NAME policy)
foreach(t IN LISTS _evoke_client_targets _evoke_policy_targets)
  _evoke_build_tree_includes(${t})
endforeach()
# Libraries built with sanitizers need their runtime in whatever links them.
if(EVOKE_SANITIZE)
  target_link_options(evoke_client INTERFACE -fsanitize=${EVOKE_SANITIZE})
endif()

install(TARGETS ${_evoke_client_targets} EXPORT evokeTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT devel
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT devel
  FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT devel
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS ${_evoke_policy_targets} EXPORT evokePolicyTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT devel
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT devel
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# The generated messages and stubs of proto/evoke/v1 (<evoke/v1/*.pb.h>),
# which the public headers include. grpc/health/v1 stays private.
install(DIRECTORY ${PROJECT_BINARY_DIR}/proto/evoke/v1/
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/evoke/v1 COMPONENT devel
  FILES_MATCHING PATTERN "*.pb.h")

install(EXPORT evokeTargets NAMESPACE evoke::
  DESTINATION ${EVOKE_INSTALL_CMAKEDIR} COMPONENT devel)
install(EXPORT evokePolicyTargets NAMESPACE evoke::
  DESTINATION ${EVOKE_INSTALL_CMAKEDIR} COMPONENT devel)
export(EXPORT evokeTargets NAMESPACE evoke::
  FILE ${PROJECT_BINARY_DIR}/evokeTargets.cmake)
export(EXPORT evokePolicyTargets NAMESPACE evoke::
  FILE ${PROJECT_BINARY_DIR}/evokePolicyTargets.cmake)

# Read by evokeConfig.cmake.in: what the package must find for its users.
set(EVOKE_PACKAGE_WITH_CUDA ${EVOKE_CUDA})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/evokeConfig.cmake.in
  ${PROJECT_BINARY_DIR}/evokeConfig.cmake
  INSTALL_DESTINATION ${EVOKE_INSTALL_CMAKEDIR})
# 0.x: a minor release may break the API, so only the same minor matches.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/evokeConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/evokeConfig.cmake
              ${PROJECT_BINARY_DIR}/evokeConfigVersion.cmake
  DESTINATION ${EVOKE_INSTALL_CMAKEDIR} COMPONENT devel)
