// evoke-sim: the synthetic long-session simulator (see docs/simulator.md).
//
//   evoke-sim [run] --tasks multifact --policies evoke,snapkv --budgets 1024
//             --seeds 15 --query-alignment 0.2,0.5,0.8 --out-dir results/
//   evoke-sim fitness --task agentic --policy h2o --seeds 0-9
//             --budgets-json budgets.json     (or - for stdin)
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "policy/layer_budgets.h"
#include "policy/policy.h"
#include "sim/evaluation.h"
#include "sim/evoked_process.h"
#include "sim/model.h"
#include "sim/report.h"
#include "sim/runner.h"

namespace {

using evoke::sim::GridSpec;

int Fail(const std::string& message) {
  std::cerr << "evoke-sim: " << message << "\n";
  return 1;
}

// "0-9" -> [0, 10); "15" -> [0, 15) for --seeds N.
bool ParseSeedRange(const std::string& text, uint64_t* begin, uint64_t* end) {
  std::vector<std::string> parts = absl::StrSplit(text, '-');
  uint64_t a = 0, b = 0;
  if (parts.size() == 1) {
    if (!absl::SimpleAtoi(parts[0], &b) || b == 0) return false;
    *begin = 0;
    *end = b;
    return true;
  }
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &a) || !absl::SimpleAtoi(parts[1], &b) ||
      b < a) {
    return false;
  }
  *begin = a;
  *end = b + 1;
  return true;
}

std::string ReadAll(std::istream& in) {
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool NeedsEvoked(const std::vector<std::string>& policies) {
  for (const std::string& p : policies) {
    if (evoke::sim::IsRecovering(p)) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{std::string(evoke::sim::kNoModelNotice) +
               "\nRuns eviction/recovery policies over simulated long sessions (NIAH, multi-fact, "
               "agentic) and reports pass rates with Wilson 95% intervals. Recovering policies "
               "(infllm, evoke) run against a real evoked that evoke-sim starts itself."};
  app.require_subcommand(0, 1);
  GridSpec spec;
  std::string tasks = "niah,multifact,agentic";
  std::string policies = "recency,streaming_llm,h2o,snapkv,infllm,evoke";
  std::string budgets = "512,1024,2048";
  std::string seeds;
  uint64_t seed_begin = 0, seed_end = 15;
  std::string out_dir = "sim-results";
  std::string layer_budgets = "uniform";
  std::string evoked_path;
  std::string pinned = "16MiB";
  std::string policy_params;
  uint32_t threads = 1;
  std::string alignments;
  std::string probe_log;
  bool print_params = false;
  auto add_common = [&](CLI::App* a) {
    a->add_option("--evoked", evoked_path,
                  "evoked binary (default: the build tree's daemon/evoked, else PATH)");
    a->add_option("--pinned-bytes", pinned, "evoked's tier 1 (small, so that blocks spill)")
        ->capture_default_str();
    a->add_option("--threads", threads, "Sessions run in parallel")->capture_default_str();
    a->add_option("--policy-params", policy_params,
                  "Policy parameters, key=value,... (policy/policy.h PolicyParams)");
    a->add_option("--query-alignment", alignments,
                  "Cosine of recovery queries with their fact, in [0, 1], comma-separated for a "
                  "sweep (recovering policies run once per value); default: the model's (" +
                      absl::StrCat(spec.params.query_alignment) + ")");
  };
  add_common(&app);
  app.add_option("--tasks", tasks, "Comma-separated: niah, multifact, agentic")
      ->capture_default_str();
  app.add_option("--policies", policies, "Comma-separated policy names")->capture_default_str();
  app.add_option("--budgets", budgets, "Comma-separated mean budgets (tokens per layer)")
      ->capture_default_str();
  app.add_option("--seeds", seeds, "N (seeds 0..N-1) or A-B (inclusive); default 15");
  app.add_option("--seed-begin", seed_begin, "First seed (with --seed-end)");
  app.add_option("--seed-end", seed_end, "One past the last seed");
  app.add_option("--out-dir", out_dir, "Where results.{csv,md,svg} go")->capture_default_str();
  app.add_option("--layer-budgets", layer_budgets,
                 "Per-layer budgets of recovery-less policies: uniform, pyramid, FILE.json, or "
                 "several comma-separated (compared side by side)")
      ->capture_default_str();
  app.add_option("--probe-log", probe_log,
                 "Also write one CSV row per probe (residency, distance, mass) to this file");
  app.add_flag("--print-params", print_params, "Print the simulator's parameters and exit");

  CLI::App* fit = app.add_subcommand(
      "fitness", "Run one task and policy with per-layer budgets from JSON; print the mean pass "
                 "rate as the last line of stdout (for evoke-tune --fitness-cmd)");
  std::string fit_task = "agentic";
  std::string fit_policy = "h2o";
  std::string fit_seeds = "0-9";
  std::string fit_json = "-";
  add_common(fit);
  fit->add_option("--task", fit_task, "Task")->capture_default_str();
  fit->add_option("--policy", fit_policy, "Policy")->capture_default_str();
  fit->add_option("--seeds", fit_seeds, "A-B or N")->capture_default_str();
  fit->add_option("--budgets-json", fit_json, "Budgets JSON file, or - for stdin")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  if (print_params) {
    std::cout << "# " << evoke::sim::kNoModelNotice << "\n" << spec.params.Describe();
    return 0;
  }
  if (absl::Status s = evoke::policy::ParsePolicyParams(policy_params, &spec.policy_params);
      !s.ok() && !policy_params.empty()) {
    return Fail(std::string(s.message()));
  }
  spec.threads = threads;
  for (absl::string_view a : absl::StrSplit(alignments, ',', absl::SkipEmpty())) {
    double v = 0;
    if (!absl::SimpleAtod(a, &v) || !(v >= 0 && v <= 1)) {
      return Fail(absl::StrCat("--query-alignment: \"", a, "\" is not a number in [0, 1]"));
    }
    spec.alignments.push_back(v);
  }
  const auto start = std::chrono::steady_clock::now();

  if (fit->parsed()) {
    absl::StatusOr<evoke::sim::Task> task = evoke::sim::ParseTask(fit_task);
    if (!task.ok()) return Fail(std::string(task.status().message()));
    spec.tasks = {*task};
    spec.policies = {fit_policy};
    if (!ParseSeedRange(fit_seeds, &spec.seed_begin, &spec.seed_end)) {
      return Fail("--seeds: expected N or A-B, got \"" + fit_seeds + "\"");
    }
    std::string json;
    if (fit_json == "-") {
      json = ReadAll(std::cin);
    } else {
      std::ifstream in(fit_json);
      if (!in) return Fail("--budgets-json: cannot open " + fit_json);
      json = ReadAll(in);
    }
    absl::StatusOr<std::vector<uint32_t>> b =
        evoke::policy::ParseBudgetsJson(json, spec.params.n_layers);
    if (!b.ok()) return Fail(absl::StrCat("--budgets-json: ", b.status().message()));
    evoke::sim::LayerBudgetScheme scheme;
    scheme.name = "file";
    scheme.fixed = *b;
    spec.schemes = {scheme};
  } else {
    spec.tasks.clear();
    for (absl::string_view t : absl::StrSplit(tasks, ',', absl::SkipEmpty())) {
      absl::StatusOr<evoke::sim::Task> task = evoke::sim::ParseTask(t);
      if (!task.ok()) return Fail(std::string(task.status().message()));
      spec.tasks.push_back(*task);
    }
    spec.policies = absl::StrSplit(policies, ',', absl::SkipEmpty());
    spec.budgets.clear();
    for (absl::string_view b : absl::StrSplit(budgets, ',', absl::SkipEmpty())) {
      uint32_t v = 0;
      if (!absl::SimpleAtoi(b, &v) || v == 0) return Fail(absl::StrCat("--budgets: bad \"", b, "\""));
      spec.budgets.push_back(v);
    }
    if (!seeds.empty()) {
      if (!ParseSeedRange(seeds, &spec.seed_begin, &spec.seed_end)) {
        return Fail("--seeds: expected N or A-B, got \"" + seeds + "\"");
      }
    } else {
      spec.seed_begin = seed_begin;
      spec.seed_end = seed_end;
      if (seed_end <= seed_begin) return Fail("--seed-end must be above --seed-begin");
    }
    spec.schemes.clear();
    for (absl::string_view s : absl::StrSplit(layer_budgets, ',', absl::SkipEmpty())) {
      evoke::sim::LayerBudgetScheme scheme;
      if (s == "uniform" || s == "pyramid") {
        scheme.name = std::string(s);
      } else {
        absl::StatusOr<std::vector<uint32_t>> b =
            evoke::policy::ReadBudgetsFile(std::string(s), spec.params.n_layers);
        if (!b.ok()) return Fail(absl::StrCat("--layer-budgets ", s, ": ", b.status().message()));
        scheme.name = std::filesystem::path(std::string(s)).stem().string();
        scheme.fixed = *b;
      }
      spec.schemes.push_back(scheme);
    }
  }
  for (const std::string& p : spec.policies) {
    absl::StatusOr<std::unique_ptr<evoke::policy::Policy>> made =
        evoke::policy::MakePolicy(p, spec.policy_params);
    if (!made.ok()) return Fail(std::string(made.status().message()));
  }

  std::unique_ptr<evoke::sim::EvokedProcess> evoked;
  if (NeedsEvoked(spec.policies)) {
    evoke::sim::EvokedProcessOptions o;
    o.binary = evoked_path;
    o.pinned_bytes = pinned;
    o.summary_layer = spec.params.recovery_layer;
    absl::StatusOr<std::unique_ptr<evoke::sim::EvokedProcess>> e =
        evoke::sim::EvokedProcess::Start(o);
    if (!e.ok()) return Fail(std::string(e.status().message()));
    evoked = std::move(*e);
  }
  std::vector<evoke::sim::ProbeRow> probe_rows;
  absl::StatusOr<std::vector<evoke::sim::Cell>> cells =
      evoke::sim::RunGrid(spec, evoked.get(), probe_log.empty() ? nullptr : &probe_rows);
  evoked.reset();  // SIGTERM.
  if (!cells.ok()) return Fail(cells.status().ToString());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  if (fit->parsed()) {
    // The mean over sessions of each session's pass rate (as the headline).
    uint64_t passes = 0, probes = 0, sessions = 0;
    double rate_sum = 0;
    for (const evoke::sim::Cell& c : *cells) {
      passes += c.passes;
      probes += c.probes;
      sessions += c.sessions;
      rate_sum += c.session_rate_sum;
    }
    std::cerr << "evoke-sim fitness: " << passes << "/" << probes << " probes passed over "
              << sessions << " sessions in " << seconds << " s\n";
    std::printf("%.6f\n", sessions == 0 ? 0.0 : rate_sum / static_cast<double>(sessions));
    return 0;
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  std::string command;
  for (int i = 0; i < argc; ++i) absl::StrAppend(&command, i == 0 ? "evoke-sim" : " ", i == 0 ? "" : argv[i]);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream out(std::filesystem::path(out_dir) / name);
    out << text;
    return static_cast<bool>(out);
  };
  const std::string params = spec.params.Describe();
  if (!write("results.csv", evoke::sim::ToCsv(*cells)) ||
      !write("results.md", evoke::sim::ToMarkdown(*cells, command, params)) ||
      !write("results.svg", evoke::sim::ToSvg(*cells)) ||
      !write("timing.md", absl::StrCat(evoke::sim::ToMarkdown(*cells, command, "", true),
                                       "\nWall time: ", seconds, " s with --threads ", threads,
                                       "\n"))) {
    return Fail("cannot write to " + out_dir);
  }
  if (!probe_log.empty()) {
    std::ofstream out(probe_log);
    out << evoke::sim::ProbeLogCsv(probe_rows);
    if (!out) return Fail("cannot write " + probe_log);
  }
  std::cout << evoke::sim::ToMarkdown(*cells, command, "", true);
  std::cerr << "evoke-sim: " << cells->size() << " cells in " << seconds << " s, written to "
            << out_dir << "\n";
  return 0;
}
