// MetricsServer: Prometheus /metrics over HTTP (prometheus-cpp's Exposer).
// Every scrape builds the families afresh from the daemon's own figures: an
// admin Stat (the same answer `evokectl stat` shows) and the RpcMetrics, so
// /metrics and Stat cannot drift apart. Names: docs/METRICS.md.
#ifndef EVOKE_DAEMON_METRICS_SERVER_H_
#define EVOKE_DAEMON_METRICS_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "absl/status/statusor.h"
#include "daemon/rpc_metrics.h"
#include "evoke/v1/kvtier.pb.h"

namespace prometheus {
class Exposer;
}

namespace evoke {

// The families of one scrape, built from `stat` (an admin StatResponse) and
// `rpcs`. The evoke_namespace_* series (each tenant's namespace name and
// usage) only with `per_namespace`; otherwise the count of namespaces alone.
// Exposed for tests.
std::vector<prometheus::MetricFamily> BuildMetricFamilies(const v1::StatResponse& stat,
                                                          const RpcMetrics& rpcs,
                                                          bool per_namespace);

class MetricsServer {
 public:
  // Bind serves /metrics on `address` ("HOST:PORT"; port 0 lets the kernel
  // pick one) with nothing registered yet. UNAVAILABLE, naming
  // --metrics-address, when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Bind(const std::string& address);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Serve starts answering scrapes with `stat` (fills an admin
  // StatResponse; called on the HTTP server's thread) and `rpcs`, which
  // must outlive this object; per-namespace series only with
  // `per_namespace` (--metrics-namespaces). Once.
  void Serve(std::function<void(v1::StatResponse*)> stat, const RpcMetrics* rpcs,
             bool per_namespace);

  // "HOST:PORT" as bound, the port resolved.
  const std::string& address() const { return address_; }

 private:
  class Collector;
  MetricsServer() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<Collector> collector_;
  std::string address_;
};

}  // namespace evoke

#endif  // EVOKE_DAEMON_METRICS_SERVER_H_
