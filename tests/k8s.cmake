# The Kubernetes manifests (deploy/kubernetes): every object against the
# OpenAPI schema of its kind, and the admission policy evoke-pod-identity run
# as the API server runs it (CEL), on the shipped pods and on forged ones
# (tests/k8s/check_manifests.mjs). Node.js and the npm packages pinned in
# tests/k8s/package-lock.json come from scripts/setup-debian.sh. Registered
# whether or not node exists: without it the test fails, it is never left out.
find_program(EVOKE_NODE node)
if(NOT EVOKE_NODE)
  set(EVOKE_NODE node)
endif()
add_test(NAME k8s_manifests_test
  COMMAND ${EVOKE_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/k8s/check_manifests.mjs
    ${PROJECT_SOURCE_DIR}/deploy/kubernetes)
set_tests_properties(k8s_manifests_test PROPERTIES LABELS "deploy" TIMEOUT 120)
