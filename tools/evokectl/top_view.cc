#include "tools/evokectl/top_view.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/byte_size.h"

namespace evoke::ctl {
namespace {

// Counters only grow; one that went backwards belongs to a new daemon, so
// all of its value is new.
uint64_t Delta(uint64_t prev, uint64_t cur) { return cur >= prev ? cur - prev : cur; }

std::string Rate(uint64_t n, double seconds) {
  if (seconds <= 0) return "-";
  return absl::StrFormat("%.1f", static_cast<double>(n) / seconds);
}

std::string Percent(uint64_t part, uint64_t whole) {
  if (whole == 0) return "-";
  return absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

std::string Duration(double seconds) {
  if (seconds < 1e-3) return absl::StrFormat("%.0fus", seconds * 1e6);
  if (seconds < 1) return absl::StrFormat("%.2fms", seconds * 1e3);
  return absl::StrFormat("%.2fs", seconds);
}

std::string Uptime(uint64_t s) {
  if (s >= 86400) return absl::StrFormat("%dd%02dh%02dm", s / 86400, s / 3600 % 24, s / 60 % 60);
  if (s >= 3600) return absl::StrFormat("%dh%02dm%02ds", s / 3600, s / 60 % 60, s % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrCat(s, "s");
}

std::string QuantileText(const std::optional<Quantile>& q) {
  if (!q.has_value()) return "-";
  return q->overflow ? absl::StrCat(">", Duration(q->seconds)) : Duration(q->seconds);
}

std::string TierLine(const char* name, const v1::TierStat& t, int bar_cells) {
  std::string line = absl::StrFormat("%-16s %8d %11s %11s %11s", name, t.blocks(),
                                     FormatByteSize(t.payload_bytes()),
                                     FormatByteSize(t.used_bytes()),
                                     FormatByteSize(t.capacity_bytes()));
  if (t.capacity_bytes() == 0) return line + "  -";
  const double fraction = std::min(
      1.0, static_cast<double>(t.used_bytes()) / static_cast<double>(t.capacity_bytes()));
  if (bar_cells > 0) {
    const int full = static_cast<int>(std::lround(fraction * bar_cells));
    absl::StrAppend(&line, "  [", std::string(full, '#'), std::string(bar_cells - full, '.'),
                    "]");
  }
  absl::StrAppend(&line, absl::StrFormat(" %5.1f%%", fraction * 100));
  return line;
}

}  // namespace

std::optional<Quantile> HistogramQuantile(const std::vector<double>& upper_bounds,
                                          const std::vector<uint64_t>& counts, double q) {
  if (counts.size() != upper_bounds.size() + 1) return std::nullopt;
  uint64_t total = 0;
  for (uint64_t c : counts) total += c;
  if (total == 0) return std::nullopt;
  // The rank of the quantile among the calls, at least the first call.
  const double rank = std::max(1.0, std::ceil(std::clamp(q, 0.0, 1.0) * static_cast<double>(total)));
  uint64_t below = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] == 0) continue;
    if (static_cast<double>(below + counts[i]) >= rank) {
      if (i == upper_bounds.size()) {
        return Quantile{upper_bounds.empty() ? 0 : upper_bounds.back(), true};
      }
      const double lower = i == 0 ? 0 : upper_bounds[i - 1];
      const double upper = upper_bounds[i];
      const double within = (rank - static_cast<double>(below)) / static_cast<double>(counts[i]);
      return Quantile{lower + (upper - lower) * within, false};
    }
    below += counts[i];
  }
  return std::nullopt;  // Unreachable: rank <= total.
}

std::vector<RpcDelta> RpcDeltas(const v1::StatResponse* prev, const v1::StatResponse& cur) {
  std::vector<RpcDelta> out;
  for (const v1::RpcStat& c : cur.rpcs()) {
    const v1::RpcStat* p = nullptr;
    if (prev != nullptr) {
      for (const v1::RpcStat& candidate : prev->rpcs()) {
        if (candidate.method() == c.method()) p = &candidate;
      }
    }
    // A restarted daemon (fewer calls than before) or a changed histogram
    // shape: compare with nothing.
    if (p != nullptr && (p->calls() > c.calls() ||
                         p->bucket_counts_size() != c.bucket_counts_size() ||
                         p->bucket_upper_seconds_size() != c.bucket_upper_seconds_size())) {
      p = nullptr;
    }
    RpcDelta d;
    d.method = c.method();
    d.total_calls = c.calls();
    d.calls = Delta(p ? p->calls() : 0, c.calls());
    d.errors = Delta(p ? p->errors() : 0, c.errors());
    d.seconds_sum = std::max(0.0, c.seconds_sum() - (p ? p->seconds_sum() : 0.0));
    d.upper_bounds.assign(c.bucket_upper_seconds().begin(), c.bucket_upper_seconds().end());
    for (int i = 0; i < c.bucket_counts_size(); ++i) {
      d.counts.push_back(Delta(p ? p->bucket_counts(i) : 0, c.bucket_counts(i)));
    }
    out.push_back(std::move(d));
  }
  return out;
}

std::vector<std::string> RenderTop(const TopInput& in) {
  std::vector<std::string> lines;
  const int width = std::max(20, in.width);
  const v1::StatResponse* cur = in.cur;
  const v1::StatResponse* prev = in.prev;
  if (cur != nullptr && prev != nullptr &&
      (prev->pid() != cur->pid() || prev->uptime_seconds() > cur->uptime_seconds())) {
    prev = nullptr;  // Restarted in between: its counters began again.
  }
  double seconds = in.elapsed_seconds;
  if (prev == nullptr && cur != nullptr) seconds = static_cast<double>(cur->uptime_seconds());
  const std::string window =
      prev != nullptr ? absl::StrFormat("last %.1fs", seconds) : "avg since start";

  if (cur == nullptr) {
    lines.push_back(absl::StrCat("evokectl top  ", in.target));
  } else {
    lines.push_back(absl::StrCat("evoked ", cur->version(), "  pid ", cur->pid(), "  up ",
                                 Uptime(cur->uptime_seconds()), "  ", in.target));
  }
  if (!in.disconnected.empty()) {
    lines.push_back(absl::StrCat("*** disconnected, retrying: ", in.disconnected));
  }
  if (cur == nullptr) {
    for (std::string& l : lines) {
      if (static_cast<int>(l.size()) > width) l.resize(width);
    }
    return lines;
  }
  if (!cur->has_counters()) {
    lines.push_back("");
    lines.push_back("this caller is not an admin: evoked shows it its namespaces only");
  }
  const v1::Counters& c = cur->counters();
  const v1::Counters empty;
  const v1::Counters& p = prev != nullptr ? prev->counters() : empty;

  // Tiers. The bar takes what the columns (72 with the percentage) leave,
  // up to 30 cells; under 10 it is left out.
  const int bar_cells = width - 72 >= 10 ? std::min(30, width - 72) : 0;
  lines.push_back("");
  lines.push_back(absl::StrFormat("%-16s %8s %11s %11s %11s  %s", "TIER", "BLOCKS", "PAYLOAD",
                                  "USED", "CAPACITY", "USAGE"));
  lines.push_back(TierLine("1 pinned host", cur->pinned(), bar_cells));
  lines.push_back(TierLine("2 spill (disk)", cur->spill(), bar_cells));
  if (cur->has_remote() && cur->remote().enabled()) {
    const v1::RemoteStat& r = cur->remote();
    lines.push_back(absl::StrFormat("%-16s %8d %11s  %s", "3 remote", r.pool_objects(),
                                    FormatByteSize(r.pool_used_bytes()), r.state()));
  }
  lines.push_back(absl::StrFormat("%-16s %8d   pinned %d  metadata %s", "breadcrumbs",
                                  cur->breadcrumb_blocks(), cur->pinned_blocks(),
                                  FormatByteSize(cur->metadata_bytes())));

  // Hit rates: where loads were served from, or that they missed.
  auto hit_line = [](const std::string& label, uint64_t t1, uint64_t t2, uint64_t miss) {
    const uint64_t all = t1 + t2 + miss;
    return absl::StrFormat("%-16s %8s %8s %8s %10d", label, Percent(t1, all), Percent(t2, all),
                           Percent(miss, all), all);
  };
  lines.push_back("");
  lines.push_back(absl::StrFormat("%-16s %8s %8s %8s %10s", "HIT RATE", "TIER 1", "TIER 2",
                                  "MISS", "LOOKUPS"));
  if (prev != nullptr) {
    lines.push_back(hit_line(window, Delta(p.hits_tier1(), c.hits_tier1()),
                             Delta(p.hits_tier2(), c.hits_tier2()),
                             Delta(p.misses(), c.misses())));
  }
  lines.push_back(hit_line("since start", c.hits_tier1(), c.hits_tier2(), c.misses()));

  // Throughput from counter deltas.
  lines.push_back("");
  lines.push_back(absl::StrFormat("%-16s %9s %9s %9s %9s %9s %11s %9s %9s", "THROUGHPUT",
                                  "saves/s", "dedups/s", "loads/s", "misses/s", "spills/s",
                                  "spilled/s", "evicts/s", "deletes/s"));
  const uint64_t spilled = Delta(p.spilled_bytes(), c.spilled_bytes());
  lines.push_back(absl::StrFormat(
      "%-16s %9s %9s %9s %9s %9s %11s %9s %9s", window, Rate(Delta(p.saves(), c.saves()), seconds),
      Rate(Delta(p.dedups(), c.dedups()), seconds), Rate(Delta(p.loads(), c.loads()), seconds),
      Rate(Delta(p.misses(), c.misses()), seconds), Rate(Delta(p.spills(), c.spills()), seconds),
      seconds > 0
          ? FormatByteSize(static_cast<uint64_t>(static_cast<double>(spilled) / seconds))
          : "-",
      Rate(Delta(p.evictions(), c.evictions()), seconds),
      Rate(Delta(p.deletes(), c.deletes()), seconds)));
  lines.push_back(absl::StrCat("totals: saves ", c.saves(), "  dedups ", c.dedups(), "  loads ",
                               c.loads(), "  misses ", c.misses(), "  spills ", c.spills(),
                               "  evictions ", c.evictions(), "  deletes ", c.deletes(),
                               "  checksum_failures ", c.checksum_failures()));

  // Per-RPC latency over the interval, from histogram deltas.
  lines.push_back("");
  std::vector<RpcDelta> rpcs = RpcDeltas(prev, *cur);
  const bool reported = !rpcs.empty();
  // Methods never called are left out: a daemon reports every method and
  // ring opcode, most of them idle.
  std::erase_if(rpcs, [](const RpcDelta& d) { return d.total_calls == 0; });
  if (!reported) {
    lines.push_back("RPC LATENCY: n/a (this evoked reports no per-RPC figures)");
  } else {
    lines.push_back(absl::StrFormat("%-16s %9s %9s %9s %9s %9s %10s   (%s)", "RPC", "calls/s",
                                    "errors/s", "mean", "p50", "p99", "calls", window));
    if (rpcs.empty()) lines.push_back("(no calls yet)");
    for (const RpcDelta& d : rpcs) {
      lines.push_back(absl::StrFormat(
          "%-16s %9s %9s %9s %9s %9s %10d", d.method, Rate(d.calls, seconds),
          Rate(d.errors, seconds),
          d.calls > 0 ? Duration(d.seconds_sum / static_cast<double>(d.calls)) : "-",
          QuantileText(HistogramQuantile(d.upper_bounds, d.counts, 0.5)),
          QuantileText(HistogramQuantile(d.upper_bounds, d.counts, 0.99)), d.total_calls));
    }
  }
  for (std::string& l : lines) {
    if (static_cast<int>(l.size()) > width) l.resize(width);
  }
  return lines;
}

}  // namespace evoke::ctl
