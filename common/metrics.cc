#include "common/metrics.h"

#include <algorithm>

namespace evoke {

absl::Span<const double> LatencyBucketsSeconds() {
  static constexpr double kBounds[] = {
      10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
      25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5, 5.0, 10.0};
  return kBounds;
}

Histogram::Histogram(absl::Span<const double> bounds)
    : bounds_(bounds.begin(), bounds.end()),
      counts_(new std::atomic<uint64_t>[bounds.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  const size_t i = static_cast<size_t>(
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.bounds = bounds_;
  s.counts.resize(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
    s.count += s.counts[i];
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

const char* PhaseName(Phase phase) {
  static constexpr const char* kNames[kPhaseCount] = {"copy", "checksum", "summary",
                                                      "reanchor", "rocksdb"};
  return kNames[static_cast<int>(phase)];
}

Histogram& PhaseHistogram(Phase phase) {
  // Leaked: timers may run in threads that outlive static destruction.
  static Histogram* const histograms = [] {
    auto* h = static_cast<Histogram*>(::operator new(sizeof(Histogram) * kPhaseCount));
    for (int i = 0; i < kPhaseCount; ++i) new (&h[i]) Histogram(LatencyBucketsSeconds());
    return h;
  }();
  return histograms[static_cast<int>(phase)];
}

}  // namespace evoke
