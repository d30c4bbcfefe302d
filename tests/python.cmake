# The Python client (python, package evoke) against the real evoked,
# with Debian's interpreter (the one that has python3-grpcio, -protobuf and
# -numpy; a `python3` earlier on PATH may lack them). Twice: with the
# protobuf runtime the interpreter finds, and with its pure-Python runtime,
# to show the package does not depend on one. Then `import evoke` from an
# installed tree. Labels: e2e;python.
# Registered whether or not the interpreter exists: without it the tests
# fail ("Could not find executable"), they are never silently left out.
set(EVOKE_PYTHON3 /usr/bin/python3 CACHE FILEPATH "The Python the Python client is tested with")
set(_py_env
  "PYTHONPATH=${PROJECT_BINARY_DIR}/python"
  "EVOKED=$<TARGET_FILE:evoked>"
  "PYTHONDONTWRITEBYTECODE=1")
add_test(NAME python_client_test
  COMMAND ${EVOKE_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/python/test_client.py -v)
set_tests_properties(python_client_test PROPERTIES
  ENVIRONMENT "${_py_env}" LABELS "e2e-python" TIMEOUT 300)
add_test(NAME python_client_pure_protobuf_test
  COMMAND ${EVOKE_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/python/test_client.py -v)
set_tests_properties(python_client_pure_protobuf_test PROPERTIES
  ENVIRONMENT "${_py_env};PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python"
  LABELS "e2e-python" TIMEOUT 300)
# `import evoke` from a tree made by `cmake --install --component python`.
add_test(NAME python_install_test
  COMMAND ${CMAKE_COMMAND}
    -DBUILD_DIR=${PROJECT_BINARY_DIR} -DPYTHON=${EVOKE_PYTHON3}
    -DPREFIX=${CMAKE_CURRENT_BINARY_DIR}/python-install
    -DPKG_DIR=${EVOKE_PYTHON_INSTALL_DIR}
    -P ${CMAKE_CURRENT_SOURCE_DIR}/python/install_test.cmake)
set_tests_properties(python_install_test PROPERTIES LABELS "python" TIMEOUT 120)
