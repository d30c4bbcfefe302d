#include "sim/report.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace evoke::sim {

const char kNoModelNotice[] =
    "evoke-sim: synthetic attention-level simulation. NO LANGUAGE MODEL is involved: tokens are "
    "random key vectors, facts are spans sharing a hidden direction, and a probe passes when "
    "softmax attention over the resident cache puts enough mass on the fact's tokens.";

Interval Wilson95(uint64_t passes, uint64_t n) {
  if (n == 0) return {0, 1};
  const double z = 1.959963984540054;
  const double nn = static_cast<double>(n);
  const double p = static_cast<double>(passes) / nn;
  const double denom = 1 + z * z / nn;
  const double center = (p + z * z / (2 * nn)) / denom;
  const double half = z / denom * std::sqrt(p * (1 - p) / nn + z * z / (4 * nn * nn));
  return {std::max(0.0, center - half), std::min(1.0, center + half)};
}

Interval WilsonRate(double rate, uint64_t n) {
  if (n == 0) return {0, 1};
  const double z = 1.959963984540054;
  const double nn = static_cast<double>(n);
  const double p = std::clamp(rate, 0.0, 1.0);
  const double denom = 1 + z * z / nn;
  const double center = (p + z * z / (2 * nn)) / denom;
  const double half = z / denom * std::sqrt(p * (1 - p) / nn + z * z / (4 * nn * nn));
  return {std::max(0.0, center - half), std::min(1.0, center + half)};
}

std::string CsvHeader() {
  return "task,policy,query_alignment,budget,layer_budgets,sessions,probes,passes,rate,wilson_lo,"
         "wilson_hi,probe_rate,probe_wilson_lo,probe_wilson_hi,blocks_saved,blocks_recovered,"
         "blocks_verified,bytes_moved,decode_steps,recovery_failures";
}

std::string ToCsv(absl::Span<const Cell> cells, bool timing) {
  std::string out = absl::StrCat("# ", kNoModelNotice, "\n", CsvHeader(),
                                 timing ? ",engine_ms_per_step" : "", "\n");
  for (const Cell& c : cells) {
    const Interval w = c.interval();
    const Interval pw = c.probe_interval();
    absl::StrAppend(&out, c.task, ",", c.policy, ",",
                    c.alignment < 0 ? "" : absl::StrFormat("%.2f", c.alignment), ",", c.budget,
                    ",", c.layer_budgets, ",", c.sessions, ",", c.probes, ",", c.passes, ",",
                    absl::StrFormat("%.4f,%.4f,%.4f", c.rate(), w.lo, w.hi), ",",
                    absl::StrFormat("%.4f,%.4f,%.4f", c.probe_rate(), pw.lo, pw.hi), ",",
                    c.blocks_saved, ",", c.blocks_recovered, ",", c.blocks_verified, ",",
                    c.bytes_moved, ",", c.decode_steps, ",", c.recovery_failures);
    if (timing) absl::StrAppend(&out, ",", absl::StrFormat("%.4f", c.engine_ms_per_step()));
    absl::StrAppend(&out, "\n");
  }
  return out;
}

std::string Label(const Cell& c) {
  std::string label = c.policy;
  if (c.alignment >= 0) absl::StrAppend(&label, absl::StrFormat(" rho=%.2f", c.alignment));
  if (c.layer_budgets != "uniform") absl::StrAppend(&label, " (", c.layer_budgets, ")");
  return label;
}

std::string ProbeLogCsv(absl::Span<const ProbeRow> rows) {
  std::string out = absl::StrCat(
      "# ", kNoModelNotice, "\n",
      "task,variant,seed,policy,query_alignment,budget,layer_budgets,probe,fact,resident,"
      "distance,mass,layers,passed\n");
  for (const ProbeRow& r : rows) {
    absl::StrAppend(&out, r.task, ",", r.variant, ",", r.seed, ",", r.policy, ",",
                    r.alignment < 0 ? "" : absl::StrFormat("%.2f", r.alignment), ",", r.budget,
                    ",", r.layer_budgets, ",", r.probe, ",", r.fact, ",",
                    absl::StrFormat("%.4f,%.1f,%.4f", r.resident, r.distance, r.mass), ",",
                    r.layers, ",", r.passed ? 1 : 0, "\n");
  }
  return out;
}

namespace {

// Ordered unique values, first-seen order.
template <typename T, typename F>
std::vector<T> Unique(absl::Span<const Cell> cells, F f) {
  std::vector<T> out;
  for (const Cell& c : cells) {
    T v = f(c);
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
  }
  return out;
}

}  // namespace

std::string ToMarkdown(absl::Span<const Cell> cells, const std::string& command,
                       const std::string& params, bool timing) {
  std::string out = absl::StrCat("> ", kNoModelNotice, "\n\n");
  if (!command.empty()) absl::StrAppend(&out, "Command: `", command, "`\n\n");
  const auto tasks = Unique<std::string>(cells, [](const Cell& c) { return c.task; });
  auto budgets = Unique<uint32_t>(cells, [](const Cell& c) { return c.budget; });
  std::sort(budgets.begin(), budgets.end());
  const auto labels = Unique<std::string>(cells, Label);
  for (const std::string& task : tasks) {
    absl::StrAppend(&out, "### ", task,
                    ": pass rate, mean over sessions [Wilson 95% over sessions] (sessions; "
                    "probes passed)\n\n| policy |");
    for (uint32_t b : budgets) absl::StrAppend(&out, " b=", b, " |");
    absl::StrAppend(&out, "\n|---|");
    for (size_t i = 0; i < budgets.size(); ++i) absl::StrAppend(&out, "---|");
    absl::StrAppend(&out, "\n");
    for (const std::string& label : labels) {
      std::string row = absl::StrCat("| ", label, " |");
      bool any = false;
      for (uint32_t b : budgets) {
        const Cell* found = nullptr;
        for (const Cell& c : cells) {
          if (c.task == task && c.budget == b && Label(c) == label) found = &c;
        }
        if (found == nullptr) {
          absl::StrAppend(&row, " |");
          continue;
        }
        any = true;
        const Interval w = found->interval();
        absl::StrAppend(&row, absl::StrFormat(" %.1f%% [%.1f, %.1f] (%d; %d/%d) |",
                                              100 * found->rate(), 100 * w.lo, 100 * w.hi,
                                              found->sessions, found->passes, found->probes));
      }
      if (any) absl::StrAppend(&out, row, "\n");
    }
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out,
                  "### Engine counters (per session, mean)\n\n| task | policy | budget | blocks saved | "
                  "blocks recovered (verified) | MiB moved | recovery failures |",
                  timing ? " engine+evoked ms / decode step |" : "",
                  "\n|---|---|---|---|---|---|---|", timing ? "---|" : "", "\n");
  for (const Cell& c : cells) {
    const double runs = std::max<double>(1, static_cast<double>(c.sessions));
    absl::StrAppend(
        &out, absl::StrFormat("| %s | %s | %d | %.1f | %.1f (%.1f) | %.1f | %d |", c.task,
                              Label(c), c.budget, c.blocks_saved / runs, c.blocks_recovered / runs,
                              c.blocks_verified / runs,
                              static_cast<double>(c.bytes_moved) / runs / (1 << 20),
                              c.recovery_failures));
    if (timing) absl::StrAppend(&out, absl::StrFormat(" %.4f |", c.engine_ms_per_step()));
    absl::StrAppend(&out, "\n");
  }
  if (!params.empty()) absl::StrAppend(&out, "\n### Simulator parameters\n\n```\n", params, "```\n");
  return out;
}

std::string ToSvg(absl::Span<const Cell> cells) {
  const auto tasks = Unique<std::string>(cells, [](const Cell& c) { return c.task; });
  auto budgets = Unique<uint32_t>(cells, [](const Cell& c) { return c.budget; });
  std::sort(budgets.begin(), budgets.end());
  const auto labels = Unique<std::string>(cells, Label);
  const int pw = 330, ph = 260, left = 50, top = 40, legend = 190;
  const int width = left + static_cast<int>(tasks.size()) * (pw + 30) + legend;
  const int height = top + ph + 70;
  static const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  std::string out = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\">\n",
      width, height, width, height);
  absl::StrAppend(&out, "<!-- ", kNoModelNotice, " -->\n");
  absl::StrAppend(&out, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
  absl::StrAppend(&out, absl::StrFormat(
                            "<text x=\"%d\" y=\"16\" font-size=\"12\">Pass rate vs budget (Wilson "
                            "95%% over sessions). Synthetic simulator: no language model."
                            "</text>\n",
                            left));
  const double lmin = std::log2(static_cast<double>(budgets.empty() ? 1 : budgets.front()));
  const double lmax = std::log2(static_cast<double>(budgets.empty() ? 2 : budgets.back()));
  for (size_t ti = 0; ti < tasks.size(); ++ti) {
    const int x0 = left + static_cast<int>(ti) * (pw + 30);
    auto xof = [&](uint32_t b) {
      const double f = lmax > lmin ? (std::log2(static_cast<double>(b)) - lmin) / (lmax - lmin)
                                   : 0.5;
      return x0 + 20 + f * (pw - 40);
    };
    auto yof = [&](double r) { return top + ph - r * ph; };
    absl::StrAppend(&out, absl::StrFormat("<g id=\"panel-%s\">\n", tasks[ti]));
    absl::StrAppend(&out, absl::StrFormat("<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
                                          "fill=\"none\" stroke=\"#444\"/>\n",
                                          x0, top, pw, ph));
    absl::StrAppend(&out, absl::StrFormat("<text x=\"%d\" y=\"%d\" font-size=\"13\" "
                                          "font-weight=\"bold\">%s</text>\n",
                                          x0 + pw / 2 - 30, top - 6, tasks[ti]));
    for (int g = 0; g <= 4; ++g) {
      const double y = yof(g / 4.0);
      absl::StrAppend(&out, absl::StrFormat("<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" "
                                            "stroke=\"#ddd\"/><text x=\"%d\" y=\"%.1f\" "
                                            "text-anchor=\"end\">%d%%</text>\n",
                                            x0, y, x0 + pw, y, x0 - 3, y + 4, g * 25));
    }
    for (uint32_t b : budgets) {
      absl::StrAppend(&out, absl::StrFormat("<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">"
                                            "%d</text>\n",
                                            xof(b), top + ph + 14, b));
    }
    absl::StrAppend(&out, absl::StrFormat("<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">"
                                          "budget (tokens per layer)</text>\n",
                                          x0 + pw / 2, top + ph + 30));
    for (size_t li = 0; li < labels.size(); ++li) {
      const char* color = kColors[li % 10];
      std::vector<const Cell*> pts;
      for (uint32_t b : budgets) {
        for (const Cell& c : cells) {
          if (c.task == tasks[ti] && c.budget == b && Label(c) == labels[li]) pts.push_back(&c);
        }
      }
      if (pts.empty()) continue;
      // Small horizontal offset per series so that whiskers do not overlap.
      const double dx = (static_cast<double>(li) - (labels.size() - 1) / 2.0) * 3.0;
      std::string poly;
      for (const Cell* c : pts) {
        absl::StrAppend(&poly, absl::StrFormat("%.1f,%.1f ", xof(c->budget) + dx, yof(c->rate())));
      }
      absl::StrAppend(&out, absl::StrFormat("<polyline fill=\"none\" stroke=\"%s\" "
                                            "stroke-width=\"1.5\" points=\"%s\"/>\n",
                                            color, poly));
      for (const Cell* c : pts) {
        const Interval w = c->interval();
        const double x = xof(c->budget) + dx;
        absl::StrAppend(&out, absl::StrFormat(
                                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                                  "stroke=\"%s\"/><circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" "
                                  "fill=\"%s\"><title>%s %s b=%d: %.1f%% [%.1f, %.1f]</title>"
                                  "</circle>\n",
                                  x, yof(w.lo), x, yof(w.hi), color, x, yof(c->rate()), color,
                                  c->task, Label(*c), c->budget, 100 * c->rate(), 100 * w.lo,
                                  100 * w.hi));
      }
    }
    absl::StrAppend(&out, "</g>\n");
  }
  const int lx = left + static_cast<int>(tasks.size()) * (pw + 30);
  for (size_t li = 0; li < labels.size(); ++li) {
    const int y = top + 10 + static_cast<int>(li) * 16;
    absl::StrAppend(&out, absl::StrFormat("<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" "
                                          "stroke=\"%s\" stroke-width=\"2\"/><text x=\"%d\" "
                                          "y=\"%d\">%s</text>\n",
                                          lx, y, lx + 18, y, kColors[li % 10], lx + 22, y + 4,
                                          labels[li]));
  }
  absl::StrAppend(&out, "</svg>\n");
  return out;
}

}  // namespace evoke::sim
