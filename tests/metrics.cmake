# Prometheus /metrics and the logs (issue #15): a real evoked scraped over
# HTTP, promtool's lint, exact counter moves for a known workload, the
# --metrics-address start rules, and the Grafana dashboard and Kubernetes
# manifests checked against what evoked exports.
evoke_add_test(metrics_e2e_test SOURCES metrics_e2e_test.cc
  DEPS ${E2E_DEPS} LABELS e2e TIMEOUT 300)
if(TARGET metrics_e2e_test)
  target_compile_definitions(metrics_e2e_test PRIVATE EVOKE_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
endif()

# The log format and the hot-path rate limiter (no daemon).
evoke_add_test(metrics_log_test SOURCES metrics_log_test.cc DEPS evoke_common)
