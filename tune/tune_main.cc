// evoke-tune: EvolKV-style search for per-layer KV budgets, scored by an
// external command. See docs/tuning.md.
//
// Exit status: 0 on success; 1 when the search stopped on a fitness error
// (the trace so far is in --trace and the best plan so far, completed, in
// --out with "method": "evolkv-partial", when at least one evaluation
// succeeded) or an output file could not be written; 2 for bad flags.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "policy/layer_budgets.h"
#include "tune/evolkv.h"
#include "tune/external_fitness.h"

namespace {

using evoke::tune::Evaluation;

// WriteFileAtomically writes `text` to path.tmp, then renames it to `path`.
absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

// TraceWriter writes one CSV row per evaluation as it happens, flushed, so
// the trace on disk is complete up to the last evaluation whatever happens.
class TraceWriter {
 public:
  absl::Status Open(const std::string& path, uint32_t n_layers) {
    out_.open(path, std::ios::binary | std::ios::trunc);
    if (!out_) return absl::UnavailableError(absl::StrCat("cannot open trace file ", path));
    out_ << "group,generation,evaluation,objective,f,cache_score,mean_budget";
    for (uint32_t i = 0; i < n_layers; ++i) out_ << ",k" << i;
    out_ << "\n";
    out_.flush();
    return absl::OkStatus();
  }
  void Write(const Evaluation& e) {
    if (!out_.is_open()) return;
    out_ << absl::StrFormat("%u,%u,%u,%.17g,%.17g,%.17g,%.17g", e.group, e.generation, e.index,
                            e.objective, e.f, e.cache_score, e.mean_budget);
    for (uint32_t k : e.budgets) out_ << "," << k;
    out_ << "\n";
    out_.flush();
  }

 private:
  std::ofstream out_;
};

}  // namespace

int main(int argc, char** argv) {
  evoke::tune::TuneOptions options;
  evoke::tune::ExternalFitnessOptions fitness_options;
  std::string out_path;
  std::string trace_path;
  bool quiet = false;

  CLI::App app{
      "evoke-tune: EvolKV-style search for per-layer KV budgets. Layers are cut into groups,\n"
      "optimised bottom-up by CMA-ES (pagmo2); each candidate plan is scored by an external\n"
      "command (budgets JSON on its stdin and in $EVOKE_BUDGETS_FILE; it prints one number,\n"
      "higher is better). The objective is f * (1 + lambda * CacheScore). The best plan is\n"
      "completed to sum to exactly target * layers and written to --out. See docs/tuning.md."};
  app.add_option("--layers", options.n_layers, "Number of layers L")->required();
  app.add_option("--target", options.target_budget,
                 "Target mean budget c, tokens per layer (the output sums to c * L)")
      ->required();
  app.add_option("--fitness-cmd", fitness_options.command,
                 "Shell command that scores a plan (run as /bin/sh -c CMD)")
      ->required();
  app.add_option("--out", out_path, "Where to write the best plan (budgets JSON)")->required();
  app.add_option("--trace", trace_path, "CSV trace, one row per evaluation (default: none)");
  app.add_option("--group-size", options.group_size, "Layers per group n_g")
      ->capture_default_str();
  app.add_option("--population", options.population, "CMA-ES population (>= 5)")
      ->capture_default_str();
  app.add_option("--sigma", options.sigma0,
                 "Initial CMA-ES step, relative to the bounds' width (max - min budget)")
      ->capture_default_str();
  app.add_option("--generations", options.generations, "CMA-ES generations per group")
      ->capture_default_str();
  app.add_option("--lambda", options.lambda, "Weight of CacheScore in the objective")
      ->capture_default_str();
  app.add_option("--gamma", options.gamma, "CacheScore's penalty below the target, (0, 1]")
      ->capture_default_str();
  app.add_option("--seed", options.seed, "Seed (same seed + deterministic fitness = same run)")
      ->capture_default_str();
  app.add_option("--min-budget", options.min_budget, "Lowest budget tried per layer, tokens")
      ->capture_default_str();
  app.add_option("--max-budget", options.max_budget,
                 "Highest budget tried per layer, tokens (0 = 2 * target)")
      ->capture_default_str();
  app.add_option("--timeout-s", fitness_options.timeout_s,
                 "Seconds one fitness command may run before its process group is killed")
      ->capture_default_str();
  app.add_flag("--quiet", quiet, "No progress on stderr");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (absl::Status s = options.Validate(); !s.ok()) {
    std::cerr << "evoke-tune: " << s.message() << "\n";
    return 2;
  }
  if (!(fitness_options.timeout_s > 0 && fitness_options.timeout_s <= 1e6)) {
    std::cerr << "evoke-tune: --timeout-s must be in (0, 1e6]\n";
    return 2;
  }

  TraceWriter trace;
  if (!trace_path.empty()) {
    if (absl::Status s = trace.Open(trace_path, options.n_layers); !s.ok()) {
      std::cerr << "evoke-tune: " << s.message() << "\n";
      return 1;
    }
  }
  const uint32_t n_groups = (options.n_layers + options.group_size - 1) / options.group_size;
  double best = 0;
  bool have_best = false;
  double gen_best = 0;
  uint32_t in_generation = 0;
  options.on_evaluation = [&](const Evaluation& e) {
    trace.Write(e);
    if (!have_best || e.objective > best) best = e.objective;
    have_best = true;
    gen_best = in_generation == 0 ? e.objective : std::max(gen_best, e.objective);
    if (++in_generation < options.population) return;
    in_generation = 0;
    if (!quiet) {
      std::cerr << absl::StrFormat(
          "group %u/%u generation %u/%u: evaluations %u, best of generation %.6g, best so "
          "far %.6g\n",
          e.group + 1, n_groups, e.generation, options.generations, e.index + 1, gen_best, best);
    }
  };

  if (!quiet) {
    std::cerr << absl::StrFormat(
        "evoke-tune: %u layers in %u groups of <= %u, target %u tokens/layer, budgets in "
        "[%u, %u], population %u, sigma %.3g, %u generations/group, lambda %.3g, gamma %.3g, "
        "seed %u\n",
        options.n_layers, n_groups, options.group_size, options.target_budget,
        options.min_budget, options.EffectiveMaxBudget(), options.population, options.sigma0,
        options.generations, options.lambda, options.gamma, options.seed);
  }
  evoke::tune::TuneResult partial;
  absl::StatusOr<evoke::tune::TuneResult> result = evoke::tune::TuneLayerBudgets(
      options, evoke::tune::MakeExternalFitness(fitness_options), &partial);
  if (!result.ok()) {
    std::cerr << "evoke-tune: search stopped: " << result.status() << "\n";
    if (!trace_path.empty()) {
      std::cerr << "evoke-tune: the trace so far (" << partial.trace.size()
                << " evaluations) is in " << trace_path << "\n";
    }
    if (!partial.completed_budgets.empty()) {
      absl::Status s = WriteFileAtomically(
          out_path, evoke::policy::BudgetsToJson(partial.completed_budgets, "evolkv-partial"));
      if (s.ok()) {
        std::cerr << absl::StrFormat(
            "evoke-tune: the best plan so far (objective %.6g, f %.6g), completed, is in %s "
            "with \"method\": \"evolkv-partial\"\n",
            partial.best_objective, partial.best_f, out_path);
      } else {
        std::cerr << "evoke-tune: " << s.message() << "\n";
      }
    } else {
      std::cerr << "evoke-tune: no evaluation succeeded; " << out_path << " not written\n";
    }
    return 1;
  }
  if (absl::Status s = WriteFileAtomically(
          out_path, evoke::policy::BudgetsToJson(result->completed_budgets, "evolkv"));
      !s.ok()) {
    std::cerr << "evoke-tune: " << s.message() << "\n";
    return 1;
  }
  std::cout << absl::StrFormat(
      "best objective %.6g (f %.6g, mean budget %.6g before completion) after %u evaluations; "
      "completed plan (sum %u = %u x %u, f %.6g) written to %s\n",
      result->best_objective, result->best_f, evoke::policy::MeanBudget(result->best_budgets),
      result->trace.size(), options.target_budget * options.n_layers, options.n_layers,
      options.target_budget, result->completed_f, out_path);
  return 0;
}
