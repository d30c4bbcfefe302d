#include "eval/report.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace evoke::eval {
namespace {

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string RankKey(int32_t rank) {
  if (rank < 0) return "resident";
  if (rank == 0) return absl::StrCat("not in top ", kRankDepth);
  return absl::StrCat(rank);
}

}  // namespace

std::pair<double, double> Wilson95(double successes, double n) {
  if (n <= 0) return {0.0, 1.0};
  const double z = 1.96;
  const double p = successes / n;
  const double denom = 1 + z * z / n;
  const double centre = (p + z * z / (2 * n)) / denom;
  const double half = z * std::sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom;
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

void Cell::Add(const SessionResult& r) {
  const uint32_t probes = static_cast<uint32_t>(r.probes.size());
  passes += r.passes;
  n += probes;
  ++sessions;
  session_rates.push_back(probes ? double(r.passes) / probes : 0);
  blocks_saved += r.blocks_saved;
  blocks_recovered += r.blocks_recovered;
  recovery_failures += r.recovery_failures;
  recovery_points += r.recovery_points;
  steps += r.steps;
  seconds += r.seconds;
  bring_seconds += r.bring_seconds;
  brought_tier1 += r.brought_tier1;
  brought_tier2 += r.brought_tier2;
  prefetched += r.prefetched;
  for (const ProbeResult& p : r.probes) {
    if (policy != kFullPolicy) ++fact_rank[RankKey(p.fact_rank)];
  }
}

void Cell::AddError(uint32_t probes, const std::string& message) {
  n += probes;
  ++sessions;
  ++errors;
  session_rates.push_back(0);
  if (first_error.empty()) first_error = message;
}

double Cell::session_mean() const {
  if (session_rates.empty()) return 0;
  double sum = 0;
  for (double r : session_rates) sum += r;
  return sum / session_rates.size();
}

std::pair<double, double> Cell::wilson_sessions() const {
  return Wilson95(session_mean() * sessions, sessions);
}

std::string CellsToJson(absl::Span<const Cell> cells, const std::string& header_members) {
  std::vector<std::string> rows;
  for (const Cell& c : cells) {
    std::vector<std::string> ranks;
    for (const auto& [k, v] : c.fact_rank) ranks.push_back(absl::StrCat(Quote(k), ":", v));
    const auto ws = c.wilson_sessions();
    const auto wp = c.wilson_probes();
    rows.push_back(absl::StrFormat(
        "{\"task\":%s,\"policy\":%s,\"budget\":%u,\"context\":%u,\"passes\":%u,\"n\":%u,"
        "\"sessions\":%u,\"pass_rate\":%.6f,\"session_mean\":%.6f,"
        "\"wilson_sessions\":[%.6f,%.6f],\"wilson_probes\":[%.6f,%.6f],"
        "\"blocks_saved\":%u,\"blocks_recovered\":%u,\"recovery_failures\":%u,"
        "\"recovery_points\":%u,\"ms_per_step\":%.4f,\"seconds\":%.3f,\"errors\":%u,"
        "\"stall_us_per_step\":%.3f,\"brought_tier1\":%u,\"brought_tier2\":%u,"
        "\"prefetched\":%u,\"first_error\":%s,\"fact_rank\":{%s}}",
        Quote(c.task), Quote(c.policy), c.budget, c.context, c.passes, c.n, c.sessions, c.rate(),
        c.session_mean(), ws.first, ws.second, wp.first, wp.second, c.blocks_saved,
        c.blocks_recovered, c.recovery_failures, c.recovery_points, c.ms_per_step(), c.seconds,
        c.errors, c.stall_us_per_step(), c.brought_tier1, c.brought_tier2, c.prefetched,
        Quote(c.first_error), absl::StrJoin(ranks, ",")));
  }
  return absl::StrCat("{", header_members, header_members.empty() ? "" : ",", "\"cells\":[\n",
                      absl::StrJoin(rows, ",\n"), "\n]}\n");
}

std::string CellsToMarkdown(absl::Span<const Cell> cells) {
  std::string out =
      "| task | policy | budget | pass rate (sessions) [Wilson 95%] | probes [Wilson 95%] | "
      "saved | recovered | rec. failures | ms/step | errors |\n"
      "|---|---|---:|---|---|---:|---:|---:|---:|---:|\n";
  for (const Cell& c : cells) {
    const auto ws = c.wilson_sessions();
    const auto wp = c.wilson_probes();
    absl::StrAppendFormat(
        &out, "| %s | %s | %s | %.1f%% [%.1f, %.1f] (%u sessions) | %u/%u [%.1f, %.1f] | %u | %u | "
              "%u | %.2f | %u |\n",
        c.task, c.policy, c.budget ? absl::StrCat(c.budget) : "all", 100 * c.session_mean(),
        100 * ws.first, 100 * ws.second, c.sessions, c.passes, c.n, 100 * wp.first,
        100 * wp.second, c.blocks_saved, c.blocks_recovered, c.recovery_failures,
        c.ms_per_step(), c.errors);
  }
  return out;
}

std::string CellsToSvg(absl::Span<const Cell> cells, const std::string& title) {
  std::vector<std::string> tasks;
  std::set<uint64_t> budget_set;
  std::vector<std::string> policies;
  for (const Cell& c : cells) {
    if (std::find(tasks.begin(), tasks.end(), c.task) == tasks.end()) tasks.push_back(c.task);
    if (c.budget) budget_set.insert(c.budget);
    if (std::find(policies.begin(), policies.end(), c.policy) == policies.end()) {
      policies.push_back(c.policy);
    }
  }
  const std::vector<uint64_t> budgets(budget_set.begin(), budget_set.end());
  static const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                  "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
  const int pw = 300, ph = 220, left = 50, top = 50, gap = 40;
  const int width = left + static_cast<int>(tasks.size()) * (pw + gap) + 150;
  const int height = top + ph + 70;
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" "
      "fill=\"white\"/>\n<text x=\"10\" y=\"20\" font-size=\"13\">%s</text>\n",
      width, height, title);
  const double lo = budgets.empty() ? 1 : std::log2(double(budgets.front()));
  const double hi = budgets.empty() ? 2 : std::log2(double(budgets.back()));
  auto x_of = [&](int x0, uint64_t b) {
    if (hi <= lo) return x0 + pw / 2.0;
    return x0 + 20 + (pw - 40) * (std::log2(double(b)) - lo) / (hi - lo);
  };
  auto y_of = [&](double rate) { return top + ph - ph * rate; };
  for (size_t t = 0; t < tasks.size(); ++t) {
    const int x0 = left + static_cast<int>(t) * (pw + gap);
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
                          "stroke=\"#888\"/>\n<text x=\"%d\" y=\"%d\">%s</text>\n",
                          x0, top, pw, ph, x0, top - 8, tasks[t]);
    for (int g = 0; g <= 4; ++g) {
      absl::StrAppendFormat(&svg, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%d%%</text>\n",
                            x0 - 4, y_of(g / 4.0) + 4, g * 25);
    }
    for (uint64_t b : budgets) {
      absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%u</text>\n",
                            x_of(x0, b), top + ph + 15, b);
    }
    for (size_t p = 0; p < policies.size(); ++p) {
      const char* color = kColors[p % 8];
      std::vector<std::string> points;
      for (const Cell& c : cells) {
        if (c.task != tasks[t] || c.policy != policies[p]) continue;
        if (c.policy == kFullPolicy) {
          absl::StrAppendFormat(&svg,
                                "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                                "stroke-dasharray=\"4 3\" data-policy=\"full\" data-y=\"%.4f\"/>\n",
                                x0, x0 + pw, y_of(c.session_mean()), y_of(c.session_mean()), color,
                                c.session_mean());
          continue;
        }
        const double x = x_of(x0, c.budget);
        const auto w = c.wilson_sessions();
        points.push_back(absl::StrFormat("%.1f,%.1f", x, y_of(c.session_mean())));
        absl::StrAppendFormat(&svg,
                              "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" "
                              "stroke=\"%s\" opacity=\"0.5\"/>\n<circle cx=\"%.1f\" cy=\"%.1f\" "
                              "r=\"3\" fill=\"%s\" data-policy=\"%s\" data-x=\"%u\" "
                              "data-y=\"%.4f\"/>\n",
                              x, x, y_of(w.first), y_of(w.second), color, x,
                              y_of(c.session_mean()), color, c.policy, c.budget, c.session_mean());
      }
      if (points.size() > 1) {
        absl::StrAppendFormat(&svg,
                              "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\"/>\n",
                              absl::StrJoin(points, " "), color);
      }
    }
  }
  const int lx = left + static_cast<int>(tasks.size()) * (pw + gap);
  for (size_t p = 0; p < policies.size(); ++p) {
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%d\" y=\"%zu\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                          "<text x=\"%d\" y=\"%zu\">%s</text>\n",
                          lx, top + p * 16, kColors[p % 8], lx + 14, top + p * 16 + 9,
                          policies[p]);
  }
  absl::StrAppendFormat(&svg, "<text x=\"%d\" y=\"%d\">KV budget (tokens, log scale); bars: "
                              "Wilson 95%% over sessions</text>\n</svg>\n",
                        left, top + ph + 40);
  return svg;
}

}  // namespace evoke::eval
