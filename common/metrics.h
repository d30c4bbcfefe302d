// Lock-free histograms for the daemon's latency figures, and the per-phase
// timers the data paths report into. The daemon exports them two ways from
// this one source: Stat (RpcStat) and Prometheus /metrics
// (daemon/metrics_server.h; every name in docs/METRICS.md).
#ifndef EVOKE_COMMON_METRICS_H_
#define EVOKE_COMMON_METRICS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"

namespace evoke {

// Upper bounds (seconds) of the latency buckets: 10 µs to 10 s, about three
// per decade, which covers a tier-1 hit of a small block and a Save that
// waited for room.
absl::Span<const double> LatencyBucketsSeconds();

// Histogram counts observations into fixed buckets. Observe is a few relaxed
// atomic adds (no lock), so every thread may record on the hot path.
class Histogram {
 public:
  // `bounds` ascending; a value lands in the first bucket whose bound is
  // >= it, or in the overflow bucket past the last.
  explicit Histogram(absl::Span<const double> bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  void Observe(double value);

  struct Snapshot {
    std::vector<double> bounds;
    // Not cumulative: counts[i] is bucket i, counts.back() the overflow.
    std::vector<uint64_t> counts;
    uint64_t count = 0;  // Sum of counts.
    double sum = 0;
  };
  // Read is a consistent-enough view: each bucket is read once; count is
  // the sum of the buckets read, so it always agrees with them.
  Snapshot Read() const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // bounds_.size() + 1.
  std::atomic<double> sum_{0};
};

// The phases of a request timed on their own (one observation per batch of
// blocks that went through the phase): copying payload bytes in or out of
// tier 1 (hashing fused with the copy included), a separate checksum pass,
// computing Recover summaries, re-anchoring positions on Load, and RocksDB
// reads and writes of the spill store.
enum class Phase { kCopy = 0, kChecksum, kSummary, kReanchor, kRocksDb };
inline constexpr int kPhaseCount = 5;
// "copy", "checksum", "summary", "reanchor", "rocksdb".
const char* PhaseName(Phase phase);
// Process-wide latency histogram (seconds) of `phase`.
Histogram& PhaseHistogram(Phase phase);

// PhaseTimer observes the time from its construction to its destruction
// into the phase's histogram.
class PhaseTimer {
 public:
  explicit PhaseTimer(Phase phase)
      : phase_(phase), start_(std::chrono::steady_clock::now()) {}
  ~PhaseTimer() {
    PhaseHistogram(phase_).Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  const Phase phase_;
  const std::chrono::steady_clock::time_point start_;
};

}  // namespace evoke

#endif  // EVOKE_COMMON_METRICS_H_
