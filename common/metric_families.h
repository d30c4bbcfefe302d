// MetricFamilies: Prometheus metric families built afresh for each scrape
// (prometheus-cpp's data model, no registry): one family per name, in the
// order first added. evoked's /metrics (daemon/metrics_server.cc) and
// evoke-serve's build their pages with it. Header-only; link
// prometheus-cpp::core (target evoke_metric_families).
#ifndef EVOKE_COMMON_METRIC_FAMILIES_H_
#define EVOKE_COMMON_METRIC_FAMILIES_H_

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <prometheus/client_metric.h>
#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>

#include "common/metrics.h"

namespace evoke {

class MetricFamilies {
 public:
  using ClientMetric = prometheus::ClientMetric;
  using MetricFamily = prometheus::MetricFamily;
  using MetricType = prometheus::MetricType;
  using Labels = std::vector<ClientMetric::Label>;

  void Gauge(const std::string& name, const std::string& help, double value,
             Labels labels = {}) {
    ClientMetric m;
    m.label = std::move(labels);
    m.gauge.value = value;
    Family(name, help, MetricType::Gauge).metric.push_back(std::move(m));
  }
  void Counter(const std::string& name, const std::string& help, double value,
               Labels labels = {}) {
    ClientMetric m;
    m.label = std::move(labels);
    m.counter.value = value;
    Family(name, help, MetricType::Counter).metric.push_back(std::move(m));
  }
  void AddHistogram(const std::string& name, const std::string& help,
                    const Histogram::Snapshot& h, Labels labels = {}) {
    ClientMetric m;
    m.label = std::move(labels);
    m.histogram.sample_count = h.count;
    m.histogram.sample_sum = h.sum;
    uint64_t cumulative = 0;
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      cumulative += h.counts[i];
      m.histogram.bucket.push_back({cumulative, h.bounds[i]});
    }
    // The +Inf bucket.
    m.histogram.bucket.push_back({h.count, std::numeric_limits<double>::infinity()});
    Family(name, help, MetricType::Histogram).metric.push_back(std::move(m));
  }
  // Declares a family that may end up without samples (still listed, so
  // that dashboards find it).
  void Declare(const std::string& name, const std::string& help, MetricType type) {
    Family(name, help, type);
  }
  std::vector<MetricFamily> Take() { return std::move(families_); }

 private:
  MetricFamily& Family(const std::string& name, const std::string& help, MetricType type) {
    auto [it, added] = index_.emplace(name, families_.size());
    if (added) {
      MetricFamily f;
      f.name = name;
      f.help = help;
      f.type = type;
      families_.push_back(std::move(f));
    }
    return families_[it->second];
  }
  std::vector<MetricFamily> families_;
  std::map<std::string, size_t> index_;
};

}  // namespace evoke

#endif  // EVOKE_COMMON_METRIC_FAMILIES_H_
