# Installs the Python component into PREFIX and imports it from there, from
# a directory outside the build, with nothing else on PYTHONPATH.
file(REMOVE_RECURSE ${PREFIX})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --component python
                        --prefix ${PREFIX}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc}): ${out}")
endif()
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH PYTHONPATH=${PREFIX}/${PKG_DIR}
          ${PYTHON} -c "import evoke, os; assert os.path.dirname(evoke.__file__).startswith('${PREFIX}'), evoke.__file__; print(evoke.pb.StatResponse.DESCRIPTOR.full_name, evoke.runtime())"
  WORKING_DIRECTORY ${PREFIX}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "evoke.v1.StatResponse")
  message(FATAL_ERROR "import evoke from ${PREFIX}/${PKG_DIR} failed (${rc}): ${out} ${err}")
endif()
message(STATUS "installed package imports: ${out}")
