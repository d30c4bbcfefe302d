# Tenancy: tenants told apart by SO_PEERCRED, as other uids (needs root;
# skips otherwise). tenant_client is one tenant's process.
add_executable(tenant_client ${CMAKE_CURRENT_SOURCE_DIR}/tenant_client.cc)
evoke_target_options(tenant_client)
target_link_libraries(tenant_client PRIVATE ${CHAOS_DEPS})
evoke_add_test(tenancy_e2e_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/tenancy_e2e_test.cc
  DEPS ${CHAOS_DEPS} LABELS "e2e;chaos" TIMEOUT 300)
if(TARGET tenancy_e2e_test)
  target_compile_definitions(tenancy_e2e_test PRIVATE
    EVOKE_TENANT_CLIENT_PATH="$<TARGET_FILE:tenant_client>")
  add_dependencies(tenancy_e2e_test tenant_client evoked)
endif()
